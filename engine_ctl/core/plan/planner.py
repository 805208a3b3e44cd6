"""Planning: desired documents + recorded state + live facts -> a Plan. Pure: values in, a value out.

Actions follow Terraform's vocabulary: ["create"], ["update"] (in place), ["delete", "create"] (replace, a
rolling restart), ["delete"], ["no-op"].
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from engine_ctl.core.documents.inventory import Inventory
from engine_ctl.core.documents.rules import field_name, resolve_engine
from engine_ctl.core.fit.fitting import FitResult, FitUnknown, Taken, fit, place, replica_threads
from engine_ctl.core.fit.hostfacts import BUSY_BYTES, HostFacts, UnitFact
from engine_ctl.core.fit.modelfacts import ModelFacts
from engine_ctl.core.fit.runspec import FitPlan, Placement
from engine_ctl.core.model import Deployment, DesiredState, Model
from engine_ctl.core.plan.engines import engine_drift_detail, engine_refusals
from engine_ctl.core.plan.gateway import GatewayChange, plan_gateways
from engine_ctl.core.plan.unitdiff import attach_unit_diffs
from engine_ctl.core.render.gateway import GATEWAY_UNIT
from engine_ctl.core.render.units import UNIT_PREFIX, RenderedUnit, model_path_on_host, render_unit, replica_runs
from engine_ctl.core.weights import WeightsFetch
from engine_ctl.providers import Provider
from engine_ctl.state.model import DeploymentRecord, ReplicaRecord, State

FORMAT_VERSION = 1
Strategy = Literal["surge", "stop-then-start"]


class FieldChange(BaseModel):
    path: str
    old: Any = None
    new: Any = None


class ReplicaChange(BaseModel):
    model_config = ConfigDict(extra="forbid")

    index: int
    action: list[str]
    host: str
    unit: str
    slot: str
    port: int
    gpus: list[str] = Field(default_factory=list)
    gpu_indexes: list[int] = Field(default_factory=list)
    revision: int
    argv: list[str] = Field(default_factory=list)
    unit_text: str | None = None
    unit_sha256: str | None = None
    engine_version: str | None = None
    engine_sha256: str = ""
    """The build the unit runs (argv[0]) as the facts found it: recorded per replica when applied."""
    old_unit: str | None = None
    old_host: str | None = None
    old_slot: str | None = None
    old_argv: list[str] | None = None
    strategy: Strategy | None = None
    reason: str = ""
    cleanup: bool = False
    """Removes what an interrupted apply left (a never-ready or second slot): done before anything else."""
    placement: Placement | None = None
    """Where the unit was rendered for (host, GPUs, port, threads): apply renders it again from this to prove a
    saved plan's unit is engine-ctl's own."""

    @property
    def symbol(self) -> str:
        return SYMBOLS[tuple(self.action)]


class DeploymentChange(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    action: list[str]
    reasons: list[str] = Field(default_factory=list)
    old_revision: int = 0
    revision: int = 0
    spec: dict[str, Any] = Field(default_factory=dict)
    model: dict[str, Any] = Field(default_factory=dict)
    spec_hash: str = ""
    fit: dict[str, Any] | None = None
    field_changes: list[FieldChange] = Field(default_factory=list)
    strategy: Strategy | None = None
    warnings: list[str] = Field(default_factory=list)
    pending_reason: str | None = None
    failed_reason: str | None = None
    waiting: dict[str, str] = Field(default_factory=dict)
    blocked: list[str] = Field(default_factory=list)
    """Replicas that could not be checked or changed (their host is unreachable or left the inventory): apply
    leaves them as they are, records them at the revision they run, and exits 1."""
    chosen: dict[str, int] = Field(default_factory=dict)
    """Fields the documents leave out that engine-ctl chose (gpus, parallel), each with the revision it was
    chosen at; kept until the documents change."""
    adopt: list[str] = Field(default_factory=list)
    """Units recorded pending that run (they became ready before an apply was interrupted): recorded serving."""
    replicas: list[ReplicaChange] = Field(default_factory=list)
    fetches: list[WeightsFetch] = Field(default_factory=list)
    """hf: weights each host with a new replica fetches first (engine_ctl.core.plan.fetching)."""

    @property
    def symbol(self) -> str:
        return SYMBOLS[tuple(self.action)]

    @property
    def changed(self) -> bool:
        return self.action != ["no-op"]

    @property
    def state_only(self) -> bool:
        """An update that changes only the state: nothing on the hosts changes."""
        return self.action == ["update"] and not self.replicas


class Drift(BaseModel):
    host: str
    unit: str
    deployment: str | None = None
    kind: Literal[
        "edited", "missing", "stopped", "crash-looping", "gpu-held", "unmanaged", "weights-changed", "engine-changed"
    ]
    detail: str
    diff: list[str] = Field(default_factory=list)
    """A hand-edited unit: the unified diff from the file on the host to engine-ctl's (secret values hidden)."""


class Plan(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format_version: int = FORMAT_VERSION
    created_at: str = ""
    state_serial: int
    state_lineage: str
    host_fingerprints: dict[str, str] = Field(default_factory=dict)
    unreachable: dict[str, str] = Field(default_factory=dict)
    targets: list[str] = Field(default_factory=list)
    refresh_only: bool = False
    changes: list[DeploymentChange] = Field(default_factory=list)
    drift: list[Drift] = Field(default_factory=list)
    context: dict[str, Any] = Field(default_factory=dict)
    """Where the plan came from (documents, inventory, state file, model paths), for `apply PLANFILE`."""
    absent: list[str] = Field(default_factory=list)
    """Deployments this plan destroys because their documents are not among those passed (shown first)."""
    refused: list[str] = Field(default_factory=list)
    """Why the plan may not be applied at all (a deployment with prevent_destroy: true would be destroyed)."""
    gateways: list[GatewayChange] = Field(default_factory=list)
    """The gateway hosts (inventory role gateway): their HAProxy configuration, maps and unit."""

    def summary(self) -> dict[str, int]:
        add = sum(1 for c in self.changes if c.action == ["create"])
        change = sum(1 for c in self.changes if c.action in (["update"], ["delete", "create"]))
        destroy = sum(1 for c in self.changes if c.action == ["delete"])
        add += sum(1 for g in self.gateways if g.action == ["create"])
        change += sum(1 for g in self.gateways if g.action == ["update"])
        destroy += sum(1 for g in self.gateways if g.action == ["delete"])
        return {"add": add, "change": change, "destroy": destroy}

    @property
    def has_changes(self) -> bool:
        return (
            any(c.changed for c in self.changes)
            or any(g.changed for g in self.gateways)
            or (self.refresh_only and bool(self.drift))
        )

    @property
    def problems(self) -> list[str]:
        """What makes plan and apply exit 1: deployments that cannot be served as asked, replicas that could
        not be checked, hosts that could not be reached."""
        out = list(self.refused)
        out += [f"{c.name} is Failed: {c.failed_reason}" for c in self.changes if c.failed_reason]
        out += [f"{c.name}: {b}" for c in self.changes for b in c.blocked]
        out += [f"host {h} could not be checked: {why}" for h, why in sorted(self.unreachable.items())]
        return out

    def digest(self) -> str:
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()


SYMBOLS = {
    ("create",): "+",
    ("update",): "~",
    ("delete", "create"): "-/+",
    ("delete",): "-",
    ("no-op",): " ",
}


def spec_record(d: Deployment, model: Model) -> tuple[dict[str, Any], dict[str, Any], str]:
    spec = d.model_dump(mode="json", exclude={"prevent_destroy"})
    mdl = model.model_dump(mode="json")
    digest = hashlib.sha256(json.dumps({"spec": spec, "model": mdl}, sort_keys=True).encode()).hexdigest()
    if d.prevent_destroy:  # recorded (a plan without the document still refuses), never a new revision
        spec["prevent_destroy"] = True
    return spec, mdl, digest


def weights_missing(model: Model, hosts: list[HostFacts], inventory: Mapping[str, Any]) -> dict[str, str]:
    """host -> why a replica waits there: the model's weights are missing, or not a valid file (the facts'
    model_problems). No replica is placed on such a host (seed: Pending, waiting for the weights)."""
    out = {}
    for h in hosts:
        path = model_path_on_host(model, inventory[h.host])
        if path in h.model_problems and not fetched_at_apply(model, h.model_problems[path]):
            out[h.host] = f"Waiting for the weights of {model.name} at {path} ({h.model_problems[path]})"
    return out


def fetched_at_apply(model: Model, problem: str) -> bool:
    """An hf: model's weights missing on a host are fetched there by apply: a replica may be placed there."""
    return model.hf is not None and problem == "not found"


def destroy_refusals(plan: Plan, state: State) -> list[str]:
    """prevent_destroy: true (recorded from the deployment's document) refuses every plan that destroys it."""
    out = []
    for c in plan.changes:
        record = state.deployments.get(c.name)
        if c.action == ["delete"] and record is not None and record.spec.get("prevent_destroy") is True:
            out.append(
                f"{c.name} has prevent_destroy: true, and this plan destroys it; nothing is applied "
                "(to destroy it, set prevent_destroy: false in its document and apply that first)"
            )
    return out


def field_changes(
    old: dict[str, Any], new: dict[str, Any], prefix: str = "spec", names: Callable[[str], str] | None = None
) -> list[FieldChange]:
    """The fields that differ, named as the document names them (`names` maps an internal field to that)."""
    changes = _field_changes(old, new, prefix)
    if names is None:
        return changes
    out = []
    for c in changes:
        head, dot, rest = c.path.removeprefix(prefix + ".").partition(".")
        key, bracket, index = head.partition("[")
        out.append(c.model_copy(update={"path": names(key) + bracket + index + dot + rest}))
    return sorted(out, key=lambda c: c.path)


def _field_changes(old: dict[str, Any], new: dict[str, Any], prefix: str) -> list[FieldChange]:
    from deepdiff import DeepDiff  # imported here: it pulls in numpy (~0.1 s), which only a diff needs

    diff = DeepDiff(old, new, ignore_order=False, verbose_level=2)
    out: list[FieldChange] = []
    for kind in ("values_changed", "type_changes"):
        for path, change in diff.get(kind, {}).items():
            out.append(FieldChange(path=_path(path, prefix), old=change.get("old_value"), new=change.get("new_value")))
    for path, value in diff.get("dictionary_item_added", {}).items():
        out.append(FieldChange(path=_path(path, prefix), new=value))
    for path, value in diff.get("dictionary_item_removed", {}).items():
        out.append(FieldChange(path=_path(path, prefix), old=value))
    for kind in ("iterable_item_added", "iterable_item_removed"):
        for path in diff.get(kind, {}):
            base = _path(path, prefix).split("[")[0]
            if not any(c.path == base for c in out):
                out.append(FieldChange(path=base, old=_get(old, base, prefix), new=_get(new, base, prefix)))
    return sorted(out, key=lambda c: c.path)


def _path(deepdiff_path: str, prefix: str) -> str:
    text = deepdiff_path.removeprefix("root")
    text = text.replace("']['", ".").replace("['", ".").replace("']", "")
    return prefix + text


def _get(data: dict[str, Any], dotted: str, prefix: str) -> Any:
    key = dotted.removeprefix(prefix + ".")
    return data.get(key)


class _Allocation:
    """Ports, GPUs, cores and memory taken on each host: recorded replicas (with their recorded plan's cores and
    memory) plus what this plan places. `taken` is what place() counts."""

    def __init__(self, state: State) -> None:
        self.taken = Taken(ours=set(state.gpus_held()))
        self.ports, self.gpus, self.ours = self.taken.ports, self.taken.gpus, self.taken.ours
        self.shares: dict[str, tuple[int, int]] = {}
        for d in state.deployments.values():
            share = (int((d.plan or {}).get("cpu_cores") or 0), int((d.plan or {}).get("memory_bytes") or 0))
            for r in d.replicas:
                self.shares[r.unit] = share
                self.taken.hold(r.host, port=r.port, gpus=r.gpus, cores=share[0], memory=share[1])

    def take(self, placement: Placement) -> None:
        self.taken.take(placement)

    def release(self, record: ReplicaRecord) -> None:
        cores, memory = self.shares.pop(record.unit, (0, 0))
        self.taken.free(record.host, port=record.port, gpus=record.gpus, cores=cores, memory=memory)


def _unit_fact(facts: HostFacts | None, unit: str) -> UnitFact | None:
    if facts is None:
        return None
    return next((u for u in facts.units if u.name == unit), None)


def _is_running(u: UnitFact | None) -> bool:
    return u is not None and u.active_state == "active"


def _other(slot: str) -> str:
    return "b" if slot == "a" else "a"


def _placement_of(record: ReplicaRecord, facts: HostFacts, plan: FitPlan) -> Placement | None:
    """The recorded placement, if the host still has the GPUs it names."""
    by_uuid = {g.uuid: g for g in facts.gpus}
    if any(u not in by_uuid for u in record.gpus):
        return None
    gpus = tuple(by_uuid[u] for u in record.gpus)
    return Placement(
        index=record.index, host=record.host, gpus=gpus, port=record.port, threads=replica_threads(plan, facts),
        cpu_cores=plan.cpu_cores, memory_bytes=plan.memory_bytes,
    )  # fmt: skip


def plan_deployment(
    d: Deployment,
    model: Model,
    provider: Provider,
    model_facts: ModelFacts | None,
    record: DeploymentRecord | None,
    inventory: Inventory,
    facts: Mapping[str, HostFacts],
    alloc: _Allocation,
    names: Callable[[str], str] | None = None,
) -> tuple[DeploymentChange, list[Drift]]:
    spec, mdl, digest = spec_record(d, model)
    old_revision = record.revision if record else 0
    revision = old_revision if record and record.spec_hash == digest else old_revision + 1
    change = DeploymentChange(
        name=d.name, action=["no-op"], old_revision=old_revision, revision=revision, spec=spec, model=mdl,
        spec_hash=digest,
    )  # fmt: skip
    drift: list[Drift] = []
    if record is not None and record.spec_hash != digest:
        change.field_changes = field_changes(record.spec, spec, names=names) + field_changes(record.model, mdl, "model")
    hosts = [facts[h.name] for h in inventory.hosts if h.name in facts]
    sized, change.chosen = _keep_chosen(d, record, digest, revision)
    fitted = fit(sized, model, model_facts, hosts, names)
    if isinstance(fitted, str):
        change.failed_reason = fitted
        change.warnings.append(f"{d.name} is Failed: {fitted}; its running replicas are left as they are")
        return change, drift
    if isinstance(fitted, FitUnknown):  # Pending: nothing to size a replica from yet
        change.pending_reason = fitted.reason
        change.action = ["create"] if record is None else change.action
        return change, drift
    change.fit = fitted.model_dump(mode="json")
    d = sized
    by_host = {h.name: h for h in inventory.hosts}
    no_weights = {**engine_refusals(provider, d.accelerator, hosts, by_host), **weights_missing(model, hosts, by_host)}
    count = max(d.replicas_min, 1)
    records = list(record.replicas) if record else []
    replicas: list[ReplicaChange] = []
    # Leftovers of an interrupted apply: pending slots whose unit is not running, units being removed.
    live: list[ReplicaRecord] = []
    for r in records:
        recorded_unit = _unit_fact(facts.get(r.host), r.unit)
        if r.host in facts and r.status == "removing":
            replicas.append(_delete(r, "left by an interrupted apply (was being removed)", cleanup=True))
            alloc.release(r)
        elif r.status == "pending" and r.host in facts and not _is_running(recorded_unit):
            replicas.append(_delete(r, "left by an interrupted apply (never became ready)", cleanup=True))
            alloc.release(r)
        else:
            live.append(r)
    strategies: set[Strategy] = set()
    on_host: dict[str, int] = {}
    for r in live:
        if r.index < count:
            on_host[r.host] = on_host.get(r.host, 0) + 1
    for index in range(count):
        current = _current(live, index, facts)
        extras = [r for r in live if r.index == index and r is not current]
        for extra in extras:
            replicas.append(_delete(extra, "a second slot of this replica (left by an interrupted roll)", cleanup=True))
            alloc.release(extra)
        if current is not None and current.host not in facts:
            change.blocked.append(_out_of_reach(current, by_host))
            continue
        if current is not None and current.status == "pending":
            change.adopt.append(current.unit)  # it runs: it passed its health gate before the apply was cut off
        if current is None:
            result = place(
                d, fitted, provider, _with_alloc(hosts, alloc), 1, taken=alloc.taken, already=on_host,
                no_weights=no_weights,
            )  # fmt: skip
            if not result.placements:
                change.pending_reason = result.pending_reason
                change.waiting = result.waiting
                break
            p = result.placements[0].model_copy(update={"index": index})
            alloc.take(p)
            on_host[p.host] = on_host.get(p.host, 0) + 1
            created = render_replica(d, model, provider, fitted, p, by_host, revision, "a")
            replicas.append(_replica(["create"], created, revision, p, reason="new replica"))
            continue
        host_facts = facts[current.host]
        same_place = _placement_of(current, host_facts, fitted)
        moving = d.host not in (None, current.host)  # spec.host changed: a replacement onto the new host
        unit_now = None
        if same_place is not None and len(same_place.gpus) == fitted.gpus and not moving:
            unit_now = render_replica(d, model, provider, fitted, same_place, by_host, current.revision, current.slot)
        fact = _unit_fact(host_facts, current.unit)
        if unit_now is not None and same_place is not None and unit_now.sha256 == current.unit_sha256:
            found = _drift(d.name, current, fact, host_facts)
            drift.extend(found)
            if found:
                why = "; ".join(f.detail for f in found)
                replicas.append(_replica(["update"], unit_now, current.revision, same_place, reason=why))
            continue
        # The content changes: a rolling replace, with a surge when there is room for both.
        new_slot = _other(current.slot)
        others = {h: n - (1 if h == current.host else 0) for h, n in on_host.items()}
        surge = place(
            d, fitted, provider, _with_alloc(hosts, alloc), 1, taken=alloc.taken, already=others, prefer=current.host,
            no_weights=no_weights,
        )  # fmt: skip
        if surge.placements:
            p = surge.placements[0].model_copy(update={"index": index})
            strategy: Strategy = "surge"
        else:
            alloc.release(current)
            stop_start = place(
                d, fitted, provider, [h for h in _with_alloc(hosts, alloc) if moving or h.host == current.host], 1,
                taken=alloc.taken, no_weights=no_weights,
            )  # fmt: skip
            if not stop_start.placements:
                change.pending_reason = stop_start.pending_reason
                change.waiting = stop_start.waiting
                alloc.take(
                    _placement_of(current, host_facts, fitted)
                    or Placement(index=index, host=current.host, port=current.port)
                )
                break
            kept = {} if moving else {"port": current.port}
            p = stop_start.placements[0].model_copy(update={"index": index, **kept})
            strategy = "stop-then-start"
        alloc.take(p)
        if p.host != current.host:
            on_host[current.host] = on_host.get(current.host, 1) - 1
            on_host[p.host] = on_host.get(p.host, 0) + 1
        strategies.add(strategy)
        rolled = render_replica(d, model, provider, fitted, p, by_host, revision, new_slot)
        why = ", ".join(c.path for c in change.field_changes) or "the unit's content changed"
        rc = _replica(["delete", "create"], rolled, revision, p, reason=why)
        rc.old_unit, rc.old_host, rc.old_slot, rc.old_argv = current.unit, current.host, current.slot, current.argv
        rc.strategy = strategy
        replicas.append(rc)
    before = len({r.index for r in live})  # replicas recorded before this plan (a second slot is not one)
    for r in live:
        if r.index >= count and r.host in facts:
            replicas.append(_delete(r, f"replicas {before} → {count}"))
        elif r.index >= count:
            change.blocked.append(_out_of_reach(r, by_host))
    change.replicas = replicas
    for host in sorted({r.host for r in replicas if r.action != ["delete"]}):
        hf = facts.get(host)
        if hf is None:
            continue
        if provider.name not in hf.engines:
            change.warnings.append(
                f"{provider.title} is not installed on {host} (engines: in the inventory says where); "
                "apply fails there until it is"
            )
        path = model_path_on_host(model, by_host[host])
        if path in hf.model_problems and not fetched_at_apply(model, hf.model_problems[path]):
            change.warnings.append(
                f"the weights of {model.name} are not on {host} at {path} ({hf.model_problems[path]})"
            )
    actions = {tuple(r.action) for r in replicas}
    if record is None:
        change.action = ["create"]
        change.reasons.append("new deployment")
    elif ("delete", "create") in actions:
        change.action = ["delete", "create"]
        change.reasons.append(
            "a rolling replace: " + (", ".join(c.path for c in change.field_changes) or "units changed")
        )
    elif replicas and all(r.cleanup for r in replicas):
        change.action = ["update"]
        change.reasons.append("finish an interrupted apply: remove what it left")
    elif actions - {("no-op",)}:
        change.action = ["update"]
        change.reasons.append(
            "in place: " + (", ".join(c.path for c in change.field_changes) or "repair what changed outside engine-ctl")
        )
    elif record.spec_hash != digest:
        change.action = ["update"]
        what = ", ".join(c.path for c in change.field_changes)
        change.reasons.append(f"records revision {revision}" + (f" ({what})" if what else "")
                              + ": nothing changes on the hosts")  # fmt: skip
    elif record.spec.get("prevent_destroy", False) != d.prevent_destroy:
        change.action = ["update"]
        path = names("prevent_destroy") if names else "spec.prevent_destroy"
        change.field_changes.append(FieldChange(path=path, old=not d.prevent_destroy, new=d.prevent_destroy))
        change.reasons.append(f"records {path}: {str(d.prevent_destroy).lower()}; nothing changes on the hosts")
    elif change.adopt or _needs_clearing(record, change):
        change.action = ["update"]
        why = f" (the last change had failed: {record.last_error or record.reason})" if record.last_error else ""
        change.reasons.append(f"records what runs: every replica matches the documents{why}; nothing changes on "
                              "the hosts")  # fmt: skip
    if strategies:
        change.strategy = "stop-then-start" if "stop-then-start" in strategies else "surge"
        if change.strategy == "stop-then-start":
            serving_after = count - 1
            if serving_after < 1:
                change.warnings.append(
                    f"{d.name} will have no serving replica during the change: no free "
                    f"{'GPU' if fitted.accelerator == 'gpu' else 'room'} for a surge, so stop-then-start"
                )
    if change.pending_reason and record is None and not replicas:
        change.action = ["create"]
    return change, drift


def _keep_chosen(
    d: Deployment, record: DeploymentRecord | None, digest: str, revision: int
) -> tuple[Deployment, dict[str, int]]:
    """gpus and parallel, when the documents leave them out, are chosen once and kept with the revision ("so it
    does not move as machines come and go"): chosen again only when the deployment's documents change."""
    open_fields = [f for f in ("gpus", "parallel") if getattr(d, f) is None]
    if d.accelerator == "cpu" and "gpus" in open_fields:
        open_fields.remove("gpus")
    if record is None or record.spec_hash != digest or not record.plan:
        return d, {f: revision for f in open_fields}
    kept = {f: record.plan[f] for f in open_fields if isinstance(record.plan.get(f), int)}
    return d.model_copy(update=kept), {f: record.chosen.get(f, record.revision) for f in kept}


def _out_of_reach(r: ReplicaRecord, hosts: Mapping[str, Any]) -> str:
    why = "is not in the inventory" if r.host not in hosts else "could not be reached"
    return f"replica {r.index} on {r.host} ({r.host} {why}) is left as it is, at revision {r.revision}"


def _needs_clearing(record: DeploymentRecord, change: DeploymentChange) -> bool:
    """A recorded failure, or a state that is not Ready, while every replica matches and runs: apply records it."""
    if change.blocked or change.pending_reason or change.replicas:
        return False
    return record.last_error is not None or record.state != "Ready"


def _with_alloc(hosts: list[HostFacts], alloc: _Allocation) -> list[HostFacts]:
    """Hosts as placement sees them: ports recorded in state count as in use."""
    return [
        h.model_copy(update={"ports_in_use": tuple(sorted(set(h.ports_in_use) | alloc.ports.get(h.host, set())))})
        for h in hosts
    ]


def _current(records: list[ReplicaRecord], index: int, facts: Mapping[str, HostFacts]) -> ReplicaRecord | None:
    """The record that serves replica `index`: a running one first, then serving, then the newest."""
    candidates = [r for r in records if r.index == index]
    if not candidates:
        return None

    def rank(r: ReplicaRecord) -> tuple[int, int, int]:
        # An active unit has passed its health gate (ExecStartPost), so a running newer slot wins: after an
        # interrupted roll it is kept, and the older one is the leftover.
        running = _is_running(_unit_fact(facts.get(r.host), r.unit))
        return (int(running), r.revision, int(r.status == "serving"))

    return max(candidates, key=rank)


def _drift(name: str, record: ReplicaRecord, fact: UnitFact | None, host: HostFacts) -> list[Drift]:
    if fact is None or fact.sha256 is None:
        return [Drift(host=record.host, unit=record.unit, deployment=name, kind="missing",
                      detail=f"unit file {record.unit} is missing on {record.host}")]  # fmt: skip
    out = []
    engine = engine_drift_detail(record, host)
    if engine:
        out.append(Drift(host=record.host, unit=record.unit, deployment=name, kind="engine-changed", detail=engine))
    if fact.sha256 != record.unit_sha256:
        detail = f"unit file edited by hand (sha256 {fact.sha256[:12]}… ≠ {record.unit_sha256[:12]}…)"
        out.append(Drift(host=record.host, unit=record.unit, deployment=name, kind="edited", detail=detail))
    if fact.active_state != "active":
        looping = (fact.n_restarts or 0) >= 3 or fact.active_state == "failed"
        detail = f"{record.unit} is {fact.active_state}/{fact.sub_state}"
        if fact.exec_main_status:
            detail += f" (exit status {fact.exec_main_status})"
        if (fact.n_restarts or 0) > 0:
            detail += f" after {fact.n_restarts} restart(s)"
        out.append(Drift(host=record.host, unit=record.unit, deployment=name,
                         kind="crash-looping" if looping else "stopped", detail=detail))  # fmt: skip
        held = [g for g in host.gpus if g.uuid in record.gpus and (g.memory_used_bytes or 0) > BUSY_BYTES]
        for g in held:
            out.append(Drift(host=record.host, unit=record.unit, deployment=name, kind="gpu-held",
                             detail=f"GPU {g.index} ({g.uuid}) is held by another process"))  # fmt: skip
    return out


def render_replica(
    d: Deployment, model: Model, provider: Provider, fitted: FitPlan, p: Placement,
    hosts: Mapping[str, Any], revision: int, slot: str,
) -> RenderedUnit:  # fmt: skip
    result = FitResult(plan=fitted, placements=(p,))
    ((run, host),) = replica_runs(d, model, provider, result, dict(hosts), revision=revision, slot=slot)
    return render_unit(run, provider, host)


def _replica(action: list[str], unit: RenderedUnit, revision: int, p: Placement, reason: str) -> ReplicaChange:
    return ReplicaChange(
        index=unit.index, action=action, host=unit.host, unit=unit.name, slot=unit.slot, port=unit.port,
        gpus=list(unit.gpus), gpu_indexes=[g.index for g in p.gpus], revision=revision, argv=list(unit.argv),
        unit_text=unit.text, unit_sha256=unit.sha256, reason=reason, placement=p,
    )  # fmt: skip


def _delete(r: ReplicaRecord, reason: str, cleanup: bool = False) -> ReplicaChange:
    return ReplicaChange(
        index=r.index, action=["delete"], host=r.host, unit=r.unit, slot=r.slot, port=r.port, gpus=list(r.gpus),
        revision=r.revision, old_unit=r.unit, old_host=r.host, old_slot=r.slot, old_argv=r.argv, reason=reason,
        cleanup=cleanup,
    )  # fmt: skip


def make_plan(
    desired: DesiredState,
    state: State,
    inventory: Inventory,
    facts: Mapping[str, HostFacts],
    model_facts: Mapping[str, ModelFacts | None],
    *,
    unreachable: Mapping[str, str] | None = None,
    targets: list[str] | None = None,
    refresh_only: bool = False,
    created_at: str = "",
    hold_absent: str | None = None,
) -> Plan:
    """`hold_absent`, when set, says why deployments absent from the documents are not destroyed (some
    documents could not be read: a deployment whose document is broken is never taken as removed)."""
    plan = Plan(
        created_at=created_at, state_serial=state.serial, state_lineage=state.lineage,
        host_fingerprints={name: f.fingerprint() for name, f in sorted(facts.items())},
        unreachable=dict(unreachable or {}), targets=sorted(targets or []), refresh_only=refresh_only,
    )  # fmt: skip
    alloc = _Allocation(state)
    wanted = {ld.deployment.name: ld for ld in desired.deployments}
    names = sorted(set(wanted) | set(state.deployments))
    if targets:
        names = [n for n in names if n in targets]
    ordered = sorted(names, key=lambda n: (-(wanted[n].deployment.priority if n in wanted else 0), n))
    for name in ordered:
        record = state.deployments.get(name)
        if name not in wanted and hold_absent:
            assert record is not None
            plan.changes.append(
                DeploymentChange(
                    name=name,
                    old_revision=record.revision,
                    revision=record.revision,
                    action=["no-op"],
                    blocked=[f"not destroyed, though no valid document names it: {hold_absent}"],
                )
            )
            continue
        if name not in wanted:
            assert record is not None
            by_host = {h.name: h for h in inventory.hosts}
            plan.changes.append(
                DeploymentChange(
                    name=name,
                    action=["delete"],
                    reasons=["removed from the documents"],
                    old_revision=record.revision,
                    revision=record.revision,
                    replicas=[_delete(r, "not in the documents") for r in record.replicas if r.host in facts],
                    blocked=[_out_of_reach(r, by_host) for r in record.replicas if r.host not in facts],
                )
            )
            continue
        d = wanted[name].deployment
        model = desired.model(d.model)
        provider = resolve_engine(d, model)
        assert model is not None and provider is not None
        origin = wanted[name].origin
        change, drift = plan_deployment(
            d, model, provider, model_facts.get(model.name), record, inventory, facts, alloc,
            names=lambda internal, o=origin: field_name(o, internal),  # type: ignore[misc]
        )  # fmt: skip
        plan.changes.append(change)
        plan.drift.extend(drift)
    plan.gateways, found = plan_gateways(plan.changes, state, inventory, facts, desired.api_keys)
    plan.drift += [Drift(host=d["host"], unit=GATEWAY_UNIT, kind=d["kind"], detail=d["detail"])  # type: ignore[arg-type]
                   for d in found]  # fmt: skip
    managed = {r.unit for rec in state.deployments.values() for r in rec.replicas} | {GATEWAY_UNIT}
    for host, f in sorted(facts.items()):
        for u in f.units:
            if u.name.startswith(UNIT_PREFIX) and u.name not in managed:
                detail = f"{u.name} on {host} is not in this state; engine-ctl leaves it alone"
                plan.drift.append(Drift(host=host, unit=u.name, kind="unmanaged", detail=detail))
    attach_unit_diffs(plan, facts)
    if refresh_only:
        for c in plan.changes:
            c.action = ["no-op"]
            c.replicas = []
        for g in plan.gateways:
            g.action = ["no-op"]
    plan.absent = [c.name for c in plan.changes if c.action == ["delete"]]
    plan.refused = destroy_refusals(plan, state)
    return plan


__all__ = ["DeploymentChange", "Drift", "Plan", "ReplicaChange", "make_plan"]
