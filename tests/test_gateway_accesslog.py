"""The gateway's access log, read back from the real HAProxy: a request the gateway retried and sent on to another
replica (its connection to the first was refused: `retries`, `retry-on conn-failure`, `option redispatch 1`) is
logged as valid JSON, with its retries and the redispatch. HAProxy writes %rc as "+1" for a redispatch: unquoted,
that line was not JSON, and `engine-ctl logs --gateway` and `usage` dropped it (3,740 of 3,819 retried requests in
a 30-minute bench.gateway_soak). And a request a replica took is never sent to a second one."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
from pathlib import Path

from engine_ctl.core.accesslog import parse_request
from engine_ctl.core.documents.apikey import key_sha256
from engine_ctl.core.documents.inventory import Host
from engine_ctl.core.model import ApiKey
from engine_ctl.core.render.gateway import GatewayBackend, GatewayServer, render_gateway
from engine_ctl.shell.gateway.runtime import ServerState, server_states
from engine_ctl.shell.transport import LocalTransport
from tests.ports import free_port
from tests.test_gateway_loopback import HAPROXY, KEY_ALL, Replica, call, chat


def hang_up_on_posts(port: int, posts: list[int]) -> socket.socket:
    """A replica that passes its health checks (GET answers 200) and closes every POST's connection without a
    word, as an engine that crashes on a request does; it counts the POSTs it was sent in `posts`."""
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
                elif head:
                    posts.append(1)

    threading.Thread(target=serve, daemon=True).start()
    return listener


class CountingReplica(Replica):
    """A stand-in replica that counts the POSTs it answers (its health checks are GETs)."""

    def __init__(self, name: str, port: int) -> None:
        self.answered = 0
        super().__init__(name, port)

    def finish_request(self, request: socket.socket, client_address: object) -> None:  # type: ignore[override]
        first = request.recv(4, socket.MSG_PEEK)
        self.answered += first.startswith(b"POST")
        super().finish_request(request, client_address)


def start_gateway(tmp_path: Path, first_port: int, good_port: int) -> tuple[subprocess.Popen[bytes], Host]:
    """The real HAProxy with the rendered configuration, in front of two replicas, once both are UP."""
    servers = (
        GatewayServer(name="r0a", address="127.0.0.1", port=first_port, maxconn=4),
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
    log.close()
    t = LocalTransport(host)
    deadline = time.monotonic() + 15
    states: dict[tuple[str, str], ServerState] = {}
    while time.monotonic() < deadline:  # both servers pass their first check
        states = server_states(t, str(tmp_path / "admin.sock")) if (tmp_path / "admin.sock").exists() else {}
        if all(states.get(("d_chat", s.name)) and states[("d_chat", s.name)].status == "UP" for s in servers):
            return proc, host
        time.sleep(0.2)
    proc.terminate()
    proc.wait(timeout=10)
    raise AssertionError(f"the servers never came UP: {states}")


def post(host: Host) -> tuple[int, dict[str, object]]:
    status, _, body = call(f"http://127.0.0.1:{host.gateway_port}", "/v1/chat/completions", KEY_ALL, chat("chat"))
    return status, body


def test_a_retried_and_redispatched_request_is_logged_as_json_with_its_retries(tmp_path: Path) -> None:
    """r0a stops listening once both replicas are UP (an engine stopped since its last check): the request sent
    to it is refused, tried again and sent on to r1a; HAProxy marks r0a down at that error."""
    gone_port, good_port = free_port(), free_port()
    gone, good = Replica("chat-0", gone_port), Replica("chat-1", good_port)
    proc, host = start_gateway(tmp_path, gone_port, good_port)
    try:
        gone.shutdown()
        gone.server_close()  # refused from now on
        for _ in range(6):  # leastconn, one at a time: the first or the second goes to r0a
            status, body = post(host)
            assert status == 200 and body["replica"] == "chat-1", (status, body)
        # HAProxy writes a request's line when its stream ends, a moment after the client has the whole answer
        deadline = time.monotonic() + 10
        while _logged(tmp_path) < 6 and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
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


def test_a_request_a_replica_took_is_never_sent_to_a_second_one(tmp_path: Path) -> None:
    """r0a takes every POST and closes its connection unanswered, as an engine a request crashed: that request is
    answered 502 and never sent on to r1a (a request that crashed one engine must not crash the next: no L7
    retry). Each request reaches exactly one replica."""
    mute_port, good_port = free_port(), free_port()
    posts: list[int] = []
    mute = hang_up_on_posts(mute_port, posts)
    good = CountingReplica("chat-1", good_port)
    proc, host = start_gateway(tmp_path, mute_port, good_port)
    try:
        answers = [post(host) for _ in range(6)]
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        mute.close()
        good.shutdown()
        good.server_close()
    failed = [body for status, body in answers if status == 502]
    served = [body for status, body in answers if status == 200]
    assert failed, answers  # leastconn, one at a time: some went to the mute replica
    assert all(b["error"]["code"] == "bad_gateway" for b in failed), failed  # type: ignore[index]
    assert len(failed) + len(served) == 6 and all(b["replica"] == "chat-1" for b in served), answers
    assert len(posts) == len(failed) and good.answered == len(served), (len(posts), good.answered, answers)


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
