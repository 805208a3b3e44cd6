"""A freshly started gateway (the real HAProxy 2.6 of this machine, on loopback, started as its unit starts it)
sends no request to a replica whose engine is not serving yet: every server starts DOWN (start.state) and enters at
its first passing check, so a request meanwhile is held and then answered, never a 502/503 from that replica.

The replica is a stand-in on loopback that behaves as llama-server does while it loads its model (its source:
llama.cpp's tools/server/server.cpp, which answers /health and every request 503 `{"error": {"code": 503,
"message": "Loading model", "type": "unavailable_error"}}` until the model is loaded)."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from engine_ctl.core.documents.apikey import key_sha256
from engine_ctl.core.documents.inventory import Host
from engine_ctl.core.model import ApiKey
from engine_ctl.core.render.gateway import (
    START_STATE_FILE,
    GatewayBackend,
    GatewayServer,
    render_gateway,
    start_state,
)
from engine_ctl.shell.gateway.runtime import SETUP_FAILURE
from tests.ports import free_port

HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
KEY = "ak-start-" + "5" * 40
LOADING = json.dumps({"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}).encode()


class LoadingEngine(ThreadingHTTPServer):
    """Answers 503 "Loading model" (health included) until `loaded` is set, then 200."""

    daemon_threads = True

    def __init__(self, port: int) -> None:
        self.loaded = threading.Event()
        self.answered_503 = 0
        super().__init__(("127.0.0.1", port), _Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()


class _Handler(BaseHTTPRequestHandler):
    server: LoadingEngine

    def log_message(self, *args: object) -> None:
        pass

    def _answer(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        ready = self.server.loaded.is_set()
        body = b'{"status":"ok"}' if self.path == "/health" else json.dumps({"replica": "engine"}).encode()
        if not ready:
            body = LOADING
            if self.path != "/health":
                self.server.answered_503 += 1
        self.send_response(200 if ready else 503)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = _answer
    do_POST = _answer


def test_start_state_lists_every_server_down_and_keeps_maintenance() -> None:
    servers = (GatewayServer(name="r0a", address="10.0.0.1", port=9000, maxconn=2),
               GatewayServer(name="r1a", address="10.0.0.2", port=9001, maxconn=2, disabled=True))  # fmt: skip
    lines = start_state([GatewayBackend(deployment="chat", servers=servers)]).splitlines()
    assert lines[0] == "1" and lines[1].startswith("# be_id be_name srv_id srv_name")
    rows = [ln.split() for ln in lines[2:]]
    assert [(r[1], r[3], r[4], r[5], r[6], r[18]) for r in rows] == [
        ("d_chat", "r0a", "10.0.0.1", "0", "0", "9000"),
        ("d_chat", "r1a", "10.0.0.2", "0", "5", "9001"),
    ]
    assert all(len(r) == 25 for r in rows)


@pytest.fixture
def fresh_gateway(tmp_path: Path) -> Iterator[dict[str, object]]:
    port = free_port()
    engine = LoadingEngine(port)
    host = Host(name="edge", address="127.0.0.1", gateway_port=free_port(), transport="local")
    # HAProxy spreads its first checks over a second by the servers' order: 30 other deployments come first, so the
    # first check of solo's replica runs about a second after the start, when the request is already there
    others = [GatewayBackend(deployment=f"other-{i:02}", servers=(GatewayServer(name="r0a", address="127.0.0.1",
                                                                                port=free_port(), maxconn=1),))
              for i in range(30)]  # fmt: skip
    solo = GatewayServer(name="r0a", address="127.0.0.1", port=port, maxconn=2)
    backends = [*others, GatewayBackend(deployment="solo", servers=(solo,))]
    rendered = render_gateway(host, backends, [ApiKey(name="k", sha256=key_sha256(KEY))], internal_key=False,
                              hold_s=20, run_dir=str(tmp_path))  # fmt: skip
    for name, text in rendered.files.items():
        (tmp_path / name).write_text(text)
    # as the unit's ExecStartPre does: the fresh gateway loads start.state
    assert f"ExecStartPre=/bin/cp -f /etc/engine-ctl/gateway/{START_STATE_FILE} " in rendered.unit_text
    shutil.copy(tmp_path / START_STATE_FILE, tmp_path / "server-state")
    proc = subprocess.Popen([HAPROXY, "-f", str(tmp_path / "haproxy.cfg")], stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{host.gateway_port}"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(base + "/health", timeout=1)
            break
        except OSError:
            time.sleep(0.05)
    yield {"base": base, "engine": engine}
    proc.terminate()
    proc.wait(timeout=10)
    engine.shutdown()
    engine.server_close()


def test_a_fresh_gateway_holds_a_request_until_the_only_replica_serves(fresh_gateway: dict) -> None:  # type: ignore[type-arg]
    base, engine = str(fresh_gateway["base"]), fresh_gateway["engine"]
    assert isinstance(engine, LoadingEngine)
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "model": "solo"}).encode()
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"}
    results: list[tuple[int, bytes, float]] = []

    def ask() -> None:
        began = time.monotonic()
        request = urllib.request.Request(base + "/v1/chat/completions", data=body, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=30) as r:
                results.append((r.status, r.read(), time.monotonic() - began))
        except urllib.error.HTTPError as exc:
            results.append((exc.code, exc.read(), time.monotonic() - began))

    waiter = threading.Thread(target=ask)
    waiter.start()  # at once: the gateway has just started, its first check may not have run
    time.sleep(2.0)
    assert not results, f"answered before the replica served: {results}"
    engine.loaded.set()
    waiter.join(timeout=20)
    assert results, "no answer"
    status, answer, took = results[0]
    assert status == 200 and json.loads(answer) == {"replica": "engine"}, (status, answer)
    assert took >= 2.0 and engine.answered_503 == 0, "the request never reached the engine while it loaded"


def test_a_fresh_gateway_keeps_a_disabled_server_in_maintenance_and_holds_its_request(tmp_path: Path) -> None:
    """Issue 24: a sleeping on-demand slot (`disabled`) came out of maintenance when the gateway started (killed and
    restarted by systemd, or installed anew): HAProxy read start.state's admin state 4 as "set ready at run time",
    put the server UP before any check ("UP 1/3", logged "UP/READY (leaving forced maintenance)"), and sent the next
    request to an engine that was not running: HAProxy's 503 after its retries, not a held request. Here nothing
    listens on the slot's port, as when the slot sleeps: the server must stay in MAINT and the request be held."""
    port = free_port()  # nothing listens there: the slot sleeps
    host = Host(name="edge", address="127.0.0.1", gateway_port=free_port(), transport="local")
    asleep = GatewayServer(name="r0a", address="127.0.0.1", port=port, maxconn=2, disabled=True)
    rendered = render_gateway(host, [GatewayBackend(deployment="zero", servers=(asleep,))],
                              [ApiKey(name="k", sha256=key_sha256(KEY))], internal_key=False, hold_s=3,
                              run_dir=str(tmp_path))  # fmt: skip
    for name, text in rendered.files.items():
        (tmp_path / name).write_text(text)
    shutil.copy(tmp_path / START_STATE_FILE, tmp_path / "server-state")  # as the unit's ExecStartPre does
    proc = subprocess.Popen([HAPROXY, "-f", str(tmp_path / "haproxy.cfg")], stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{host.gateway_port}"
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(base + "/health", timeout=1)
                break
            except OSError:
                time.sleep(0.05)
        status = server_status(tmp_path / "admin.sock", "d_zero", "r0a")
        assert status == "MAINT", f"the sleeping slot's server is {status!r} at start, not in maintenance"
        body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "model": "zero"}).encode()
        request = urllib.request.Request(base + "/v1/chat/completions", data=body,
                                         headers={"Content-Type": "application/json",
                                                  "Authorization": f"Bearer {KEY}"})  # fmt: skip
        with pytest.raises(urllib.error.HTTPError) as raised:
            urllib.request.urlopen(request, timeout=30)
        answer = json.loads(raised.value.read())
        # held for the whole hold (3 s here), then the gateway's own 503 with Retry-After: never HAProxy's "No server
        # is available", which is what a request sent to the stopped engine gets after its retries
        assert raised.value.code == 503 and raised.value.headers.get("Retry-After") == "5", answer
        assert "No replica of this deployment is serving yet" in answer["error"]["message"], answer
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=10)
    assert "leaving forced maintenance" not in err, err


def server_status(admin: Path, backend: str, server: str) -> str:
    """A server's status from HAProxy's `show stat` on its admin socket."""
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(admin))
        s.sendall(b"show stat\n")
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    for line in out.decode().splitlines():
        fields = line.split(",")
        if fields[:2] == [backend, server]:
            return fields[17]
    raise AssertionError(f"{backend}/{server} is not in show stat:\n{out.decode()}")


def test_only_systemd_s_own_set_up_failures_are_waited_for() -> None:
    """The unit's journal lines as systemd 252 (Debian 12) writes them when a start fails: its own exit statuses
    (200-243, systemd's `exit-status.h`) mean it never ran HAProxy, and it starts the unit again itself
    (Restart=always); HAProxy's own failure (1) or a signal is reported at once."""
    waited = ["engine-ctl-gateway.service: Main process exited, code=exited, status=219/CGROUP",
              "engine-ctl-gateway.service: Control process exited, code=exited, status=200/CHDIR",
              "engine-ctl-gateway.service: Main process exited, code=exited, status=243/CREDENTIALS"]  # fmt: skip
    reported = ["engine-ctl-gateway.service: Main process exited, code=exited, status=1/FAILURE",
                "engine-ctl-gateway.service: Main process exited, code=killed, status=9/KILL",
                "engine-ctl-gateway.service: Main process exited, code=exited, status=244/UNKNOWN",
                "engine-ctl-gateway.service: Main process exited, code=exited, status=20/n/a"]  # fmt: skip
    assert all(SETUP_FAILURE.search(line) for line in waited)
    assert not any(SETUP_FAILURE.search(line) for line in reported)
