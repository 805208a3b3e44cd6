"""Each of the planner's steps alone (engine_ctl/core/plan/deployment.py: resolve, fit, leftovers, place, shrink,
decide; diff.py; drift.py; placement's HostRanking), and the plan's and the state's file formats read back.
Synthetic facts from recorded real tool output (tests/fleetfacts.py)."""

from __future__ import annotations

import json

from engine_ctl.providers import PROVIDERS
from hypothesis import given, settings
from hypothesis import strategies as st

from engine_ctl.core.documents.inventory import Host, Inventory
from engine_ctl.core.fit.fitting import fit
from engine_ctl.core.fit.hostfacts import HostFacts, UnitFact
from engine_ctl.core.fit.placement import HostRanking, Taken, place, place_one
from engine_ctl.core.fit.runspec import FitPlan
from engine_ctl.core.model import Deployment, Model
from engine_ctl.core.plan.changes import FORMAT_VERSION, DeploymentChange, ReplicaChange
from engine_ctl.core.plan.deployment import (
    Target,
    current_replica,
    decide,
    fit_step,
    keep_chosen,
    leftovers,
    resolve,
    shrink,
)  # fmt: skip
from engine_ctl.core.plan.diff import changed_fields, spec_digest
from engine_ctl.core.plan.drift import replica_drift, unmanaged_units
from engine_ctl.core.plan.savedplan import decode_plan
from engine_ctl.core.plan.world import Allocation, Hosts
from engine_ctl.core.record.model import DeploymentRecord, ReplicaRecord, State, parse_state
from tests.fleetfacts import cpu_host, h100x8
from tests.test_plan_core import SHAPE, applied, plan_for

LLAMA = PROVIDERS["llama.cpp"]
MODEL = Model(name="m", format="gguf", path="m/m.gguf", context_length=32768)


def hosts_of(*facts: HostFacts) -> Hosts:
    inventory = Inventory(hosts=tuple(Host(name=f.host, address=f.host, models_dir="/srv/models") for f in facts))
    return Hosts.of(inventory, {f.host: f for f in facts})


def replica(index: int = 0, slot: str = "a", host: str = "gpu-h100", status: str = "serving", revision: int = 1,
            port: int = 8000) -> ReplicaRecord:  # fmt: skip
    return ReplicaRecord(index=index, slot=slot, host=host, unit=f"engine-ctl-chat-{index}{slot}.service", port=port,
                         unit_sha256="a" * 64, revision=revision, status=status)  # type: ignore[arg-type]  # fmt: skip


# --- resolve --------------------------------------------------------------------------------------------------


def test_resolve_a_new_deployment_is_revision_1_with_nothing_to_compare() -> None:
    d = Deployment(name="chat", model="m", gpus=1)
    change, sized = resolve(d, MODEL, None)
    assert (change.revision, change.old_revision, change.field_changes, sized) == (1, 0, [], d)
    assert change.spec == d and change.model == MODEL and change.spec_hash == spec_digest(d, MODEL)


def test_resolve_a_changed_field_is_a_new_revision_named_as_the_document_names_it() -> None:
    old = Deployment(name="chat", model="m", gpus=1, context_length=4096)
    record = DeploymentRecord(name="chat", revision=3, spec=old, model=MODEL, spec_hash=spec_digest(old, MODEL))
    new = old.model_copy(update={"context_length": 8192})
    change, _ = resolve(new, MODEL, record, names=lambda f: f"resources.{f}")
    assert (change.old_revision, change.revision) == (3, 4)
    assert [(c.path, c.old, c.new) for c in change.field_changes] == [("resources.context_length", 4096, 8192)]
    same, _ = resolve(old, MODEL, record)
    assert same.revision == 3 and same.field_changes == []


def test_prevent_destroy_alone_is_never_a_new_revision() -> None:
    d = Deployment(name="chat", model="m")
    assert spec_digest(d, MODEL) == spec_digest(d.model_copy(update={"prevent_destroy": True}), MODEL)
    guarded = d.model_copy(update={"prevent_destroy": True})
    assert [c.path for c in changed_fields(d, MODEL, guarded, MODEL, None)] == ["spec.prevent_destroy"]


def test_keep_chosen_keeps_gpus_and_parallel_until_the_documents_change() -> None:
    d = Deployment(name="chat", model="m")
    fitted = fit(d.model_copy(update={"gpus": 2, "parallel": 2}), MODEL, SHAPE, [h100x8()])
    assert isinstance(fitted, FitPlan)
    digest = spec_digest(d, MODEL)
    record = DeploymentRecord(name="chat", revision=2, spec=d, model=MODEL, spec_hash=digest, plan=fitted,
                              chosen={"gpus": 1})  # fmt: skip
    kept, chosen = keep_chosen(d, record, digest, 2)
    assert (kept.gpus, kept.parallel, chosen) == (2, 2, {"gpus": 1, "parallel": 2})
    again, chosen_again = keep_chosen(d, record, "another digest", 3)
    assert (again.gpus, again.parallel, chosen_again) == (None, None, {"gpus": 3, "parallel": 3})


# --- fit ------------------------------------------------------------------------------------------------------


def test_fit_step_failed_and_pending_stop_the_deployment_with_why() -> None:
    hosts = hosts_of(h100x8())
    too_long = Deployment(name="chat", model="m", context_length=65536)
    change, _ = resolve(too_long, MODEL, None)
    assert fit_step(change, too_long, MODEL, SHAPE, hosts, None) is None
    assert change.failed_reason and "takes at most 32768 tokens" in change.failed_reason
    assert change.action == ["no-op"] and "is Failed" in change.warnings[0]
    unknown = Deployment(name="chat", model="m")
    change, _ = resolve(unknown, MODEL, None)
    assert fit_step(change, unknown, MODEL, None, hosts, None) is None
    assert change.pending_reason and change.pending_reason.startswith("the fit is not known yet")
    assert change.action == ["create"]  # a new deployment, Pending


# --- leftovers and the replica that serves --------------------------------------------------------------------


def test_leftovers_of_an_interrupted_apply_are_removed_first_and_free_their_room() -> None:
    h = h100x8()
    running = replica(1, status="pending", port=8002)
    facts = h.model_copy(update={"units": (UnitFact(name=running.unit, sha256="a" * 64, active_state="active"),)})
    hosts = hosts_of(facts)
    records = [replica(0, status="removing"), replica(0, "b", status="pending", port=8001), running,
               replica(2, host="gone")]  # fmt: skip
    state = State(deployments={"chat": DeploymentRecord(name="chat", replicas=records)})
    alloc = Allocation(state, hosts.reached)
    removals, live = leftovers(records, hosts, alloc)
    assert [(r.unit, r.cleanup, r.action) for r in removals] == [
        ("engine-ctl-chat-0a.service", True, ["delete"]), ("engine-ctl-chat-0b.service", True, ["delete"])]  # fmt: skip
    assert [r.unit for r in live] == [running.unit, "engine-ctl-chat-2a.service"]
    assert alloc.taken.ports["gpu-h100"] == {8002}  # the removed ones' ports are free again


def test_current_replica_prefers_a_running_slot_then_the_newest() -> None:
    h = h100x8()
    old, new = replica(0, "a", revision=1), replica(0, "b", revision=2, status="pending", port=8001)
    stopped = hosts_of(h.model_copy(update={"units": (UnitFact(name=old.unit, active_state="active"),)}))
    assert current_replica([old, new], stopped) is old
    both = hosts_of(h.model_copy(update={"units": (UnitFact(name=old.unit, active_state="active"),
                                                   UnitFact(name=new.unit, active_state="active"))}))  # fmt: skip
    assert current_replica([old, new], both) is new
    assert current_replica([], both) is None


# --- place: HostRanking gives place()'s choice, looking at fewer hosts --------------------------------------------


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 3), st.integers(0, 7)), min_size=1, max_size=12),
    st.lists(st.integers(0, 3), max_size=4),
    st.one_of(st.none(), st.integers(0, 3)),
)
def test_place_one_chooses_what_place_chooses(
    taken: list[tuple[int, int]], spread: list[int], prefer: int | None
) -> None:
    fleet = [h100x8(f"h{i}").model_copy(update={"gpus": tuple(g.model_copy(update={"uuid": f"{g.uuid}-{i}"})
             for g in h100x8().gpus)}) for i in range(3)] + [cpu_host("c3", cores=64, memory_gib=512)]  # fmt: skip
    held = Taken()
    for host, gpu in taken:
        f = fleet[host]
        held.hold(f.host, port=8000 + gpu, gpus=[f.gpus[gpu].uuid] if f.gpus else [], cores=4, memory=8 << 30)
    per_host: dict[str, int] = {}
    for host in spread:
        per_host[fleet[host].host] = per_host.get(fleet[host].host, 0) + 1
    preferred = fleet[prefer].host if prefer is not None else None
    for d in (Deployment(name="g", model="m", gpus=2), Deployment(name="c", model="m", accelerator="cpu")):
        fitted = fit(d, MODEL, SHAPE, fleet)
        assert isinstance(fitted, FitPlan)
        ranking = HostRanking(fleet, held)
        one = place_one(d, fitted, LLAMA, ranking, per_host=per_host, prefer=preferred)
        full = place(d, fitted, LLAMA, fleet, 1, taken=held, already=per_host, prefer=preferred)
        assert one.placements == full.placements
        assert one.pending_reason == full.pending_reason
        if not one.placements:
            assert one.waiting == full.waiting


def test_the_ranking_follows_room_taken_and_freed() -> None:
    a, b = h100x8("a"), h100x8("b").model_copy(update={"gpus": tuple(
        g.model_copy(update={"uuid": g.uuid + "-b"}) for g in h100x8().gpus)})  # fmt: skip
    taken = Taken()
    ranking = HostRanking([a, b], taken)
    assert [h.host for h in ranking.in_order({}, None)] == ["a", "b"]  # equal room: inventory order
    taken.hold("a", gpus=[a.gpus[0].uuid])
    assert [h.host for h in ranking.in_order({}, None)] == ["b", "a"]  # a has one GPU fewer free
    assert [h.host for h in ranking.in_order({"b": 1}, None)] == ["a", "b"]  # fewest of the deployment first
    assert [h.host for h in ranking.in_order({}, "a")] == ["a", "b"]  # the surge's own host next
    taken.free("a", gpus=[a.gpus[0].uuid])
    assert [h.host for h in ranking.in_order({}, None)] == ["a", "b"]


# --- shrink and decide ------------------------------------------------------------------------------------------


def test_shrink_deletes_replicas_beyond_the_count_and_says_which_it_cannot_reach() -> None:
    h = h100x8()
    hosts = hosts_of(h)
    d = Deployment(name="chat", model="m", gpus=1)
    fitted = fit(d, MODEL, SHAPE, [h])
    assert isinstance(fitted, FitPlan)
    change, _ = resolve(d, MODEL, None)
    t = Target(d=d, model=MODEL, provider=LLAMA, fitted=fitted, revision=1, hosts=hosts,
               alloc=Allocation(State(), hosts.reached), no_weights={}, change=change)  # fmt: skip
    live = [replica(0), replica(1, port=8001), replica(2, host="gone")]
    shrink(t, live)
    assert [(r.unit, r.reason) for r in t.replicas] == [("engine-ctl-chat-1a.service", "replicas 3 → 1")]
    assert change.blocked == ["replica 2 on gone (gone is not in the inventory) is left as it is, at revision 1"]


def _replacing(strategy: str) -> DeploymentChange:
    step = ReplicaChange(index=0, action=["create", "delete"] if strategy == "surge" else ["delete", "create"],
                         host="h", unit="engine-ctl-chat-0b.service", slot="b", port=8000, revision=2,
                         strategy=strategy)  # type: ignore[arg-type]  # fmt: skip
    return DeploymentChange(name="chat", action=["no-op"], revision=2, spec_hash="new", replicas=[step],
                            strategy=strategy)  # type: ignore[arg-type]  # fmt: skip


def test_decide_orders_a_replacement_as_terraform_does() -> None:
    record = DeploymentRecord(name="chat", revision=1, spec_hash="old", state="Ready")
    d = Deployment(name="chat", model="m")
    surge = _replacing("surge")
    decide(surge, record, d, None)
    assert surge.action == ["create", "delete"] and surge.symbol == "+/-" and surge.replaces
    stop_start = _replacing("stop-then-start")
    decide(stop_start, record, d, None)
    assert stop_start.action == ["delete", "create"] and stop_start.symbol == "-/+"
    fresh = DeploymentChange(name="chat", action=["no-op"], spec_hash="x")
    decide(fresh, None, d, None)
    assert fresh.action == ["create"] and fresh.reasons == ["new deployment"]


# --- drift ------------------------------------------------------------------------------------------------------


def test_replica_drift_names_what_changed_on_the_host() -> None:
    h = h100x8()
    r = replica(0)
    assert [x.kind for x in replica_drift("chat", r, None, h)] == ["missing"]
    edited = UnitFact(name=r.unit, sha256="b" * 64, active_state="active")
    assert [x.kind for x in replica_drift("chat", r, edited, h)] == ["edited"]
    looping = UnitFact(name=r.unit, sha256="a" * 64, active_state="failed", sub_state="failed", n_restarts=3)
    (found,) = replica_drift("chat", r, looping, h)
    assert found.kind == "crash-looping" and "after 3 restart(s)" in found.detail
    assert replica_drift("chat", r, UnitFact(name=r.unit, sha256="a" * 64, active_state="active"), h) == []
    stray = h.model_copy(update={"units": (UnitFact(name="engine-ctl-other-0a.service"),)})
    (unmanaged,) = unmanaged_units(State(), {h.host: stray})
    assert unmanaged.kind == "unmanaged" and unmanaged.deployment is None


# --- file formats -----------------------------------------------------------------------------------------------


def _format_1(plan_json: str) -> str:
    """A plan as format 1 wrote it: every replacement ["delete", "create"] with its strategy beside it, {} for a
    spec or model it did not have, the context as a plain mapping."""
    raw = json.loads(plan_json)
    raw["format_version"] = 1
    for change in raw["changes"]:
        for step in [change, *change["replicas"]]:
            if step["action"] in (["create", "delete"], ["delete", "create"]):
                step["action"] = ["delete", "create"]
        change["spec"] = change["spec"] or {}
        change["model"] = change["model"] or {}
        if change["spec"]:
            del change["spec"]["prevent_destroy"]
    raw["context"] = {"documents": ["/srv/docs/chat.yaml"], "inventory": "/srv/hosts.yaml", "state": "/srv/s.json",
                      "model_paths": {"gpu-h100": ["/srv/models/m/m.gguf"]}}  # fmt: skip
    return json.dumps(raw)


def test_a_format_1_plan_reads_as_format_2_with_the_surge_in_create_before_destroy_order() -> None:
    h = h100x8()
    first = plan_for("gpus: 4, context_length: 4096", State(), h)
    state, facts = applied(first, State(), {h.host: h})
    roll = plan_for("gpus: 4, context_length: 8192", state, *facts.values())
    assert roll.changes[0].action == ["create", "delete"]
    old = decode_plan(_format_1(roll.model_dump_json()))
    assert old is not None and old.format_version == FORMAT_VERSION == 2
    (c,) = old.changes
    assert c.action == ["create", "delete"] and c.replicas[0].action == ["create", "delete"]
    assert c.spec == roll.changes[0].spec and c.fit == roll.changes[0].fit  # typed, prevent_destroy defaulted
    assert old.context.inventory == "/srv/hosts.yaml" and old.context.model_paths["gpu-h100"]
    stop = plan_for("gpus: 8, context_length: 4096", State(), h)
    state8, facts8 = applied(stop, State(), {h.host: h})
    roll8 = plan_for("gpus: 8, context_length: 8192", state8, *facts8.values())
    old8 = decode_plan(_format_1(roll8.model_dump_json()))
    assert old8 is not None and old8.changes[0].action == ["delete", "create"]  # stop-then-start stays


def test_a_state_written_before_typed_records_reads_back_and_plans_no_change() -> None:
    """The state as engine-ctl wrote it with dict records: spec without prevent_destroy, {} for a record with no
    spec, and a field this engine-ctl does not know (left out; the spec_hash keeps the revision)."""
    h = h100x8()
    first = plan_for("gpus: 1", State(), h)
    state, facts = applied(first, State(), {h.host: h})
    raw = json.loads(state.model_dump_json())
    record = raw["deployments"]["chat"]
    del record["spec"]["prevent_destroy"]
    record["spec"]["a_field_from_another_version"] = True
    raw["deployments"]["empty"] = {"name": "empty", "revision": 0, "spec": {}, "model": {}, "spec_hash": "",
                                   "plan": None, "state": "Pending", "replicas": []}  # fmt: skip
    read = parse_state(json.loads(json.dumps(raw)), "old.json")
    assert read.deployments["chat"].spec == state.deployments["chat"].spec
    assert read.deployments["chat"].plan == state.deployments["chat"].plan
    assert read.deployments["empty"].spec is None and read.deployments["empty"].model is None
    del read.deployments["empty"]
    again = plan_for("gpus: 1", read, *facts.values())
    assert not again.has_changes and again.changes[0].revision == 1


def test_fit_step_says_when_the_weights_and_spec_architecture_disagree() -> None:
    from engine_ctl.core.model import Architecture

    stated = MODEL.model_copy(update={"architecture": Architecture(layers=2, kv_heads=2, head_dim=16)})
    d = Deployment(name="chat", model="m", gpus=1, context_length=4096)
    change, _ = resolve(d, stated, None)
    assert fit_step(change, d, stated, SHAPE, hosts_of(h100x8()), None) is not None
    assert change.warnings == [
        "model m: its weights give 32 layers, 8 KV heads, head size 128, spec.architecture says 2 layers, 2 KV heads, "
        "head size 16; the KV cache is sized from the weights"
    ]
