"""`--replace NAME` / `restart NAME` in the pure core: every replica of NAME is planned as a rolling replacement
("replace requested"), a surge where there is room and stop-then-start where not; the revision stays; after it
is applied the next plan is empty; other deployments are untouched."""

from __future__ import annotations

from engine_ctl.core.plan.planner import make_plan
from engine_ctl.core.record.model import State
from tests.fleetfacts import h100x8
from tests.test_plan_core import SHAPE, applied, desired, plan_for, world


def _running(spec: str):  # type: ignore[no-untyped-def]
    h = h100x8()
    first = plan_for(spec, State(), h)
    return applied(first, State(), {h.host: h})


def test_replace_plans_every_replica_as_a_rolling_replacement_and_then_nothing() -> None:
    spec = "gpus: 1, replicas: {min: 2, max: 2}"
    state, facts = _running(spec)
    inventory = world(*facts.values())[0]
    plan = make_plan(desired(spec), state, inventory, facts, {"m": SHAPE}, replace=frozenset({"chat"}))
    (c,) = plan.changes
    assert c.replaces and c.reasons == ["a rolling replace: replace requested"]
    assert c.revision == c.old_revision == 1 and c.strategy == "surge" and not c.field_changes
    old = {r.unit for r in state.deployments["chat"].replicas}
    assert [r.replaces for r in c.replicas] == [True] * 2
    assert {r.old_unit for r in c.replicas} == old and not {r.unit for r in c.replicas} & old  # the other slot
    assert [r.reason for r in c.replicas] == ["replace requested"] * 2
    assert plan.summary() == {"add": 0, "change": 1, "destroy": 0}
    after, facts_after = applied(plan, state, facts)
    again = make_plan(desired(spec), after, world(*facts_after.values())[0], facts_after, {"m": SHAPE})
    assert not again.has_changes
    unforced = make_plan(desired(spec), state, inventory, facts, {"m": SHAPE})
    assert not unforced.has_changes  # nothing but the request makes it a replacement


def test_a_replica_with_no_room_beside_it_is_replaced_stop_then_start() -> None:
    state, facts = _running("gpus: 8")
    plan = make_plan(desired("gpus: 8"), state, world(*facts.values())[0], facts, {"m": SHAPE},
                     replace=frozenset({"chat"}))  # fmt: skip
    (c,) = plan.changes
    assert c.strategy == "stop-then-start" and c.replicas[0].reason == "replace requested"
    assert c.replicas[0].port == state.deployments["chat"].replicas[0].port


def test_replace_with_a_changed_document_says_both() -> None:
    state, facts = _running("gpus: 1, context_length: 4096")
    plan = make_plan(desired("gpus: 1, context_length: 8192"), state, world(*facts.values())[0], facts,
                     {"m": SHAPE}, replace=frozenset({"chat"}))  # fmt: skip
    (c,) = plan.changes
    assert c.reasons[-1] == "replace requested" and c.revision == 2
    assert c.replicas[0].reason.endswith("; replace requested") and "context_length" in c.replicas[0].reason


def test_replace_and_restart_refuse_a_name_with_nothing_to_replace(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Refused before anything is asked of a host: a name not in the documents (with the names there), or one
    with no replicas recorded yet; as JSON the error object (one line for restart, whose output is events)."""
    import json
    from pathlib import Path

    from tests.helpers import run

    quickstart = Path(__file__).resolve().parents[1] / "examples" / "quickstart"
    monkeypatch.setenv("ENGINE_CTL_STATE", str(tmp_path / "state.json"))
    unknown = run("plan", str(quickstart), "--replace", "nope", "--json")
    assert unknown.exit_code == 1
    (detail,) = json.loads(unknown.stdout)["error"]["details"]
    assert detail["code"] == "unknown_deployment" and detail["hint"] == "deployments: tiny-chat"
    fresh = run("restart", "tiny-chat", str(quickstart), "--auto-approve", "--json")
    assert fresh.exit_code == 1 and len(fresh.stdout.splitlines()) == 1, fresh.output
    (detail,) = json.loads(fresh.stdout)["error"]["details"]
    assert detail["code"] == "replace_refused" and "nothing to replace" in detail["message"]
    assert not (tmp_path / "state.json").exists()
