"""Deployment and replica states from the recorded state plus live facts and health. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, Field, SerializerFunctionWrapHandler, model_serializer

from engine_ctl.core.fit.hostfacts import HostFacts
from engine_ctl.providers import PROVIDERS
from engine_ctl.state.model import DeploymentRecord, ReplicaRecord

DeploymentState = Literal["Pending", "Starting", "Ready", "ScaledToZero", "Failed"]


class InstanceStatus(BaseModel):
    index: int
    host: str
    unit: str
    port: int
    gpus: list[int]
    state: Literal["ready", "starting", "failed", "stopped", "unknown"]
    restarts: int | None = None
    last_error: str | None = None


class Member(BaseModel):
    """Seed 000's members[]: each replica, and whether it is ready: behind the endpoint, its health check
    passing as every gateway sees it."""

    run: str
    machine: str
    state: str
    reason: str | None = None
    ready: bool


class Endpoint(BaseModel):
    name: str
    listen_port: int | None = None
    external: str | None = None


class DeploymentStatus(BaseModel):
    name: str
    state: DeploymentState
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
    members: list[Member] = Field(default_factory=list)
    api: Literal["decisions"] | None = None
    """"decisions" for a decision model (seed 003: status shows an API line for it); a chat deployment has none."""

    @model_serializer(mode="wrap")
    def _api_only_for_decisions(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if data.get("api") is None:
            data.pop("api", None)
        return data


def instance_status(r: ReplicaRecord, facts: HostFacts | None, loading: frozenset[str] = frozenset()) -> InstanceStatus:
    """`loading`: what the engine's health check answers while it loads its model (its provider's
    loading_statuses): such an answer from an active unit is starting, with no error."""
    base = {"index": r.index, "host": r.host, "unit": r.unit, "port": r.port, "gpus": r.gpu_indexes}
    if facts is None:
        return InstanceStatus(**base, state="unknown", last_error=f"host {r.host} unreachable")
    unit = next((u for u in facts.units if u.name == r.unit), None)
    health = facts.health.get(str(r.port))
    if unit is None or unit.sha256 is None:
        return InstanceStatus(**base, state="failed", last_error="unit file missing on the host")
    restarts = unit.n_restarts
    error = r.reason
    if restarts:
        status = f"exit status {unit.exec_main_status}" if unit.exec_main_status else "killed or exited"
        error = f"restarted {restarts} time(s), last: {status}"
    if unit.active_state == "active" and health == "200":
        state = "ready"
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
        if not others:
            return Verdict(state="Pending", reason=pending)
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


def recorded_verdict(
    replicas: list[ReplicaRecord], wanted: int, target: int, *,
    failure: str | None = None, pending: str | None = None, fit_failed: bool = False,
) -> Verdict:  # fmt: skip
    """The verdict from the replicas as the state records them (what apply writes)."""
    serving = [r.revision for r in replicas if r.status == "serving"]
    others = ["starting" if r.status == "pending" else r.status for r in replicas if r.status != "serving"]
    return verdict(serving, others, wanted, target, failure=failure, pending=pending, fit_failed=fit_failed)


def members(
    name: str,
    ordered: Sequence[ReplicaRecord],
    instances: Sequence[InstanceStatus],
    gateways: Sequence[HostFacts | None],
) -> list[Member]:
    """Each replica as the gateways see it: ready when its engine answers and every gateway reached has it UP."""
    out = []
    for r, i in zip(ordered, instances, strict=True):
        server = f"d_{name}/r{r.index}{r.slot}"
        seen = [g.gateway_servers.get(server, "") for g in gateways if g is not None]
        behind = bool(gateways) and bool(seen) and all(s.startswith("UP") for s in seen)
        out.append(Member(run=r.unit, machine=r.host, state=i.state, reason=i.last_error,
                          ready=i.state == "ready" and behind))  # fmt: skip
    return out


def deployment_status(
    rec: DeploymentRecord, facts: dict[str, HostFacts], gateways: Sequence[tuple[str, str]] = ()
) -> DeploymentStatus:
    """`gateways`: (host, endpoint host:port) of each gateway host of the inventory."""
    ordered = sorted(rec.replicas, key=lambda x: (x.index, x.slot))
    engine = PROVIDERS.get(rec.plan.engine) if rec.plan else None
    loading = engine.loading_statuses if engine else frozenset()
    instances = [instance_status(r, facts.get(r.host), loading) for r in ordered]
    wanted = (rec.spec.replicas_min or 1) if rec.spec else len(instances)
    serving = [r.revision for r, i in zip(ordered, instances, strict=True) if i.state == "ready"]
    others = [i.state for i in instances if i.state != "ready"]
    # "cannot be served as asked" (the fit failed) stays Failed whatever still runs; apply records it so
    fit_failed = rec.state == "Failed" and rec.last_error is not None and rec.reason == rec.last_error
    failure = rec.last_error or (rec.reason if rec.state == "Failed" else None)
    found = verdict(serving, others, wanted, rec.revision, failure=failure, fit_failed=fit_failed)
    return DeploymentStatus(
        name=rec.name, state=found.state, reason=found.reason, ready=len(serving),
        replicas=max(wanted, len(instances)), revision=rec.revision, hosts=sorted({r.host for r in rec.replicas}),
        instances=instances, served_model_name=rec.name, kind=rec.plan.kind if rec.plan else None,
        api="decisions" if rec.spec is not None and rec.spec.api == "decisions" else None,
        endpoint=Endpoint(name=rec.name, listen_port=int(gateways[0][1].rsplit(":", 1)[1]),
                          external=gateways[0][1]) if gateways else None,
        gateways=[f"http://{e}" for _, e in gateways],
        members=members(rec.name, ordered, instances, [facts.get(h) for h, _ in gateways]) if gateways else
        [Member(run=r.unit, machine=r.host, state=i.state, reason=i.last_error, ready=False)
         for r, i in zip(ordered, instances, strict=True)],
    )  # fmt: skip
