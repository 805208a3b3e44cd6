"""From documents and facts to each replica's unit: fit, place, render. Pure; the CLI and plan call it."""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict

from engine_ctl.facts import HostFacts
from engine_ctl.fit import FitResult, FitUnknown, Taken, fit, place
from engine_ctl.inventory import Inventory
from engine_ctl.model import DesiredState
from engine_ctl.modelfacts import ModelFacts
from engine_ctl.render import RenderedUnit, render_unit, replica_runs
from engine_ctl.rules import field_name, resolve_engine


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
    count: int | None = None,
    revision: int = 1,
    taken: Taken | None = None,
) -> DeploymentRender:
    loaded = desired.deployment(name)
    if loaded is None:
        raise KeyError(name)
    d = loaded.deployment
    model = desired.model(d.model)
    provider = resolve_engine(d, model)
    if model is None or provider is None:
        raise KeyError(d.model)
    hosts = [facts[h.name] for h in inventory.hosts if h.name in facts]
    plan = fit(d, model, model_facts, hosts, lambda internal: field_name(loaded.origin, internal))
    if isinstance(plan, str):
        return DeploymentRender(deployment=name, fit=FitResult(failed_reason=plan))
    if isinstance(plan, FitUnknown):
        return DeploymentRender(deployment=name, fit=FitResult(pending_reason=plan.reason))
    replicas = count if count is not None else max(d.replicas_min, 1)
    result = place(d, plan, provider, hosts, replicas, taken=taken)
    by_name = {h.name: h for h in inventory.hosts}
    units = tuple(
        render_unit(run, provider, host)
        for run, host in replica_runs(d, model, provider, result, by_name, revision=revision)
    )
    return DeploymentRender(deployment=name, fit=result, units=units)
