"""Ownership and adoption in the pure core: the lineage in each unit's header, units owned elsewhere, the
upgrade from lineage-less units, `import`'s records, and `state rm`/`state mv` on the state value. The hosts'
units here are the units the planner rendered, read back as the probe reads them (tests/test_fleet_ownership.py
does the same on real hosts)."""

from __future__ import annotations

import json

import pytest

from engine_ctl.cli.views.plan import plan_markdown, plan_text
from engine_ctl.core.documents.rules import resolve_engine
from engine_ctl.core.fit.hostfacts import EngineInstall, HostFacts, UnitFact
from engine_ctl.core.fit.runspec import FitPlan
from engine_ctl.core.fit.unitheader import parse_unit_header
from engine_ctl.core.model import Deployment, Model
from engine_ctl.core.plan.adoption import AdoptionError, adopt
from engine_ctl.core.plan.planner import Plan, make_plan, render_replica
from engine_ctl.core.plan.savedplan import tampering
from engine_ctl.core.record.edit import StateEditError, forget, rename
from engine_ctl.core.record.model import State, parse_state
from engine_ctl.shell.remote.facts_probe import unit_file
from tests.fleetfacts import cpu_host, h100x8
from tests.test_plan_core import SHAPE, applied, desired, plan_for, world

CPU = "accelerator: cpu, context_length: 4096"


def unit_fact(name: str, text: str, active: str = "active") -> UnitFact:
    """A unit file as the probe reads it (unit_file is the probe's own function) and gather parses it."""
    probed = unit_file(text.encode())
    return UnitFact(
        name=name, sha256=probed["sha256"], active_state=active, sub_state="running",
        header=parse_unit_header(probed["header"]), body_sha256=probed["body_sha256"], text=probed["text"],
    )  # fmt: skip


def hosts_after(plan: Plan, facts: dict[str, HostFacts]) -> dict[str, HostFacts]:
    """The hosts once `plan` is applied: each new unit's file as rendered, read back with its header, and the
    engine it runs installed there (else the plan warns that a serving replica's engine is gone)."""
    units: dict[str, list[UnitFact]] = {h: list(f.units) for h, f in facts.items()}
    engines = {h: dict(f.engines) for h, f in facts.items()}
    for c in plan.changes:
        for r in c.replicas:
            if r.old_unit:
                units[r.old_host or r.host] = [u for u in units[r.old_host or r.host] if u.name != r.old_unit]
            if r.action != ["delete"] and r.unit_text is not None:
                units[r.host] = [u for u in units[r.host] if u.name != r.unit] + [unit_fact(r.unit, r.unit_text)]
                if c.fit is not None and r.argv:
                    engines[r.host].setdefault(c.fit.engine, EngineInstall(path=r.argv[0]))
    return {h: f.model_copy(update={"units": tuple(units[h]), "engines": engines[h]}) for h, f in facts.items()}


def apply_and_read(spec: str, state: State, *facts: HostFacts) -> tuple[State, dict[str, HostFacts], Plan]:
    first = plan_for(spec, state, *facts)
    recorded, _ = applied(first, state, {f.host: f for f in facts})
    return recorded, hosts_after(first, {f.host: f for f in facts}), first


# --- the header --------------------------------------------------------------------------------------------
def test_the_header_names_the_unit_and_its_state_and_reads_back() -> None:
    state = State(lineage="lineage-a")
    plan = plan_for("gpus: 2", state, h100x8())
    (step,) = plan.changes[0].replicas
    assert step.unit_text is not None and "# lineage: lineage-a\n" in step.unit_text
    probed = unit_file(step.unit_text.encode())
    header = parse_unit_header(probed["header"])
    assert header is not None
    assert (header.deployment, header.replica, header.slot, header.revision) == ("chat", 0, "a", 1)
    assert (header.engine, header.host, header.port, header.lineage) == (
        "llama.cpp",
        "gpu-h100",
        step.port,
        "lineage-a",
    )
    assert list(header.gpus) == step.gpus and len(header.gpus) == 2
    # the content hash: the file with that line's value left empty; an edit shows
    assert header.content_sha256 == probed["body_sha256"]
    fact = unit_fact(step.unit, step.unit_text)
    assert not fact.edited
    edited = unit_fact(step.unit, step.unit_text.replace("Restart=on-failure", "Restart=no"))
    assert edited.edited and edited.header == fact.header


def test_a_header_that_is_not_engine_ctls_is_none() -> None:
    assert parse_unit_header([]) is None
    assert parse_unit_header(["[Unit]", "Description=x"]) is None
    assert (
        parse_unit_header(["# Managed by engine-ctl", "# deployment: chat  replica: x  slot: a  revision: 1"]) is None
    )
    legacy = parse_unit_header(["# Managed by engine-ctl: …", "# deployment: chat  replica: 0  slot: b  revision: 3"])
    assert legacy is not None and legacy.lineage is None and legacy.slot == "b" and legacy.revision == 3


# --- upgrading from units without a lineage ----------------------------------------------------------------
def legacy(state: State, plan: Plan, facts: dict[str, HostFacts]) -> tuple[State, dict[str, HostFacts]]:
    """The state and hosts as an engine-ctl from before lineage headers left them: the same units, rendered
    without the lineage line (recorded with that file's sha256)."""
    old_state = state.model_copy(deep=True)
    new_facts = dict(facts)
    for c in plan.changes:
        deployment, model = Deployment.model_validate(c.spec), Model.model_validate(c.model)
        provider = resolve_engine(deployment, model)
        inv, _ = world(*facts.values())
        for r in c.replicas:
            assert r.placement is not None and c.fit is not None and provider is not None
            unit = render_replica(deployment, model, provider, FitPlan.model_validate(c.fit), r.placement,
                                  {h.name: h for h in inv.hosts}, r.revision, r.slot, None)  # fmt: skip
            assert "# lineage:" not in unit.text
            rec = next(x for x in old_state.deployments[c.name].replicas if x.unit == r.unit)
            rec.unit_sha256 = unit.sha256
            hf = new_facts[r.host]
            units = (*(u for u in hf.units if u.name != r.unit), unit_fact(r.unit, unit.text))
            new_facts[r.host] = hf.model_copy(update={"units": units})
    return old_state, new_facts


def test_upgrading_replaces_nothing_and_a_change_writes_the_lineage() -> None:
    h = cpu_host()
    state, facts, first = apply_and_read(CPU + ", replicas: {min: 2, max: 2}", State(lineage="L1"), h)
    old_state, old_facts = legacy(state, first, facts)
    inv, _ = world(h)
    again = make_plan(desired(CPU + ", replicas: {min: 2, max: 2}"), old_state, inv, old_facts, {"m": SHAPE})
    assert not again.has_changes and again.drift == [] and again.owned_elsewhere == []
    assert "No changes." in plan_text(again)
    # a unit deleted by hand is repaired with the text it had (no lineage: the record's sha256 is kept)
    a = old_state.deployments["chat"].replicas[0]
    gone = {h.host: old_facts[h.host].model_copy(update={"units": tuple(u for u in old_facts[h.host].units
                                                                    if u.name != a.unit)})}  # fmt: skip
    repair = make_plan(desired(CPU + ", replicas: {min: 2, max: 2}"), old_state, inv, gone, {"m": SHAPE})
    (step,) = repair.changes[0].replicas
    assert step.action == ["update"] and step.unit_sha256 == a.unit_sha256
    assert step.unit_text is not None and "# lineage:" not in step.unit_text
    saved = Plan.model_validate(json.loads(repair.model_dump_json()))
    assert tampering(saved, {x.name: x for x in inv.hosts}) == []  # the lineage-less repair is engine-ctl's own
    # a real change rolls the replicas, and the new units carry the lineage
    roll = make_plan(desired("accelerator: cpu, context_length: 8192, replicas: {min: 2, max: 2}"), old_state, inv,
                     old_facts, {"m": SHAPE})  # fmt: skip
    steps = roll.changes[0].replicas
    assert [s.replaces for s in steps] == [True] * 2
    assert all(s.unit_text is not None and "# lineage: L1\n" in s.unit_text for s in steps)


def test_a_saved_plan_with_another_lineage_in_a_unit_is_refused() -> None:
    plan = plan_for(CPU, State(lineage="L1"), cpu_host())
    inv, _ = world(cpu_host())
    hosts = {h.name: h for h in inv.hosts}
    assert tampering(plan, hosts) == []  # type: ignore[arg-type]
    step = plan.changes[0].replicas[0]
    assert step.unit_text is not None
    step.unit_text = step.unit_text.replace("# lineage: L1", "# lineage: L2")
    assert any("unit file differs" in p for p in tampering(plan, hosts))  # type: ignore[arg-type]


# --- owned elsewhere -----------------------------------------------------------------------------------------
def two_states() -> tuple[State, dict[str, HostFacts]]:
    """State A runs `chat` (2 CPU replicas) on one host; the facts show its units with their headers."""
    h = cpu_host()
    state, facts, _ = apply_and_read(CPU + ", replicas: {min: 2, max: 2}", State(lineage="state-a"), h)
    return state, facts


def test_another_states_units_are_owned_elsewhere_never_drift_and_keep_their_ports() -> None:
    a_state, facts = two_states()
    inv, _ = world(*facts.values())
    b_docs = desired(CPU.replace("context_length: 4096", "context_length: 2048"))
    # state B, on the same host, with a deployment of another name
    b_named = b_docs.model_copy(update={"deployments": tuple(
        ld.model_copy(update={"deployment": ld.deployment.model_copy(update={"name": "search"})})
        for ld in b_docs.deployments
    )})  # fmt: skip
    plan = make_plan(b_named, State(lineage="state-b"), inv, facts, {"m": SHAPE})
    owned = {(f.unit, f.deployment, f.lineage) for f in plan.owned_elsewhere}
    assert owned == {(r.unit, "chat", "state-a") for r in a_state.deployments["chat"].replicas}
    assert plan.drift == []
    text = plan_text(plan)
    assert "Owned elsewhere" in text and "owned by the state of lineage state-a" in text
    assert not any(line.lstrip().startswith(("~", "!")) and "engine-ctl-chat" in line for line in text.splitlines())
    assert "Owned elsewhere" in plan_markdown(plan)
    (create,) = plan.changes[0].replicas
    assert create.port not in {r.port for r in a_state.deployments["chat"].replicas}


def _search(spec: str):  # type: ignore[no-untyped-def]
    """State B's documents: one deployment named `search` (not state A's `chat`)."""
    docs = desired(spec)
    return docs.model_copy(update={"deployments": tuple(
        ld.model_copy(update={"deployment": ld.deployment.model_copy(update={"name": "search"})})
        for ld in docs.deployments
    )})  # fmt: skip


def test_placement_leaves_another_states_cores_and_says_so() -> None:
    """Issue 26: staging's replica on a shared host keeps its CPU cores; production's plan places around them
    (or waits, when no other host has room), and lists what it left to that unit."""
    alone = cpu_host("cpu-01", cores=64)
    a_state, facts, _ = apply_and_read(CPU, State(lineage="state-a"), alone)
    a_cores = a_state.deployments["chat"].plan.cpu_cores  # type: ignore[union-attr]
    assert a_cores >= 2
    # the same host, now with just the cores A's replica was given plus one
    tight = facts["cpu-01"].model_copy(update={"cpu": alone.cpu.model_copy(update={"cores": a_cores + 1})})
    inv, by_name = world(tight)
    waiting = make_plan(_search(CPU), State(lineage="state-b"), inv, by_name, {"m": SHAPE})
    (c,) = waiting.changes
    assert c.replicas == [] and any(f"1 of {a_cores + 1} free here" in p for p in waiting.problems + c.blocked), (
        waiting.problems, c.blocked)  # fmt: skip
    (held,) = waiting.owned_elsewhere
    assert held.cpu_cores == a_cores and f"placement leaves it port {held.port}, {a_cores} CPU cores" in held.line
    assert held.line in plan_text(waiting)
    # with a second host, B goes there instead
    inv, by_name = world(tight, cpu_host("cpu-02", cores=a_cores + 1))
    moved = make_plan(_search(CPU), State(lineage="state-b"), inv, by_name, {"m": SHAPE})
    assert [r.host for r in moved.changes[0].replicas] == ["cpu-02"]


def test_a_deployment_named_like_another_states_never_touches_its_units() -> None:
    a_state, facts = two_states()
    inv, _ = world(*facts.values())
    plan = make_plan(desired(CPU + ", replicas: {min: 2, max: 2}"), State(lineage="state-b"), inv, facts,
                     {"m": SHAPE})  # fmt: skip
    (c,) = plan.changes
    a_units = {r.unit for r in a_state.deployments["chat"].replicas}
    assert not any(r.unit in a_units or r.old_unit in a_units for r in c.replicas)
    assert len(c.blocked) == 2 and all("belongs to another state (lineage state-a" in b for b in c.blocked)
    assert plan.problems and plan.drift == []


def test_a_state_rolled_back_to_before_a_deployment_never_writes_over_its_running_unit() -> None:
    """The same lineage's state from before the deployment existed (an old backup, a git copy): its unit runs and
    is not recorded. Before, plan said it left the unit alone and, in the same plan, created a replica of that very
    name; apply wrote over the file (another port), `systemctl start` of the active unit did nothing, apply said
    it served on the new port, and the next plan said "No changes" while nothing listened there (a probe,
    session 15). Now the replica is blocked, naming the unit and `engine-ctl import`."""
    h = h100x8()
    state, facts, _ = apply_and_read("gpus: 1", State(lineage="lineage-a"), h)
    older = State(lineage="lineage-a")
    plan = make_plan(desired("gpus: 1"), older, world(*facts.values())[0], facts, {"m": SHAPE})
    (c,) = plan.changes
    (unit,) = [r.unit for r in state.deployments["chat"].replicas]
    assert c.replicas == [], "nothing is written over the running unit"
    (blocked,) = c.blocked
    assert blocked.startswith(f"replica 0 would be {unit} on {h.host}, which is there already and not in this state")
    assert "`engine-ctl import` adopts it" in blocked
    assert plan.problems == [f"chat: {blocked}"]  # plan and apply exit 1
    assert [d.kind for d in plan.drift] == ["unmanaged"]  # "left alone", and now it is


def test_a_roll_never_writes_over_a_unit_of_this_lineage_that_runs_in_its_other_slot_unrecorded() -> None:
    """The unit a roll would surge into (the replica's other slot) runs already, of this lineage, and the state
    does not record it there: two inventory addresses swapped brought it under this host's name (a probe, session
    17). Before, the plan picked that very name; apply wrote its file, `systemctl start` of the active unit did
    nothing, apply said "serving on port 8002 (healthy)" and the deployment served nothing. Now it is blocked."""
    h = h100x8()
    state, facts, _ = apply_and_read("gpus: 1", State(lineage="lineage-a"), h)
    (r,) = state.deployments["chat"].replicas
    (recorded,) = [u for u in facts[h.host].units if u.name == r.unit]
    other = r.unit.replace("-0a.", "-0b.")
    swapped = recorded.model_copy(update={"name": other})
    here = facts[h.host].model_copy(update={"units": (*facts[h.host].units, swapped)})
    plan = make_plan(desired("gpus: 1, parallel: 2"), state, world(here)[0], {h.host: here},
                     {"m": SHAPE})  # fmt: skip
    (c,) = plan.changes
    assert not any(rc.unit == other for rc in c.replicas), "nothing is written over the running unit"
    (blocked,) = c.blocked
    assert blocked.startswith(f"replica 0 would be {other} on {h.host}, which is there already and not in this state")
    assert plan.problems == [f"chat: {blocked}"]  # plan and apply exit 1


def test_a_recorded_unit_taken_over_by_another_state_is_held_back_not_repaired() -> None:
    a_state, facts = two_states()
    inv, _ = world(*facts.values())
    # B's state records the same units (a copied state file, say), with its own lineage
    b_state = a_state.model_copy(update={"lineage": "state-b"})
    plan = make_plan(desired(CPU + ", replicas: {min: 2, max: 2}"), b_state, inv, facts, {"m": SHAPE})
    (c,) = plan.changes
    assert c.replicas == [] and plan.drift == [] and len(c.blocked) == 2
    gone = make_plan(desired(CPU).model_copy(update={"deployments": ()}), b_state, inv, facts, {"m": SHAPE})
    assert gone.changes[0].action == ["delete"] and gone.changes[0].replicas == []


# --- import ------------------------------------------------------------------------------------------------
def test_import_rebuilds_a_lost_state_and_the_next_plan_is_empty() -> None:
    h = h100x8()
    spec = "gpus: 1, replicas: {min: 2, max: 2}"
    state, facts, _ = apply_and_read(spec, State(lineage="lost"), h)
    inv, _ = world(h)
    adoption = adopt(desired(spec), inv, facts, {"m": SHAPE}, State())
    assert adoption.lineage == "lost" and adoption.skipped == []
    assert [(a.deployment, a.index, a.status, a.note) for a in adoption.adopted] == [
        ("chat", 0, "serving", ""), ("chat", 1, "serving", ""),
    ]  # fmt: skip
    rebuilt = State(lineage=adoption.lineage, deployments=adoption.deployments)
    parse_state(rebuilt.model_dump(mode="json"), "test")  # a state engine-ctl reads back
    for name, rec in rebuilt.deployments.items():
        old = state.deployments[name]
        assert [(r.unit, r.port, r.gpus, r.unit_sha256, r.argv) for r in rec.replicas] == [
            (r.unit, r.port, r.gpus, r.unit_sha256, r.argv) for r in old.replicas
        ]
        assert rec.spec_hash == old.spec_hash and rec.revision == old.revision and rec.state == "Ready"
    again = make_plan(desired(spec), rebuilt, inv, facts, {"m": SHAPE})
    assert not again.has_changes and again.drift == [] and "No changes." in plan_text(again)


def test_import_leaves_other_states_units_and_asks_when_lineages_are_mixed() -> None:
    h = cpu_host()
    _, facts_a, _ = apply_and_read(CPU, State(lineage="A"), h)
    search = CPU.replace("4096", "2048")
    docs = desired(search)
    renamed = docs.model_copy(update={"deployments": tuple(
        ld.model_copy(update={"deployment": ld.deployment.model_copy(update={"name": "search"})})
        for ld in docs.deployments
    )})  # fmt: skip
    inv, _ = world(h)
    plan_b = make_plan(renamed, State(lineage="B"), inv, facts_a, {"m": SHAPE})
    both = hosts_after(plan_b, facts_a)
    both_docs = renamed.model_copy(update={"deployments": renamed.deployments + desired(CPU).deployments})
    with pytest.raises(AdoptionError, match=r"2 different states.*--lineage"):
        adopt(both_docs, inv, both, {"m": SHAPE}, State())
    only_b = adopt(both_docs, inv, both, {"m": SHAPE}, State(), lineage="B")
    assert [a.deployment for a in only_b.adopted] == ["search"]
    assert [(s.deployment, s.why) for s in only_b.skipped] == [("chat", "owned by another state (lineage A)")]
    # nothing of these documents runs there: nothing is adopted, and the units are listed as left
    nothing = adopt(renamed.model_copy(update={"deployments": ()}), inv, both, {"m": SHAPE}, State())
    assert nothing.adopted == [] and nothing.deployments == {} and len(nothing.skipped) == 2
    # without the document of a deployment, its units are left too
    just_chat = adopt(desired(CPU), inv, both, {"m": SHAPE}, State(), lineage="A")
    assert [a.deployment for a in just_chat.adopted] == ["chat"]
    assert any("no document names deployment search" in s.why for s in just_chat.skipped)


def test_import_of_an_edited_unit_and_of_changed_documents() -> None:
    h = cpu_host()
    _, facts, first = apply_and_read(CPU, State(lineage="L"), h)
    (step,) = first.changes[0].replicas
    assert step.unit_text is not None
    edited_text = step.unit_text.replace("RestartSec=5", "RestartSec=1")
    edited = {h.host: facts[h.host].model_copy(update={"units": (unit_fact(step.unit, edited_text),)})}
    inv, _ = world(h)
    adoption = adopt(desired(CPU), inv, edited, {"m": SHAPE}, State())
    (a,) = adoption.adopted
    assert "edited by hand" in a.note
    rebuilt = State(lineage=adoption.lineage, deployments=adoption.deployments)
    repair = make_plan(desired(CPU), rebuilt, inv, edited, {"m": SHAPE})
    assert [d.kind for d in repair.drift] == ["edited"] and repair.changes[0].replicas[0].action == ["update"]
    # the documents changed since the unit was written: a new revision replaces it
    changed = adopt(desired("accelerator: cpu, context_length: 8192"), inv, facts, {"m": SHAPE}, State())
    (b,) = changed.adopted
    assert "differs from what the documents render at revision 1" in b.note
    rebuilt = State(lineage=changed.lineage, deployments=changed.deployments)
    roll = make_plan(desired("accelerator: cpu, context_length: 8192"), rebuilt, inv, facts, {"m": SHAPE})
    (c,) = roll.changes
    assert c.replaces and c.revision == 2 and c.replicas[0].old_unit == step.unit


# --- state rm and state mv ------------------------------------------------------------------------------------
def test_state_rm_and_mv_on_the_state_value() -> None:
    state, facts, _ = apply_and_read(CPU + ", replicas: {min: 2, max: 2}", State(lineage="L"), cpu_host())
    with pytest.raises(StateEditError) as rm_typo:
        forget(state, "chta")
    assert "no deployment named 'chta'" in str(rm_typo.value) and rm_typo.value.hint == "did you mean 'chat'?"
    assert forget(state, "chat").deployments == {} and "chat" in state.deployments
    moved = rename(state, "chat", "assistant")
    record = moved.deployments["assistant"]
    assert record.name == "assistant" and record.moved_from == ["chat"] and list(moved.deployments) == ["assistant"]
    parse_state(moved.model_dump(mode="json"), "test")  # its replicas' units, named after chat, are accepted
    assert "moved_from" not in json.dumps(state.model_dump(mode="json"))  # written only when set
    with pytest.raises(StateEditError, match="already has a deployment named 'assistant'"):
        rename(moved.model_copy(update={"deployments": {**moved.deployments, "chat": state.deployments["chat"]}}),
               "chat", "assistant")  # fmt: skip
    with pytest.raises(StateEditError, match="not a deployment name"):
        rename(state, "chat", "Bad_Name")
    with pytest.raises(StateEditError, match="no deployment named 'chatt'") as mv_typo:
        rename(state, "chatt", "x")
    assert mv_typo.value.hint == "did you mean 'chat'?"
    # the next plan of the renamed document replaces the old units one at a time (never destroy + create)
    docs = desired(CPU + ", replicas: {min: 2, max: 2}")
    renamed = docs.model_copy(update={"deployments": tuple(
        ld.model_copy(update={"deployment": ld.deployment.model_copy(update={"name": "assistant"})})
        for ld in docs.deployments
    )})  # fmt: skip
    inv, _ = world(*facts.values())
    plan = make_plan(renamed, moved, inv, facts, {"m": SHAPE})
    (c,) = plan.changes
    assert c.name == "assistant" and c.replaces and plan.drift == []
    assert [(s.old_unit, s.unit) for s in c.replicas] == [
        ("engine-ctl-chat-0a.service", "engine-ctl-assistant-0b.service"),
        ("engine-ctl-chat-1a.service", "engine-ctl-assistant-1b.service"),
    ]


def test_import_of_units_above_min_that_are_not_enabled_records_them_on_demand() -> None:
    """The scaling envelope: slots below `min` always on (apply enables their units), the others on demand (apply
    installs them and never enables them; the scaler starts them). Import reads it back from UnitFileState."""
    h = h100x8()
    spec = "gpus: 1, replicas: {min: 1, max: 3}"
    state, facts, _ = apply_and_read(spec, State(lineage="lost"), h)
    seen = {0: ("enabled", "active"), 1: ("disabled", "inactive"), 2: ("disabled", "active")}  # 2: the scaler's

    def as_systemd_says(u: UnitFact) -> UnitFact:
        index = u.header.replica if u.header else 0
        enabled, active = seen[index]
        return u.model_copy(update={"unit_file_state": enabled, "active_state": active})

    facts = {n: f.model_copy(update={"units": tuple(as_systemd_says(u) for u in f.units)}) for n, f in facts.items()}
    inv, _ = world(h)
    adoption = adopt(desired(spec), inv, facts, {"m": SHAPE}, State())
    rec = adoption.deployments["chat"]
    assert [(r.index, r.on_demand, r.status) for r in rec.replicas] == [
        (0, False, "serving"), (1, True, "standby"), (2, True, "serving"),
    ]  # fmt: skip
    assert [(r.index, r.on_demand) for r in rec.replicas] == [
        (r.index, r.on_demand) for r in sorted(state.deployments["chat"].replicas, key=lambda r: r.index)
    ]
    rebuilt = State(lineage=adoption.lineage, deployments=adoption.deployments)
    again = make_plan(desired(spec), rebuilt, inv, facts, {"m": SHAPE})
    assert not again.has_changes and again.drift == [], plan_text(again)
    enabled = {n: f.model_copy(update={"units": tuple(u.model_copy(update={"unit_file_state": "enabled"})
                                                      for u in f.units)}) for n, f in facts.items()}  # fmt: skip
    always = adopt(desired(spec), inv, enabled, {"m": SHAPE}, State()).deployments["chat"]
    assert [(r.index, r.on_demand, r.status) for r in always.replicas] == [
        (0, False, "serving"), (1, False, "stopped"), (2, False, "serving"),
    ]  # fmt: skip


def test_a_host_name_that_now_reaches_another_machine_refuses_the_plan_and_says_which() -> None:
    """The state records each host's /etc/machine-id at apply. Two inventory addresses swapped: each name now
    reaches the other's machine. Before, apply "stopped and removed" a replica that ran on, forgotten, and the next
    plan said "No changes" (a probe, session 17). Now nothing is applied, and the plan names the machine; a
    reinstalled host (an unknown machine-id) is accepted by --refresh-only."""
    from engine_ctl.core.record.model import HostRecord

    a, b = cpu_host("c1"), cpu_host("c2")
    state, _, first = apply_and_read(CPU, State(lineage="lineage-a"), a, b)
    assert first.host_machines == {}  # the fleet facts double has no machine-id: nothing to record
    ids = {"c1": "1" * 32, "c2": "2" * 32}
    state.hosts = {h: HostRecord(facts_fingerprint="f", machine_id=m) for h, m in ids.items()}
    same = {h.host: h.model_copy(update={"machine_id": ids[h.host]}) for h in (a, b)}
    plan = make_plan(desired(CPU), state, world(*same.values())[0], same, {"m": SHAPE})
    assert plan.refused == [] and plan.host_machines == ids
    swapped = {h.host: h.model_copy(update={"machine_id": ids["c2" if h.host == "c1" else "c1"]}) for h in (a, b)}
    plan = make_plan(desired(CPU), state, world(*swapped.values())[0], swapped, {"m": SHAPE})
    assert plan.refused[0] == (
        f"c1 is not the machine this state recorded under that name (machine-id {'2' * 12}…, recorded {'1' * 12}…): "
        "it is the machine this state knows as c2. Its address in the inventory changed, or it was reinstalled: "
        "nothing is applied. Put its address back; for the same host reinstalled, `engine-ctl apply --refresh-only` "
        "records the new machine"
    )
    assert len(plan.refused) == 2 and plan.problems[:2] == plan.refused
    new = {**same, "c1": a.model_copy(update={"machine_id": "3" * 32})}
    reinstalled = make_plan(desired(CPU), state, world(*new.values())[0], new, {"m": SHAPE})
    assert "c1 is not the machine" in reinstalled.refused[0] and "knows as" not in reinstalled.refused[0]
    refresh = make_plan(desired(CPU), state, world(*new.values())[0], new, {"m": SHAPE}, refresh_only=True)
    assert refresh.refused == [] and refresh.host_machines["c1"] == "3" * 32
