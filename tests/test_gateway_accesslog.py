"""The gateway's access log, read back from the real HAProxy: a request the gateway retried and sent on to another
replica (`retry-on conn-failure empty-response`, `option redispatch 1`) is logged as valid JSON, with its retries
and the redispatch. HAProxy writes %rc as "+1" for a redispatch: unquoted, that line was not JSON, and `engine-ctl
logs --gateway` and `usage` dropped it (3,740 of 3,819 retried requests in a 30-minute bench.gateway_soak)."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

from engine_ctl.core.accesslog import parse_request
from engine_ctl.core.documents.apikey import key_sha256
from engine_ctl.core.documents.inventory import Host
from engine_ctl.core.model import ApiKey
from engine_ctl.core.render.gateway import GatewayBackend, GatewayServer, render_gateway
from engine_ctl.shell.gateway.runtime import server_states
from engine_ctl.shell.transport import LocalTransport
from tests.test_gateway_loopback import HAPROXY, KEY_ALL, Replica, chat, free_port


def hang_up_on_posts(port: int) -> socket.socket:
    """A replica that passes its health checks (GET answers 200) and closes every POST's connection without a
    word: what llama-server does to a pooled connection it closes just as the gateway sends on it."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(50)

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                head = conn.recv(65536)
                if head.startswith(b"GET "):
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")

    threading.Thread(target=serve, daemon=True).start()
    return listener


def test_a_retried_and_redispatched_request_is_logged_as_json_with_its_retries(tmp_path: Path) -> None:
    mute_port, good_port = free_port(), free_port()
    mute = hang_up_on_posts(mute_port)
    good = Replica("chat-1", good_port)
    servers = (
        GatewayServer(name="r0a", address="127.0.0.1", port=mute_port, maxconn=4),
        GatewayServer(name="r1a", address="127.0.0.1", port=good_port, maxconn=4),
    )
    host = Host(name="edge", address="127.0.0.1", gateway_port=free_port(), transport="local")
    rendered = render_gateway(host, [GatewayBackend(deployment="chat", servers=servers)],
                              [ApiKey(name="all", sha256=key_sha256(KEY_ALL))], internal_key=False, hold_s=3,
                              run_dir=str(tmp_path))  # fmt: skip
    for name, text in rendered.files.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "server-state").write_text("")
    log = (tmp_path / "stdout.log").open("wb")
    proc = subprocess.Popen([HAPROXY, "-f", str(tmp_path / "haproxy.cfg")], stdout=log, stderr=subprocess.DEVNULL)
    try:
        t = LocalTransport(host)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:  # both servers pass their first check
            states = server_states(t, str(tmp_path / "admin.sock")) if (tmp_path / "admin.sock").exists() else {}
            if all(states.get(("d_chat", s.name)) and states[("d_chat", s.name)].status == "UP" for s in servers):
                break
            time.sleep(0.2)
        else:
            raise AssertionError(f"the servers never came UP: {states}")
        base = f"http://127.0.0.1:{host.gateway_port}"
        for _ in range(6):  # leastconn, one at a time: some go to the mute replica first
            req = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(chat("chat")).encode(),
                                         headers={"Authorization": f"Bearer {KEY_ALL}"})  # fmt: skip
            with urllib.request.urlopen(req, timeout=30) as r:
                assert r.status == 200 and json.loads(r.read())["replica"] == "chat-1"
        # HAProxy writes a request's line when its stream ends, a moment after the client has the whole answer
        deadline = time.monotonic() + 10
        while _logged(tmp_path) < 6 and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()
        mute.close()
        good.shutdown()
        good.server_close()
    lines = [ln for ln in (tmp_path / "stdout.log").read_text().splitlines() if ln.startswith('{"ts":')]
    assert len(lines) == 6, lines
    for line in lines:
        json.loads(line)  # every line is JSON, as logs --gateway and usage read it
    parsed = [parse_request(ln) for ln in lines]
    assert all(p is not None and p.status == 200 and p.deployment == "chat" for p in parsed), parsed
    moved = [p for p in parsed if p is not None and p.redispatched]
    assert moved and all(p.retries >= 1 and p.replica == "r1a" for p in moved), parsed
    assert all(p.retries == 0 for p in parsed if p is not None and not p.redispatched), parsed


def _logged(tmp_path: Path) -> int:
    return sum(1 for ln in (tmp_path / "stdout.log").read_text().splitlines() if ln.startswith('{"ts":'))


def test_a_line_of_a_gateway_rendered_before_the_quoting_is_still_read() -> None:
    """What a gateway not yet re-rendered by an apply writes (HAProxy 2.6, the old log-format)."""
    line = ('{"ts":1764806400.123,"id":"x","gateway":"edge","key":"all","deployment":"chat","replica":"r1a",'
            '"server":"127.0.0.1:9000","method":"POST","path":"/v1/chat/completions","status":200,"bytes_in":90,'
            '"bytes_out":85,"queue_ms":0,"connect_ms":1,"ttfb_ms":8,"total_ms":9,"term":"--","retries":+3,'
            '"prompt_tokens":"4","completion_tokens":"2"}')  # fmt: skip
    parsed = parse_request(line)
    assert parsed is not None and parsed.retries == 3 and parsed.redispatched and parsed.completion_tokens == 2
    plain = parse_request(line.replace('"retries":+3', '"retries":0'))
    assert plain is not None and plain.retries == 0 and not plain.redispatched
