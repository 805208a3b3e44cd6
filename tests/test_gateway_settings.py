"""The inventory's `gateway:` block: the hold time and the cap on held requests (the seed's 2 minutes and 100 by
default), rendered into the gateway's configuration and Lua, carried by the plan to apply, checked against a saved
plan, and refused with their place when out of range."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine_ctl.core.diagnostics import InputError
from engine_ctl.core.documents.inventory import DEFAULT_HOLD_CAP, DEFAULT_HOLD_S, Inventory, load_inventory
from engine_ctl.core.plan.gateway import gateway_after_apply, gateway_tampering
from engine_ctl.core.plan.planner import make_plan
from engine_ctl.core.record.model import State
from tests.helpers import run, write
from tests.test_gateway_core import SHAPE, applied, desired, world

ROOT = Path(__file__).resolve().parents[1]
HOSTS = "hosts:\n  - {name: edge, address: 10.0.0.2, roles: [gateway]}\n"


def test_the_defaults_are_the_seeds() -> None:
    assert (DEFAULT_HOLD_S, DEFAULT_HOLD_CAP) == (120, 100)
    assert Inventory().gateway.hold_s == 120 and Inventory().gateway.hold_cap == 100


def test_the_settings_are_read_from_the_inventory(tmp_path: Path) -> None:
    inv = load_inventory(write(tmp_path, "hosts.yaml", "gateway: {hold_s: 30, hold_cap: 5}\n" + HOSTS))
    assert (inv.gateway.hold_s, inv.gateway.hold_cap) == (30, 5)
    plain = load_inventory(write(tmp_path, "plain.yaml", HOSTS))
    assert (plain.gateway.hold_s, plain.gateway.hold_cap) == (120, 100)


def test_a_plan_renders_them_and_apply_keeps_them() -> None:
    inv, facts = world()
    inv = inv.model_copy(update={"gateway": inv.gateway.model_copy(update={"hold_s": 30, "hold_cap": 5})})
    plan = make_plan(desired(), State(), inv, facts, SHAPE)
    (g,) = plan.gateways
    assert (g.hold_s, g.hold_cap) == (30, 5)
    assert "HOLD_MS = 30000" in g.files["hold.lua"] and "local CAP = 5\n" in g.files["hold.lua"]
    assert "(up to 30 s, at most 5 per deployment)" in g.files["haproxy.cfg"]
    state, _ = applied(plan, facts)
    after = gateway_after_apply(inv.hosts[0], state, {h.name: h for h in inv.hosts}, g)
    assert after.files["hold.lua"] == g.files["hold.lua"] and after.files["haproxy.cfg"] == g.files["haproxy.cfg"]
    default, _ = world()
    forged = plan.model_copy(deep=True)
    assert gateway_tampering(forged.gateways, forged.changes, State(lineage=plan.state_lineage), inv) == []
    forged.gateways[0].hold_s = 3600
    assert "gateway edge: its hold or thread settings are not the inventory's" in gateway_tampering(
        forged.gateways, forged.changes, State(lineage=forged.state_lineage), inv
    )
    assert make_plan(desired(), State(), default, facts, SHAPE).gateways[0].hold_s == 120


def test_the_gateway_runs_one_haproxy_thread_unless_the_inventory_says_more(tmp_path: Path) -> None:
    inv, facts = world()
    assert Inventory().gateway.threads == 1
    assert "\n    nbthread 1\n" in make_plan(desired(), State(), inv, facts, SHAPE).gateways[0].files["haproxy.cfg"]
    four = load_inventory(write(tmp_path, "hosts.yaml", "gateway: {threads: 4}\n" + HOSTS))
    assert four.gateway.threads == 4
    inv = inv.model_copy(update={"gateway": inv.gateway.model_copy(update={"threads": 4})})
    plan = make_plan(desired(), State(), inv, facts, SHAPE)
    (g,) = plan.gateways
    assert g.threads == 4 and "\n    nbthread 4\n" in g.files["haproxy.cfg"]
    state, _ = applied(plan, facts)
    after = gateway_after_apply(inv.hosts[0], state, {h.name: h for h in inv.hosts}, g)
    assert after.files["haproxy.cfg"] == g.files["haproxy.cfg"]
    forged = plan.model_copy(deep=True)
    forged.gateways[0].threads = 64
    assert "gateway edge: its hold or thread settings are not the inventory's" in gateway_tampering(
        forged.gateways, forged.changes, State(lineage=forged.state_lineage), inv
    )


@pytest.mark.parametrize(
    ("block", "where", "message"),
    [
        ("gateway: {hold_s: 0}\n", "1:19", "gateway.hold_s: between 1 and 3600 seconds, not 0"),
        ("gateway:\n  hold_cap: -1\n", "2:13", "gateway.hold_cap: between 0 and 10000, not -1"),
        ("gateway: {hold_s: 86400, hold_cap: 20000}\n", "1:19", "gateway.hold_s: between 1 and 3600 seconds"),
        ("gateway: {threads: 0}\n", "1:20", "gateway.threads: between 1 and 64, not 0"),
    ],
)
def test_out_of_range_settings_are_refused_with_their_place(
    tmp_path: Path, block: str, where: str, message: str
) -> None:
    path = write(tmp_path, "hosts.yaml", block + HOSTS)
    with pytest.raises(InputError) as err:
        load_inventory(path)
    rendered = [d.render() for d in err.value.diagnostics]
    assert any(r.startswith(f"{path}:{where}: error: {message}") for r in rendered), rendered
    result = run("validate", "--inventory", str(path), str(ROOT / "examples/seed"))
    assert result.exit_code == 1 and f"{path}:{where}: error: {message}" in result.stderr
    assert "Traceback" not in result.output


def test_a_setting_of_the_wrong_type_is_refused_with_its_place(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts.yaml", "gateway: {hold_s: soon}\n" + HOSTS)
    result = run("validate", "--inventory", str(path), str(ROOT / "examples/seed"))
    assert result.exit_code == 1 and f"{path}:1:19: error: gateway.hold_s" in result.stderr, result.stderr
