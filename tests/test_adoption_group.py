"""`import` of a replica group (issue 30) in the pure core: the head's and each worker's unit (engine-ctl-<d>-<i><slot>
and its -w<rank>), each on its own host, adopt as one replica with its members, so the next plan is empty; a
worker whose head runs nowhere is left, with why; a head whose worker runs nowhere is adopted with that member
recorded from its header, so the plan shows it missing and repairs the group. The hosts' units are the units the
planner rendered, read back as the probe reads them (tests/test_ownership.py's unit_fact; tests/test_fleet_multinode.py
does it on real hosts)."""

from __future__ import annotations

import json

import pytest

from engine_ctl.cli.import_cmd import _show
from engine_ctl.cli.views.plan import plan_text
from engine_ctl.core.fit.hostfacts import HostFacts, UnitFact
from engine_ctl.core.fit.unitheader import header_members, parse_unit_header
from engine_ctl.core.plan.adoption import Adoption, adopt
from engine_ctl.core.plan.planner import Plan
from engine_ctl.core.record.model import State, parse_state
from tests.fleetfacts import cpu_host
from tests.test_multinode import _applied, _plan, _world
from tests.test_ownership import unit_fact
from tests.test_plan_core import SHAPE, desired

SPEC = "accelerator: cpu, nodes: 2"
IMPORT_CANNOT_KNOW = ("engine_version", "engine_sha256")
"""What a member's record holds that no host says: the build it was applied with (adoption's docstring)."""


def _group(nodes: int = 2) -> tuple[State, dict[str, HostFacts], Plan]:
    """A group applied on hosts c1..c<nodes+1>: the state apply records, and each host with the unit files as
    rendered (the head's on its host, each worker's on its own), read back as the probe reads them."""
    inv, facts = _world(*(cpu_host(f"c{i}") for i in range(1, nodes + 2)))
    plan = _plan(State(), inv, facts, f"accelerator: cpu, nodes: {nodes}")
    state, _ = _applied(plan, facts)
    units: dict[str, list[UnitFact]] = {h: [] for h in facts}
    for r in plan.changes[0].replicas:
        assert r.unit_text is not None
        units[r.host].append(unit_fact(r.unit, r.unit_text))
        for m in r.members:
            assert m.unit_text is not None
            units[m.host].append(unit_fact(m.unit, m.unit_text))
    return state, {h: f.model_copy(update={"units": tuple(units[h])}) for h, f in facts.items()}, plan


def _adopt(facts: dict[str, HostFacts], spec: str = SPEC) -> Adoption:
    inv, _ = _world(*facts.values())
    return adopt(desired(spec), inv, facts, {"m": SHAPE}, State())


def _without(facts: dict[str, HostFacts], host: str, unit: str) -> dict[str, HostFacts]:
    kept = tuple(u for u in facts[host].units if u.name != unit)
    return {**facts, host: facts[host].model_copy(update={"units": kept})}


def _members(state: State) -> list[dict[str, object]]:
    (r,) = state.deployments["chat"].replicas
    return [{k: v for k, v in m.model_dump().items() if k not in IMPORT_CANNOT_KNOW} for m in r.members]


def test_the_heads_header_names_its_group_port_and_its_workers() -> None:
    _, _, plan = _group(nodes=3)
    (r,) = plan.changes[0].replicas
    assert r.unit_text is not None and r.placement is not None
    header = parse_unit_header(r.unit_text.splitlines())
    assert header is not None and header.group_port == r.placement.group_port and header.port == r.port
    assert [(m.rank, m.unit, m.host, m.port, m.sha256) for m in header.members] == [
        (m.rank, m.unit, m.host, m.port, m.unit_sha256) for m in r.members
    ]
    # a worker's own header: its port, no group port, no member lines
    worker = parse_unit_header((r.members[0].unit_text or "").splitlines())
    assert worker is not None and worker.port == r.members[0].port and worker.group_port is None
    assert worker.members == () and (worker.deployment, worker.replica, worker.slot) == ("chat", 0, "a")
    assert header_members(["# Managed by engine-ctl", "# group member 1: x on h port 99999 sha256 " + "0" * 64]) == ()


def test_the_probe_reads_a_whole_head_header_at_the_most_nodes_a_document_may_ask() -> None:
    """nodes: 16 (validate's bound): 15 worker lines, then the content-sha256 line, all within what the probe
    sends; with 8 lines a head of 4 or more lost its content hash, and a hand edit read as a unit that differs."""
    from engine_ctl.shell.remote.facts_probe import unit_file

    _, _, plan = _group(nodes=16)
    (r,) = plan.changes[0].replicas
    assert r.unit_text is not None
    sent = unit_file(r.unit_text.encode())["header"]
    header = parse_unit_header(sent)
    assert header is not None and len(header.members) == 15
    assert any(line.startswith("# content-sha256: ") for line in sent), sent


def test_a_group_adopts_as_one_replica_with_its_members_and_the_next_plan_is_empty() -> None:
    state, facts, _ = _group()
    adoption = _adopt(facts)
    assert adoption.skipped == []  # the worker's unit is not "not a name engine-ctl gives its units" any more
    (a,) = adoption.adopted
    (r,) = state.deployments["chat"].replicas
    (m,) = r.members
    assert (a.unit, a.host, a.status, a.note) == (r.unit, r.host, "serving", "")
    assert [(x.rank, x.host, x.unit, x.port, x.status, x.note) for x in a.members] == [
        (1, m.host, m.unit, m.port, "serving", "")
    ]
    rebuilt = State(lineage=adoption.lineage, deployments=adoption.deployments)
    parse_state(rebuilt.model_dump(mode="json"), "test")  # a state engine-ctl reads back
    (got,) = rebuilt.deployments["chat"].replicas
    assert got.group_port == r.group_port is not None and got.argv == r.argv and got.unit_sha256 == r.unit_sha256
    assert _members(rebuilt) == _members(state)  # host, unit, port, GPUs, sha256 and argv: as apply recorded them
    rec, old = rebuilt.deployments["chat"], state.deployments["chat"]
    assert (rec.revision, rec.spec_hash, rec.id, rec.state) == (old.revision, old.spec_hash, old.id, "Ready")
    inv, _ = _world(*facts.values())
    again = _plan(rebuilt, inv, facts)
    assert not again.has_changes and again.drift == [], plan_text(again)


def test_the_scalers_unit_is_engine_ctls_own_and_never_left_as_a_foreign_unit(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A gateway host that ran a scaler for an earlier document keeps its unit; import neither adopts it as a
    replica nor lists it under "Left as they are" as "not a name engine-ctl gives its units" (the plan, too,
    counts it as engine-ctl's own). Seen on the fleet, where an earlier module's scaler was still there."""
    _, facts, _ = _group()
    c1 = facts["c1"]
    scaler = UnitFact(name="engine-ctl-scaler.service", active_state="active", sub_state="running")
    with_scaler = {**facts, "c1": c1.model_copy(update={"units": (*c1.units, scaler)})}
    adoption = _adopt(with_scaler)
    assert adoption.skipped == [] and len(adoption.adopted) == 1
    _show(adoption, "engine-ctl.state.json")
    assert "Left as they are" not in capsys.readouterr().out


def test_a_group_of_three_adopts_every_worker_in_rank_order() -> None:
    """Its head's header has more lines than the probe sends (HEADER_LINES): the workers come from the text."""
    state, facts, _ = _group(nodes=3)
    adoption = _adopt(facts, "accelerator: cpu, nodes: 3")
    rebuilt = State(lineage=adoption.lineage, deployments=adoption.deployments)
    assert adoption.skipped == [] and [x.rank for x in adoption.adopted[0].members] == [1, 2]
    assert _members(rebuilt) == _members(state)
    inv, _ = _world(*facts.values())
    assert not _plan(rebuilt, inv, facts, "accelerator: cpu, nodes: 3").has_changes


def test_a_worker_whose_head_runs_nowhere_is_left_with_why() -> None:
    state, facts, _ = _group()
    (r,) = state.deployments["chat"].replicas
    (m,) = r.members
    adoption = _adopt(_without(facts, r.host, r.unit))
    assert adoption.adopted == [] and adoption.deployments == {}
    (s,) = adoption.skipped
    assert (s.host, s.unit, s.deployment) == (m.host, m.unit, "chat")
    assert s.why == f"group member 1 of {r.unit}, which runs on no host: a group is adopted whole, not a worker alone"


def test_a_head_whose_worker_runs_nowhere_is_adopted_and_the_plan_repairs_the_member() -> None:
    state, facts, _ = _group()
    (r,) = state.deployments["chat"].replicas
    (m,) = r.members
    lost = _without(facts, m.host, m.unit)
    adoption = _adopt(lost)
    (a,) = adoption.adopted
    (x,) = a.members
    assert (x.host, x.unit, x.port, x.status) == (m.host, m.unit, m.port, "missing")
    assert "no host runs it: recorded as its head's header names it" in x.note
    rebuilt = State(lineage=adoption.lineage, deployments=adoption.deployments)
    assert _members(rebuilt) == _members(state)  # from the head's header (and the rendering it names)
    inv, _ = _world(*lost.values())
    repair = _plan(rebuilt, inv, lost)
    (rc,) = repair.changes[0].replicas
    assert rc.action == ["update"] and rc.unit == r.unit and [w.unit for w in rc.members] == [m.unit]
    assert f"group member 1: unit file {m.unit} is missing on {m.host}" in rc.reason
    assert [(d.kind, d.host, d.unit) for d in repair.drift] == [("missing", m.host, m.unit)]


def test_an_edited_worker_is_adopted_as_written_and_the_plan_repairs_it() -> None:
    state, facts, plan = _group()
    (step,) = plan.changes[0].replicas
    (m,) = step.members
    assert m.unit_text is not None
    edited_text = m.unit_text.replace("UMask=0077", "UMask=0022", 1)
    assert edited_text != m.unit_text
    edited = {**facts, m.host: facts[m.host].model_copy(update={"units": (unit_fact(m.unit, edited_text),)})}
    adoption = _adopt(edited)
    (x,) = adoption.adopted[0].members
    assert x.note == "edited by hand since engine-ctl wrote it: the next plan repairs it"
    rebuilt = State(lineage=adoption.lineage, deployments=adoption.deployments)
    assert _members(rebuilt) == _members(state)  # the sha256 engine-ctl wrote, not the edited file's
    rec = rebuilt.deployments["chat"]
    assert rec.spec_hash == state.deployments["chat"].spec_hash  # repaired in place, not a new revision
    inv, _ = _world(*edited.values())
    repair = _plan(rebuilt, inv, edited)
    (rc,) = repair.changes[0].replicas
    assert rc.action == ["update"] and "group member 1: unit file edited by hand" in rc.reason


def test_a_worker_of_another_revision_or_state_is_not_its_heads() -> None:
    state, facts, _ = _group()
    (r,) = state.deployments["chat"].replicas
    (m,) = r.members
    (u,) = [u for u in facts[m.host].units if u.name == m.unit]
    assert u.text is not None and u.header is not None
    for old, new, why in [
        ("revision: 1\n", "revision: 7\n", f"group member 1 of {r.unit} at revision 7, its head at 1: not one group"),
        (f"# lineage: {u.header.lineage}\n", "# lineage: other\n", "owned by another state (lineage other)"),
    ]:
        text = u.text.replace(old, new, 1)
        assert text != u.text
        odd = {**facts, m.host: facts[m.host].model_copy(update={"units": (unit_fact(m.unit, text),)})}
        adoption = _adopt(odd)
        assert [(s.unit, s.why) for s in adoption.skipped] == [(m.unit, why)]
        (x,) = adoption.adopted[0].members  # the head's header names it: recorded as missing, repaired by the plan
        assert x.status == "missing"


def test_the_import_command_shows_each_member_and_a_missing_one(capsys: pytest.CaptureFixture[str]) -> None:
    """What `import` prints and what `import --json` writes: each replica with its members."""
    state, facts, _ = _group()
    (r,) = state.deployments["chat"].replicas
    (m,) = r.members
    adoption = _adopt(facts)
    _show(adoption, "engine-ctl.state.json")
    assert f"group member 1 on {m.host}: {m.unit} (port {m.port}, serving)" in capsys.readouterr().out
    shown = json.loads(adoption.adopted[0].model_dump_json())
    assert [(x["rank"], x["unit"], x["status"]) for x in shown["members"]] == [(1, m.unit, "serving")]
    _show(_adopt(_without(facts, m.host, m.unit)), "engine-ctl.state.json")
    assert f"group member 1 on {m.host}: {m.unit} (port {m.port}, missing): no host runs it" in capsys.readouterr().out
