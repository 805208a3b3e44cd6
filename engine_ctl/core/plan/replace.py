"""`apply --replace NAME` and `engine-ctl restart NAME`: a rolling restart without editing a document (Terraform's
`-replace`). Pure: the planner plans a forced deployment as if no recorded unit matched what it renders, so every
replica it keeps is planned as a replacement, rolled one at a time and health-gated (a surge where there is room
for both units, else stop-then-start), exactly as a changed document would be."""

from __future__ import annotations

from engine_ctl.core.plan.changes import DeploymentChange
from engine_ctl.core.record.model import DeploymentRecord

REASON = "replace requested"
FORCED = "replace-requested"
"""What the forced record carries as its units' sha256: never a real digest, so no rendered unit matches it."""


def forced(record: DeploymentRecord) -> DeploymentRecord:
    """The record as the planner sees it for a forced replacement (the real state is not changed)."""
    replicas = [r.model_copy(update={"unit_sha256": FORCED}) for r in record.replicas]
    return record.model_copy(update={"replicas": replicas})


def mark_replaced(change: DeploymentChange) -> None:
    """Say why in the plan: each replica's replacement, and the deployment's, reads "replace requested"."""
    rolled = [r for r in change.replicas if r.replaces and not r.cleanup]
    if not rolled:
        return
    for r in rolled:
        r.reason = REASON if not change.field_changes else f"{r.reason}; {REASON}"
    if change.replaces:
        if change.field_changes:
            change.reasons.append(REASON)
        else:
            change.reasons = [f"a rolling replace: {REASON}"]


__all__ = ["FORCED", "REASON", "forced", "mark_replaced"]
