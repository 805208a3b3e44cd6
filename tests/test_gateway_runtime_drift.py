"""What an admin command on the running gateway's socket changes beyond its maps, weights and states, read by the
facts probe from the real HAProxy 2.6 of this machine and judged by the plan (core.plan.gatewayruntime): a server
added (`add server`, which would get requests and the internal key), an ACL's entries (`add acl #N`: the internal
endpoint opened to any source), the connection limits (`set maxconn`), a server's check moved (`set server ...
check-port`), and a key map holding a key twice (a lookup finds the first entry). Each is drift; a gateway as
rendered has none (every ACL of a full configuration, internal endpoint, metrics and decisions included, is read
and matched)."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine_ctl.core.documents.apikey import key_sha256
from engine_ctl.core.documents.inventory import Host
from engine_ctl.core.fit.hostfacts import Cpu, HostFacts, Memory
from engine_ctl.core.model import ApiKey
from engine_ctl.core.plan.gateway import map_differences
from engine_ctl.core.plan.gatewayruntime import added_frontends, declared_acls, haproxy_words, tampered_drift
from engine_ctl.core.render.gateway import GatewayBackend, GatewayServer, render_gateway
from engine_ctl.shell.remote import facts_probe
from engine_ctl.shell.remote.haproxy_admin import haproxy_ask
from tests.ports import free_port

HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """The real HAProxy with a full rendered configuration: two deployments (one a decision model), two servers
    each, an internal endpoint with allowed hosts, a metrics port with monitoring hosts, keys with a scope, an
    expiry and a limit."""
    backends = [
        GatewayBackend(deployment="chat", servers=(
            GatewayServer(name="r0a", address="127.0.0.1", port=free_port(), maxconn=4),
            GatewayServer(name="r1a", address="127.0.0.2", port=free_port(), maxconn=4),
        )),
        GatewayBackend(deployment="route", api="decisions", servers=(
            GatewayServer(name="r0a", address="127.0.0.1", port=free_port(), maxconn=2),
        )),
    ]  # fmt: skip
    keys = [
        ApiKey(name="all", sha256=key_sha256("ak-all-" + "1" * 40)),
        ApiKey(name="one", sha256=key_sha256("ak-one-" + "2" * 40), deployments=("chat",), expires=2000000000),
    ]
    host = Host(name="edge", address="127.0.0.1", gateway_port=free_port(), transport="local")
    rendered = render_gateway(host, backends, keys, internal_key=False, run_dir=str(tmp_path),
                              internal_allow=["198.18.0.11", "198.18.0.12"], internal_port=free_port(),
                              metrics_port=free_port(), metrics_allow=["198.18.0.20"],
                              requests_per_minute=600)  # fmt: skip
    for name, text in rendered.files.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "server-state").write_text("")
    (tmp_path / "start.state").write_text("")
    proc = subprocess.Popen([HAPROXY, "-f", str(tmp_path / "haproxy.cfg")], stderr=subprocess.DEVNULL)
    sock = str(tmp_path / "admin.sock")
    deadline = time.monotonic() + 10
    while not Path(sock).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    yield tmp_path, rendered.files["haproxy.cfg"]
    proc.terminate()
    proc.wait(timeout=10)


def facts(sock: str) -> HostFacts:
    stat = facts_probe.gateway_ask("show stat", sock) or ""
    info = facts_probe.gateway_ask("show info", sock)
    return HostFacts(host="edge", cpu=Cpu(cores=2), memory=Memory(total_bytes=8 << 30, available_bytes=4 << 30),
                     gateway_servers=facts_probe.parse_show_stat(stat), gateway_frontends=facts_probe.frontends(stat),
                     gateway_runtime=facts_probe.gateway_runtime(stat, info, sock))  # fmt: skip


def drift(folder: Path, config: str) -> list[str]:
    return [d["detail"] for d in tampered_drift("edge", config, facts(str(folder / "admin.sock")))]


def ask(folder: Path, command: str) -> str:
    return haproxy_ask(str(folder / "admin.sock"), command, 3)


def test_a_gateway_as_rendered_has_no_runtime_drift_and_every_acl_is_matched(gateway: tuple[Path, str]) -> None:
    folder, config = gateway
    running = facts(str(folder / "admin.sock")).gateway_runtime
    assert drift(folder, config) == []
    # every ACL the configuration declares is read, and the plan's reading of the file agrees with HAProxy's
    # numbering line by line (a line it read otherwise would be skipped, and its tampering missed)
    by_line: dict[int, list[str]] = {}
    for line, fetch, _ in running["acls"]:
        by_line.setdefault(line, []).append(fetch)
    declared = declared_acls(config)
    assert {n: [f for f, _ in acls] for n, acls in declared.items()} == by_line
    assert len(running["acls"]) > 40


def test_a_frontend_the_configuration_does_not_declare_is_drift(gateway: tuple[Path, str]) -> None:
    """Every frontend of the rendered configuration, as the real HAProxy lists them, is declared (no drift above);
    one loaded from another file beside it (a wrapper's `-f`, a probe of session 17) is named."""
    folder, config = gateway
    running = facts(str(folder / "admin.sock")).gateway_frontends
    assert {"api", "h_chat", "h_route"} <= set(running) and added_frontends(config, running) == []
    assert added_frontends(config, [*running, "sneaky"]) == [
        "has frontend sneaky, which its configuration does not (another configuration loaded beside it): it answers "
        "on a port of its own, past every key check"
    ]


def test_an_acl_entry_added_at_run_time_is_drift(gateway: tuple[Path, str]) -> None:
    """The internal endpoint's allowed sources: `add acl #N 0.0.0.0/0` opens it (no key) to any address."""
    folder, config = gateway
    line = next(i for i, text in enumerate(config.splitlines(), 1) if "ectl_internal !{ src" in text)
    internal = next(row.split()[0] for row in ask(folder, "show acl").splitlines() if f"line {line}." in row)
    ask(folder, f"add acl #{internal} 0.0.0.0/0")
    found = drift(folder, config)
    assert len(found) == 1 and "'0.0.0.0/0'" in found[0] and "matches src on line" in found[0], found
    assert "apply reloads it" in found[0]


def test_an_acl_cleared_at_run_time_is_drift(gateway: tuple[Path, str]) -> None:
    folder, config = gateway
    odd = next(row.split()[0] for row in ask(folder, "show acl").splitlines() if "'path_sub'" in row)
    ask(folder, f"clear acl #{odd}")
    found = drift(folder, config)
    assert len(found) == 1 and "path_sub" in found[0] and "matches path_sub on line" in found[0], found


def test_a_server_added_at_run_time_is_drift(gateway: tuple[Path, str]) -> None:
    folder, config = gateway
    assert "New server registered" in ask(folder, "add server d_chat/evil 127.0.0.9:9999")
    found = drift(folder, config)
    assert found == [
        "the running gateway on edge has server d_chat/evil, which its configuration does not (an admin command: "
        "`add server`): it takes requests, and the replicas' internal key with them: apply reloads it"
    ]


def test_connection_limits_and_check_ports_changed_at_run_time_are_drift(gateway: tuple[Path, str]) -> None:
    folder, config = gateway
    ask(folder, "set maxconn frontend api 1")
    ask(folder, "set maxconn server d_chat/r0a 1")
    ask(folder, "set maxconn global 5")
    ask(folder, "set server d_chat/r1a check-port 9")
    found = drift(folder, config)
    assert any("takes at most 5 connections in all" in d for d in found), found
    assert any("limits frontend api to 1 connections, not its configuration's 1000" in d for d in found), found
    assert any("limits server d_chat/r0a to 1 connections, not its configuration's 4" in d for d in found), found
    assert any("checks server d_chat/r1a's health at 9" in d for d in found), found
    assert len(found) == 4


def test_a_key_held_twice_is_read_as_a_lookup_finds_it(gateway: tuple[Path, str]) -> None:
    """`del map`, then `add map` of another key name first and the right one after: `show map` lists both, and a
    lookup finds the first. The probe takes the first, so the plan sees the key as what it now is."""
    folder, _ = gateway
    digest = key_sha256("ak-one-" + "2" * 40)
    ask(folder, f"del map keys.map {digest}")
    ask(folder, f"add map keys.map {digest} all")
    ask(folder, f"add map keys.map {digest} one")
    maps = facts_probe.gateway_maps(str(folder / "admin.sock"))
    assert maps is not None and maps["keys.map"][digest] == "all"
    wanted = {digest: "one", key_sha256("ak-all-" + "1" * 40): "all"}
    assert map_differences("keys.map", maps["keys.map"], wanted, "edge") == [
        "the running gateway on edge (keys.map, in memory) accepts a key that no ApiKey document gives, named 'all'"
    ]


def test_haproxy_words_reads_quotes_escapes_and_comments() -> None:
    assert haproxy_words(r"acl a req.fhdr(authorization) -m reg ^Bearer\ [!-~]+$") == [
        "acl", "a", "req.fhdr(authorization)", "-m", "reg", "^Bearer [!-~]+$"]  # fmt: skip
    assert haproxy_words('x \'"a\\s"\' "b\\"c" d # e') == ["x", '"a\\s"', 'b"c', "d"]
    assert haproxy_words("acl o path_sub -i // %2e \\\\") == ["acl", "o", "path_sub", "-i", "//", "%2e", "\\"]
