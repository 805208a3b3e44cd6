"""A parked deployment woken by a request through the gateway (issue 13). Pure: values in, values out.

`engine-ctl park deployment NAME` records the park (DeploymentRecord.operator: verb `parked`, its operation ID and
sleep level) and writes the scaler's configuration at once: the deployment with `parked` (core.render.scaler
ScalerWake), its provider's wake steps as data. The gateway holds a request for it (its servers are in
maintenance) and its Lua pokes the scaler (`wake <deployment>`); the scaler wakes it once whatever becomes of the
held client (single flight): on each replica the engine's own wake calls and their check, as its provider gives
them (none for restart_only), then the scaler's start of the slot, the same as a scale-up: the unit started over
its forced SSH command (a restart for an engine that parks by stopping; a no-op for an engine asleep, which still
runs), health-gated, then its server put into the gateway's backend, so the held request is answered.

The scaler records `woken` (when, and the park's operation) in its state.json. engine-ctl reads it back from the
gateway host's facts: status and list show the deployment serving with LAST OPERATION `wake succeeded (request)`,
the plan says it was woken and apply leaves it serving (it neither re-parks it nor calls it drift). The park record
stays until `engine-ctl start deployment NAME` clears it, or `engine-ctl park deployment NAME` parks it again.
It does not park again by itself when idle: a park is an operator's act, and so is the next one."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

from engine_ctl.core.record.model import DeploymentRecord, OperatorAction
from engine_ctl.core.render.scaler import ScalerWake, WakeCall, WakeCheck
from engine_ctl.providers.base import Provider

WOKEN_OPERATION = "wake succeeded (request)"
"""status's LAST OPERATION of a parked deployment a request woke."""


class Woken(BaseModel):
    """The scaler's record of a wake by a request (its state.json: deployments.<name>.woken)."""

    model_config = ConfigDict(extra="ignore")

    at: str
    park: str
    """The operation ID of the park it woke from."""


def park_id(action: OperatorAction) -> str:
    """The park's identity as the scaler knows it: its operation ID (its time for a record without one)."""
    return action.operation or action.when


def parked(rec: DeploymentRecord) -> bool:
    return rec.operator is not None and rec.operator.verb == "parked"


def wake_steps(rec: DeploymentRecord, provider: Provider | None) -> ScalerWake | None:
    """What the scaler does to wake a parked deployment on a request; None when it is not parked."""
    if rec.operator is None or not parked(rec):
        return None
    level = rec.operator.level
    controls = provider.sleep_controls if provider is not None and level > 0 else None
    if controls is None:  # restart_only: the park stopped the units; the scaler's start of each is the wake
        return ScalerWake(operation=park_id(rec.operator))
    calls = tuple(WakeCall(method=c.method, path=c.path, body=c.body) for c in controls.wake(level))
    check = WakeCheck(path=controls.asleep.path, key=controls.asleep_key) if controls.asleep else None
    return ScalerWake(operation=park_id(rec.operator), level=level, calls=calls, check=check)


def woken_at(rec: DeploymentRecord | None, woken: Woken | None) -> str | None:
    """When a request woke this park of `rec` (the scaler's word), or None (not parked, not woken, or woken from
    an earlier park)."""
    if rec is None or rec.operator is None or not parked(rec) or woken is None:
        return None
    return woken.at if woken.park == park_id(rec.operator) else None


def woken_parks(records: Mapping[str, DeploymentRecord], views: Mapping[str, Any]) -> dict[str, str]:
    """Deployment -> when a request woke it, for each parked one the scaler woke (views: core.plan.scaler's
    ScalerView per deployment)."""
    out = {}
    for name, rec in records.items():
        at = woken_at(rec, getattr(views.get(name), "woken", None))
        if at is not None:
            out[name] = at
    return out


def woken_status(status: Any, at: str) -> Any:
    """A parked deployment's status once a request woke it: its status as if not held (its instances as their
    hosts say: ready once they answer), LAST OPERATION `wake succeeded (request)`."""
    return status.model_copy(update={"last_operation": WOKEN_OPERATION,
                                     "reason": f"parked, then woken by a request at {at}"})  # fmt: skip


def woken_note(at: str, name: str) -> str:
    """The plan's words for a parked deployment a request woke."""
    return (f"woken by a request through the gateway at {at}: serving; apply leaves it serving (a replica whose unit "
            "was edited is repaired as any serving one), "
            f"`engine-ctl park deployment {name}` parks it again, `engine-ctl start deployment {name}` clears the "
            "park record")  # fmt: skip


def names_parked(records: Iterable[DeploymentRecord]) -> list[str]:
    return sorted(r.name for r in records if parked(r))


__all__ = ["WOKEN_OPERATION", "Woken", "names_parked", "park_id", "parked", "wake_steps", "woken_at", "woken_note",
           "woken_parks", "woken_status"]  # fmt: skip
