"""A reload keeps each server's state (server-state-file) only where the server stays at its address and port.

HAProxy 2.6 takes a server's port from the state file over its configuration's (the GitLab write-up of the same
pathology: gitlab-com/gl-infra/reliability#12421). A slot named again at another port (a roll's new `b` slot, a
deployment placed again) then went on sending its requests to the old port, where another deployment's engine
answered them; once that one stopped, the gateway marked the server DOWN and clients got 503 (issue 24, soak seed 7
step 150). Real HAProxy, stand-in replicas that say who they are."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from pathlib import Path

from engine_ctl.core.documents.apikey import key_sha256
from engine_ctl.core.documents.inventory import Host
from engine_ctl.core.model import ApiKey
from engine_ctl.core.render.gateway import (
    START_STATE_FILE,
    GatewayBackend,
    GatewayServer,
    misrouted,
    render_gateway,
    start_state,
    state_across_reload,
)
from engine_ctl.shell.gateway.runtime import runtime, server_states
from engine_ctl.shell.transport import LocalTransport
from tests.ports import free_port
from tests.test_gateway_loopback import HAPROXY, KEY_ALL, Replica, chat


def _servers(text: str) -> dict[str, list[str]]:
    return {f[3]: f for f in (ln.split() for ln in text.splitlines()) if len(f) > 18 and not f[0].startswith("#")}


def test_a_server_moved_to_another_port_starts_down_there_and_the_others_keep_their_state() -> None:
    def server(name: str, address: str, port: int) -> GatewayServer:
        return GatewayServer(name=name, address=address, port=port, maxconn=4)

    old = [GatewayBackend(deployment="sb", servers=(server("r0a", "10.0.0.1", 8000), server("r0b", "10.0.0.2", 8000),
                                                     server("r1a", "10.0.0.3", 8000)))]  # fmt: skip
    new = [GatewayBackend(deployment="sb", servers=(server("r0a", "10.0.0.1", 8000), server("r0b", "10.0.0.2", 8001),
                                                     server("r2a", "10.0.0.4", 8000)))]  # fmt: skip
    dumped = start_state(old).replace(" 0 0 1 1 0 8 2 0 6 ", " 2 0 1 1 40 15 3 4 6 ")  # every server UP, as dumped
    kept = _servers(state_across_reload(dumped, start_state(new)))
    assert sorted(kept) == ["r0a", "r0b", "r2a"]  # r1a is gone from the configuration
    assert kept["r0a"][5] == "2" and kept["r0a"][18] == "8000"  # same address and port: its UP state carried over
    assert kept["r0b"][5] == "0" and kept["r0b"][18] == "8001"  # moved: DOWN at the new port until its check passes
    assert kept["r2a"][5] == "0" and kept["r2a"][4] == "10.0.0.4"
    assert state_across_reload(dumped, start_state(new)).startswith("1\n# be_id ")
    # a check moved at runtime (`set server … check-port 9`, check-addr) is not carried across the reload that
    # apply does to undo it (a probe, session 16: the reload loaded it back, and the replica stayed DOWN)
    moved = _servers(dumped)["r0a"]
    moved[21], moved[22] = "9", "10.9.9.9"
    tampered = "\n".join(" ".join(moved) if ln.split()[3:4] == ["r0a"] else ln for ln in dumped.splitlines())
    kept = _servers(state_across_reload(tampered, start_state(new)))
    assert kept["r0a"][5] == "2" and (kept["r0a"][21], kept["r0a"][22]) == ("0", "-")


def test_a_host_name_is_compared_by_its_port_only_and_a_unix_socket_not_at_all() -> None:
    """HAProxy shows the address it resolved a host name to: never drift by itself (else plan never says No
    changes for an inventory of names); a port or an IP address that differs is."""
    config = ("backend d_x\n    server r0a gpu1.internal:8000 maxconn 2\n    server r1a 10.0.0.5:8001 maxconn 2\n"
              "    server held unix@/run/engine-ctl-gateway/held-x.sock backup no-check\n")  # fmt: skip
    assert misrouted(config, {"d_x/r0a": "10.1.1.1:8000", "d_x/r1a": "10.0.0.5:8001", "d_x/held": "unix@x"}) == {}
    assert misrouted(config, {"d_x/r0a": "10.1.1.1:8002", "d_x/r1a": "10.0.0.6:8001"}) == {
        "d_x/r0a": ("10.1.1.1:8002", "gpu1.internal:8000"),
        "d_x/r1a": ("10.0.0.6:8001", "10.0.0.5:8001"),
    }
    assert misrouted(config, {}) == {}  # a gateway that does not answer: nothing to compare


def _start(tmp: Path, rendered_files: dict[str, str], state: str) -> subprocess.Popen[bytes]:
    for name, text in rendered_files.items():
        (tmp / name).write_text(text)
    (tmp / "server-state").write_text(state)
    (tmp / "admin.sock").unlink(missing_ok=True)
    return subprocess.Popen([HAPROXY, "-f", str(tmp / "haproxy.cfg")], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip


def _wait_up(t: LocalTransport, tmp: Path, server: str) -> None:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        states = server_states(t, str(tmp / "admin.sock")) if (tmp / "admin.sock").exists() else {}
        if (s := states.get(("d_sb", server))) is not None and s.status == "UP":
            return
        time.sleep(0.2)
    raise AssertionError(f"{server} never came UP")


def _answered_by(port: int) -> set[str]:
    said = set()
    for _ in range(4):
        body = json.dumps(chat("sb")).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
                                     headers={"Authorization": f"Bearer {KEY_ALL}"})  # fmt: skip
        with urllib.request.urlopen(req, timeout=30) as r:
            said.add(json.loads(r.read())["replica"])
    return said


def test_after_a_reload_the_moved_slot_gets_the_requests_not_the_engine_at_its_old_port(tmp_path: Path) -> None:
    sa_port, sb_port = free_port(), free_port()
    sa, sb = Replica("sa's engine", sa_port), Replica("sb's engine", sb_port)
    host = Host(name="edge", address="127.0.0.1", gateway_port=free_port(), transport="local")
    keys = [ApiKey(name="all", sha256=key_sha256(KEY_ALL))]

    def rendered(port: int) -> dict[str, str]:
        r0b = GatewayServer(name="r0b", address="127.0.0.1", port=port, maxconn=4)
        backend = GatewayBackend(deployment="sb", servers=(r0b,))
        return dict(render_gateway(host, [backend], keys, internal_key=False, hold_s=3, run_dir=str(tmp_path)).files)

    t = LocalTransport(host)
    admin = str(tmp_path / "admin.sock")
    before = rendered(sa_port)  # r0b once pointed where sa's engine listens now
    proc = _start(tmp_path, before, before[START_STATE_FILE])
    try:
        _wait_up(t, tmp_path, "r0b")
        dumped = runtime(t, ["show servers state"], admin)[0]
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    after = rendered(sb_port)
    try:
        # HAProxy itself, given the plain dump: the configuration says sb's port, the requests go to sa's engine
        proc = _start(tmp_path, after, dumped)
        _wait_up(t, tmp_path, "r0b")
        assert _answered_by(host.gateway_port) == {"sa's engine"}
        live = {f"{b}/{n}": st.address for (b, n), st in server_states(t, admin).items()}
        wrong = misrouted(after["haproxy.cfg"], live)  # what plan reports as drift, and apply reloads for
        assert wrong["d_sb/r0b"] == (f"127.0.0.1:{sa_port}", f"127.0.0.1:{sb_port}"), wrong
        proc.terminate()
        proc.wait(timeout=10)
        # what a reload loads: the moved server at its new port
        proc = _start(tmp_path, after, state_across_reload(dumped, after[START_STATE_FILE]))
        _wait_up(t, tmp_path, "r0b")
        assert _answered_by(host.gateway_port) == {"sb's engine"}
        assert _servers(runtime(t, ["show servers state"], admin)[0])["r0b"][18] == str(sb_port)
        live = {f"{b}/{n}": st.address for (b, n), st in server_states(t, admin).items()}
        assert live["d_sb/r0b"] == f"127.0.0.1:{sb_port}" and misrouted(after["haproxy.cfg"], live) == {}
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        sa.shutdown(), sb.shutdown()
        sa.server_close(), sb.server_close()
