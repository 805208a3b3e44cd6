"""Deployment and replica states from the recorded state plus live facts and health. Pure."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from engine_ctl.facts import HostFacts
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


class DeploymentStatus(BaseModel):
    name: str
    state: DeploymentState
    reason: str | None = None
    ready: int
    replicas: int
    revision: int
    hosts: list[str]
    instances: list[InstanceStatus]


def instance_status(r: ReplicaRecord, facts: HostFacts | None) -> InstanceStatus:
    base = {"index": r.index, "host": r.host, "unit": r.unit, "port": r.port, "gpus": r.gpu_indexes}
    if facts is None:
        return InstanceStatus(**base, state="unknown", last_error=f"host {r.host} unreachable")  # type: ignore[arg-type]
    unit = next((u for u in facts.units if u.name == r.unit), None)
    health = facts.health.get(str(r.port))
    if unit is None or unit.sha256 is None:
        return InstanceStatus(**base, state="failed", last_error="unit file missing on the host")  # type: ignore[arg-type]
    restarts = unit.n_restarts
    error = r.reason
    if restarts:
        status = f"exit status {unit.exec_main_status}" if unit.exec_main_status else "killed or exited"
        error = f"restarted {restarts} time(s), last: {status}"
    if unit.active_state == "active" and health == "200":
        state = "ready"
    elif unit.active_state in ("activating", "reloading") or (unit.active_state == "active" and health == "503"):
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
    return InstanceStatus(**base, state=state, restarts=restarts, last_error=error)  # type: ignore[arg-type]


def deployment_status(rec: DeploymentRecord, facts: dict[str, HostFacts]) -> DeploymentStatus:
    instances = [instance_status(r, facts.get(r.host)) for r in sorted(rec.replicas, key=lambda x: (x.index, x.slot))]
    ready = sum(1 for i in instances if i.state == "ready")
    wanted = int(rec.spec.get("replicas_min", len(instances)) or 1) if rec.spec else len(instances)
    reason = rec.reason
    if rec.state == "Failed" and ready == 0:
        state: DeploymentState = "Failed"
    elif ready > 0:
        state = "Ready"
        reason = (
            f"{ready} replica serving"
            if ready == 1 and wanted == 1
            else f"{ready} of {max(wanted, len(instances))} replicas serving"
        )
        if rec.state == "Failed":
            reason += f"; last change failed: {rec.reason}"
    elif any(i.state == "starting" for i in instances):
        state = "Starting"
    elif not instances:
        state = "Pending"
    else:
        state = "Failed"
        reason = next((i.last_error for i in instances if i.last_error), "no replica serves")
    return DeploymentStatus(
        name=rec.name, state=state, reason=reason, ready=ready, replicas=max(wanted, len(instances)),
        revision=rec.revision, hosts=sorted({r.host for r in rec.replicas}), instances=instances,
    )  # fmt: skip
