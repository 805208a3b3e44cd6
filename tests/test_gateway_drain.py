"""A roll's drain sees every request in flight (issue 24 point 13), on the real HAProxy 2.6 of this machine run
as the gateway's unit runs it (master-worker, -S master socket): a request that began before a reload is served
by the old worker, invisible on the admin socket (the newest worker's); the drain waits for it too."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

from engine_ctl.core.documents.apikey import key_sha256
from engine_ctl.core.documents.inventory import Host
from engine_ctl.core.model import ApiKey
from engine_ctl.core.render.gateway import GatewayBackend, GatewayServer, render_gateway
from engine_ctl.shell.gateway.runtime import (
    GatewayFailure,
    in_flight_in_old_workers,
    old_workers,
    runtime,
    server_states,
    wait_drained,
)
from engine_ctl.shell.transport import LocalTransport
from tests.ports import free_port
from tests.test_gateway_loopback import HAPROXY, KEY_ALL

SLOW_S = 8.0


def slow_replica(port: int) -> socket.socket:
    """/health at once; any other request answered SLOW_S seconds later (a long stream, say)."""
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", port))
    server.listen(50)

    def one(conn: socket.socket) -> None:
        with conn:
            while True:
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                if not data.startswith(b"GET /health"):
                    time.sleep(SLOW_S)
                body = b'{"ok":true}'
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                             b"Content-Length: %d\r\n\r\n" % len(body) + body)  # fmt: skip
                return

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=one, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return server


def reloaded(t: LocalTransport, master: str) -> bool:
    """The master (re-executed by the reload) answers, and lists an old worker."""
    try:
        return bool(old_workers(runtime(t, ["show proc; quit"], master)[0]))
    except GatewayFailure:
        return False


def test_the_drain_waits_for_a_request_in_a_worker_a_reload_left(tmp_path: Path) -> None:
    port = free_port()
    replica = slow_replica(port)
    backend = GatewayBackend(deployment="chat", servers=(GatewayServer(name="r0a", address="127.0.0.1", port=port,
                                                                       maxconn=2),))  # fmt: skip
    host = Host(name="edge", address="127.0.0.1", gateway_port=free_port(), transport="local")
    rendered = render_gateway(host, [backend], [ApiKey(name="all", sha256=key_sha256(KEY_ALL))], internal_key=False,
                              run_dir=str(tmp_path))  # fmt: skip
    for name, text in rendered.files.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "server-state").write_text("")
    admin, master = str(tmp_path / "admin.sock"), str(tmp_path / "master.sock")
    proc = subprocess.Popen([HAPROXY, "-Ws", "-f", str(tmp_path / "haproxy.cfg"), "-S", master],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    t = LocalTransport(host)
    answers: list[int] = []
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                if server_states(t, admin)[("d_chat", "r0a")].status == "UP":
                    break
            except Exception:  # not listening yet
                pass
            time.sleep(0.2)

        def ask() -> None:
            conn = http.client.HTTPConnection("127.0.0.1", host.gateway_port, timeout=60)
            body = json.dumps({"model": "chat", "messages": [{"role": "user", "content": "hi"}]})
            headers = {"Authorization": f"Bearer {KEY_ALL}", "Content-Type": "application/json"}
            conn.request("POST", "/v1/chat/completions", body=body, headers=headers)
            answers.append(conn.getresponse().status)

        asking = threading.Thread(target=ask)
        started = time.monotonic()
        asking.start()
        time.sleep(1.0)
        assert server_states(t, admin)[("d_chat", "r0a")].in_flight == 1
        os.kill(proc.pid, signal.SIGUSR2)  # the gateway's reload (its unit's ExecReload)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not reloaded(t, master):
            time.sleep(0.2)
        time.sleep(1.0)  # the new worker answers on the admin socket
        assert server_states(t, admin)[("d_chat", "r0a")].in_flight == 0, "the newest worker does not see it"
        assert in_flight_in_old_workers(t, "d_chat", "r0a", master) == 1, "the old worker serves it"
        assert wait_drained(t, "d_chat", "r0a", 30, admin, master)
        drained_after = time.monotonic() - started
        assert drained_after >= SLOW_S - 0.5, f"drained after {drained_after:.1f} s, with the request in flight"
        asking.join(timeout=30)
        assert answers == [200]
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        replica.close()
