"""From documents, state and facts to each replica's unit, by the planner's own path: `render` shows what
`plan` would run. Pure; the CLI and the tests call it."""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict

from engine_ctl.core.documents.inventory import Inventory
from engine_ctl.core.documents.rules import resolve_engine
from engine_ctl.core.fit.fitting import FitResult
from engine_ctl.core.fit.hostfacts import HostFacts
from engine_ctl.core.fit.modelfacts import ModelFacts
from engine_ctl.core.fit.runspec import Placement
from engine_ctl.core.model import Deployment, DesiredState, Model
from engine_ctl.core.plan.changes import DELETE, DeploymentChange
from engine_ctl.core.plan.deployment import render_replica
from engine_ctl.core.plan.ownership import as_recorded
from engine_ctl.core.plan.planner import make_plan
from engine_ctl.core.plan.world import recorded_placement
from engine_ctl.core.record.model import DeploymentRecord, ReplicaRecord, State
from engine_ctl.core.render.units import RenderedUnit
from engine_ctl.providers import Provider


class DeploymentRender(BaseModel):
    model_config = ConfigDict(frozen=True)

    deployment: str
    fit: FitResult
    units: tuple[RenderedUnit, ...] = ()


def render_deployment(
    desired: DesiredState,
    name: str,
    inventory: Inventory,
    facts: Mapping[str, HostFacts],
    model_facts: ModelFacts | None = None,
    *,
    state: State | None = None,
    all_model_facts: Mapping[str, ModelFacts | None] | None = None,
) -> DeploymentRender:
    """The fit of deployment `name` and the unit of each of its replicas once the plan is applied: the plan of
    every deployment (make_plan, the same path as `plan`, with the same state), then this one's replicas: those
    the plan creates or replaces, and those that stay as they are. `model_facts` is this deployment's model's;
    `all_model_facts` every model's (placement of the others, placed first by priority, depends on them)."""
    loaded = desired.deployment(name)
    if loaded is None:
        raise KeyError(name)
    d = loaded.deployment
    model = desired.model(d.model)
    provider = resolve_engine(d, model)
    if model is None or provider is None:
        raise KeyError(d.model)
    by_model = dict(all_model_facts or {})
    if model_facts is not None or model.name not in by_model:
        by_model[model.name] = model_facts
    state = state or State()
    plan = make_plan(desired, state, inventory, facts, by_model)
    change = next(c for c in plan.changes if c.name == name)
    return _from_change(change, d, model, provider, state.deployments.get(name), inventory, facts, state.lineage)


def _from_change(
    change: DeploymentChange, d: Deployment, model: Model, provider: Provider, record: DeploymentRecord | None,
    inventory: Inventory, facts: Mapping[str, HostFacts], lineage: str | None = None,
) -> DeploymentRender:  # fmt: skip
    if change.failed_reason:
        return DeploymentRender(deployment=change.name, fit=FitResult(failed_reason=change.failed_reason))
    if change.fit is None:  # the fit is not known yet
        return DeploymentRender(deployment=change.name, fit=FitResult(pending_reason=change.pending_reason))
    fitted = change.fit
    hosts = {h.name: h for h in inventory.hosts}
    units: dict[int, RenderedUnit] = {}
    placements: dict[int, Placement] = {}
    for step in change.replicas:
        if step.actions != DELETE and step.placement is not None:
            placements[step.index] = step.placement
            units[step.index] = render_replica(d, model, provider, fitted, step.placement, hosts, step.revision,
                                               step.slot, lineage, change.deployment_id or None)  # fmt: skip
    touched = {step.index for step in change.replicas}
    for r in _kept(record, touched, max(d.replicas_max, d.replicas_min, 1)):  # every slot, on demand too
        hf = facts.get(r.host)
        placement = recorded_placement(r, hf, fitted, facts) if hf is not None and r.host in hosts else None
        if placement is not None:
            placements[r.index] = placement
            units[r.index] = as_recorded(
                lambda owner, ident, p=placement, r=r: render_replica(  # type: ignore[misc]
                    d, model, provider, fitted, p, hosts, r.revision, r.slot, owner, ident
                ), lineage, r.unit_sha256, change.deployment_id or None,
            )  # fmt: skip
    result = FitResult(
        plan=fitted, placements=tuple(placements[i] for i in sorted(placements)), waiting=change.waiting,
        pending_reason=change.pending_reason,
    )  # fmt: skip
    return DeploymentRender(deployment=change.name, fit=result, units=tuple(units[i] for i in sorted(units)))


def _kept(record: DeploymentRecord | None, touched: set[int], count: int) -> list[ReplicaRecord]:
    """The recorded replicas the plan leaves as they are (one per index: the serving one first)."""
    if record is None:
        return []
    out: dict[int, ReplicaRecord] = {}
    for r in sorted(record.replicas, key=lambda r: (r.status != "serving", -r.revision)):
        if r.index < count and r.index not in touched:
            out.setdefault(r.index, r)
    return [out[i] for i in sorted(out)]
