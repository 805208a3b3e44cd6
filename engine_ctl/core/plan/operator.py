"""Operator verbs in a declarative tool (engine-ctl stop, start, park, delete). Pure: values in, values out.

The documents say what a deployment is; an operator's verb says what is done with it for now, and is recorded in
the state (DeploymentRecord.operator). Every plan shows it, and apply never undoes it:

- stopped (`engine-ctl stop`): the units stay installed, disabled and stopped; the gateway answers its requests
  with deployment_stopped and never holds or starts them; the scaler never starts a slot. Until `start`.
- parked (`engine-ctl park`): asleep (by its provider's SleepControls) or, for an engine with no sleep mode
  (residency restart_only), stopped; requests are held by the gateway. Until `start`.
- deleted (`engine-ctl delete`): the units are gone and the record is a tombstone: while the document is still
  in the repository the plan says so and re-creates nothing; once the document is removed, the next apply
  forgets the record. `engine-ctl start deployment NAME` lifts the tombstone, and the next apply creates it.

A document change made while a deployment is held is shown (its field changes) and rolled in by the first apply
after `start`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime

from engine_ctl.core.fit.hostfacts import HostFacts
from engine_ctl.core.plan.changes import NO_OP, UPDATE, DeploymentChange, Drift, ReplicaChange
from engine_ctl.core.plan.gateway import stopped_map
from engine_ctl.core.plan.wake import woken_note
from engine_ctl.core.record.model import DeploymentRecord, OperatorAction, State
from engine_ctl.providers import PROVIDERS

STOP_WAIT_S = 160
"""Seed 003: `start --wait` waits at most 160 s for a stop to finish (the drain, then the engine's own stop)."""
STOP_SETTLE_S = 5
"""Once the gateway answers deployment_stopped, a stop waits this long, then for the engine's requests in flight
(at most DRAIN_S), before it stops the engine: requests the gateway forwarded just before still finish."""
DRAIN_S = 120
"""How long a stop or a park waits for the engine's requests in flight to finish (the gateway's drain timeout)."""
SLEEP_CONTROLS_WARNING = (
    "warning: {names} run with the engine's sleep controls enabled (parking is on): they listen on loopback only "
    "(each replica's guard passes on only /v1/, the health check and the metrics; the gateway forwards only /v1/)"
)

HELD_DRIFT = frozenset({"stopped", "disabled"})
"""Drift that is the operator's doing on a held deployment (its units stopped and disabled): never drift, never
repaired."""


def note(action: OperatorAction, name: str) -> str:
    """What every plan says of a held deployment."""
    by = f" by {action.who}" if action.who else ""
    if action.verb == "deleted":
        return (f"deleted by an operator{by} at {action.when}; not re-created while its document is here: remove "
                f"the document (the next apply forgets it), or run `engine-ctl start deployment {name}` to bring "
                "it back")  # fmt: skip
    return (f"{action.verb} by an operator{by} at {action.when}; apply keeps it {action.verb} until "
            f"`engine-ctl start deployment {name}`")  # fmt: skip


FILE_DRIFT = frozenset({"edited", "missing", "drop-in", "internal-key", "unstopped"})
"""Drift of files that a held (stopped or parked) deployment's repair writes back without starting or stopping
anything: its units' (and drop-ins), and the internal key's on its hosts (apply's gateway step writes them on every
host of a change)."""


def keeps_stopped(record: DeploymentRecord | None, now: str, facts: Mapping[str, HostFacts] | None = None) -> bool:
    """A deployment an operator stopped (or parked at level 0, which stops its units as a stop does) whose stop
    is over: its stop jobs are gone from its hosts (`facts`: each unit's stop_job), or it has had its time
    (STOP_WAIT_S: the drain, then the engine's own stop). A unit of it that runs then was started outside
    engine-ctl (`unstopped`), which apply stops again (a probe, session 17: the 160 s alone said "stopping" and
    "No changes" for minutes after the stop was done)."""
    held = record.operator if record is not None else None
    if (
        record is None
        or held is None
        or not now
        or not (held.verb == "stopped" or (held.verb == "parked" and held.level == 0))
    ):
        return False
    try:
        since = (datetime.fromisoformat(now.replace("Z", "+00:00")) - datetime.fromisoformat(held.when)).total_seconds()
    except ValueError:
        return False
    if since > STOP_WAIT_S:
        return True
    if facts is None or since < STOP_JOB_START_S:
        return False
    places = [(r.host, r.unit) for r in record.replicas] + [
        (m.host, m.unit) for r in record.replicas for m in r.members
    ]
    if any(host not in facts for host, _ in places):
        return False  # a host not read: its job may still run
    return not any(u.stop_job for host, unit in places for u in facts[host].units if u.name == unit)


STOP_JOB_START_S = 10
"""A stop verb records the stop, then starts its jobs: a plan this soon after may find none yet."""


def file_drift(drift: Iterable[Drift]) -> dict[tuple[str, str], str]:
    """(host, unit) -> how its files drifted (FILE_DRIFT), for hold's repairs of a stopped deployment."""
    out: dict[tuple[str, str], str] = {}
    for d in drift:
        if d.kind in FILE_DRIFT:
            key = (d.host, d.unit)
            out[key] = f"{out[key]}; {d.detail}" if key in out else d.detail
    return out


def hold(
    change: DeploymentChange, record: DeploymentRecord, woken_at: str | None = None,
    rewrite: Mapping[tuple[str, str], str] | None = None,
) -> DeploymentChange:  # fmt: skip
    """The plan of a deployment an operator holds: nothing on its hosts runs or stops, and the plan says why;
    changes of its document are still listed (they roll in after start). `woken_at`: a parked one a request woke
    then (core.plan.wake): it serves, and apply leaves it serving (woken_repairs). `rewrite`: (host, unit) -> how
    the unit's file drifted (FILE_DRIFT); they are written again (held_rewrites), so that `engine-ctl start` (or a
    wake that starts the unit) starts what engine-ctl wrote, never a hand edit."""
    assert record.operator is not None
    why = note(record.operator, record.name)
    if woken_at is not None:
        why = f"{why}; {woken_note(woken_at, record.name)}"
    said = [*change.blocked, *([f"Failed: {change.failed_reason}"] if change.failed_reason else [])]
    if woken_at is None:
        repairs = held_rewrites(change, record.operator, rewrite or {})
    else:
        repairs = woken_repairs(change, rewrite or {})
    held = change.model_copy(
        update={"action": list(UPDATE if repairs else NO_OP), "replicas": repairs, "fetches": [], "adopt": [],
                "operator": why, "reasons": [], "blocked": [], "failed_reason": None,
                "warnings": [*change.warnings, *said]}  # nothing else for apply to do
    )  # fmt: skip
    if change.field_changes:
        fields = ", ".join(f.path for f in change.field_changes)
        held.warnings = [*held.warnings, f"{record.name}: the documents changed ({fields}); the change rolls in "
                         f"with the first apply after `engine-ctl start deployment {record.name}`"]  # fmt: skip
    return held


def held_rewrites(
    change: DeploymentChange, action: OperatorAction, rewrite: Mapping[tuple[str, str], str]
) -> list[ReplicaChange]:
    """The replicas of a held deployment whose unit files drifted (the head's or a group worker's), as steps that
    write them again (role `held`) and start or stop nothing: a stopped deployment's (a park at level 0 stops and
    disables its units as a stop does) stay stopped; a parked one's engine sleeps on as it runs (its unit stays
    active and enabled), so that its next start or restart runs what engine-ctl wrote."""
    if action.verb == "deleted":
        return []
    kept = "kept stopped" if action.verb == "stopped" or action.level == 0 else "its engine sleeps on as it runs"
    out = []
    for step in change.replicas:
        drifted = [rewrite[p] for p in step.units if p in rewrite]
        if step.actions == UPDATE and step.role is None and drifted:
            out.append(step.model_copy(update={"role": "held", "reason": f"{'; '.join(drifted)}; written again, "
                                               f"{kept}"}))  # fmt: skip
    return out


def woken_repairs(change: DeploymentChange, rewrite: Mapping[tuple[str, str], str]) -> list[ReplicaChange]:
    """A parked deployment a request woke serves: a replica of it whose unit files drifted (FILE_DRIFT) runs, or
    would run at its next start, what engine-ctl did not write, so it is repaired as any serving replica is
    (drained, written again, restarted, back behind the gateway); nothing else of it changes, and a change of its
    documents still waits for `engine-ctl start`."""
    if change.field_changes:
        return []
    out = []
    for step in change.replicas:
        if step.actions == UPDATE and step.role is None and any(p in rewrite for p in step.units):
            out.append(step)
    return out


HELD_WARNED = frozenset({"port-taken"})
"""Drift of a held deployment that its plan says as a warning instead (nothing for apply to do now; what its start
would meet): another process on a replica's port."""


def without_held_drift(drift: Iterable[Drift], state: State) -> list[Drift]:
    """Drift less the operator's doing (a held deployment's units stopped), and less what a held deployment's plan
    warns of instead (HELD_WARNED)."""
    quiet = HELD_DRIFT | HELD_WARNED
    return [
        d for d in drift
        if not (d.kind in quiet and d.deployment is not None and held_by(state, d.deployment) is not None)
    ]  # fmt: skip


def held_by(state: State, name: str) -> OperatorAction | None:
    record = state.deployments.get(name)
    return record.operator if record is not None else None


def sleep_controls_warning(records: Iterable[DeploymentRecord]) -> str | None:
    """list's and status's warning while parking is on for any deployment shown (its engine launched with its
    sleep controls)."""
    names = []
    for rec in records:
        provider = PROVIDERS.get(rec.plan.engine) if rec.plan else None
        residency = rec.spec.residency if rec.spec is not None and rec.spec.api == "chat" else "restart_only"
        if provider is not None and provider.parks_asleep(residency):
            names.append(rec.name)
    return SLEEP_CONTROLS_WARNING.format(names=", ".join(names)) if names else None


def scaler_stopped(record: DeploymentRecord) -> bool:
    """The scaler's `stopped` (scaler.json): it never starts a slot of a deployment an operator stopped, parked or
    deleted."""
    return record.operator is not None


def stop_phase(unit_states: Iterable[str]) -> str:
    """From the ActiveState of each replica's unit and of its stop job: `stopping` while any is still active,
    activating or deactivating; `stopped` once all are inactive or failed (or gone)."""
    going = {"active", "activating", "deactivating", "reloading", "refreshing"}
    return "stopping" if any(s in going for s in unit_states) else "stopped"


def parking_phase(verb: str | None, unit_states: Iterable[str]) -> str | None:
    """status's STATE for a parked deployment: `parking` while the park job runs, then `parked`."""
    if verb != "parked":
        return None
    return "parking" if stop_phase(unit_states) == "stopping" else "parked"


def park_refusal(keeps_bytes: int, available_bytes: int | None, host: str, name: str) -> str | None:
    """A park at level 1 keeps the weights in host RAM: refused when the host's free memory cannot hold them."""
    if keeps_bytes <= 0 or available_bytes is None or available_bytes >= keeps_bytes:
        return None
    gib = 1024**3
    return (f"{name} cannot park on {host}: sleep level 1 keeps {keeps_bytes / gib:.1f} GiB of weights in host "
            f"RAM, and {host} has {available_bytes / gib:.1f} GiB free; free memory there, or set residency: deep "
            "(level 2 drops the weights)")  # fmt: skip


__all__ = [
    "DRAIN_S", "STOP_SETTLE_S", "STOP_WAIT_S", "hold", "note", "park_refusal", "parking_phase", "scaler_stopped",
    "sleep_controls_warning", "stop_phase", "stopped_map", "without_held_drift",
]  # fmt: skip
