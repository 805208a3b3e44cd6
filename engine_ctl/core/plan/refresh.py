"""--refresh-only: accept into the state what drifted on the hosts (Terraform's refresh). Pure: it changes the
state value it is given; the caller records it."""

from __future__ import annotations

from engine_ctl.core.plan.changes import Plan
from engine_ctl.core.record.model import State

ACCEPTED_EDIT = "unit file edited by hand (accepted by refresh-only)"
"""A replica's reason once --refresh-only accepted its hand-edited unit (its recorded sha256 emptied)."""


def refresh_state(state: State, plan: Plan) -> None:
    """--refresh-only: accept into the state what drifted on the hosts."""
    for d in plan.drift:
        rec = state.deployments.get(d.deployment or "")
        if rec is None:
            continue
        for r in list(rec.replicas):
            if r.unit != d.unit or r.host != d.host:
                continue
            if d.kind == "missing":
                rec.replicas.remove(r)
            elif d.kind == "edited":
                r.reason = ACCEPTED_EDIT
                r.unit_sha256 = ""
            elif d.kind in ("stopped", "crash-looping"):
                r.status = "failed" if d.kind == "crash-looping" else "stopped"
                r.reason = d.detail
