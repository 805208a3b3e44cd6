"""The scaling envelope's slots kept true (issue 24): an on-demand slot that cannot start is a change, not
"No changes"; placement keeps what an on-demand slot reserved; a roll keeps replicas spread. Pure core tests."""

from __future__ import annotations

from engine_ctl.core.fit.hostfacts import UnitFact
from engine_ctl.core.plan.changes import Action, Plan
from engine_ctl.core.plan.drift import replica_drift
from engine_ctl.core.plan.planner import make_plan
from engine_ctl.core.record.model import State
from tests.fleetfacts import cpu_host, h100x8
from tests.test_plan_core import SHAPE, applied
from tests.test_plan_steps import replica
from tests.test_scaling_envelope import change, desired, plan, world


def test_a_failed_on_demand_slot_is_drift_apply_repairs_and_an_inactive_one_is_not() -> None:
    """systemd's start limit after a failed start: the scaler's next start would fail too, so the plan says so."""
    h = h100x8()
    r = replica(1).model_copy(update={"on_demand": True, "status": "standby"})
    failed = UnitFact(name=r.unit, sha256="a" * 64, active_state="failed", sub_state="failed", exec_main_status=1)
    (found,) = replica_drift("chat", r, failed, h)
    assert found.kind == "start-failed" and found.unit == r.unit
    assert "its last start failed" in found.detail and "apply resets it" in found.detail
    for state in ("inactive", "active", "activating"):  # the scaler's doing: never drift
        assert replica_drift("chat", r, UnitFact(name=r.unit, sha256="a" * 64, active_state=state), h) == []


# --- point 5: an always-on replica keeps off what an on-demand slot reserved, or the slot moves -----------------
CPU = "accelerator: cpu, context_length: 2048"


def test_a_new_always_on_replica_keeps_off_the_cores_an_on_demand_slot_reserved() -> None:
    _, facts = world(cpu_host("cpu-01", cores=8), cpu_host("cpu-02", cores=8))
    zero = f"{CPU}, cpu_cores: 8, replicas: {{min: 0, max: 1}}"
    state, facts = applied(plan(State(), facts, zero=zero), State(), facts)
    (slot,) = state.deployments["zero"].replicas
    second = plan(state, facts, zero=zero, busy=f"{CPU}, cpu_cores: 8")
    (busy,) = change(second, "busy").replicas
    assert busy.host != slot.host  # without the reservation: cpu-01, the slot's host (inventory order)
    assert busy.reason == f"new replica; kept off {slot.host} (on-demand zero replica 0 reserves it)"
    kept = f"replica 0 on {busy.host}: kept off {slot.host} (on-demand zero replica 0 reserves it)"
    assert kept in change(second, "busy").reasons  # the plan's `#` lines
    assert change(second, "zero").replicas == []


def test_an_on_demand_slot_whose_cores_an_always_on_replica_took_moves_and_the_plan_says_why() -> None:
    """busy is pinned to the slot's host: it takes the room (its only place), and the slot moves, said."""
    _, facts = world(cpu_host("cpu-01", cores=8), cpu_host("cpu-02", cores=8))
    zero = f"{CPU}, cpu_cores: 8, replicas: {{min: 0, max: 1}}"
    state, facts = applied(plan(State(), facts, zero=zero), State(), facts)
    (slot,) = state.deployments["zero"].replicas
    second = plan(state, facts, zero=zero, busy=f"{CPU}, cpu_cores: 8, host: {slot.host}")
    assert change(second, "busy").replicas[0].host == slot.host
    (moved,) = change(second, "zero").replicas
    assert moved.on_demand and moved.old_unit == slot.unit and moved.host != slot.host
    why = f"moved: always-on replicas hold 8 of the 8 cores of {slot.host}, and it needs 8"
    assert moved.reason.startswith(why) and f"replica 0 {why}" in change(second, "zero").reasons
    state, facts = applied(second, state, facts)
    third = plan(state, facts, zero=zero, busy=f"{CPU}, cpu_cores: 8, host: {slot.host}")
    assert all(c.replicas == [] for c in third.changes)  # and then it stays where it moved


# --- point 15: fewest replicas of a deployment per host, kept through a roll and restored -----------------------


def spread_of(p: Plan, name: str) -> list[str]:
    return sorted(r.host for r in change(p, name).replicas if r.actions != (Action.DELETE,))


def test_a_roll_keeps_the_replicas_on_separate_hosts_when_room_appears_on_one() -> None:
    """chat's replicas fill c2 and c3 (c1 is full, c4 out of reach); c4 is back, empty, as chat rolls. Replica 0
    surges onto c4; replica 1 has no room for a surge on its own host and would surge beside replica 0 on c4: it
    stops and starts on c3 instead."""
    inv, facts = world(*(cpu_host(f"c{i}", cores=2) for i in range(1, 5)))
    fill = {f"f{i}": f"{CPU}, cpu_cores: {n}, host: c{i + 1}" for i, n in enumerate((2, 1, 1))}  # placed first
    fill = {k: v + ", priority: 5" for k, v in fill.items()}
    chat = f"{CPU}, cpu_cores: 1, replicas: {{min: 2, max: 2}}"
    three = {h: f for h, f in facts.items() if h != "c4"}
    first = make_plan(desired(**fill, chat=chat), State(), inv, three, {"m": SHAPE}, unreachable={"c4": "x"})
    assert spread_of(first, "chat") == ["c2", "c3"]
    state, three = applied(first, State(), three)
    roll = plan(state, {**facts, **three}, **fill, chat=chat.replace("2048", "1024"))
    assert spread_of(roll, "chat") in (["c2", "c4"], ["c3", "c4"]), spread_of(roll, "chat")  # not ["c4", "c4"]
    assert change(roll, "chat").strategy == "stop-then-start"


def test_the_plan_restores_a_spread_a_host_out_of_reach_had_broken() -> None:
    hosts = [cpu_host(f"c{i}", cores=4) for i in range(1, 4)]
    inv, facts = world(*hosts)
    chat = f"{CPU}, cpu_cores: 1, replicas: {{min: 2, max: 2}}"
    alone = {"c1": facts["c1"]}  # c2 and c3 out of reach: both replicas on c1
    first = make_plan(desired(chat=chat), State(), inv, alone, {"m": SHAPE}, unreachable={"c2": "x", "c3": "x"})
    assert spread_of(first, "chat") == ["c1", "c1"]
    state, alone = applied(first, State(), alone)
    facts = {**facts, **alone}
    back = plan(state, facts, chat=chat)
    (moved,) = change(back, "chat").replicas
    assert moved.old_host == "c1" and moved.host == "c2" and moved.strategy == "surge"
    why = "moved: 2 replicas of chat on c1, and c2 has room with 0 (fewest replicas of a deployment per host)"
    assert moved.reason == why and f"replica 0 {why}" in change(back, "chat").reasons
    state, facts = applied(back, state, facts)
    assert all(c.replicas == [] for c in plan(state, facts, chat=chat).changes)


# --- point 16: a stop-then-start with the other replicas out of reach warns of the outage -----------------------


def test_a_stop_then_start_whose_other_replicas_are_out_of_reach_warns_of_the_outage() -> None:
    inv, facts = world(cpu_host("c1", cores=2), cpu_host("c2", cores=2))
    chat = f"{CPU}, cpu_cores: 2, replicas: {{min: 2, max: 2}}"  # each a whole host: no room for a surge
    state, facts = applied(plan(State(), facts, chat=chat), State(), facts)
    assert sorted(r.host for r in state.deployments["chat"].replicas) == ["c1", "c2"]
    everyone = plan(state, facts, chat=chat.replace("2048", "1024"))
    assert change(everyone, "chat").strategy == "stop-then-start"
    assert not any("no serving replica" in w for w in change(everyone, "chat").warnings)  # the other serves
    cut = make_plan(desired(chat=chat.replace("2048", "1024")), state, inv, {"c1": facts["c1"]}, {"m": SHAPE},
                    unreachable={"c2": "ssh: connect timed out"})  # fmt: skip
    c = change(cut, "chat")
    assert [r.host for r in c.replicas] == ["c1"] and c.strategy == "stop-then-start"
    assert (
        "chat will have no serving replica during the change: no free room for a surge, so stop-then-start, "
        "and its other replicas are on hosts out of reach (c2)" in c.warnings
    ), c.warnings


def test_a_min_zero_deployment_whose_only_slot_has_no_place_is_a_problem_not_no_changes() -> None:
    """The one host's cores go to an always-on replica it must take (its only place): zero could never wake."""
    _, facts = world(cpu_host("cpu-01", cores=8))
    zero = f"{CPU}, cpu_cores: 8, replicas: {{min: 0, max: 1}}"
    state, facts = applied(plan(State(), facts, zero=zero), State(), facts)
    second = plan(state, facts, zero=zero, busy=f"{CPU}, cpu_cores: 8")
    state, facts = applied(second, state, facts)
    third = plan(state, facts, zero=zero, busy=f"{CPU}, cpu_cores: 8")
    assert not third.has_changes
    (problem,) = [p for p in third.problems if p.startswith("zero: ")]
    assert "on-demand replica 0 has no place (Waiting for a machine with 8 free CPU cores" in problem
    assert "a request never wakes zero (503 after the hold) until a host has room" in problem
