"""`import` in the pure core, beside the replicas (tests/test_ownership.py): the gateway is adopted from what its
host carries (its files' sha256 and unit), so the next plan is empty; a gateway whose files are not what the
documents render is recorded as it is, so the next plan updates it; each deployment's ID comes back from the
scaler's state on the gateway host (issue 24, point 8; tests/test_fleet_import.py does it on the fleet)."""

from __future__ import annotations

from engine_ctl.cli.views.plan import plan_text
from engine_ctl.core.plan.adoption import adopt_gateways, deployment_ids, recorded_revision
from engine_ctl.core.plan.planner import make_plan
from engine_ctl.core.record.model import State
from tests.test_gateway_core import SHAPE, applied, desired, world

ID = "01M9078CDNV526TMBTWX37F02Y"


def test_the_gateway_is_adopted_as_the_last_apply_recorded_it_and_the_next_plan_is_empty() -> None:
    inv, facts = world()
    state, after = applied(make_plan(desired(), State(), inv, facts, SHAPE), facts)
    lost = state.model_copy(update={"gateways": {}})
    assert make_plan(desired(), lost, inv, after, SHAPE).gateways[0].action == ["create"]  # what import left before

    records, seen = adopt_gateways(lost, inv, after, desired().api_keys)
    assert records == state.gateways
    assert [(g.host, g.endpoint, g.note) for g in seen] == [("edge", "10.0.0.2:8800", "")]
    again = make_plan(desired(), lost.model_copy(update={"gateways": records}), inv, after, SHAPE)
    assert not again.has_changes and again.drift == [], plan_text(again)


def test_a_gateway_whose_files_are_not_the_documents_is_recorded_as_it_is_and_updated() -> None:
    inv, facts = world()
    state, after = applied(make_plan(desired(), State(), inv, facts, SHAPE), facts)
    lost = state.model_copy(update={"gateways": {}})
    files = dict(after["edge"].gateway_files or {})
    files["haproxy.cfg"] = "0" * 64
    edited = {**after, "edge": after["edge"].model_copy(update={"gateway_files": files})}
    records, seen = adopt_gateways(lost, inv, edited, desired().api_keys)
    assert records["edge"].files_sha256 == files and records["edge"].config == ""
    assert "not what these documents render" in seen[0].note
    plan = make_plan(desired(), lost.model_copy(update={"gateways": records}), inv, edited, SHAPE)
    assert plan.gateways[0].action == ["update"] and "changes: haproxy.cfg" in plan.gateways[0].reasons
    assert not [d for d in plan.drift if "edited by hand" in d.detail]  # engine-ctl's own files, not a person's
    without = {**after, "edge": after["edge"].model_copy(update={"gateway_files": None, "units": ()})}
    assert adopt_gateways(lost, inv, without, desired().api_keys) == ({}, [])  # none there: the plan creates it


def test_ids_come_back_from_the_scalers_state_and_only_when_they_agree() -> None:
    _, facts = world()
    view = {"deployments": {"chat": {"id": ID}, "other": {"id": "not a ulid"}, "bad": "x"}}
    with_scaler = {**facts, "edge": facts["edge"].model_copy(update={"scaler_state": view})}
    assert deployment_ids(with_scaler, ["chat", "other", "gone"]) == {"chat": ID}
    two = {**with_scaler, "cpu-1": facts["cpu-1"].model_copy(update={"scaler_state": {"deployments": {
        "chat": {"id": "01M9078CDWXZCD1YQ3XM5FVG4Z"}}}})}  # fmt: skip
    assert deployment_ids(two, ["chat"]) == {}


def test_a_revision_recorded_in_place_comes_back_from_the_scalers_state_with_its_id() -> None:
    """An in-place change (idle_minutes) records a revision no unit's header has; the scaler's state carries it
    beside the ID, and only for that ID (a deployment made again under its name is another one)."""
    _, facts = world()
    view = {"deployments": {"chat": {"id": ID, "revision": 3}, "old": {"id": ID, "revision": "9"}}}
    with_scaler = {**facts, "edge": facts["edge"].model_copy(update={"scaler_state": view})}
    assert recorded_revision(with_scaler, "chat", ID) == 3
    assert recorded_revision(with_scaler, "chat", "01M9078CDWXZCD1YQ3XM5FVG4Z") == 0
    assert recorded_revision(with_scaler, "chat", "") == 0
    assert recorded_revision(with_scaler, "old", ID) == 0  # not a number: none


def test_a_stop_the_running_gateway_says_is_adopted_only_where_no_unit_of_it_runs() -> None:
    """The stop is on no unit's header; a gateway's running stopped.map (deployment -> ID) says it, and the units
    say no unit runs. Both, and import records it stopped; a listed deployment whose unit runs is not (a stop by
    hand in the map is no operator's stop); without a time (a dry run of the core) nothing is adopted."""
    from engine_ctl.core.plan.adoption import held_stops

    inv, facts = world()
    state, after = applied(make_plan(desired(), State(), inv, facts, SHAPE), facts)
    edge = after["edge"].model_copy(update={"gateway_maps": {"stopped.map": {"chat": "01J0000000000000000000000A"}}})
    (r,) = state.deployments["chat"].replicas
    host = after[r.host]
    down = host.model_copy(update={"units": tuple(u.model_copy(update={"active_state": "inactive"})
                                                  if u.name == r.unit else u for u in host.units)})  # fmt: skip
    stopped = {**after, "edge": edge, r.host: down} if r.host != "edge" else {**after, "edge": edge}
    records = {"chat": state.deployments["chat"].model_copy(deep=True)}
    assert held_stops(records, stopped, "2026-12-06T09:00:00+00:00") == {"chat": "edge"}
    assert records["chat"].operator is not None and records["chat"].operator.verb == "stopped"
    assert [x.status for x in records["chat"].replicas] == ["stopped"]
    running = {**after, "edge": edge}
    assert held_stops({"chat": state.deployments["chat"].model_copy(deep=True)}, running, "2026-12-06T09:00:00Z") == {}
    assert held_stops({"chat": state.deployments["chat"].model_copy(deep=True)}, stopped, "") == {}
