"""The scaler with several gateway hosts, its pure parts and its timeouts: counts summed over the gateways (from
HAProxy 2.6's own `show stat`, recorded: tests/recordings/), the reconciling of every gateway's servers, the wake
heard from the gateway hosts only, the forced command's gateway verbs and what they refuse, the rendering (the
Lua's wake address per gateway, scaler.json's gateways, the unit's IPAddressAllow=), and a gateway that does not
answer (a real ssh against a real TCP listener that never speaks) holding up no other."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import pytest

from engine_ctl.core.documents.inventory import Host
from engine_ctl.core.render.gateway import GatewayBackend, render_gateway, wake_address_for, wake_addresses_for
from engine_ctl.core.render.scaler import ScalerDeployment, ScalerSlot, render_scaler
from engine_ctl.shell.remote import scaler, scaler_command

RECORDINGS = Path(__file__).parent / "recordings"
STAT = (RECORDINGS / "haproxy-2.6-show-stat.csv").read_text()
GW1 = Host(name="gw-a", address="198.18.0.11", roles=("gateway",))
GW2 = Host(name="gw-b", address="198.18.0.12", roles=("gateway",))
NODE = Host(name="node", address="198.18.0.13")


def slot(index: int, always_on: bool = False) -> dict[str, object]:
    return {"index": index, "server": f"r{index}a", "always_on": always_on}


# --- counts from every gateway ----------------------------------------------------------------------------------
def test_counts_are_summed_over_the_gateways_and_a_server_is_in_service_where_any_has_it() -> None:
    one = scaler.parse_stat(STAT)
    other = scaler.parse_stat(STAT.replace(",UP,", ",MAINT,", 1).replace(",MAINT,", ",UP,", 1))
    merged = scaler.merge_stats({"gw-a": one, "gw-b": other})["d_chat"]
    assert merged["requests"] == 4 and merged["requests_by"] == {"gw-a": 2, "gw-b": 2} and merged["queued"] == 0
    assert other["d_chat"]["servers"]["r0a"]["status"] == "UP"
    assert merged["servers"]["r0a"]["status"] == "UP"  # UP on both
    assert merged["servers"]["r1a"]["status"] == "MAINT"  # MAINT on gw-a; the replace above moved only one


def test_a_status_in_service_on_any_gateway_wins() -> None:
    a = {"d_x": {"queued": 1, "sessions": 2, "requests": 5, "servers": {"r1a": {"status": "MAINT", "sessions": 0}}}}
    b = {"d_x": {"queued": 2, "sessions": 1, "requests": 7, "servers": {"r1a": {"status": "DRAIN", "sessions": 1}}}}
    c = {"d_x": {"queued": 0, "sessions": 0, "requests": 1, "servers": {"r1a": {"status": "UP", "sessions": 3}}}}
    merged = scaler.merge_stats({"a": a, "b": b})["d_x"]
    assert (merged["queued"], merged["sessions"], merged["servers"]["r1a"]) == (
        3,
        3,
        {"status": "DRAIN", "sessions": 1},
    )
    assert scaler.merge_stats({"a": a, "b": b, "c": c})["d_x"]["servers"]["r1a"] == {"status": "UP", "sessions": 4}


def test_idleness_counts_a_request_on_any_gateway_and_not_a_gateway_first_seen_or_restarted() -> None:
    assert scaler.requests_rose({"a": 5, "b": 2}, {"a": 5, "b": 3})
    assert not scaler.requests_rose({"a": 5}, {"a": 5, "b": 40})  # b read for the first time: its mark only
    assert not scaler.requests_rose({"a": 5, "b": 9}, {"a": 5, "b": 1})  # b's HAProxy restarted: counts went back
    assert not scaler.requests_rose({"a": 5, "b": 9}, {"a": 5})  # b did not answer


# --- reconciling ------------------------------------------------------------------------------------------------
def test_reconcile_puts_running_slots_in_service_and_the_others_in_maintenance_on_every_gateway() -> None:
    slots = [slot(0, always_on=True), slot(1), slot(2), slot(3)]
    servers = {
        "gw-a": {"r0a": {"status": "DOWN"}, "r1a": {"status": "UP"}, "r2a": {"status": "MAINT"}},
        "gw-b": {"r0a": {"status": "UP"}, "r1a": {"status": "MAINT"}, "r2a": {"status": "UP"},
                 "r3a": {"status": "DOWN"}},
    }  # fmt: skip
    got = scaler.reconcile(slots, wanted={1}, unknown={3}, servers_by_gateway=servers)
    # always-on r0a and unknown r3a are left alone; gw-a is right already but for nothing; gw-b restarted
    assert got == [("gw-b", "r1a", "ready"), ("gw-b", "r2a", "maint")]
    assert scaler.reconcile(slots, {1}, set(), {"gw-a": {"r1a": {"status": "DRAIN"}}}) == [("gw-a", "r1a", "ready")]
    assert scaler.reconcile(slots, set(), set(), {"gw-a": {"r1a": {"status": "MAINT (via x/y)"}}}) == []


# --- the wake ---------------------------------------------------------------------------------------------------
def test_a_wake_is_heard_from_loopback_and_the_gateway_hosts_only() -> None:
    allowed = ["127.0.0.1", "198.18.0.12"]
    assert scaler.wake_allowed("127.0.0.1", allowed) and scaler.wake_allowed("198.18.0.12", allowed)
    assert not scaler.wake_allowed("198.18.0.13", allowed) and not scaler.wake_allowed("10.0.0.1", allowed)


def test_each_gateways_lua_pokes_its_own_scaler_then_the_first_gateway_hosts() -> None:
    hosts = [GW2, NODE, GW1]
    assert wake_address_for(GW1, hosts) == "127.0.0.1"  # the scaler's own host: the first gateway by name
    assert wake_address_for(GW2, hosts) == GW1.address
    assert wake_addresses_for(GW2, hosts) == ["127.0.0.1", GW1.address]  # none on its loopback: the first's
    assert wake_addresses_for(GW1, hosts) == ["127.0.0.1", GW2.address]  # (with the PostgreSQL lock, each has one)
    backend = GatewayBackend(deployment="chat")
    lua = render_gateway(GW2, [backend], [], wake_addresses=wake_addresses_for(GW2, hosts)).files["hold.lua"]
    assert 'local WAKE_ADDRESSES = { "127.0.0.1", "198.18.0.11" }' in lua and "s:connect(address, WAKE_PORT)" in lua
    assert "if heard then\n            return" in lua  # the first that listens hears it, and only it
    own = render_gateway(GW1, [backend], [], wake_address=wake_address_for(GW1, hosts)).files["hold.lua"]
    assert 'local WAKE_ADDRESSES = { "127.0.0.1" }' in own


def test_the_scaler_drives_every_gateway_and_hears_them_only() -> None:
    s = ScalerSlot(index=1, host="node", ssh_host="root@198.18.0.13", address="198.18.0.13", port=8101,
                   unit="engine-ctl-chat-1a.service", server="r1a")  # fmt: skip
    dep = ScalerDeployment(name="chat", id="c", min=0, max=1, parallel=1, slots=(s,))
    rendered = render_scaler(GW1, [dep], "ab" * 32, [GW2, GW1])
    config = json.loads(rendered.config)
    assert config["gateways"] == [
        {"name": "gw-a", "local": True, "ssh_host": "", "ssh_port": 22, "address": ""},
        {"name": "gw-b", "local": False, "ssh_host": "root@198.18.0.12", "ssh_port": 22, "address": "198.18.0.12"},
    ]
    assert config["wake_bind"] == ["127.0.0.1", "198.18.0.11"] and config["wake_from"] == ["127.0.0.1", "198.18.0.12"]
    lines = rendered.unit_text.splitlines()
    assert "IPAddressDeny=any" in lines
    assert "IPAddressAllow=localhost 127.0.0.1 198.18.0.11 198.18.0.12 198.18.0.13" in lines
    alone = render_scaler(GW1, [dep], "ab" * 32, [GW1])
    assert json.loads(alone.config)["wake_bind"] == ["127.0.0.1"]  # one gateway: loopback only
    named = render_scaler(GW1, [dep], "ab" * 32, [GW1, Host(name="gw-c", address="gw-c.lan", roles=("gateway",))])
    assert "IPAddressDeny=any" not in named.unit_text  # systemd takes IPs only: the listener's check guards


# --- the forced command's gateway verbs -------------------------------------------------------------------------
def test_the_gateway_verbs_are_one_server_of_one_engine_ctl_backend() -> None:
    assert scaler_command.gateway_commands(["gateway-set", "d_chat-2", "r12b", "drain"]) == [
        "set server d_chat-2/r12b state drain"
    ]
    assert scaler_command.gateway_commands(["gateway-set", "d_chat", "r0a", "ready"]) == [
        "set server d_chat/r0a state ready",
        "set server d_chat/r0a health up",
    ]
    assert scaler_command.gateway_commands(["gateway-stat"]) == ["show stat"]


@pytest.mark.parametrize(
    "command",
    [
        "gateway-set api r0a maint",  # not an engine-ctl backend
        "gateway-set d_Chat r0a maint",
        "gateway-set d_chat/r0a r0a maint",
        "gateway-set d_chat r0a;id maint",
        "gateway-set d_chat r0c maint",
        "gateway-set d_chat r01a maint",
        "gateway-set d_chat r0a up",
        "gateway-set d_chat r0a maint extra",
        "gateway-set d_-chat r0a maint",
        "gateway-set d_" + "a" * 41 + " r0a maint",
        "gateway-stat all",
        "show stat",
        "set server d_chat/r0a state maint",
    ],
)
def test_the_forced_command_refuses_other_gateway_names_and_commands(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert scaler_command.main(command) == scaler_command.REFUSED
    assert "refused" in capsys.readouterr().err


def test_gateway_stat_lets_only_engine_ctl_backends_leave_the_host() -> None:
    rows = scaler_command.engine_ctl_rows(STAT).splitlines()
    assert rows[0].startswith("# pxname,") and len(rows) == 4
    assert all(r.startswith("d_chat,") for r in rows[1:])  # not the frontend, not the stats
    assert scaler.parse_stat("\n".join(rows))["d_chat"]["requests"] == 2


# --- a gateway that does not answer -----------------------------------------------------------------------------
def silent_listener() -> tuple[socket.socket, int]:
    """A TCP port that accepts and never says a word: ssh waits there for a banner that never comes."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    held: list[socket.socket] = []

    def accept() -> None:
        try:
            while True:
                held.append(server.accept()[0])
        except OSError:  # closed at the test's end
            return

    threading.Thread(target=accept, daemon=True).start()
    return server, server.getsockname()[1]


def test_gateways_that_do_not_answer_hold_up_nothing_and_are_named(tmp_path: Path) -> None:
    server, port = silent_listener()  # closed at the end, after the third look
    gateways = [{"name": f"gw-{c}", "ssh_host": "root@127.0.0.1", "ssh_port": port} for c in "bcd"]
    gateways.append({"name": "gw-a", "local": True})
    config = {"deployments": [{"name": "chat", "slots": []}], "gateways": gateways, "gateway_timeout_s": 1,
              "key": str(tmp_path / "key"), "known_hosts": str(tmp_path / "known_hosts"),
              "gateway_socket": str(tmp_path / "absent.sock"), "internal_env": str(tmp_path / "none")}  # fmt: skip
    said: list[str] = []
    s = scaler.Scaler(config, str(tmp_path / "state.json"), said.append)
    started = time.monotonic()
    assert s.gateway_stats() == {}
    took = time.monotonic() - started
    assert took < 2.5, took  # all at once: one timeout, not three
    decisions = s.mem("chat")["decisions"]
    named = sorted(d["reason"].split(":")[0] for d in decisions)
    assert named == [f"gateway gw-{c} unreachable" for c in "abcd"], decisions
    reasons = {d["reason"].split()[1]: d["reason"] for d in decisions}
    assert "its admin socket: [Errno 2]" in reasons["gw-a"] and reasons["gw-b"].endswith("no answer within 1 s")
    assert s.gateway_stats() == {} and len(s.mem("chat")["decisions"]) == 4  # named once, not every poll
    started = time.monotonic()
    assert s.gateway_stats(all_gateways=False) == {}  # a wake's look: those that did not answer are not waited for
    assert time.monotonic() - started < 0.5
    server.close()
