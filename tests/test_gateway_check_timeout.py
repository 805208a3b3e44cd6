"""The replicas' health check gives up after 3 s (seed 000: "checked every 5 s, 3 s timeout, 3 failures in a row
to be taken out"; issue 25 point 19, B40), on the real HAProxy of this machine with the gateway's rendered
configuration: a replica whose /health accepts the connection and never answers fails its check with HAProxy's
L7 timeout after 3 s, not after the 5 s interval HAProxy uses when `timeout check` is not set."""

from __future__ import annotations

import csv
import io
import socket
import subprocess
import threading
import time
from pathlib import Path

from engine_ctl.core.documents.apikey import key_sha256
from engine_ctl.core.documents.inventory import Host
from engine_ctl.core.model import ApiKey
from engine_ctl.core.render.gateway import GatewayBackend, GatewayServer, render_gateway
from engine_ctl.shell.gateway.runtime import runtime
from engine_ctl.shell.transport import LocalTransport
from tests.ports import free_port
from tests.test_gateway_loopback import HAPROXY, KEY_ALL


def silent_replica(port: int) -> socket.socket:
    """Accepts every connection, reads the request and never answers (an engine stuck in a long step)."""
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", port))
    server.listen(50)
    held: list[socket.socket] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            held.append(conn)

    threading.Thread(target=serve, daemon=True).start()
    return server


def check_of(t: LocalTransport, admin: str) -> dict[str, str]:
    """`show stat`'s row of the replica (HAProxy's CSV: check_status, check_duration in ms, status, …)."""
    text = runtime(t, ["show stat"], admin)[0].lstrip("# ")
    rows = [r for r in csv.DictReader(io.StringIO(text)) if r["pxname"] == "d_chat" and r["svname"] == "r0a"]
    return rows[0] if rows else {}


def test_a_health_check_that_gets_no_answer_times_out_after_3_s(tmp_path: Path) -> None:
    port = free_port()
    replica = silent_replica(port)
    backend = GatewayBackend(deployment="chat", servers=(GatewayServer(name="r0a", address="127.0.0.1", port=port,
                                                                       maxconn=2),))  # fmt: skip
    host = Host(name="edge", address="127.0.0.1", gateway_port=free_port(), transport="local")
    rendered = render_gateway(host, [backend], [ApiKey(name="all", sha256=key_sha256(KEY_ALL))], internal_key=False,
                              run_dir=str(tmp_path))  # fmt: skip
    assert "\n    timeout check 3s\n" in rendered.files["haproxy.cfg"]
    for name, text in rendered.files.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "server-state").write_text("")
    admin = str(tmp_path / "admin.sock")
    proc = subprocess.Popen([HAPROXY, "-Ws", "-f", str(tmp_path / "haproxy.cfg"), "-S", str(tmp_path / "m.sock")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    t = LocalTransport(host)
    try:
        row: dict[str, str] = {}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                row = check_of(t, admin)
            except Exception:  # not listening yet
                row = {}
            if row.get("check_status") == "L7TOUT":
                break
            time.sleep(0.2)
        assert row.get("check_status") == "L7TOUT", row
        assert 2_500 <= int(row["check_duration"]) < 4_500, row  # 3 s, not the 5 s interval
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        replica.close()
