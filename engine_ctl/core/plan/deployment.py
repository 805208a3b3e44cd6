"""Planning one deployment, in named steps, each a pure function that can be tested alone:

resolve (documents + record -> revision, field changes, kept choices) → fit (one replica's needs, or why it
is Pending or Failed) → leftovers (what an interrupted apply left) → place (each replica: keep, repair, create
or replace, rendering its unit) → shrink (replicas beyond the count) → warn → decide (the deployment's action).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from engine_ctl.core.documents.inventory import Host
from engine_ctl.core.fit.fitting import FitResult, FitUnknown, fit, host_decides, shape_disagreement
from engine_ctl.core.fit.hostfacts import HostFacts
from engine_ctl.core.fit.modelfacts import ModelFacts
from engine_ctl.core.fit.placement import crowds, group_reason, place_group, place_one, reserved_note
from engine_ctl.core.fit.runspec import FitPlan, Placement
from engine_ctl.core.fit.startup import same_engine
from engine_ctl.core.model import Deployment, Model
from engine_ctl.core.names import unit_name
from engine_ctl.core.plan.changes import (
    CREATE,
    NO_OP,
    STOP_START,
    SURGE,
    UPDATE,
    Action,
    DeploymentChange,
    Drift,
    FieldChange,
    MemberStep,
    ReplicaChange,
    Strategy,
    replace_actions,
)  # fmt: skip
from engine_ctl.core.plan.decisions import decisions_refusals
from engine_ctl.core.plan.diff import Names, changed_fields, spec_digest
from engine_ctl.core.plan.drift import (
    checkpoint_drift,
    guard_drift,
    launch_drift,
    replica_drift,
    replica_key_drift,
    unit_written_drift,
    weights_written_drift,
)
from engine_ctl.core.plan.engines import member_engine_drift_detail
from engine_ctl.core.plan.grouplinks import link_problem
from engine_ctl.core.plan.ownership import as_recorded, is_foreign
from engine_ctl.core.plan.refresh import ACCEPTED_EDIT
from engine_ctl.core.plan.world import Allocation, Hosts, recorded_placement
from engine_ctl.core.record.model import DeploymentRecord, ReplicaRecord
from engine_ctl.core.render.guard import guard_refusals, needs_guard, residency_of
from engine_ctl.core.render.units import (
    RenderedUnit,
    gateway_allow,
    group_of,
    model_path_on_host,
    render_member,
    render_unit,
    replica_run,
)
from engine_ctl.core.sizes import gib_down, gib_up
from engine_ctl.core.unitsetup import shared_drop_in_warning
from engine_ctl.providers import Provider
from engine_ctl.providers.base import at_least_2gib


@dataclass
class Target:
    """One deployment as its replicas are planned: what is fixed (the documents with kept choices, the fit, the
    revision, the replica count) and what the steps find (replica changes, drift, strategies, on_host)."""

    d: Deployment
    model: Model
    provider: Provider
    fitted: FitPlan
    revision: int
    hosts: Hosts
    alloc: Allocation
    no_weights: dict[str, str]
    change: DeploymentChange
    replicas: list[ReplicaChange] = field(default_factory=list)
    drift: list[Drift] = field(default_factory=list)
    strategies: set[Strategy] = field(default_factory=set)
    on_host: dict[str, int] = field(default_factory=dict)
    """Replicas of this deployment (below the count) on each host, as placement spreads them."""
    lineage: str | None = None
    """The owning state's lineage, written into each unit's header."""
    deployment_id: str | None = None
    """The deployment's ID (recorded, or the one its first apply records: changes.deployment_id_for), in each unit's
    header."""
    keep_stopped: bool = False
    """Stopped by an operator, its stop done (operator.keeps_stopped): a unit of it that runs is `unstopped`."""
    parked: bool = False
    """Parked by an operator: apply writes its units again while their engines sleep on (held rewrites), so a
    unit file newer than its engine is engine-ctl's own doing, not drift."""
    always_pending: bool = False
    """An always-on replica could not be placed (the change is Pending): no on-demand slot is placed."""
    placed: dict[int, Placement] = field(default_factory=dict)
    """Each slot's placement after the plan (new, replaced or kept): the scaling envelope."""
    live: list[ReplicaRecord] = field(default_factory=list)
    exclusive: frozenset[str] = frozenset()
    """GPUs the always-on replicas of every deployment hold (known once they are all placed): an on-demand slot
    never shares them."""

    @property
    def nodes(self) -> int:
        return self.d.node_count

    def place(self, **kw: object) -> FitResult:
        """place_one (its keywords), and for a replica group (spec.nodes > 1) its workers on other hosts. The fit
        sized each machine of a group (fitting's docstring): the head and every worker take what it says."""
        result = place_one(self.d, self.fitted, self.provider, self.alloc.ranking, **kw)  # type: ignore[arg-type]
        if self.nodes == 1:
            return result
        if not result.placements:  # no head: what each machine of the group needs
            why = group_reason(result.pending_reason, self.nodes) if result.pending_reason else None
            return result.model_copy(update={"pending_reason": why})
        labels = {name: h.labels for name, h in self.hosts.inventory.items()}
        group = place_group(self.nodes, result.placements[0], self.fitted, self.provider, self.hosts.reached,
                            self.alloc.taken, labels, self.no_weights)  # fmt: skip
        if isinstance(group, str):
            return FitResult(plan=result.plan, pending_reason=group, waiting=result.waiting)
        return FitResult(plan=result.plan, placements=(group,), waiting=result.waiting)

    @property
    def count(self) -> int:
        """The slots: replicas up to `max`, each placed (seed 000: replicas.max, at least 1)."""
        return max(self.d.replicas_max, self.d.replicas_min, 1)

    @property
    def always(self) -> int:
        """The always-on replicas: slots below `min` (none with min: 0); the others are on demand."""
        return min(self.d.replicas_min, self.count)

    def on_demand(self, index: int) -> bool:
        return index >= self.always

    def render(self, p: Placement, revision: int, slot: str, owner: str | None = None) -> RenderedUnit:
        """The unit at `p`, with `owner` as the lineage in its header (the state's when not given)."""
        lineage = self.lineage if owner is None else owner
        return render_replica(self.d, self.model, self.provider, self.fitted, p, self.hosts.inventory, revision, slot,
                              lineage, self.deployment_id)  # fmt: skip

    def render_recorded(self, p: Placement, current: ReplicaRecord) -> RenderedUnit:
        """A recorded replica's unit as this state renders it (ownership.as_recorded: a unit written before
        lineage or ID headers keeps its text)."""

        def render(owner: str | None, ident: str | None) -> RenderedUnit:
            return render_replica(self.d, self.model, self.provider, self.fitted, p, self.hosts.inventory,
                                  current.revision, current.slot, owner, ident)  # fmt: skip

        return as_recorded(render, self.lineage, current.unit_sha256, self.deployment_id)


# --- resolve ------------------------------------------------------------------------------------------------


def resolve(
    d: Deployment, model: Model, record: DeploymentRecord | None, names: Names | None = None
) -> tuple[DeploymentChange, Deployment]:
    """The change's skeleton (revision, specification, field changes, kept choices) and the deployment with the
    choices kept from its record (keep_chosen)."""
    digest = spec_digest(d, model)
    old_revision = record.revision if record else 0
    revision = old_revision if record and record.spec_hash == digest else old_revision + 1
    change = DeploymentChange(
        name=d.name, action=list(NO_OP), old_revision=old_revision, revision=revision, spec=d, model=model,
        spec_hash=digest,
    )  # fmt: skip
    if record is not None and record.spec_hash != digest:
        change.field_changes = changed_fields(record.spec, record.model, d, model, names)
    sized, change.chosen = keep_chosen(d, record, digest, revision)
    return change, sized


def keep_chosen(
    d: Deployment, record: DeploymentRecord | None, digest: str, revision: int
) -> tuple[Deployment, dict[str, int]]:
    """gpus and parallel, when the documents leave them out, are chosen once and kept with the revision ("so it
    does not move as machines come and go"): chosen again only when the deployment's documents change."""
    open_fields = [f for f in ("gpus", "parallel") if getattr(d, f) is None]
    if d.accelerator == "host":  # the flat form: the host decides, once per revision
        open_fields.insert(0, "accelerator")
    if d.accelerator == "cpu" and "gpus" in open_fields:
        open_fields.remove("gpus")
    if record is None or record.spec_hash != digest or record.plan is None:
        return d, {f: revision for f in open_fields}
    kept = {f: getattr(record.plan, f) for f in open_fields}
    if kept.get("accelerator") == "cpu":
        kept.pop("gpus", None)
    return d.model_copy(update=kept), {f: record.chosen.get(f, record.revision) for f in kept}


# --- fit ----------------------------------------------------------------------------------------------------


def fit_step(
    change: DeploymentChange, d: Deployment, model: Model, model_facts: ModelFacts | None, hosts: Hosts,
    record: DeploymentRecord | None, names: Names | None = None, flat: bool = False,
) -> FitPlan | None:  # fmt: skip
    """One replica's fit, recorded in the change; None when there is none (the change then says Failed, or
    Pending and why), and nothing more is planned for the deployment. `flat`: a flat-form document (seed 003's
    memory margin)."""
    gone = weights_gone(model, hosts, record)
    if gone:
        change.failed_reason = gone
        change.warnings.append(f"{d.name} is Failed: {gone}; its running replicas are left as they are")
        return None
    fitted = fit(d, model, model_facts, hosts.reached, names, hosts, flat=flat)
    if isinstance(fitted, str):
        change.failed_reason = fitted
        change.warnings.append(f"{d.name} is Failed: {fitted}; its running replicas are left as they are")
        return None
    if isinstance(fitted, FitUnknown):  # Pending: nothing to size a replica from yet
        change.pending_reason = fitted.reason
        if model_facts is None:  # the files are there but not usable: say which, where and why
            change.pending_reason, change.waiting = unusable_weights(model, hosts) or (fitted.reason, {})
        change.action = list(CREATE) if record is None else change.action
        return None
    change.fit, change.startup_provenance = with_measured_startup(fitted, record, change.revision, d, model)
    if change.startup_provenance == "default":
        change.fit, change.whole_host = capped_to(change.fit, hosts.most_available(d.host))
        if change.whole_host:
            change.warnings.append(whole_host_warning(d.name, fitted, change.fit))
    fitted = change.fit
    disagreement = shape_disagreement(model, model_facts)
    if disagreement:  # the weights' own metadata sized it; say that the Model document says otherwise
        change.warnings.append(disagreement)
    return fitted


def with_measured_startup(
    fitted: FitPlan,
    record: DeploymentRecord | None,
    revision: int,
    d: Deployment | None = None,
    model: Model | None = None,
) -> tuple[FitPlan, Literal["measured", "default"]]:
    """The fit with the start-up peak its revision's first start measured set aside instead of the estimate
    (host RAM, never below seed 000's floor of 2 GiB; and each GPU's peak), and where the figures came from. A new
    revision that changes only the instance count (same_engine) keeps the measurement. A replica group keeps the
    fit: its start is measured on its head only, which need not hold a worker's share (a CPU head holds
    no layers), and every member takes the one figure."""
    startup = record.startup if record is not None else None
    if record is None or startup is None or startup.host_peak_bytes is None or (d is not None and d.node_count > 1):
        return fitted, "default"
    kept = startup.revision == record.revision and same_engine(record.spec, record.model, d, model)
    if startup.revision != revision and not kept:
        return fitted, "default"
    update: dict[str, int] = {"memory_bytes": at_least_2gib(startup.host_peak_bytes)}  # the seed's floor holds
    if startup.device_peak_bytes:
        update["min_gpu_memory_bytes"] = max(startup.device_peak_bytes.values())
    return fitted.model_copy(update=update), "measured"


def whole_host(fitted: FitPlan, hosts: list[HostFacts]) -> tuple[FitPlan, bool]:
    """Before a first start has measured it: an estimated start-up peak (host memory) above what every host can
    give (its memory available) is set to the most one host gives, so that its first start runs alone there and
    sets aside all of it (whole_host). Unchanged when some host can give it, or none was reached."""
    return capped_to(fitted, max((h.memory.available_bytes for h in hosts), default=0))


def capped_to(fitted: FitPlan, limit: int) -> tuple[FitPlan, bool]:
    """whole_host with the most one host gives known (Hosts.most_available: asked once per plan, not once per
    deployment over every host). Never below what the weights themselves take in host memory (a CPU replica
    holds them all): a host that cannot hold them is no whole host for it, and the replica waits (Pending) for a
    machine with the memory its plan needs."""
    resident = fitted.weights_bytes if fitted.accelerator == "cpu" else 0
    if not limit or fitted.memory_bytes <= limit or limit < resident:
        return fitted, False
    return fitted.model_copy(update={"memory_bytes": limit}), True


def whole_host_warning(name: str, estimated: FitPlan, capped: FitPlan) -> str:
    return (f"{name}: its estimated start-up peak ({gib_up(estimated.memory_bytes)} of host memory) is above what "
            f"any host can give; its first start runs alone on the host with the most ({gib_down(capped.memory_bytes)}"
            ") and sets aside all of it (whole_host), and the measured peak is set aside after it")  # fmt: skip


def weights_missing(model: Model, hosts: Hosts) -> dict[str, str]:
    """host -> why a replica waits there: the model's weights are missing, or not a valid file (the facts'
    model_problems). No replica is placed on such a host (seed: Pending, waiting for the weights)."""
    out = {}
    for h in hosts.lacking_weights:
        path = model_path_on_host(model, hosts.inventory[h.host])
        if path in h.model_problems and not fetched_at_apply(model, h.model_problems[path]):
            out[h.host] = f"Waiting for the weights of {model.name} at {path} ({h.model_problems[path]})"
    return out


def weights_gone(model: Model, hosts: Hosts, record: DeploymentRecord | None) -> str | None:
    """Seed 000's Failed, "the model is gone": the weights a recorded revision ran from, at the same path, are on
    none of the hosts reached (not found on each), and no download brings them back (a path, not hf:). A first
    deployment whose weights are not there yet waits for them (Pending) instead."""
    ran = record is not None and record.replicas and record.model is not None and record.model.path == model.path
    if not ran or model.hf is not None or not hosts.reached:
        return None
    paths = {h.host: model_path_on_host(model, hosts.inventory[h.host]) for h in hosts.reached}
    if any(h.model_problems.get(paths[h.host]) != "not found" for h in hosts.reached):
        return None
    where = ", ".join(f"{paths[h.host]} on {h.host}" for h in hosts.reached)
    return (f"the model is gone: the weights of {model.name} are on no reachable host ({where}: not found); put them "
            "back, or point the model's path at where they are")  # fmt: skip


WRITABLE = "is writable by other users"
"""The facts' model problem for a model whose directory or file others may write (seed 003 refuses it)."""


def unusable_weights(model: Model, hosts: Hosts) -> tuple[str, dict[str, str]] | None:
    """Why a model's files, present on the reached hosts, cannot be used (not a valid file, writable by others):
    the reason naming each file, its hosts and the fault, and each host's own; None when no host has such a file
    (the weights are simply not there: fetched at apply, or waited for)."""
    found: dict[tuple[str, str], list[str]] = {}
    waiting: dict[str, str] = {}
    for h in hosts.lacking_weights:
        path = model_path_on_host(model, hosts.inventory[h.host])
        problem = h.model_problems.get(path)
        if problem is None or problem == "not found":
            continue
        found.setdefault((path, problem), []).append(h.host)
        waiting[h.host] = f"{path} is not usable: {problem}"
    if not found:
        return None
    said = "; ".join(f"{path} on {', '.join(on)}: {problem}" for (path, problem), on in sorted(found.items()))
    todo = "replace the file, or point the model's path at a valid one"
    if all(WRITABLE in problem for _, problem in found):  # B41: the files are there; who may write them is the fault
        todo = "remove the other users' write access, or point the model's path at files only their owner may write"
    return f"the weights of {model.name} are not usable on any reachable host ({said}); {todo}", waiting


# --- leftovers ----------------------------------------------------------------------------------------------


def fetched_at_apply(model: Model, problem: str) -> bool:
    """An hf: model's weights missing on a host are fetched there by apply: a replica may be placed there."""
    return model.hf is not None and problem == "not found"


def leftovers(
    records: list[ReplicaRecord], hosts: Hosts, alloc: Allocation
) -> tuple[list[ReplicaChange], list[ReplicaRecord]]:
    """What an interrupted apply left (units being removed, pending slots whose unit does not run): removed
    first, their room freed. Returns those removals and the replicas that live on."""
    removals: list[ReplicaChange] = []
    live: list[ReplicaRecord] = []
    for r in records:
        reached = r.host in hosts.facts
        if reached and r.status == "removing":
            removals.append(deletion(r, "left by an interrupted apply (was being removed)", cleanup=True))
            alloc.release(r)
        elif reached and r.status == "pending" and not hosts.running(r.host, r.unit):
            removals.append(deletion(r, "left by an interrupted apply (never became ready)", cleanup=True))
            alloc.release(r)
        else:
            live.append(r)
    return removals, live


def current_replica(candidates: list[ReplicaRecord], hosts: Hosts) -> ReplicaRecord | None:
    """The record that serves one replica index: a running one first, then the newest, then serving. An active
    unit has passed its health gate (ExecStartPost), so a running newer slot wins: after an interrupted roll it
    is kept, and the older one is the leftover."""
    if not candidates:
        return None
    return max(candidates, key=lambda r: (int(hosts.running(r.host, r.unit)), r.revision, int(r.status == "serving")))


# --- place --------------------------------------------------------------------------------------------------


def count_on_host(t: Target, live: list[ReplicaRecord]) -> None:
    """The deployment's recorded slots on each host (placement spreads them)."""
    for r in live:
        if r.index < t.count:
            t.on_host[r.host] = t.on_host.get(r.host, 0) + 1


def place_replicas(t: Target, live: list[ReplicaRecord], indexes: range) -> int | None:
    """Each replica index of `indexes`: created where there is none, kept (or repaired where it drifted), or
    replaced when its unit's content changes. Stops at the first replica that cannot be placed (Pending), and
    returns its index (None: all placed)."""
    by_index: dict[int, list[ReplicaRecord]] = {}
    for r in live:
        by_index.setdefault(r.index, []).append(r)
    for index in indexes:
        candidates = by_index.get(index, [])
        current = current_replica(candidates, t.hosts)
        for extra in (r for r in candidates if r is not current):
            why = "a second slot of this replica (left by an interrupted roll)"
            t.replicas.append(deletion(extra, why, cleanup=True))
            t.alloc.release(extra)
        if current is None:
            placed = create_replica(t, index)
        elif current.host not in t.hosts.facts:
            t.change.blocked.append(out_of_reach(current, t.hosts))
            placed = True
        else:
            if current.status == "pending" or (
                current.status == "starting" and t.hosts.running(current.host, current.unit)
            ):
                t.change.adopt.append(current.unit)  # it runs: it passed its health gate (apply cut off, or a start)
            placed = keep_replica(t, current) or replace_replica(t, current, index)
        if not placed:
            return index
    return None


def create_replica(t: Target, index: int) -> bool:
    """A new replica where placement puts it; False (the change Pending, and why) when there is no room."""
    result = t.place(per_host=t.on_host, no_weights=t.no_weights, index=index,
                     reserved=None if t.on_demand(index) else t.alloc.reserved)  # fmt: skip
    if not result.placements:
        t.change.pending_reason, t.change.waiting = result.pending_reason, result.waiting
        return False
    p = result.placements[0]
    t.alloc.take(p)
    for host in p.hosts:
        t.on_host[host] = t.on_host.get(host, 0) + 1
    t.placed[index] = p
    why = "new replica, on demand: installed, not started" if t.on_demand(index) else "new replica"
    why += reserved_note(result)
    rc = replica_change(list(CREATE), t.render(p, t.revision, "a"), t.revision, p, reason=why)
    rc.on_demand = t.on_demand(index)
    if written_over(t, rc, index):
        return True
    t.replicas.append(rc)
    return True


def written_over(t: Target, rc: ReplicaChange, index: int) -> bool:
    """True (the change blocked, and why) where a unit the change writes is on its host already, of this lineage,
    and not the state's there: an older copy of the state, or an inventory name that now reaches another machine
    (its addresses swapped). `systemctl start` of a unit that runs does nothing, so apply would call the old engine
    the new one. Another lineage's is ownership.hold_back's to report."""
    recorded = {(r.host, r.unit) for r in t.live} | {(m.host, m.unit) for r in t.live for m in r.members}
    recorded |= {(r.host, r.unit) for r in t.replicas if r.cleanup}  # an interrupted roll's slot, removed first
    there = [
        (h, u)
        for h, u in rc.units
        if (f := t.hosts.unit(h, u)) is not None and not is_foreign(f, t.lineage or "") and (h, u) not in recorded
    ]
    if not there:
        return False
    host, unit = there[0]
    t.change.blocked.append(f"replica {index} would be {unit} on {host}, which is there already and not in this state "
                            f"on {host} (an older copy of the state or another checkout's recorded it, or the "
                            f"inventory's address for {host} now reaches another machine): nothing is written over "
                            "it; `engine-ctl import` adopts it, or remove it")  # fmt: skip
    return True


def keep_replica(t: Target, current: ReplicaRecord) -> bool:
    """True when the replica's unit, rendered where it is, is what the host has: kept, or repaired in place
    where it drifted (edited, stopped, crash-looping). False: its content changes (replace_replica)."""
    facts = t.hosts.facts[current.host]
    same_place = recorded_placement(current, facts, t.fitted, t.hosts.facts)
    moving = t.d.host not in (None, current.host)  # spec.host changed: a replacement onto the new host
    if same_place is None or len(same_place.gpus) != t.fitted.gpus or moving or displaced(t, current):
        return False
    if len(same_place.members) != t.nodes - 1:  # spec.nodes changed: a new group
        return False
    if spread(t, current):
        return False
    unit_now = t.render_recorded(same_place, current)
    if unit_now.sha256 != current.unit_sha256:
        return False
    t.placed[current.index] = same_place
    on_demand = t.on_demand(current.index)
    seen = current.model_copy(update={"on_demand": True}) if on_demand else current  # its activity: not drift
    unit = t.hosts.unit(current.host, current.unit)
    found = replica_drift(t.d.name, seen, unit, facts)
    found += guard_drift(t.d.name, seen, unit_now.text, facts, t.parked)
    entry = t.hosts.inventory.get(current.host)
    weights = checkpoint_drift(t.d.name, current, t.model, entry, facts)
    found += weights or weights_written_drift(t.d.name, current, t.model, entry, facts, unit)
    found += group_drift(t, current)
    found += replica_key_drift(t.d.name, t.provider, current, facts, t.hosts.key_sent)
    found += launch_drift(t.d.name, t.provider, current, unit)
    found += [] if t.parked else unit_written_drift(t.d.name, current, unit)
    found += unstopped_drift(t, current) if t.keep_stopped else []
    t.drift.extend(found)
    taken = next((f for f in found if f.kind == "port-taken"), None)
    if taken is not None:  # a start would fail, or its health gate pass on that process: left as it is
        t.change.blocked.append(f"replica {current.index} cannot start: {taken.detail}")
        return True
    if found:
        why = "; ".join(f.detail for f in found)
        rc = replica_change(list(UPDATE), unit_now, current.revision, same_place, reason=why)
        if all(f.kind == "disabled" for f in found):  # enabled (and started unless it runs): nothing restarts
            rc.role = "always-on"
    elif current.on_demand != on_demand:
        rc = role_change(t, unit_now, current, same_place)
    else:
        return True
    rc.on_demand, rc.active = on_demand, on_demand and t.hosts.running(current.host, current.unit)
    t.replicas.append(rc)
    return True


RUNNING = ("active", "activating", "reloading")


def unstopped_drift(t: Target, current: ReplicaRecord) -> list[Drift]:
    """The units of a replica (a group's workers too) of a deployment an operator stopped that run again, started
    outside engine-ctl: apply stops them again (written again, disabled and stopped)."""
    out = []
    for host, unit in ((current.host, current.unit), *((m.host, m.unit) for m in current.members)):
        fact = t.hosts.unit(host, unit)
        if fact is not None and fact.active_state in RUNNING:
            out.append(Drift(host=host, unit=unit, deployment=t.d.name, kind="unstopped",
                             detail=f"{unit} runs on {host} though {t.d.name} is stopped by an operator (started "
                             "outside engine-ctl): apply stops it again"))  # fmt: skip
        elif fact is not None and fact.unit_file_state == "enabled":  # `systemctl enable`: it starts at boot
            out.append(Drift(host=host, unit=unit, deployment=t.d.name, kind="unstopped",
                             detail=f"{unit} is enabled on {host} though {t.d.name} is stopped by an operator: it "
                             "would start at the next boot; apply disables it again"))  # fmt: skip
    return out


def displaced(t: Target, current: ReplicaRecord) -> bool:
    """A recorded replica that must be placed again: an always-on one whose GPUs one of a higher priority took
    (two on-demand slots that both became always-on), or an on-demand one whose GPUs an always-on replica took."""
    if current.unit in t.alloc.displaced:
        return True
    return t.on_demand(current.index) and bool(set(current.gpus) & t.exclusive)


def role_change(t: Target, unit: RenderedUnit, current: ReplicaRecord, p: Placement) -> ReplicaChange:
    """`min` moved past this slot: it becomes always on (enabled, and started unless it runs) or on demand
    (disabled, left as it is). Nothing is rewritten or restarted."""
    if t.on_demand(current.index):
        why = "now on demand: disabled, left running if it runs (the scaler stops it when idle)"
    else:
        why = "now always on: enabled, and started unless the scaler already runs it"
    rc = replica_change(list(UPDATE), unit, current.revision, p, reason=why)
    rc.role = "on-demand" if t.on_demand(current.index) else "always-on"
    return rc


def replace_replica(t: Target, current: ReplicaRecord, index: int) -> bool:
    """A rolling replacement into the other slot: a surge (create, then delete) where there is room for both,
    else stop-then-start (delete, then create) on its host. False (Pending) when neither has room."""
    placed = roll_placement(t, current, index)
    if placed is None:
        return False
    p, strategy = placed
    t.alloc.take(p)
    t.placed[index] = p
    if p.hosts != current.hosts:
        for host in current.hosts:
            t.on_host[host] = t.on_host.get(host, 1) - 1
        for host in p.hosts:
            t.on_host[host] = t.on_host.get(host, 0) + 1
    t.strategies.add(strategy)
    why = replace_reason(t, current)
    rc = replica_change(replace_actions(strategy), t.render(p, t.revision, other_slot(current.slot)), t.revision, p,
                        reason=why)  # fmt: skip
    if written_over(t, rc, index):
        return True
    rc.old_unit, rc.old_host, rc.old_slot, rc.old_argv = current.unit, current.host, current.slot, current.argv
    rc.old_members = member_steps_of(current)
    rc.strategy = strategy
    rc.on_demand = t.on_demand(index)
    rc.active = rc.on_demand and t.hosts.running(current.host, current.unit)
    if rc.on_demand:
        rc.reason += "; on demand: rolled if the scaler runs it, else only installed"
    t.replicas.append(rc)
    return True


def roll_placement(t: Target, current: ReplicaRecord, index: int) -> tuple[Placement, Strategy] | None:
    """Where a replacement goes: a surge where there is room for both, unless that puts it beside more replicas of
    the deployment than its own host keeps (fewest per host holds through a roll: placement.crowds), where a
    stop-then-start on its host is taken instead; else stop-then-start. None (Pending) when neither has room."""
    moving = t.d.host not in (None, current.host)
    others = {h: n - (1 if h == current.host else 0) for h, n in t.on_host.items()}
    reserved = None if t.on_demand(index) else t.alloc.reserved
    surge = t.place(per_host=others, prefer=current.host, no_weights=t.no_weights, reserved=reserved)
    if surge.placements and (moving or not crowds(others, surge.placements[0].host, current.host)):
        return surge.placements[0].model_copy(update={"index": index}), "surge"
    t.alloc.release(current)
    stop_start = t.place(no_weights=t.no_weights, within=None if moving else current.host, reserved=reserved)
    if stop_start.placements:
        kept = {} if moving else {"port": current.port}
        return stop_start.placements[0].model_copy(update={"index": index, **kept}), "stop-then-start"
    facts = t.hosts.facts[current.host]
    t.alloc.take(recorded_placement(current, facts, t.fitted, t.hosts.facts)
                 or Placement(index=index, host=current.host, port=current.port))  # fmt: skip
    if surge.placements:  # no room on its own host after all: the surge, though it crowds
        return surge.placements[0].model_copy(update={"index": index}), "surge"
    t.change.pending_reason, t.change.waiting = stop_start.pending_reason, stop_start.waiting
    return None


def spread(t: Target, current: ReplicaRecord) -> bool:
    """An always-on replica on a host with 2 or more of the deployment's while a host with at least 2 fewer has
    room for it (a host full or out of reach when they were placed, room since): it moves there (a surge), and
    the plan says so (Allocation.moves). Placement's rule, fewest replicas of a deployment per host, restored."""
    here = t.on_host.get(current.host, 0)
    if t.d.host is not None or t.on_demand(current.index) or here < 2 or t.nodes > 1:
        return False
    others = {h: n - (1 if h == current.host else 0) for h, n in t.on_host.items()}
    found = place_one(t.d, t.fitted, t.provider, t.alloc.ranking, per_host=others, no_weights=t.no_weights)
    where = found.placements[0].host if found.placements else None
    if where is None or others.get(where, 0) > here - 2 or where in t.alloc.reserved.who:
        return False
    t.alloc.moves[current.unit] = (f"{here} replicas of {t.d.name} on {current.host}, and {where} has room with "
                                   f"{others.get(where, 0)} (fewest replicas of a deployment per host)")  # fmt: skip
    return True


def replace_reason(t: Target, current: ReplicaRecord) -> str:
    """Why a replica is replaced: moved (Allocation.moves: an on-demand slot off the room always-on replicas took,
    or a replica to restore the spread), or the fields that changed."""
    moved = t.alloc.moves.get(current.unit)
    if moved:
        return f"moved: {moved}"
    fields = ", ".join(c.path for c in t.change.field_changes)
    if current.reason == ACCEPTED_EDIT:  # a probe, session 17: the roll that undoes it said only "units changed"
        return (f"{fields}; " if fields else "") + ("its unit as edited by hand (accepted by refresh-only) is "
                                                     "written again as the documents give it")  # fmt: skip
    return fields or "the unit's content changed"


def other_slot(slot: str) -> str:
    return "b" if slot == "a" else "a"


# --- shrink and warn ----------------------------------------------------------------------------------------


def shrink(t: Target, live: list[ReplicaRecord]) -> None:
    """Replicas at an index beyond the count are deleted (or, on a host out of reach, left and said)."""
    before = len({x.index for x in live})
    for r in live:
        if r.index >= t.count and r.host in t.hosts.facts:
            t.replicas.append(deletion(r, f"replicas {before} → {t.count}"))
        elif r.index >= t.count:
            t.change.blocked.append(out_of_reach(r, t.hosts))


def host_warnings(t: Target) -> list[str]:
    """Hosts a replica goes to that lack the engine or the model's weights: apply fails there until they have."""
    out = []
    steps = [r for r in t.replicas if r.actions != (Action.DELETE,)]
    for host in sorted({r.host for r in steps}):
        hf = t.hosts.facts.get(host)
        if hf is None:
            continue
        runs = {r.argv[0] for r in steps if r.host == host and r.argv}  # the build each replica's unit runs
        found = [e.path for e in [*hf.engines.values(), *hf.engine_builds.get(t.provider.name, {}).values()]]
        built = bool(runs) and runs <= set(found)  # B30: the per-platform build the replica runs is there
        if not built and t.provider.name not in hf.engines:
            out.append(f"{t.provider.title} is not installed on {host} (engines: in the inventory says where); "
                       "apply fails there until it is")  # fmt: skip
        path = model_path_on_host(t.model, t.hosts.inventory[host])
        if path in hf.model_problems and not fetched_at_apply(t.model, hf.model_problems[path]):
            out.append(f"the weights of {t.model.name} are not on {host} at {path} ({hf.model_problems[path]})")
    unmendable = serving_warnings(t, {r.host for r in steps})
    t.change.unmendable += unmendable
    return out + unmendable


def serving_warnings(t: Target, planned: set[str]) -> list[str]:
    """Replicas that serve now (and that this plan leaves running) whose executable or weights are gone from their
    host: each serves what it loaded, but would not start again (a crash, a reboot, a roll). Apply cannot put
    them back; the plan says so (a probe, session 16: `chmod -x` of the engine, the weights moved away, beside
    "No changes")."""
    out = []
    for r in t.live:
        hf = t.hosts.facts.get(r.host)
        if hf is None or r.host in planned or r.status != "serving" or not r.argv:
            continue
        found = {e.path for e in [*hf.engines.values(), *hf.engine_builds.get(t.provider.name, {}).values()]}
        if r.argv[0] not in found and t.provider.name not in hf.engines:
            out.append(f"replica {r.index} on {r.host} serves, but its engine {r.argv[0]} is not there (or not "
                       "executable): it would not start again (a crash, a reboot); install it")  # fmt: skip
        path = model_path_on_host(t.model, t.hosts.inventory[r.host]) if r.host in t.hosts.inventory else None
        if path in hf.model_problems and not fetched_at_apply(t.model, hf.model_problems[path]):
            why = hf.model_problems[path]
            out.append(f"replica {r.index} on {r.host} serves what it loaded, but the weights of {t.model.name} are "
                       f"not at {path} ({why}): it would not start again; put them back")  # fmt: skip
        out += [f"replica {r.index}: {cut}: it serves nothing until the network between them is back (apply "
                "cannot mend a network)" for m in r.members if (cut := link_problem(r, m, hf)) is not None]  # fmt: skip
        unit = next((u for u in hf.units if u.name == r.unit), None)
        if unit is not None and unit.shared_drop_ins:
            out.append(shared_drop_in_warning(f"replica {r.index}", r.host, r.unit, unit.shared_drop_ins))
    return out


def out_of_reach(r: ReplicaRecord, hosts: Hosts) -> str:
    why = "is not in the inventory" if r.host not in hosts.inventory else "could not be reached"
    return f"replica {r.index} on {r.host} ({r.host} {why}) is left as it is, at revision {r.revision}"


# --- decide -------------------------------------------------------------------------------------------------


def decide(change: DeploymentChange, record: DeploymentRecord | None, d: Deployment, names: Names | None) -> None:
    """The deployment's action and why, from its replicas' actions and what the state records."""
    actions = {r.actions for r in change.replicas}
    if record is None:
        change.action, why = list(CREATE), "new deployment"
    elif SURGE in actions or STOP_START in actions:
        change.action = list(STOP_START if change.strategy == "stop-then-start" else SURGE)
        why = "a rolling replace: " + (", ".join(c.path for c in change.field_changes) or "units changed")
    elif change.replicas and all(r.cleanup for r in change.replicas):
        change.action, why = list(UPDATE), "finish an interrupted apply: remove what it left"
    elif actions - {NO_OP}:
        fields = ", ".join(c.path for c in change.field_changes)
        change.action, why = list(UPDATE), "in place: " + (fields or "repair what changed outside engine-ctl")
    else:
        found = state_only_reason(change, record, d, names)
        if found is None:
            return
        change.action, why = list(UPDATE), found
    change.reasons.append(why)


def state_only_reason(
    change: DeploymentChange, record: DeploymentRecord, d: Deployment, names: Names | None
) -> str | None:
    """Why the state changes though nothing on the hosts does (None: nothing changes at all)."""
    if record.spec_hash != change.spec_hash:
        what = ", ".join(c.path for c in change.field_changes)
        return f"records revision {change.revision}" + (f" ({what})" if what else "") + ": nothing changes on the hosts"
    recorded = record.spec.prevent_destroy if record.spec is not None else False
    if recorded != d.prevent_destroy:
        path = names("prevent_destroy") if names else "spec.prevent_destroy"
        change.field_changes.append(FieldChange(path=path, old=not d.prevent_destroy, new=d.prevent_destroy))
        return f"records {path}: {str(d.prevent_destroy).lower()}; nothing changes on the hosts"
    if change.adopt or needs_clearing(record, change):
        why = f" (the last change had failed: {record.last_error or record.reason})" if record.last_error else ""
        return f"records what runs: every replica matches the documents{why}; nothing changes on the hosts"
    return None


def needs_clearing(record: DeploymentRecord, change: DeploymentChange) -> bool:
    """A recorded failure, or a state that is not Ready, while every replica matches and runs: apply records it."""
    if change.blocked or change.pending_reason or change.replicas:
        return False
    return record.last_error is not None or record.state not in ("Ready", "ScaledToZero")


def placement_reasons(replicas: list[ReplicaChange]) -> list[str]:
    """What placement did beyond the documents, for the plan's reasons: a replica moved (an on-demand slot off
    room always-on replicas took, a spread restored), or kept off what on-demand slots reserve."""
    out = []
    for r in replicas:
        if r.reason.startswith("moved: "):
            out.append(f"replica {r.index} {r.reason.split('; on demand:')[0]}")
        elif "; kept off " in r.reason:
            out.append(f"replica {r.index} on {r.host}: {r.reason.split('; ', 1)[1]}")
    return out


def strategy_warnings(t: Target) -> None:
    """The roll's strategy (stop-then-start if any replica has no room for a surge) and its outage warning: with
    one always-on replica, or with every other one on a host out of reach (it may not serve, and apply cannot
    tell)."""
    if not t.strategies:
        return
    t.change.strategy = "stop-then-start" if "stop-then-start" in t.strategies else "surge"
    if t.change.strategy != "stop-then-start":
        return
    room = "GPU" if t.fitted.accelerator == "gpu" else "room"
    away = {r.index: r.host for r in t.live if r.index < t.always and r.host not in t.hosts.facts}
    if t.always <= 1:
        t.change.warnings.append(f"{t.d.name} will have no serving replica during the change: no free {room} for a "
                                 "surge, so stop-then-start")  # fmt: skip
    elif t.always - len(away) <= 1:
        t.change.warnings.append(f"{t.d.name} will have no serving replica during the change: no free {room} for a "
                                 "surge, so stop-then-start, and its other replicas are on hosts out of reach "
                                 f"({', '.join(sorted(set(away.values())))})")  # fmt: skip


# --- render -------------------------------------------------------------------------------------------------


def render_replica(
    d: Deployment, model: Model, provider: Provider, fitted: FitPlan, p: Placement,
    hosts: Mapping[str, Host], revision: int, slot: str, lineage: str | None = None, deployment_id: str | None = None,
) -> RenderedUnit:  # fmt: skip
    """One replica's unit; `lineage` and `deployment_id` (the owning state's, the deployment's) go in its header."""
    host = hosts[p.host]
    run = replica_run(d, model, provider, fitted, p, host, revision, slot, lineage, gateway_allow(hosts), deployment_id)
    group = group_of(p, hosts)
    if group is None:
        return render_unit(run, provider, host)
    head = unit_name(d.name, p.index, slot)
    members = []
    for rank, m in enumerate(p.members, start=1):
        at = Placement(index=p.index, host=m.host, gpus=m.gpus, port=m.port, threads=m.threads, cpu_cores=m.cpu_cores,
                       memory_bytes=m.memory_bytes)  # fmt: skip
        own = replica_run(d, model, provider, fitted, at, hosts[m.host], revision, slot, lineage, (), deployment_id)
        members.append(render_member(own, provider, hosts[m.host], group, rank, head))
    return render_unit(run, provider, host, group, tuple(members))


def replica_change(action: list[Action], unit: RenderedUnit, revision: int, p: Placement, reason: str) -> ReplicaChange:
    members = [MemberStep(rank=m.rank, host=m.host, unit=m.name, port=m.port, gpus=list(m.gpus), argv=list(m.argv),
                          unit_text=m.text, unit_sha256=m.sha256) for m in unit.members]  # fmt: skip
    return ReplicaChange(
        index=unit.index, action=action, host=unit.host, unit=unit.name, slot=unit.slot, port=unit.port,
        gpus=list(unit.gpus), gpu_indexes=[g.index for g in p.gpus], revision=revision, argv=list(unit.argv),
        unit_text=unit.text, unit_sha256=unit.sha256, reason=reason, placement=p, members=members,
    )  # fmt: skip


def member_steps_of(r: ReplicaRecord) -> list[MemberStep]:
    """A recorded group's workers, as a step that removes them names them."""
    return [MemberStep(rank=m.rank, host=m.host, unit=m.unit, port=m.port, gpus=list(m.gpus), argv=list(m.argv),
                       unit_sha256=m.unit_sha256) for m in r.members]  # fmt: skip


def group_drift(t: Target, current: ReplicaRecord) -> list[Drift]:
    """Drift on any worker of a replica group is drift of the replica: its unit missing, edited, stopped or
    crash-looping (replica_drift's words, naming the member's unit and host), running what its file said before it
    last changed (unit_written_drift; not asked while parked), the binary it runs changed under it
    (engine-changed: the group restarts onto it), or its host out of reach."""
    out: list[Drift] = []
    for m in current.members:
        facts = t.hosts.facts.get(m.host)
        if facts is None:
            out.append(
                Drift(
                    host=m.host,
                    unit=m.unit,
                    deployment=t.d.name,
                    kind="missing",
                    detail=f"group member {m.rank} ({m.unit}) on {m.host}: {m.host} could not be reached",
                )
            )
            continue  # fmt: skip
        seen = ReplicaRecord.model_construct(**{**current.model_dump(), "host": m.host, "unit": m.unit,
                                                "port": m.port, "gpus": m.gpus, "unit_sha256": m.unit_sha256,
                                                "engine_sha256": "", "members": []})  # fmt: skip
        unit = t.hosts.unit(m.host, m.unit)
        written = [] if t.parked else unit_written_drift(t.d.name, seen, unit)
        for found in replica_drift(t.d.name, seen, unit, facts) + written:
            out.append(found.model_copy(update={"detail": f"group member {m.rank}: {found.detail}"}))
        engine = member_engine_drift_detail(t.d.name, current, m, facts)
        if engine:
            out.append(Drift(host=m.host, unit=m.unit, deployment=t.d.name, kind="engine-changed", detail=engine))
    return out


def deletion(r: ReplicaRecord, reason: str, cleanup: bool = False) -> ReplicaChange:
    return ReplicaChange(
        index=r.index, action=[Action.DELETE], host=r.host, unit=r.unit, slot=r.slot, port=r.port, gpus=list(r.gpus),
        revision=r.revision, old_unit=r.unit, old_host=r.host, old_slot=r.slot, old_argv=r.argv, reason=reason,
        cleanup=cleanup, on_demand=r.on_demand, old_members=member_steps_of(r),
    )  # fmt: skip


# --- the steps together -------------------------------------------------------------------------------------


def start_deployment(
    d: Deployment,
    model: Model,
    provider: Provider,
    model_facts: ModelFacts | None,
    record: DeploymentRecord | None,
    hosts: Hosts,
    alloc: Allocation,
    names: Names | None = None,
    lineage: str | None = None,
    deployment_id: str | None = None,
    keep_stopped: bool = False,
) -> tuple[DeploymentChange, Target | None]:
    """resolve → fit → leftovers → place the always-on replicas. `lineage`: the owning state's (unit headers).
    None for the target when there is no fit (the change says Failed or Pending)."""
    change, sized = resolve(d, model, record, names)
    change.deployment_id = deployment_id or ""
    sized = host_decides(sized, model, hosts.reached, hosts)
    fitted = fit_step(change, sized, model, model_facts, hosts, record, names, flat=d.accelerator == "host")
    if fitted is None:
        return change, None
    refused = hosts.engine_refusals(provider, sized.accelerator)
    refused = {
        **refused,
        **_decisions_refused(change, sized, provider, hosts),
        **_guard_refused(change, sized, provider, hosts),
    }
    if change.failed_reason:
        return change, None
    held = record.operator if record is not None else None
    t = Target(d=sized, model=model, provider=provider, fitted=fitted, revision=change.revision, hosts=hosts,
               alloc=alloc, no_weights={**refused, **weights_missing(model, hosts)}, change=change,
               lineage=lineage, deployment_id=deployment_id, keep_stopped=keep_stopped,
               parked=held is not None and held.verb == "parked")  # fmt: skip
    t.replicas, t.live = leftovers(list(record.replicas) if record else [], hosts, alloc)
    count_on_host(t, t.live)
    if place_replicas(t, t.live, range(t.always)) is not None:
        t.always_pending = True
    return change, t


def finish_deployment(
    t: Target, alloc: Allocation, record: DeploymentRecord | None, d: Deployment, names: Names | None
) -> None:
    """Once every deployment's always-on replicas are placed: the on-demand slots (in the deployment's own view
    of the room, where other deployments' on-demand slots do not count), then shrink → warn → decide."""
    if not t.always_pending and t.count > t.always:
        place_on_demand(t, alloc)
    shrink(t, t.live)
    t.change.replicas = t.replicas
    t.change.warnings += host_warnings(t)
    decide_with_strategy(t, record, d, names)


def place_on_demand(t: Target, alloc: Allocation) -> None:
    """Slots `min`..`max`-1. One that has no place is a warning (the scaler can run fewer), not Pending; but at
    `min: 0` with no slot placed at all the deployment can never wake: a problem of the plan (exit 1)."""
    t.exclusive = frozenset(alloc.taken.gpus)
    t.alloc = alloc.view(t.d.name)
    pending, waiting = t.change.pending_reason, t.change.waiting
    stopped = place_replicas(t, t.live, range(t.always, t.count))
    if stopped is not None:
        why = t.change.pending_reason
        t.change.pending_reason, t.change.waiting = pending, waiting
        if stopped == 0:
            t.change.blocked.append(f"on-demand replica 0 has no place ({why}): no replica can start, so a request "
                                    f"never wakes {t.d.name} (503 after the hold) until a host has room")  # fmt: skip
            return
        t.change.warnings.append(
            f"{t.d.name}: on-demand replica {stopped} has no place ({why}); the scaler can run at most {stopped} "
            f"of the {t.count} replicas of spec.replicas.max"
        )


def _decisions_refused(change: DeploymentChange, d: Deployment, provider: Provider, hosts: Hosts) -> dict[str, str]:
    """A decisions deployment leaves out the hosts whose engine cannot serve decisions; naming one fails it."""
    if d.api != "decisions":
        return {}
    refused = decisions_refusals(provider, d.accelerator, hosts.reached, hosts.inventory)
    if d.host in refused:
        change.failed_reason = refused[d.host]
        change.warnings.append(f"{d.name} is Failed: {refused[d.host]}; its running replicas are left as they are")
    return refused


def _guard_refused(change: DeploymentChange, d: Deployment, provider: Provider, hosts: Hosts) -> dict[str, str]:
    """A deployment whose engine runs with its sleep controls leaves out the hosts its guard cannot run on
    (engine_ctl.core.render.guard); naming one fails it, saying what to do."""
    if not needs_guard(provider, residency_of(d)):
        return {}
    refused = guard_refusals(hosts.inventory, hosts.facts)
    if d.host in refused:
        change.failed_reason = refused[d.host]
        change.warnings.append(f"{d.name} is Failed: {refused[d.host]}; its running replicas are left as they are")
    return refused


def decide_with_strategy(t: Target, record: DeploymentRecord | None, d: Deployment, names: Names | None) -> None:
    strategy_warnings(t)
    decide(t.change, record, d, names)
    t.change.reasons += placement_reasons(t.change.replicas)
    if t.change.pending_reason and record is None and not t.change.replicas:
        t.change.action = list(CREATE)
