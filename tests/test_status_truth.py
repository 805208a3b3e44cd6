"""status's verdict from live facts (issue 24): a replica's old and new slots are one replica, only the replicas the
document asks for are counted, the scaler's state.json is read only for the deployment ID that wrote it and only
while the scaler acts on the deployment, and a unit stopped by hand is said to be what the plan calls it."""

from __future__ import annotations

from engine_ctl.cli.status_cmd import _statuses
from engine_ctl.core.fit.hostfacts import HostFacts, UnitFact
from engine_ctl.core.plan.status import Slot, deployment_status, per_replica, recorded_verdict
from engine_ctl.core.record.model import State
from tests.test_operator_core import running

OLD_ID = "01J0000000000000000000OLD0"


def serving(facts: dict[str, HostFacts], state: State) -> dict[str, HostFacts]:
    """Every recorded replica's health check answers 200."""
    ports = {str(r.port): "200" for d in state.deployments.values() for r in d.replicas}
    return {h: f.model_copy(update={"health": ports}) for h, f in facts.items()}


def with_unit(facts: dict[str, HostFacts], unit: UnitFact) -> dict[str, HostFacts]:
    return {h: f.model_copy(update={"units": (*[u for u in f.units if u.name != unit.name], unit)})
            for h, f in facts.items()}  # fmt: skip


def wedged() -> tuple[State, dict[str, HostFacts]]:
    """A 2-replica deployment wedged in a roll to revision 2: replica 0 serves at 1; replica 1's old slot (1a) was
    stopped for the roll and its new slot (1b) failed to start."""
    state, facts = running("gpus: 1, replicas: {min: 2, max: 2}")
    facts = serving(facts, state)
    rec = state.deployments["chat"]
    rec.revision = 2
    old = next(r for r in rec.replicas if r.index == 1)
    new = old.model_copy(update={"slot": "b", "unit": "engine-ctl-chat-1b.service", "port": 8002, "revision": 2})
    rec.replicas.append(new)
    unit = next(u for f in facts.values() for u in f.units if u.name == old.unit)
    facts = with_unit(facts, unit.model_copy(update={"active_state": "inactive", "sub_state": "dead"}))
    failed = unit.model_copy(update={"name": new.unit, "active_state": "failed", "sub_state": "failed",
                                     "exec_main_status": 1})  # fmt: skip
    return state, with_unit(facts, failed)


def test_a_wedged_roll_counts_two_replicas_not_three_slots() -> None:
    state, facts = wedged()
    s = deployment_status(state.deployments["chat"], facts)
    assert (s.state, s.ready, s.replicas) == ("Ready", 1, 2), s
    assert s.reason == "1 of 2 replicas serving; 0 of 2 at revision 2", s.reason
    recorded = state.deployments["chat"].model_copy(deep=True)
    recorded.replicas[1].status, recorded.replicas[2].status = "stopped", "failed"  # as apply records the roll
    found = recorded_verdict(recorded.replicas, 2, 2)  # what apply records: the same count
    assert found.reason == "1 of 2 replicas serving; 0 of 2 at revision 2", found


def test_both_slots_of_one_replica_ready_are_one_ready_replica() -> None:
    state, facts = running("gpus: 1")
    rec = state.deployments["chat"]
    twin = rec.replicas[0].model_copy(update={"slot": "b", "unit": "engine-ctl-chat-0b.service", "port": 8001})
    rec.replicas.append(twin)
    unit = next(u for f in facts.values() for u in f.units)
    facts = serving(with_unit(facts, unit.model_copy(update={"name": twin.unit})), state)
    s = deployment_status(rec, facts)
    assert (s.state, s.ready, s.replicas) == ("Ready", 1, 1), s  # never 2/1
    assert per_replica([Slot(index=0, state="ready", revision=1), Slot(index=0, state="ready", revision=2)], 2) == (
        [2], [],
    )  # fmt: skip
    assert per_replica([Slot(index=3, state="ready", revision=1)], 1, limit=2) == ([], [])  # not asked for


def test_a_unit_stopped_by_hand_reads_as_drift_not_as_an_older_deployments_scale_to_zero() -> None:
    state, facts = running("gpus: 1")
    rec = state.deployments["chat"]
    unit = next(u for f in facts.values() for u in f.units)
    facts = with_unit(facts, unit.model_copy(update={"active_state": "inactive", "sub_state": "dead"}))
    old = {"deployments": {"chat": {"id": OLD_ID, "state": "ScaledToZero", "reason": "idle: scaled to zero",
                                    "wanted": 0, "ready": 0, "running": []}}}  # fmt: skip
    host = next(iter(facts))
    facts = {h: f.model_copy(update={"scaler_state": old}) for h, f in facts.items()}
    (s,) = _statuses(state, ["chat"], facts, [(host, "198.18.0.1:8800")])
    assert (s.state, s.ready, s.replicas) == ("Failed", 0, 1), s
    assert s.reason is not None and "stopped outside engine-ctl" in s.reason and "idle" not in s.reason
    same = {"deployments": {"chat": {**old["deployments"]["chat"], "id": rec.id}}}
    facts = {h: f.model_copy(update={"scaler_state": same}) for h, f in facts.items()}
    (kept,) = _statuses(state, ["chat"], facts, [(host, "198.18.0.1:8800")])
    assert kept.state == "Failed" and kept.replicas == 1  # min 1: the scaler does not act on it, whatever it kept


def test_status_and_list_say_when_the_documents_ask_for_a_change_that_is_not_served() -> None:
    """Issue 24, 16c: the model path changed to weights no apply can use; plan said Pending and apply changed
    nothing, and `list` still read `ready 2/2` at the old revision, as if the documents were served."""
    from types import SimpleNamespace

    from engine_ctl.cli.views.output import console
    from engine_ctl.cli.views.status import list_table
    from tests.test_plan_core import desired

    state, facts = running("gpus: 1")
    facts = serving(facts, state)
    same = SimpleNamespace(desired=desired("gpus: 1"))
    (s,) = _statuses(state, ["chat"], facts, None, same)  # type: ignore[arg-type]
    assert (s.state, s.revision, s.documents_changed) == ("Ready", 1, False)
    assert "documents_changed" not in s.model_dump_json()  # --json carries it only when true
    changed = SimpleNamespace(desired=desired("gpus: 1, context_length: 8192"))
    (c,) = _statuses(state, ["chat"], facts, None, changed)  # type: ignore[arg-type]
    assert (c.state, c.ready, c.revision, c.documents_changed) == ("Ready", 1, 1, True)  # what serves, said so
    assert c.reason is not None and "the documents changed since revision 1 was applied" in c.reason
    out = console()
    with out.capture() as captured:
        out.print(list_table([c]))
    assert "1 (documents changed)" in captured.get()
    (plain,) = _statuses(state, ["chat"], facts)  # no documents given: nothing to compare with
    assert not plain.documents_changed
