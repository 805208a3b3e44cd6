"""Gathering what planning needs from the hosts, in one round trip per host: facts and model metadata."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from engine_ctl.core.diagnostics import Diagnostic, InputError, Location
from engine_ctl.core.documents.inventory import Inventory
from engine_ctl.core.fit.hostfacts import HostFacts
from engine_ctl.core.fit.modelfacts import ModelFacts
from engine_ctl.core.model import DesiredState, Model
from engine_ctl.core.names import unknown_targets
from engine_ctl.core.plan.changes import Plan, PlanContext
from engine_ctl.core.plan.engines import with_engines
from engine_ctl.core.plan.fetching import plan_fetches
from engine_ctl.core.plan.grouplinks import member_links
from engine_ctl.core.plan.internalkey import key_checks
from engine_ctl.core.plan.planner import make_plan
from engine_ctl.core.record.model import State
from engine_ctl.core.render.scalerlock import scaler_lock
from engine_ctl.core.render.units import model_path_on_host
from engine_ctl.core.weights import Checkout
from engine_ctl.shell.gather import gather
from engine_ctl.shell.transport import Ahead, HostFailure, Kept, SSHOptions
from engine_ctl.state.base import now


def model_paths(desired: DesiredState, inventory: Inventory) -> dict[str, list[str]]:
    """The path of every desired model on every host (probed in the facts round trip)."""
    used = {ld.deployment.model for ld in desired.deployments}
    models = [m.model for m in desired.models if m.model.name in used]
    return {h.name: sorted({model_path_on_host(m, h) for m in models}) for h in inventory.hosts}


def model_facts_by_name(
    desired: DesiredState, inventory: Inventory, facts: dict[str, HostFacts]
) -> tuple[dict[str, ModelFacts | None], dict[str, str]]:
    """Each model's metadata from the first host (inventory order) that has its files; else why not."""
    found: dict[str, ModelFacts | None] = {}
    notes: dict[str, str] = {}
    for loaded in desired.models:
        model: Model = loaded.model
        found[model.name] = None
        for host in inventory.hosts:
            f = facts.get(host.name)
            path = model_path_on_host(model, host)
            if f is not None and path in f.models:
                found[model.name] = f.models[path]
                break
        if found[model.name] is None:
            notes[model.name] = (
                f"the weights of {model.name} are on no reachable host yet; sizes come from its Model document"
            )
    return found, notes


def gather_world(
    desired: DesiredState, inventory: Inventory, options: SSHOptions | None, parallel: int
) -> tuple[dict[str, HostFacts], dict[str, HostFailure], dict[str, ModelFacts | None], dict[str, str]]:
    facts, failures = gather(list(inventory.hosts), options, parallel, model_paths(desired, inventory))
    mfacts, notes = model_facts_by_name(desired, inventory, facts)
    return facts, failures, mfacts, notes


def plan_world(
    desired: DesiredState,
    inventory: Inventory,
    state: State,
    state_location: str,
    reopen: str,
    options: SSHOptions,
    parallel: int,
    targets: tuple[str, ...],
    refresh_only: bool = False,
    documents: tuple[Path, ...] = (),
    hold_absent: str | None = None,
    replace: tuple[str, ...] = (),
    checkouts: Mapping[str, Checkout] | None = None,
    ahead: Ahead | None = None,
    keep: Kept | None = None,
) -> tuple[Plan, dict[str, HostFailure]]:
    """Gather (one round trip per host), then plan with the pure core; returns the plan and the hosts that could
    not be reached. `state_location` names the state in messages, `reopen` is how `apply PLANFILE` finds it;
    `checkouts` are the pinned hf: models' files (engine_ctl.shell.pinning), fetched by apply. Gathering uses the
    connections `ahead` began, and leaves them open in `keep` when given (transport.fan_out)."""
    known = {d.deployment.name for d in desired.deployments} | set(state.deployments)
    unknown = unknown_targets(targets, known, state_location)  # before any host is asked
    if unknown:
        raise InputError(unknown)
    refused = replace_refusals(desired, state, state_location, replace)
    if refused:
        raise InputError(refused)
    paths = model_paths(desired, inventory)
    facts, failures = gather(
        list(inventory.hosts),
        options,
        parallel,
        paths,
        ahead=ahead,
        keep=keep,
        key_checks=key_checks(state.deployments.values()),
        links=member_links(state.deployments.values(), {h.name: h.address for h in inventory.hosts}),
    )
    mfacts, _notes = model_facts_by_name(desired, inventory, facts)
    plan = make_plan(
        desired, state, inventory, facts, mfacts,
        unreachable={h: f.message for h, f in failures.items()}, targets=list(targets),
        refresh_only=refresh_only, created_at=now(), hold_absent=hold_absent, replace=frozenset(replace),
        scaler_lock=scaler_lock(state_location, inventory),
    )  # fmt: skip
    plan = with_engines(plan_fetches(plan, desired, inventory, facts, checkouts or {}, state), facts)
    plan.context = PlanContext(
        documents=[str(p.resolve()) for p in documents],
        inventory=str(Path(inventory.file).resolve()) if inventory.file else None,
        state=reopen,
        model_paths=paths,
    )
    return plan, failures


def replace_refusals(
    desired: DesiredState, state: State, state_location: str, replace: tuple[str, ...]
) -> list[Diagnostic]:
    """--replace NAME names a deployment of the documents that has replicas recorded (something to restart)."""
    wanted = {d.deployment.name for d in desired.deployments}
    out = []
    for name in replace:
        record = state.deployments.get(name)
        if name not in wanted:
            known = ", ".join(sorted(wanted)) or "(none)"
            out.append(Diagnostic(Location(state_location), "--replace", f"no deployment named {name!r} in the "
                                  f"documents", hint=f"deployments: {known}", code="unknown_deployment"))  # fmt: skip
        elif record is None or not record.replicas:
            why = f"{name} has no replicas recorded: nothing to replace"
            hint = "engine-ctl apply starts them"
            out.append(Diagnostic(Location(state_location), "--replace", why, hint=hint, code="replace_refused"))
    return out
