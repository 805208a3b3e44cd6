"""Deployment and replica states from the recorded state plus live facts and health. Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, Field

from engine_ctl.core.fit.hostfacts import HostFacts
from engine_ctl.core.model import DesiredState
from engine_ctl.core.plan.capabilities import capabilities, plan_extras
from engine_ctl.core.plan.decisions import decided_facts
from engine_ctl.core.plan.deploy import SAVED, is_saved
from engine_ctl.core.plan.diff import spec_digest
from engine_ctl.core.plan.grouplinks import link_problem
from engine_ctl.core.plan.internalkey import KEY_CHECK_PATH, REFUSED, internal_key_file
from engine_ctl.core.plan.operator import keeps_stopped
from engine_ctl.core.plan.scaler import Decision, scales
from engine_ctl.core.plan.wake import parked
from engine_ctl.core.record.model import DeploymentRecord, FailedStart, ReplicaRecord
from engine_ctl.core.render.gateway import API_FRONTEND, GATEWAY_UNIT, internal_endpoint
from engine_ctl.providers import PROVIDERS

DeploymentState = Literal["Pending", "Starting", "Ready", "ScaledToZero", "Failed"]
HeldState = Literal["stopping", "stopped", "parking", "parked", "deleted"]
"""An operator's verb in progress or done (lowercase, as seed 003 shows them)."""
Provenance = Literal["measured", "default"]
GIB = 1024**3
MIB = 1024**2


class InstanceStatus(BaseModel):
    index: int
    host: str
    unit: str
    port: int
    gpus: list[int]
    state: Literal["ready", "starting", "failed", "stopped", "unknown", "stopping", "parking", "parked"]
    restarts: int | None = None
    last_error: str | None = None
    lifecycle: str = "active"
    """Seed 003's LIFECYCLE: active (apply keeps it running), removing (being replaced or removed), stopped."""
    devices: list[str] = Field(default_factory=list)
    """Seed 003's DEVICES: gpu0, gpu1, … (empty on a CPU deployment)."""
    removed: bool = Field(default=False, exclude=True)
    """A failed start's row: its unit was removed again (not one of the units running now)."""


class Member(BaseModel):
    """Seed 000's members[]: each replica, and whether it is ready: behind the endpoint, its health check
    passing as every gateway sees it."""

    run: str
    machine: str
    state: str
    reason: str | None = None
    ready: bool


class Endpoint(BaseModel):
    """Seed 000's endpoint: its name (deploy-<name>), the internal address callers inside the fleet use without a
    key (the inventory's hosts only), and the gateway's port and address for everyone with a key."""

    name: str
    internal: str | None = None
    listen_port: int | None = None
    external: str | None = None


class DeploymentStatus(BaseModel):
    name: str
    state: DeploymentState | HeldState
    reason: str | None = None
    ready: int
    replicas: int
    revision: int
    hosts: list[str]
    instances: list[InstanceStatus]
    served_model_name: str = ""
    """What a client puts in `model`: the deployment's name."""
    kind: str | None = None
    endpoint: Endpoint | None = None
    gateways: list[str] = Field(default_factory=list)
    """The base URLs (without /v1) where programs call it with an API key; empty without a gateway host."""
    gateways_down: list[str] = Field(default_factory=list, exclude_if=lambda v: not v)
    """Gateway hosts whose gateway does not run, in words: their endpoint answers nothing, whatever the replicas."""
    members: list[Member] = Field(default_factory=list)
    id: str = ""
    """The deployment's stable ID (a ULID; empty for a record written before IDs)."""
    startup: StartupStatus | None = None
    initialize_s: float | None = None
    last_operation: str | None = None
    api: str | None = None
    """`decisions` for a decisions deployment; None (left out of --json) for chat."""
    spec: dict[str, Any] | None = None
    plan: dict[str, Any] | None = None
    capabilities: dict[str, Any] = Field(default_factory=dict)
    """Seed 000's: what it answers (chat, tools with tools_reason when not, reasoning_switch, engine, parsers, …)."""
    ready_replicas: int = 0
    documents_changed: bool = Field(default=False, exclude_if=lambda v: not v)
    """The documents (when given) ask for another revision than the one applied, which is not served yet."""
    decisions: list[Decision] = Field(default_factory=list)
    """The scaler's last decisions for this deployment, each with the figure it acted on (oldest first)."""


# --- seed 003's status: start-up, initialize, last operation, lifecycle, devices (lifecycle records) ----------
class StartupStatus(BaseModel):
    """What a start of the recorded revision sets aside (seed 003's STARTUP), and where each figure came from:
    `measured` by its first start, or `default` (the fit's estimate)."""

    reserved_bytes: int
    """The card's memory on a GPU (all of the replica's GPUs), the host RAM on a CPU deployment."""
    ram_bytes: int | None = None
    """On a discrete GPU: the host RAM the engine process takes beside the card's memory."""
    provenance: Provenance
    device_provenance: Provenance | None = None
    host_provenance: Provenance | None = None
    measured: dict[str, Any] | None = None
    """The start-up record: revision, host, host_peak_bytes, device_peak_bytes, sources, initialize_s."""
    whole_host: bool = False
    """Not measured yet, and the estimate is above what any host gives: the first start runs alone on one host
    and sets aside all of it (the figure shown is that host's)."""


def startup_status(rec: DeploymentRecord) -> StartupStatus | None:
    plan = rec.plan
    if plan is None:
        return None
    m = rec.startup if rec.startup is not None and rec.startup.revision == rec.revision else None
    host_m = m.host_peak_bytes if m is not None else None
    host: tuple[int, Provenance] = (host_m, "measured") if host_m is not None else (plan.memory_bytes, "default")
    measured = m.model_dump(mode="json") if m is not None else None
    alone = rec.whole_host and host[1] == "default"
    if plan.accelerator == "cpu" or plan.gpus == 0:
        return StartupStatus(reserved_bytes=host[0], provenance=host[1], measured=measured, whole_host=alone)
    dev_m = sum(m.device_peak_bytes.values()) if m is not None and m.device_peak_bytes else None
    dev: tuple[int, Provenance] = (
        (dev_m, "measured") if dev_m is not None else (plan.min_gpu_memory_bytes * plan.gpus, "default")
    )
    both: Provenance = "measured" if host[1] == dev[1] == "measured" else "default"
    return StartupStatus(reserved_bytes=dev[0], ram_bytes=host[0], provenance=both, device_provenance=dev[1],
                         host_provenance=host[1], measured=measured, whole_host=alone)  # fmt: skip


def size_text(n: int) -> str:
    """13.2 GiB; below 1 GiB in MiB (a tiny model's 41.3 MiB)."""
    return f"{n / GIB:.1f} GiB" if n >= GIB else f"{n / MIB:.1f} MiB"


def startup_text(s: StartupStatus | None) -> str:
    """`13.2 GiB (+4.0 GiB RAM)` on a discrete GPU, `28.5 GiB` otherwise; `-` before anything was fitted."""
    if s is None:
        return "-"
    return size_text(s.reserved_bytes) + (f" (+{size_text(s.ram_bytes)} RAM)" if s.ram_bytes is not None else "")


def initialize_text(seconds: float | None) -> str:
    return f"{round(seconds)}s" if seconds is not None else "-"


def lifecycle_of(r: ReplicaRecord) -> str:
    return {"removing": "removing", "stopped": "stopped"}.get(r.status, "active")


def with_records(i: InstanceStatus, r: ReplicaRecord) -> InstanceStatus:
    return i.model_copy(update={"lifecycle": lifecycle_of(r), "devices": [f"gpu{g}" for g in r.gpu_indexes]})


def record_fields(rec: DeploymentRecord, facts: Mapping[str, HostFacts] | None = None) -> dict[str, Any]:
    """The recorded fields seed 003's status shows, and seed 000's "What the cluster returns" that the record
    holds (the specification with what was chosen, the plan with the build its replicas run, the capabilities
    derived from the model and the engine). `facts`: the hosts' (the AMD builds they have)."""
    startup = startup_status(rec)
    measured = rec.startup if rec.startup is not None and rec.startup.revision == rec.revision else None
    spec = rec.spec.model_dump(mode="json") if rec.spec is not None else None
    if spec is not None and rec.plan is not None:
        spec.update({f: getattr(rec.plan, f) for f in rec.chosen if hasattr(rec.plan, f)})
    return {
        "startup": startup, "initialize_s": measured.initialize_s if measured else None,
        "last_operation": rec.last_operation,
        "api": rec.spec.api if rec.spec is not None and rec.spec.api != "chat" else None,
        "spec": spec, **_plan_and_capabilities(rec, facts or {}),
    }  # fmt: skip


def _plan_and_capabilities(rec: DeploymentRecord, facts: Mapping[str, HostFacts]) -> dict[str, Any]:
    engine = PROVIDERS.get(rec.plan.engine) if rec.plan is not None else None
    if rec.plan is None or engine is None:
        return {"plan": rec.plan.model_dump(mode="json") if rec.plan else None, "capabilities": {}}
    plan = rec.plan.model_dump(mode="json") | plan_extras(engine, rec.replicas, facts)
    plan.pop("capabilities", None)  # the model's word for it: `capabilities` beside the plan is derived
    if rec.model is None:
        return {"plan": plan, "capabilities": {}}
    api = rec.spec.api if rec.spec is not None else "chat"
    args = rec.spec.engine_args if rec.spec is not None else ()
    return {"plan": plan, "capabilities": capabilities(rec.model, engine, api, args)}


def group_problem(r: ReplicaRecord, facts: Mapping[str, HostFacts]) -> str | None:
    """Why a replica group (spec.nodes > 1) is out of service because of one of its workers (None: every worker
    runs), naming the member, its unit and its host."""
    for m in r.members:
        found = facts.get(m.host)
        where = f"group member {m.rank} ({m.unit}) on {m.host}"
        if found is None:
            return f"{where}: host unreachable"
        unit = next((u for u in found.units if u.name == m.unit), None)
        if unit is None or unit.sha256 is None:
            return f"{where}: unit file missing on the host"
        if unit.active_state != "active":
            status = f" (exit status {unit.exec_main_status})" if unit.exec_main_status else ""
            return f"{where} is {unit.active_state}/{unit.sub_state}{status}: the group is out of service"
        if unit.stopped_by_signal:  # the head's /health still says 200: its requests to the member hang
            return (f"{where}: its process (PID {unit.main_pid}) is stopped by a signal (SIGSTOP): it answers "
                    "nothing, and the group's requests wait on it; engine-ctl apply restarts the group")  # fmt: skip
        cut = link_problem(r, m, facts.get(r.host))
        if cut is not None:
            return f"{cut}: the group is out of service until the network between them is back"
    return None


def key_not_sent(r: ReplicaRecord, facts: HostFacts | None, others: Mapping[str, HostFacts]) -> str | None:
    """A replica that answers its own host's internal key while no running gateway sends that key (its host's
    key file rotated by hand, and the engine restarted on it): every request through a gateway is refused."""
    path = internal_key_file(r.argv)
    if path is None or facts is None or facts.key_checks.get(str(r.port)) != "200":
        return None
    held = facts.replica_keys.get(path)
    sent = {g.gateway_key.get("running") for g in others.values() if g.gateway_key} - {None}
    if not held or not sent or sent & set(held):
        return None
    return (
        f"it accepts its host's internal key ({path}), which no running gateway sends: every request through "
        "the gateway is refused (HTTP 401); engine-ctl apply gives it the gateways' key and restarts it"
    )


def instance_status(
    r: ReplicaRecord, facts: HostFacts | None, loading: frozenset[str] = frozenset(),
    others: Mapping[str, HostFacts] | None = None,
) -> InstanceStatus:  # fmt: skip
    """`loading`: what the engine's health check answers while it loads its model (its provider's
    loading_statuses): such an answer from an active unit is starting, with no error. `others`: every host's
    facts, for a replica group's workers (a worker down takes its group out of service)."""
    found = _instance_status(r, facts, loading)
    refused = key_not_sent(r, facts, others or {}) if found.state == "ready" else None
    if refused is not None:
        return found.model_copy(update={"state": "failed", "last_error": refused})
    problem = group_problem(r, others or {}) if r.members and found.state != "unknown" else None
    if problem is None:
        return found
    return found.model_copy(update={"state": "failed", "last_error": problem})


def _instance_status(r: ReplicaRecord, facts: HostFacts | None, loading: frozenset[str]) -> InstanceStatus:
    base = {"index": r.index, "host": r.host, "unit": r.unit, "port": r.port, "gpus": r.gpu_indexes}
    if facts is None:
        return InstanceStatus(**base, state="unknown", last_error=f"host {r.host} unreachable")
    unit = next((u for u in facts.units if u.name == r.unit), None)
    health = facts.health.get(str(r.port))
    if unit is None or unit.sha256 is None:
        return InstanceStatus(**base, state="failed", last_error="unit file missing on the host")
    restarts = max(unit.n_restarts or 0, len(unit.exits))  # NRestarts starts again once it serves; its exits stay
    error = r.reason
    if restarts:
        status = f"exit status {unit.exec_main_status}" if unit.exec_main_status else "killed or exited"
        error = f"restarted {restarts} time(s), last: {status}"
    if unit.last_crash:  # the unit's own record of its crashes (NRestarts starts again once it serves)
        error = f"crashed {len(unit.exits)} time(s), last {unit.last_crash}"
    refused = facts.key_checks.get(str(r.port))
    if unit.stopped_by_signal:  # SIGSTOP: it answers nothing
        state = "failed"
        error = f"its engine (PID {unit.main_pid}) is stopped by a signal (SIGSTOP): engine-ctl apply restarts it"
    elif unit.active_state == "active" and health == "200" and refused in REFUSED:  # no request of a gateway gets in
        state = "failed"
        error = (f"it refuses the internal key the gateways send (HTTP {refused} to GET {KEY_CHECK_PATH} with its "
                 "host's key): engine-ctl apply restarts it")  # fmt: skip
    elif unit.active_state == "active" and health == "200":
        state = "ready"
    elif unit.sub_state == "auto-restart":  # its engine exited; systemd starts it again: a crash loop, not a start
        state = "failed"
        how = f"exit status {unit.exec_main_status}" if unit.exec_main_status else "killed or exited"
        error = error or f"its engine exited ({how}); systemd is restarting it"
    elif unit.active_state in ("activating", "reloading") or (unit.active_state == "active" and health in loading):
        state = "starting"
    elif unit.active_state == "failed":
        state = "failed"
        error = error or f"the unit failed (exit status {unit.exec_main_status})"
    elif unit.active_state == "active":
        state = "starting"
        error = error or f"health check: {health}"
    else:
        state = "stopped"
        error = error or f"{unit.active_state}/{unit.sub_state}"
    return InstanceStatus(**base, state=state, restarts=restarts, last_error=error)


class Verdict(BaseModel):
    state: DeploymentState
    reason: str | None = None


def verdict(
    serving: Sequence[int], others: Sequence[str], wanted: int, target: int, *,
    failure: str | None = None, pending: str | None = None, fit_failed: bool = False,
) -> Verdict:  # fmt: skip
    """The seed's deployment state from its replicas: `serving` holds the revision of each serving replica,
    `others` the state of each one that does not serve. One rule for what apply records and what status shows.
    Ready means at least one replica serves (seed 000, States); the reason says how many, at which revision,
    and why the last change failed."""
    if fit_failed:
        return Verdict(state="Failed", reason=failure)
    ready = len(serving)
    total = max(wanted, ready + len(others))
    if ready == 0:
        if any(o in ("starting", "pending") for o in others):
            return Verdict(state="Starting", reason=pending or "a replica is starting")
        if failure or any(o == "failed" for o in others):
            return Verdict(state="Failed", reason=failure or "no replica serves")
        if not others and wanted == 0 and not pending:  # min: 0, and no on-demand replica runs
            return Verdict(state="ScaledToZero", reason="no replica runs; the next request starts one")
        if not others:
            return Verdict(state="Pending", reason=pending)
        if all(o == "unknown" for o in others):
            return Verdict(state="Failed", reason=pending or "no replica is known to serve: their hosts could not "
                           "be reached")  # fmt: skip
        return Verdict(state="Failed", reason=pending or "no replica serves")
    parts = ["1 replica serving" if ready == 1 and total == 1 else f"{ready} of {total} replicas serving"]
    at_target = sum(1 for r in serving if r == target)
    if at_target < total:
        parts.append(f"{at_target} of {total} at revision {target}")
    if pending:
        parts.append(pending)
    if failure:
        parts.append(f"last change failed: {failure}")
    return Verdict(state="Ready", reason="; ".join(parts))


class Slot(BaseModel):
    """One unit of a replica as a verdict counts it: its replica's index, its state (`ready` serves), the revision
    it runs, and whether it is idle (an on-demand slot nobody started: not counted at all)."""

    index: int
    state: str
    revision: int
    idle: bool = False


NOT_SERVING = ("starting", "pending", "failed", "unknown", "stopping", "parking", "stopped", "parked")
"""A replica's state from its slots' when none serves: the first of these any slot is in (a replica one of whose
slots starts is starting, whatever its other slot did)."""


def per_replica(slots: Sequence[Slot], target: int, limit: int | None = None) -> tuple[list[int], list[str]]:
    """(the revision of each serving replica, the state of each other one): one entry per replica index, its old
    and new slots (a and b of a roll) counted as one replica, and only the replicas the document asks for (index
    below `limit`, its `replicas.max`). A replica serves when a slot of it is ready (at `target` if one is)."""
    serving: list[int] = []
    others: list[str] = []
    for index in sorted({s.index for s in slots if limit is None or s.index < limit}):
        mine = [s for s in slots if s.index == index]
        ready = [s.revision for s in mine if s.state == "ready"]
        if ready:
            serving.append(target if target in ready else max(ready))
            continue
        states = [s.state for s in mine if not s.idle]
        if states:
            others.append(next((n for n in NOT_SERVING if n in states), states[0]))
    return serving, others


def recorded_verdict(
    replicas: list[ReplicaRecord], wanted: int, target: int, *,
    failure: str | None = None, pending: str | None = None, fit_failed: bool = False, limit: int | None = None,
) -> Verdict:  # fmt: skip
    """The verdict from the replicas as the state records them (what apply writes). An on-demand replica apply
    installed and did not start (standby) is not counted: the scaler starts it. One replica per index."""
    named = {"serving": "ready", "pending": "starting"}
    slots = [Slot(index=r.index, state=named.get(r.status, r.status), revision=r.revision,
                  idle=r.status == "standby") for r in replicas]  # fmt: skip
    serving, others = per_replica(slots, target, limit)
    return verdict(serving, others, wanted, target, failure=failure, pending=pending, fit_failed=fit_failed)


def members(
    name: str,
    ordered: Sequence[ReplicaRecord],
    instances: Sequence[InstanceStatus],
    gateways: Sequence[HostFacts | None],
) -> list[Member]:
    """Each replica as the gateways see it: ready when its engine answers and every gateway reached sends it
    requests (routed)."""
    out = []
    for r, i in zip(ordered, instances, strict=True):
        server = f"d_{name}/r{r.index}{r.slot}"
        seen = [routed(g, name, server) for g in gateways if g is not None]
        behind = bool(gateways) and bool(seen) and all(seen)
        out.append(Member(run=r.unit, machine=r.host, state=i.state, reason=i.last_error,
                          ready=i.state == "ready" and behind))  # fmt: skip
    return out


def routed(gateway: HostFacts, name: str, server: str) -> bool:
    """Whether the running gateway sends the deployment's requests to `server`: it has the server UP with a
    weight, routes the deployment (its routes in memory, where read) and does not answer it deployment_stopped
    itself. An admin command can take any of these away while the files stay right."""
    if gateway.gateway_frontends.get(API_FRONTEND, "OPEN") != "OPEN":  # `disable frontend`: no connection taken
        return False
    maps = gateway.gateway_maps or {}
    routes = maps.get("models.map")
    if (routes is not None and name not in routes) or name in (maps.get("stopped.map") or {}):
        return False
    return gateway.gateway_weights.get(server) != "0" and gateway.gateway_servers.get(server, "").startswith("UP")


def seen_by_gateways(
    i: InstanceStatus, name: str, r: ReplicaRecord, gateways: Sequence[HostFacts | None]
) -> InstanceStatus:
    """An instance whose host could not be reached (unknown) that every gateway reached routes, its health check
    passing there: it serves, as far as any client can tell; said so, with why its host is not asked."""
    reached = [g for g in gateways if g is not None]
    server = f"d_{name}/r{r.index}{r.slot}"
    if i.state != "unknown" or not reached or not all(routed(g, name, server) for g in reached):
        return i
    return i.model_copy(update={"state": "ready", "last_error": f"{i.last_error}; every gateway reached sends it "
                                "requests (its health check passes there)"})  # fmt: skip


def idle(r: ReplicaRecord, i: InstanceStatus) -> bool:
    """An on-demand replica whose unit is installed and does not run: the scaler has not started it (or stopped
    it). Not a replica that fails to serve."""
    return r.on_demand and i.state == "stopped"


def deployment_status(
    rec: DeploymentRecord, facts: dict[str, HostFacts], gateways: Sequence[tuple[str, str]] = (), now: str = ""
) -> DeploymentStatus:
    """`gateways`: (host, endpoint host:port) of each gateway host of the inventory; `now` (ISO time): a stopped
    deployment's stop is done once its time passed (a unit that runs then was started outside engine-ctl)."""
    ordered = sorted(rec.replicas, key=lambda x: (x.index, x.slot))
    facts = decided_facts(rec, facts)  # a decisions replica is ready by its decision, not GET /health alone
    engine = PROVIDERS.get(rec.plan.engine) if rec.plan else None
    loading = engine.loading_statuses if engine else frozenset()
    instances = [with_records(instance_status(r, facts.get(r.host), loading, facts), r) for r in ordered]
    if gateways:  # a replica whose host is out of reach, but which every gateway reached sends requests to
        seen = [facts.get(h) for h, _ in gateways]
        instances = [seen_by_gateways(i, rec.name, r, seen) for i, r in zip(instances, ordered, strict=True)]
    failed = failed_rows(rec)
    wanted = rec.spec.replicas_min if rec.spec else len({r.index for r in ordered} | {f.index for f in failed})
    slots = [Slot(index=r.index, state=i.state, revision=r.revision, idle=idle(r, i))
             for r, i in zip(ordered, instances, strict=True)]  # fmt: skip
    slots += [Slot(index=f.index, state="failed", revision=f.revision) for f in failed]
    serving, others = per_replica(slots, rec.revision, rec.spec.replicas_max if rec.spec else None)
    # "cannot be served as asked" (the fit failed) stays Failed whatever still runs; apply records it so
    fit_failed = rec.state == "Failed" and rec.last_error is not None and rec.reason == rec.last_error
    failure = rec.last_error or (rec.reason if rec.state == "Failed" else None)
    pending = rec.reason if rec.state == "Pending" else None  # what it waits for, as apply recorded it
    found = by_hand(verdict(serving, others, wanted, rec.revision, failure=failure, pending=pending,
                            fit_failed=fit_failed), others)  # fmt: skip
    held = held_state(rec, facts, now)
    status = DeploymentStatus(
        id=rec.id,
        name=rec.name, state=held[0] if held else found.state, reason=held[1] if held else found.reason,
        ready=len(serving), replicas=max(wanted, len(serving) + len(others)),
        revision=rec.revision or max((f.revision for f in failed), default=0),
        hosts=sorted({h for r in rec.replicas for h in r.hosts} | {f.host for f in failed}),
        instances=sorted(instances + [failed_instance(f) for f in failed], key=lambda i: (i.index, i.unit)),
        served_model_name=rec.name, kind=rec.plan.kind if rec.plan else None,
        endpoint=Endpoint(name=f"deploy-{rec.name}", internal=internal_endpoint(gateways[0][1]),
                          listen_port=int(gateways[0][1].rsplit(":", 1)[1]),
                          external=gateways[0][1]) if gateways else Endpoint(name=f"deploy-{rec.name}"),
        gateways=[f"http://{e}" for _, e in gateways],
        members=(members(rec.name, ordered, instances, [facts.get(h) for h, _ in gateways]) if gateways else
                 [Member(run=r.unit, machine=r.host, state=i.state, reason=i.last_error, ready=False)
                  for r, i in zip(ordered, instances, strict=True)])
        + [Member(run=f.unit, machine=f.host, state="failed", reason=f.error, ready=False) for f in failed],
        ready_replicas=len(serving), **record_fields(rec, facts),
    )  # fmt: skip
    status.gateways_down = gateways_down(gateways, facts)
    return held_view(status, held[0], facts, rec) if held else status


def gateways_down(gateways: Sequence[tuple[str, str]], facts: Mapping[str, HostFacts]) -> list[str]:
    """Each gateway host (read) whose engine-ctl-gateway.service is not active: its endpoint answers nothing (a
    probe, session 17: status said "ready" with only "0 of 1 behind the gateway" beside a stopped gateway)."""
    out = []
    for host, _ in gateways:
        f = facts.get(host)
        unit = next((u for u in f.units if u.name == GATEWAY_UNIT), None) if f is not None else None
        if f is not None and (unit is None or unit.active_state != "active"):
            state = unit.active_state if unit is not None and unit.sha256 is not None else "not installed"
            out.append(f"the gateway on {host} is {state}: its endpoint answers nothing; engine-ctl apply starts it")
    return out


def failed_rows(rec: DeploymentRecord) -> list[FailedStart]:
    """The failed starts status shows as rows of their own: those of replicas with no recorded unit at their
    revision or a later one (a roll's new replica that failed keeps its row beside the old one put back)."""
    return [f for f in rec.failed_starts
            if not any(r.index == f.index and r.revision >= f.revision for r in rec.replicas)]  # fmt: skip


def failed_instance(f: FailedStart) -> InstanceStatus:
    """Seed 003's row of a replica whose start failed: `0  gpu-box  failed  active  gpu0  launch_failed: …`."""
    return InstanceStatus(index=f.index, host=f.host, unit=f.unit, port=f.port, gpus=f.gpu_indexes, state="failed",
                          last_error=f.error, devices=[f"gpu{g}" for g in f.gpu_indexes], removed=True)  # fmt: skip


def by_hand(found: Verdict, others: Sequence[str]) -> Verdict:
    """No replica serves because each one's unit was stopped outside engine-ctl (no verb holds it, no scaler stops
    it): what the plan calls drift and apply repairs, said so."""
    if found.state != "Failed" or found.reason != "no replica serves" or not others:
        return found
    if any(o != "stopped" for o in others):
        return found
    n = len(others)
    what = "its replica's unit is" if n == 1 else f"the units of its {n} replicas are"
    return found.model_copy(update={"reason": f"no replica serves: {what} stopped outside engine-ctl (the plan shows "
                                    "it as drift; `engine-ctl apply` starts it)"})  # fmt: skip


def held_state(rec: DeploymentRecord, facts: dict[str, HostFacts], now: str = "") -> tuple[HeldState, str] | None:
    """A deployment an operator holds (engine_ctl.core.plan.operator): stopping then stopped, parking then parked
    (for a park that stops the engine, by its units' states), or deleted; None when no verb holds it. A unit that
    still runs once the stop had its time (keeps_stopped at `now`) was started outside engine-ctl: the verb's
    phase is done, and the reason says what runs."""
    held = rec.operator
    if held is None:
        return None
    reason = f"{held.verb} by an operator at {held.when}"
    if held.verb == "deleted":
        return "deleted", reason
    states = []
    for r in rec.replicas:
        unit = next((u for u in facts[r.host].units if u.name == r.unit), None) if r.host in facts else None
        states.append(unit.active_state if unit is not None else "inactive")
    going = any(s in ("active", "activating", "deactivating", "reloading") for s in states)
    if going and keeps_stopped(rec, now, facts):
        reason += "; but a unit of it runs again (started outside engine-ctl): engine-ctl apply stops it"
        return ("parked" if held.verb == "parked" else "stopped"), reason
    if held.verb == "parked":
        asleep = held.level > 0  # asleep, its unit active: parked once accepted
        return ("parking" if going and not asleep else "parked"), reason
    return ("stopping" if going else "stopped"), reason


# --- a held deployment as seed 003 shows it (follow-up of issue 13) --------------------------------------------
DONE = {"stopping": "stopped", "parking": "parked"}
"""A verb's phase while under way, and once done."""


def held_view(
    s: DeploymentStatus, phase: HeldState, facts: dict[str, HostFacts] | None = None,
    rec: DeploymentRecord | None = None,
) -> DeploymentStatus:  # fmt: skip
    """Seed 003's rows of a deployment an operator holds: the deployment in its phase (`parked`), READY 0 of its
    replicas (an engine asleep may still answer its health check: it serves nothing), each instance in the phase
    with no error (`0 gpu-box parked active gpu0 -`; an instance whose engine is still going away is `stopping` or
    `parking`), and LAST OPERATION `park succeeded` once done (`park requested` while under way)."""
    verb = {"stopping": "stop", "stopped": "stop", "parking": "park", "parked": "park", "deleted": "delete"}[phase]
    done = DONE.get(phase, phase)
    asleep = rec is not None and rec.operator is not None and rec.operator.level > 0
    instances = [
        i.model_copy(update={"state": phase if asleep else _instance_phase(i, done, facts), "last_error": None})
        if i.state != "unknown" else i
        for i in s.instances
    ]  # fmt: skip
    last = f"{verb} succeeded" if phase == done else f"{verb} requested"
    if rec is not None and is_saved(rec):  # `engine-ctl deploy` saved it, and nothing has started it yet
        last = SAVED
    members = [m.model_copy(update={"state": i.state, "reason": None, "ready": False})
               for m, i in zip(s.members, instances, strict=False)]  # fmt: skip
    return s.model_copy(update={
        "state": phase, "ready": 0, "ready_replicas": 0, "replicas": max(s.replicas, len({i.index for i in instances})),
        "instances": instances, "members": members, "last_operation": last,
    })  # fmt: skip


def _instance_phase(i: InstanceStatus, done: str, facts: dict[str, HostFacts] | None) -> str:
    """An instance's own phase: `done` (stopped, parked) unless its engine still goes away (its unit still active,
    for a verb that stops it; an engine parked asleep stays active, and the deployment's phase is its)."""
    if done not in DONE.values() or facts is None or i.host not in facts:
        return done
    unit = next((u for u in facts[i.host].units if u.name == i.unit), None)
    going = unit is not None and unit.active_state in ("active", "activating", "deactivating", "reloading")
    return {"stopped": "stopping", "parked": "parking"}[done] if going else done


# --- what status may read of the scaler's state.json (issue 24: never a file left by another deployment ID) ----
def scaler_entries(document: Any, records: Mapping[str, DeploymentRecord]) -> Any:
    """The scaler's state.json (as a gateway host's facts carry it) as status may read it: only the entries of
    deployments the scaler acts on now (they scale, or an operator parked them), each written for this deployment
    ID. An entry left by an older deployment of the same name (destroyed, made again), or kept after the scaler
    stopped acting on it (a park that `start` cleared), says nothing of what runs now."""
    if not isinstance(document, dict) or not isinstance(document.get("deployments"), dict):
        return document
    kept = {}
    for name, entry in document["deployments"].items():
        rec = records.get(str(name))
        if rec is None or not (scales(rec.spec) or parked(rec)) or not isinstance(entry, dict):
            continue
        if rec.id and entry.get("id") != rec.id:
            continue
        kept[name] = entry
    return {**document, "deployments": kept}


def hosts_not_in(records: Sequence[DeploymentRecord], known: set[str]) -> list[tuple[str, int, str]]:
    """(deployment, position in its replicas, host) of each recorded replica on a host the inventory does not have:
    status cannot ask it, and it is not "unreachable" but unknown (an error at the place that names it)."""
    return [(d.name, i, r.host) for d in records for i, r in enumerate(d.replicas) if r.host not in known]


# --- status against the documents (issue 24, 16c) -------------------------------------------------------------
def against_documents(s: DeploymentStatus, rec: DeploymentRecord, desired: DesiredState | None) -> DeploymentStatus:
    """A deployment's status, given the documents: when they ask for another specification than the applied one
    (a change not applied yet, or one no apply can make now, such as weights that are not usable), the status
    says so, and never reads as if the documents were served. Held deployments and records without a
    specification hash (an import of changed units) are left as they are."""
    loaded = desired.deployment(rec.name) if desired is not None else None
    model = desired.model(loaded.deployment.model) if desired is not None and loaded is not None else None
    if loaded is None or model is None or rec.operator is not None or not rec.spec_hash:
        return s
    if spec_digest(loaded.deployment, model) == rec.spec_hash:
        return s
    note = (f"the documents changed since revision {rec.revision} was applied, and that change is not served yet "
            "(`engine-ctl plan` shows it, and why when no apply can make it now)")  # fmt: skip
    return s.model_copy(update={"documents_changed": True, "reason": f"{s.reason}; {note}" if s.reason else note})
