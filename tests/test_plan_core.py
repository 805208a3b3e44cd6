"""The planner on synthetic facts (recorded GPU formats): actions, strategies, drift, targets. No hosts needed."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from engine_ctl.cli.views.plan import plan_text
from engine_ctl.core.documents.inventory import Host, Inventory
from engine_ctl.core.documents.loader import load_documents
from engine_ctl.core.documents.yamlsource import parse_text
from engine_ctl.core.fit.hostfacts import HostFacts, UnitFact, parse_nvidia_smi
from engine_ctl.core.fit.modelfacts import ModelFacts
from engine_ctl.core.plan.planner import Plan, ReplicaChange, make_plan
from engine_ctl.core.record.model import DeploymentRecord, ReplicaRecord, State
from tests.fleetfacts import gpu_host, h100x8, recording

MODEL = "kind: Model\nmetadata: {name: m}\nspec: {format: gguf, path: m/m.gguf, context_length: 32768}\n"
SHAPE = ModelFacts(block_count=32, head_count=32, head_count_kv=8, embedding_length=4096, weights_bytes=5_000_000_000)


def desired(spec: str):  # type: ignore[no-untyped-def]
    docs, _ = parse_text(MODEL + "---\nmetadata: {name: chat}\nspec: {model: m, " + spec + "}\n", "d.yaml")
    return load_documents(docs).desired


def world(*facts: HostFacts) -> tuple[Inventory, dict[str, HostFacts]]:
    inv = Inventory(hosts=tuple(Host(name=f.host, address=f.host, models_dir="/srv/models") for f in facts))
    return inv, {f.host: f for f in facts}


def plan_for(spec: str, state: State, *facts: HostFacts, **kw: object) -> Plan:
    inv, by_name = world(*facts)
    return make_plan(desired(spec), state, inv, by_name, {"m": SHAPE}, **kw)  # type: ignore[arg-type]


def applied(plan: Plan, state: State, facts: dict[str, HostFacts]) -> tuple[State, dict[str, HostFacts]]:
    """What a successful apply records, and the units the hosts then have (for the next plan). Apply records
    into the state the plan was made against: its lineage (which the units' headers carry) is the plan's."""
    new = state.model_copy(deep=True, update={"lineage": plan.state_lineage})
    units: dict[str, list[UnitFact]] = {h: list(f.units) for h, f in facts.items()}
    for c in plan.changes:
        rec = new.deployments.setdefault(c.name, DeploymentRecord(name=c.name))
        rec.id = rec.id or c.deployment_id  # the ID the plan named (its units' headers carry it)
        for r in c.replicas:
            if r.action in (["delete"], ["delete", "create"], ["create", "delete"]):
                rec.replicas = [x for x in rec.replicas if x.unit != r.old_unit]
                units[r.old_host or r.host] = [u for u in units[r.old_host or r.host] if u.name != r.old_unit]
            if r.action != ["delete"]:
                rec.replicas = [x for x in rec.replicas if x.unit != r.unit] + [_record(r)]
                running = not r.on_demand or r.active  # an on-demand unit is installed, not started
                units[r.host] = [u for u in units[r.host] if u.name != r.unit] + [
                    UnitFact(name=r.unit, sha256=r.unit_sha256, active_state="active" if running else "inactive",
                             sub_state="running" if running else "dead")
                ]  # fmt: skip
        rec.revision, rec.spec, rec.model, rec.spec_hash, rec.plan = c.revision, c.spec, c.model, c.spec_hash, c.fit
        rec.state, rec.chosen = "Ready", dict(c.chosen)
    return new, {h: f.model_copy(update={"units": tuple(units[h])}) for h, f in facts.items()}


def _record(r: ReplicaChange) -> ReplicaRecord:
    return ReplicaRecord(
        index=r.index, slot=r.slot, host=r.host, unit=r.unit, port=r.port, gpus=r.gpus, gpu_indexes=r.gpu_indexes,
        unit_sha256=r.unit_sha256 or "", revision=r.revision, argv=r.argv, on_demand=r.on_demand,
        status="standby" if r.on_demand and not r.active else "serving",
    )  # fmt: skip


def test_create_then_no_op() -> None:
    h = h100x8()
    first = plan_for("gpus: 1", State(), h)
    (c,) = first.changes
    assert c.action == ["create"] and c.replicas[0].action == ["create"] and c.replicas[0].gpus
    assert first.summary() == {"add": 1, "change": 0, "destroy": 0}
    assert "Plan: 1 to add, 0 to change, 0 to destroy." in plan_text(first)
    state, facts = applied(first, State(), {h.host: h})
    again = make_plan(desired("gpus: 1"), state, world(*facts.values())[0], facts, {"m": SHAPE})
    assert not again.has_changes and again.changes[0].action == ["no-op"]


def test_only_the_replica_count_changes_in_place() -> None:
    h = h100x8()
    p1 = plan_for("gpus: 1, replicas: {min: 1, max: 3}", State(), h)
    state, facts = applied(p1, State(), {h.host: h})
    p3 = make_plan(
        desired("gpus: 1, replicas: {min: 3, max: 3}"), state, world(*facts.values())[0], facts, {"m": SHAPE}
    )
    (c,) = p3.changes
    # the two on-demand slots, installed by the first apply, become always on: started, nothing rewritten
    assert c.action == ["update"] and [(r.action, r.role) for r in c.replicas] == [(["update"], "always-on")] * 2
    assert len({g for r in state.deployments["chat"].replicas for g in r.gpus}) == 3


def test_context_change_is_a_surge_with_a_free_gpu_and_stop_then_start_without() -> None:
    h = h100x8()
    p = plan_for("gpus: 4, context_length: 4096", State(), h)
    state, facts = applied(p, State(), {h.host: h})
    roll = make_plan(desired("gpus: 4, context_length: 8192"), state, world(*facts.values())[0], facts, {"m": SHAPE})
    (c,) = roll.changes
    assert c.action == ["create", "delete"] and c.strategy == "surge"  # Terraform's create-before-destroy order
    assert c.replicas[0].action == ["create", "delete"] and c.symbol == "+/-"
    (r,) = c.replicas
    assert set(r.gpus).isdisjoint(state.deployments["chat"].replicas[0].gpus)  # the 4 other GPUs
    assert any(f.path == "spec.context_length" for f in c.field_changes)
    # with 8 GPUs per replica there is no room for a second: stop-then-start, with a warning
    p8 = plan_for("gpus: 8, context_length: 4096", State(), h)
    state8, facts8 = applied(p8, State(), {h.host: h})
    roll8 = make_plan(
        desired("gpus: 8, context_length: 8192"), state8, world(*facts8.values())[0], facts8, {"m": SHAPE}
    )
    (c8,) = roll8.changes
    assert c8.action == ["delete", "create"] and c8.replicas[0].action == ["delete", "create"] and c8.symbol == "-/+"
    assert c8.strategy == "stop-then-start" and c8.replicas[0].port == state8.deployments["chat"].replicas[0].port
    assert any("no serving replica during the change" in w for w in c8.warnings)


def test_drift_is_listed_and_repaired() -> None:
    h = h100x8()
    p = plan_for("gpus: 1", State(), h)
    state, facts = applied(p, State(), {h.host: h})
    unit = state.deployments["chat"].replicas[0].unit
    edited = facts[h.host].model_copy(
        update={
            "units": (UnitFact(name=unit, sha256="0" * 64, active_state="failed", sub_state="failed", n_restarts=4),)
        }
    )
    plan = make_plan(desired("gpus: 1"), state, world(edited)[0], {h.host: edited}, {"m": SHAPE})
    kinds = {d.kind for d in plan.drift}
    assert kinds == {"edited", "crash-looping"}
    (c,) = plan.changes
    assert c.action == ["update"] and c.replicas[0].action == ["update"]
    missing = facts[h.host].model_copy(update={"units": ()})
    plan = make_plan(desired("gpus: 1"), state, world(missing)[0], {h.host: missing}, {"m": SHAPE})
    assert [d.kind for d in plan.drift] == ["missing"]
    refresh = make_plan(
        desired("gpus: 1"), state, world(missing)[0], {h.host: missing}, {"m": SHAPE}, refresh_only=True
    )
    assert refresh.has_changes and refresh.changes[0].replicas == []


def test_unmanaged_units_are_drift_and_left_alone() -> None:
    h = h100x8().model_copy(update={"units": (UnitFact(name="engine-ctl-other-0a.service", sha256="a" * 64),)})
    plan = plan_for("gpus: 1", State(), h)
    assert [d.kind for d in plan.drift] == ["unmanaged"]
    assert all(r.unit != "engine-ctl-other-0a.service" for c in plan.changes for r in c.replicas)


def test_removed_deployment_is_destroyed_and_targets_filter() -> None:
    h = h100x8()
    p = plan_for("gpus: 1", State(), h)
    state, facts = applied(p, State(), {h.host: h})
    empty = load_documents(parse_text(MODEL, "m.yaml")[0]).desired
    gone = make_plan(empty, state, world(*facts.values())[0], facts, {})
    (c,) = gone.changes
    assert c.action == ["delete"] and gone.summary()["destroy"] == 1
    assert make_plan(empty, state, world(*facts.values())[0], facts, {}, targets=["other"]).changes == []


def test_pending_with_the_reason_per_host() -> None:
    busy = parse_nvidia_smi(recording("nvidia-smi-4xA100-one-busy.csv"))[:1]  # the GPU another process holds
    small = gpu_host("small", busy)
    plan = plan_for("gpus: 1", State(), small)
    (c,) = plan.changes
    assert c.pending_reason is not None and c.pending_reason.startswith("Waiting for a machine with")
    assert "Pending: chat:" in plan_text(plan)


def test_a_gpu_another_process_holds_is_drift() -> None:
    h = h100x8()
    p = plan_for("gpus: 1", State(), h)
    state, facts = applied(p, State(), {h.host: h})
    rec = state.deployments["chat"].replicas[0]
    held = tuple(g.model_copy(update={"memory_used_bytes": 70 * 1024**3}) if g.uuid in rec.gpus else g for g in h.gpus)
    stopped = (UnitFact(name=rec.unit, sha256=rec.unit_sha256, active_state="inactive", sub_state="dead"),)
    now = facts[h.host].model_copy(update={"gpus": held, "units": stopped})
    plan = make_plan(desired("gpus: 1"), state, world(now)[0], {h.host: now}, {"m": SHAPE})
    assert {d.kind for d in plan.drift} == {"stopped", "gpu-held"}
    assert any(rec.gpus[0] in d.detail for d in plan.drift if d.kind == "gpu-held")


def test_markdown_for_a_pull_request_marks_lines_for_diff_colouring() -> None:
    from engine_ctl.cli.views.plan import plan_markdown

    text = plan_markdown(plan_for("gpus: 1", State(), h100x8()))
    assert text.startswith(
        "### engine-ctl plan: 1 to add, 0 to change, 0 to destroy\n\nReplicas: 1 to start.\n\n> [!WARNING]\n"
    )
    assert "<details><summary><code>+</code> <b>chat</b>: will be created" in text
    assert "```diff\n+ /usr/local/bin/llama-server\n+ --model /srv/models/m/m.gguf\n" in text


def test_apply_never_prompts_without_a_terminal(tmp_path: Path) -> None:
    from tests.helpers import run

    quickstart = Path(__file__).resolve().parents[1] / "examples/quickstart"
    state = tmp_path / "state.json"
    result = run("apply", str(quickstart), "--state", str(state))
    assert result.exit_code == 1
    assert "stdin is not a terminal" in result.stderr and "--auto-approve" in result.stderr
    assert not state.exists() and not Path(str(state) + ".lock").exists()


@settings(max_examples=150, deadline=None)
@given(
    specs=st.lists(st.tuples(st.sampled_from([1, 2, 4]), st.integers(min_value=1, max_value=4)), min_size=1, max_size=5)
)
def test_placement_never_shares_a_gpu_or_a_port(specs: list[tuple[int, int]]) -> None:
    docs = MODEL + "".join(
        f"---\nmetadata: {{name: d{i}}}\nspec: {{model: m, gpus: {g}, replicas: {{min: {n}, max: {n}}}}}\n"
        for i, (g, n) in enumerate(specs)
    )
    wanted = load_documents(parse_text(docs, "d.yaml")[0]).desired
    hosts = (h100x8("h1"), h100x8("h2").model_copy(update={"gpus": tuple(
        g.model_copy(update={"uuid": g.uuid.replace("GPU-2f", "GPU-3f")}) for g in h100x8().gpus)}))  # fmt: skip
    inv, facts = world(*hosts)
    plan = make_plan(wanted, State(), inv, facts, {"m": SHAPE})
    placed = [r for c in plan.changes for r in c.replicas if r.action == ["create"]]
    gpus = [g for r in placed for g in r.gpus]
    assert len(gpus) == len(set(gpus)) <= 16
    assert len({(r.host, r.port) for r in placed}) == len(placed)
    for c, (g, n) in zip(plan.changes, specs, strict=True):
        assert all(len(r.gpus) == g for r in c.replicas)
        assert len(c.replicas) == n or c.pending_reason is not None


def _interrupted_roll(new_state: str, new_sub: str):  # type: ignore[no-untyped-def]
    """A roll killed after starting the new slot, before recording it serving; the new unit is `new_state`."""
    h = h100x8()
    p = plan_for("gpus: 1, context_length: 4096", State(), h)
    state, facts = applied(p, State(), {h.host: h})
    roll = make_plan(desired("gpus: 1, context_length: 8192"), state, world(*facts.values())[0], facts, {"m": SHAPE})
    state2, facts2 = applied(roll, state, facts)
    new = roll.changes[0].replicas[0]
    rec = state2.deployments["chat"]
    old = state.deployments["chat"].replicas[0]
    rec.replicas = [old, *[r.model_copy(update={"status": "pending"}) for r in rec.replicas if r.unit == new.unit]]
    rec.spec_hash, rec.revision = state.deployments["chat"].spec_hash, 1
    host = facts2[h.host].model_copy(update={"units": (
        UnitFact(name=old.unit, sha256=old.unit_sha256, active_state="active", sub_state="running"),
        UnitFact(name=new.unit, sha256=new.unit_sha256, active_state=new_state, sub_state=new_sub),
    )})  # fmt: skip
    again = make_plan(desired("gpus: 1, context_length: 8192"), state2, world(host)[0], {h.host: host}, {"m": SHAPE})
    return again, old, new, h


def test_after_an_interrupted_roll_the_new_slot_that_serves_is_kept_and_the_old_one_cleaned_up() -> None:
    """Killed after the new slot passed its health gate, before it was recorded serving: no needless roll."""
    again, old, new, _ = _interrupted_roll("active", "running")
    (c,) = again.changes
    assert [(r.action, r.unit, r.cleanup) for r in c.replicas] == [(["delete"], old.unit, True)]
    assert c.adopt == [new.unit]
    assert "update in place" not in plan_text(again)


def test_after_an_interrupted_roll_a_new_slot_that_never_started_is_cleaned_up_first() -> None:
    again, old, new, h = _interrupted_roll("activating", "start-post")
    (c,) = again.changes
    cleanup = [r for r in c.replicas if r.cleanup]
    assert [r.unit for r in cleanup] == [new.unit] and cleanup[0].action == ["delete"]
    (replace,) = [r for r in c.replicas if r.replaces]
    assert replace.old_unit == old.unit and replace.host == h.host
