"""The scaler with TWO gateway hosts on the real fleet: HAProxy under engine-ctl's gateway unit on hosts[0] (the
scaler's host, the first gateway by name) and on hosts[3], the real llama-server on hosts[1], the real scaler
under its hardened unit, its real key and forced command on both the replica host and the second gateway, and the
official `openai` package as the client (max_retries=0).

A `min: 0` deployment is woken by a request through the second gateway (whose Lua pokes the scaler at its host's
address) and answered; a request through either gateway is then served by the replica; a gateway that stops is
named in the decisions and never holds up the other, and once back it is reconciled; scale to zero drains the
server and puts it in maintenance on both gateways; the forced command on the gateway host sets one server of one
engine-ctl backend and refuses anything else. (The project and its short timings: tests/test_fleet_scaler.py.)"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from engine_ctl.core.documents.apikey import key_sha256
from engine_ctl.core.render.scaler import COMMAND_PATH, SCALER_KEY, SCALER_UNIT
from engine_ctl.shell.remote.scaler import parse_stat
from tests.fleet import Fleet, FleetHost
from tests.test_fleet_scaler import HOLD_S, KEY, POLL_S, ScalerProject, admin, ask

pytestmark = pytest.mark.fleet
GATEWAY_UNIT = "engine-ctl-gateway.service"


class TwoGateways(ScalerProject):
    def __init__(self, path: Path, fleet: Fleet) -> None:
        super().__init__(path, fleet)
        self.second = fleet.hosts[3]
        text = self.inventory.read_text()
        line = f"  - {{name: {self.second.name}, address: {self.second.address}}}"
        assert line in text
        self.inventory.write_text(text.replace(line, line[:-1] + ", roles: [gateway]}"))

    def client_via(self, host: FleetHost) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"http://{host.address}:8800/v1", api_key=KEY, max_retries=0, timeout=120)

    def server(self, host: FleetHost) -> str:
        """r0a's status in d_zero on that gateway, as its HAProxy says."""
        stat = parse_stat(self.fleet.ssh(host, admin("show stat")).stdout)
        return str(stat["d_zero"]["servers"]["r0a"]["status"])

    def gateways(self) -> list[FleetHost]:
        return [self.gateway, self.second]

    def scaler_log(self) -> str:
        return self.on_gateway(f"journalctl -u {SCALER_UNIT} --no-pager -o cat").stdout


def zero_on(host: FleetHost) -> str:
    """The scale-to-zero deployment both gateways' projects apply: one on-demand slot, pinned to `host`."""
    return f"""
        metadata: {{name: zero}}
        spec: {{model: tiny, accelerator: cpu, cpu_cores: 1, context_length: 512, host: {host.name},
                replicas: {{min: 0, max: 1, idle_minutes: 1}}}}
        """  # fmt: skip


@pytest.fixture(scope="module")
def gp(fleet: Fleet, weights: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwoGateways]:
    p = TwoGateways(tmp_path_factory.mktemp("scaler-gateways"), fleet)
    p.write(zero_on(fleet.hosts[1]))
    try:
        with p.applied():
            yield p
    finally:
        fleet.ssh(p.second, f"systemctl disable --now {GATEWAY_UNIT}", check=False)


def test_one_scaler_and_every_gateways_lua_pokes_it(gp: TwoGateways) -> None:
    assert f"# scaler on {gp.gateway.name} (the first gateway host by name): zero" in gp.cli("plan", check=True).stdout
    assert gp.fleet.ssh(gp.second, f"systemctl is-active {SCALER_UNIT}", check=False).stdout.strip() != "active"
    lua = "/etc/engine-ctl/gateway/hold.lua"
    wakes = f'local WAKE_ADDRESSES = {{ "127.0.0.1", "{gp.gateway.address}" }}'
    assert wakes in gp.fleet.ssh(gp.second, f"cat {lua}").stdout
    own = f'local WAKE_ADDRESSES = {{ "127.0.0.1", "{gp.second.address}" }}'  # its own scaler listens: the one
    assert own in gp.on_gateway(f"cat {lua}").stdout
    listening = gp.on_gateway("ss -Hltn 'sport = :8809'").stdout
    assert f"{gp.gateway.address}:8809" in listening and "127.0.0.1:8809" in listening
    # the replica host may not wake it (the unit's IPAddressAllow= and the listener's own check)
    gp.fleet.ssh(gp.fleet.hosts[1], f"echo 'wake zero' | timeout 3 bash -c 'cat > /dev/tcp/{gp.gateway.address}/8809'",
                 check=False)  # fmt: skip
    time.sleep(2 * POLL_S)
    assert not any(d["action"] == "up" for d in gp.decisions("zero")) and not gp.active("zero", 0)


def test_a_request_through_the_second_gateway_wakes_it_and_either_gateway_is_served(gp: TwoGateways) -> None:
    gp.wait("zero at zero", lambda: not gp.active("zero", 0), 30)
    assert all(gp.server(g).startswith("MAINT") for g in gp.gateways())
    started = time.monotonic()
    assert ask(gp.client_via(gp.second), "zero") == "zero"
    assert time.monotonic() - started < HOLD_S
    up = [d for d in gp.decisions("zero") if d["action"] == "up"]
    assert len(up) == 1 and up[0]["reason"].startswith("a request at zero")
    assert [gp.server(g) for g in gp.gateways()] == ["UP", "UP"]
    for g in (gp.gateway, gp.second, gp.second, gp.gateway):
        started = time.monotonic()
        assert ask(gp.client_via(g), "zero") == "zero"
        assert time.monotonic() - started < 5  # served by the replica, not held
    assert len([d for d in gp.decisions("zero") if d["action"] == "up"]) == 1


def test_a_gateway_that_stops_is_named_holds_up_nothing_and_is_reconciled_when_back(gp: TwoGateways) -> None:
    assert gp.active("zero", 0)
    gp.fleet.ssh(gp.second, f"systemctl stop {GATEWAY_UNIT}")
    try:
        gp.wait("the second gateway named", lambda: any(
            d["action"] == "gateway" and d["reason"].startswith(f"gateway {gp.second.name} unreachable")
            for d in gp.decisions("zero")), 10 * POLL_S)  # fmt: skip
        started = time.monotonic()
        assert ask(gp.client_via(gp.gateway), "zero") == "zero"
        assert time.monotonic() - started < 5
    finally:
        gp.fleet.ssh(gp.second, f"systemctl start {GATEWAY_UNIT}")
    back = f"gateway {gp.second.name} answers again"
    gp.wait("the second gateway back", lambda: any(d["reason"] == back for d in gp.decisions("zero")), 10 * POLL_S)
    # as a gateway that missed the start would have it (or one that joined later): the next poll puts it in service
    gp.fleet.ssh(gp.second, admin("set server d_zero/r0a state maint"))
    assert gp.server(gp.second).startswith("MAINT")
    gp.wait("r0a in service on the second gateway again", lambda: gp.server(gp.second) == "UP", 10 * POLL_S)
    log = gp.scaler_log()
    assert f"zero: r0a ready on {gp.second.name} (reconciled)" in log, log
    started = time.monotonic()
    assert ask(gp.client_via(gp.second), "zero") == "zero"
    assert time.monotonic() - started < 5


def test_scale_to_zero_drains_and_puts_it_in_maintenance_on_both_gateways(gp: TwoGateways) -> None:
    gp.wait("zero stopped after idle_minutes 1", lambda: not gp.active("zero", 0), 60 + 40)
    last = [d for d in gp.decisions("zero") if d["action"] != "gateway"][-1]
    assert last["action"] == "zero" and "idle_minutes 1" in last["reason"]
    both = f"{gp.gateway.name}, {gp.second.name}"
    log = gp.scaler_log()
    assert f"zero: slot 0 draining on {both}" in log and f"zero: slot 0 in maintenance on {both}" in log
    assert log.index(f"slot 0 draining on {both}") < log.rindex(f"slot 0 in maintenance on {both}")
    assert all(gp.server(g).startswith("MAINT") for g in gp.gateways())
    status = json.loads(gp.cli("status", "zero", "--json").stdout)["deployments"][0]
    assert status["state"] == "ScaledToZero", status


def test_the_forced_command_on_a_gateway_host_sets_one_engine_ctl_server_and_nothing_else(gp: TwoGateways) -> None:
    ssh = (f"ssh -F /dev/null -i {SCALER_KEY} -o IdentitiesOnly=yes -o BatchMode=yes -o StrictHostKeyChecking=yes "
           f"-o UserKnownHostsFile=/etc/engine-ctl/scaler/known_hosts root@{gp.second.address}")  # fmt: skip
    refused = ("id", "gateway-set d_zero r0a ready; touch /tmp/owned", "gateway-set api r0a maint",
               "gateway-set d_zero/r0a r0a maint", "gateway-set d_zero r0a up", "gateway-set d_Zero r0a maint",
               "show stat", "set server d_zero/r0a state ready", f"stop {GATEWAY_UNIT}",
               "gateway-stat; id")  # fmt: skip
    for command in refused:
        said = gp.on_gateway(f"{ssh} {json.dumps(command)}", check=False)
        assert said.returncode == 126, (command, said.stdout, said.stderr)
        assert "refused" in said.stderr
    assert gp.fleet.ssh(gp.second, "test ! -e /tmp/owned", check=False).returncode == 0
    assert gp.fleet.ssh(gp.second, f"systemctl is-active {GATEWAY_UNIT}").stdout.strip() == "active"
    rows = gp.on_gateway(f"{ssh} gateway-stat").stdout.splitlines()
    assert rows[0].startswith("# pxname,") and rows[1:] and all(r.startswith("d_zero,") for r in rows[1:])
    unknown = gp.on_gateway(f"{ssh} 'gateway-set d_nothing r0a maint'", check=False)
    assert unknown.returncode == 1 and "No such backend" in unknown.stderr, unknown.stderr
    assert gp.on_gateway(f"{ssh} 'gateway-set d_zero r0a maint'", check=False).returncode == 0


def test_a_key_revoked_while_a_gateway_host_is_out_of_reach_is_revoked_on_the_other(gp: TwoGateways) -> None:
    """The second gateway host's SSH out of reach (its HAProxy still serves clients), and a key revoked: apply
    revokes it on the gateway it reaches, names the one it left, and exits 1 (a host was not checked); once that
    host is back, the next apply revokes it there too. Before, apply revoked it nowhere (a probe, session 17)."""
    spare = "ak-spare-" + "e7" * 24
    text = (gp.docs / "d.yaml").read_text()
    gp.write(zero_on(gp.fleet.hosts[1]))
    with_spare = (gp.docs / "d.yaml").read_text() + f"---\nkind: ApiKey\nmetadata: {{name: spare}}\nspec:\n  sha256: " \
        f"{key_sha256(spare)}\n"  # fmt: skip
    (gp.docs / "d.yaml").write_text(with_spare)
    gp.cli("apply", "--auto-approve", check=True)

    def status(host: FleetHost) -> int:
        client = openai.OpenAI(base_url=f"http://{host.address}:8800/v1", api_key=spare, max_retries=0, timeout=30)
        try:
            client.models.list()
            return 200
        except openai.APIStatusError as exc:
            return exc.status_code

    assert status(gp.gateway) == 200 and status(gp.second) == 200
    inventory = gp.inventory.read_text()
    cut = f"  - {{name: {gp.second.name}, address: {gp.second.address}, port: 2222, roles: [gateway]}}"
    gp.inventory.write_text(inventory.replace(f"  - {{name: {gp.second.name}, address: {gp.second.address}, "
                                              "roles: [gateway]}", cut))  # fmt: skip
    (gp.docs / "d.yaml").write_text(text)  # the spare key revoked
    try:
        applied = gp.cli("apply", "--auto-approve")
        said = applied.stdout + applied.stderr
        assert applied.returncode == 1, said
        assert f"gateway {gp.second.name}: not reached, left as it is" in said, said
        assert status(gp.gateway) == 401 and status(gp.second) == 200
    finally:
        gp.inventory.write_text(inventory)
    gp.cli("apply", "--auto-approve", check=True)
    assert status(gp.gateway) == 401 and status(gp.second) == 401


def test_destroyed_the_scalers_key_and_forced_command_are_gone_from_every_host_it_reached(gp: TwoGateways) -> None:
    """Last in this module: the destroy leaves no key on the replica's host or on the other gateway host that
    could still start or stop units there, and the operator's own key still works."""
    reached = [gp.fleet.hosts[1], gp.second]
    for host in reached:
        assert "engine-ctl-scaler" in gp.fleet.ssh(host, "cat ~/.ssh/authorized_keys").stdout
    done = gp.cli("destroy", "--auto-approve", check=True)
    for host in reached:
        assert f"its key removed from {host.name}" in done.stdout + done.stderr
        keys = gp.fleet.ssh(host, "cat ~/.ssh/authorized_keys").stdout  # the operator's key still works
        assert "engine-ctl-scaler" not in keys and keys.strip()
        assert gp.fleet.ssh(host, f"test ! -e {COMMAND_PATH}", check=False).returncode == 0
    assert gp.on_gateway(f"systemctl is-enabled {SCALER_UNIT}", check=False).stdout.strip() != "enabled"
