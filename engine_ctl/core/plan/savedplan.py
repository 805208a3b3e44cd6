"""Saved plans (`plan --out`, `apply PLANFILE`): decoding, staleness and proof that the units are engine-ctl's.

Pure: values in, values out. A saved plan is an input like any other (it travels as a CI artifact), so apply
trusts nothing in it that it cannot recompute: every unit text, sha256 and argv is rendered again from the
plan's own recorded inputs (spec, model, fit, placement) and must match byte for byte, and the recorded
specification must pass the same rules as the documents.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from engine_ctl.core.documents.inventory import Host
from engine_ctl.core.documents.rules import check, resolve_engine
from engine_ctl.core.jsonbounds import MAX_PLAN_BYTES, JsonBoundError, bounded_json
from engine_ctl.core.model import Deployment, DesiredState, LoadedDeployment, LoadedModel, Model, Origin
from engine_ctl.core.plan.changes import (
    DELETE,
    FORMAT_VERSION,
    STOP_START,
    SURGE,
    UPDATE,
    DeploymentChange,
    Plan,
    ReplicaChange,
)
from engine_ctl.core.plan.deployment import render_replica
from engine_ctl.core.plan.ownership import as_recorded
from engine_ctl.core.record.model import State
from engine_ctl.core.render.units import RenderedUnit


class PlanFileError(Exception):
    """The file is a plan, but one that cannot be applied; the message says why (and `line`, `column` where)."""

    def __init__(self, message: str, line: int | None = None, column: int | None = None) -> None:
        super().__init__(message)
        self.line, self.column = line, column


def decode_plan(text: str) -> Plan | None:
    """A saved plan, or None when the text is not one (then it is taken as documents). A JSON object is read
    within bounds (engine_ctl.core.jsonbounds: its size and nesting), before anything else."""
    if not text.lstrip().startswith("{"):
        return None
    try:
        raw = bounded_json(text, "saved plan", MAX_PLAN_BYTES)
    except JsonBoundError as exc:
        raise PlanFileError(f"{exc.message}: not a plan engine-ctl wrote", exc.line, exc.column) from None
    except ValueError:  # not JSON (json.JSONDecodeError), or a number past Python's digits limit
        return None
    if not (isinstance(raw, dict) and "changes" in raw and "state_lineage" in raw):
        return None
    version = raw.get("format_version", 0)
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise PlanFileError(f"format_version {version!r}: a plan from a newer engine-ctl; upgrade engine-ctl")
    raw.pop("summary", None)
    raw.pop("has_changes", None)
    if version < 2:
        raw = from_format_1(raw)
    try:
        return Plan.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"])
        raise PlanFileError(f"{field}: {first['msg']} (the file is not a plan this engine-ctl wrote)") from None


def from_format_1(raw: dict[str, Any]) -> dict[str, Any]:
    """Format 1 recorded every replacement as ["delete", "create"], a surge too (its strategy said which):
    format 2 records a surge in Terraform's create-before-destroy order, ["create", "delete"]."""
    old, surge = list(STOP_START), list(SURGE)
    for change in raw.get("changes") or []:
        if not isinstance(change, dict):
            continue
        for step in [change, *(change.get("replicas") or [])]:
            if isinstance(step, dict) and step.get("action") == old and step.get("strategy") == "surge":
                step["action"] = surge
    return {**raw, "format_version": FORMAT_VERSION}


def state_for_plan(plan: Plan, state: State) -> State:
    """A state that was never written takes the lineage the plan was made for, so the first reviewed plan of a
    fresh repository applies (and creates the state with that lineage); a written state is left as it is."""
    never_written = state.serial == 0 and not state.deployments and not state.operations
    if never_written and plan.state_serial == 0:
        return state.model_copy(update={"lineage": plan.state_lineage})
    return state


def stale_reasons(plan: Plan, state: State, fingerprints: Mapping[str, str | None]) -> list[str]:
    """Why a saved plan no longer describes the world (empty: it does). `fingerprints` maps each host the plan
    saw to its facts' fingerprint now, None when it cannot be reached."""
    why = []
    if state.lineage != plan.state_lineage:
        why.append(f"the state's lineage is {state.lineage}, the plan was made against {plan.state_lineage}")
    if state.serial != plan.state_serial:
        why.append(f"the state changed since the plan (serial {plan.state_serial} → {state.serial})")
    for host, fp in sorted(plan.host_fingerprints.items()):
        now_fp = fingerprints.get(host)
        if now_fp is None:
            why.append(f"host {host} is unreachable now")
        elif now_fp != fp:
            why.append(f"the facts of host {host} changed since the plan")
    return why


def _recorded_desired(deployment: Deployment, model: Model) -> DesiredState:
    origin = Origin(file=f"plan: {deployment.name}", form="spec", line=0, column=0)
    return DesiredState(
        models=(LoadedModel(origin=origin.model_copy(update={"form": "model"}), model=model),),
        deployments=(LoadedDeployment(origin=origin, deployment=deployment),),
    )


def _replica_problem(
    change: DeploymentChange, step: ReplicaChange, deployment: Deployment, model: Model, hosts: Mapping[str, Host],
    lineage: str,
) -> str | None:  # fmt: skip
    if step.actions == DELETE:
        return None
    where = f"{change.name} replica {step.index} on {step.host}"
    if step.placement is None or change.fit is None or step.unit_text is None:
        return f"{where}: the plan records a unit without the inputs it was rendered from"
    if step.host not in hosts:
        return f"{where}: host {step.host} is not in the inventory"
    provider = resolve_engine(deployment, model)
    if provider is None:
        return f"{where}: no engine serves this deployment"
    fitted = change.fit
    assert fitted is not None

    def render(owner: str | None, ident: str | None) -> RenderedUnit:
        assert step.placement is not None
        return render_replica(deployment, model, provider, fitted, step.placement, hosts, step.revision, step.slot,
                              owner, ident)  # fmt: skip

    # The unit carries the lineage of the state the plan was made against and the deployment's ID; only a repair
    # in place of a unit written before those headers keeps that unit's text (see ownership.as_recorded).
    ident = change.deployment_id or None
    unit = render(lineage, ident)
    if step.actions == UPDATE and unit.sha256 != step.unit_sha256:
        unit = as_recorded(render, lineage, step.unit_sha256 or "", ident)
    if unit.name != step.unit:
        return f"{where}: the unit is named {step.unit!r}; engine-ctl names it {unit.name!r}"
    if list(unit.argv) != step.argv:
        return f"{where}: the argv differs from what engine-ctl renders from the plan's inputs"
    if unit.text != step.unit_text or unit.sha256 != step.unit_sha256:
        return f"{where}: the unit file differs from what engine-ctl renders from the plan's inputs"
    rendered = [(m.name, m.host, list(m.argv), m.text) for m in unit.members]
    if rendered != [(m.unit, m.host, m.argv, m.unit_text) for m in step.members]:
        return f"{where}: the group's members differ from what engine-ctl renders from the plan's inputs"
    return None


def tampering(plan: Plan, hosts: Mapping[str, Host]) -> list[str]:
    """Every place where the saved plan is not what engine-ctl itself would write (empty: none). A changed
    inventory shows here too, since the units are rendered from it."""
    problems: list[str] = []
    for change in plan.changes:
        deployment, model = change.spec, change.model
        if change.actions == DELETE or deployment is None:
            continue
        if model is None:
            problems.append(f"{change.name}: the plan records a specification without its model")
            continue
        errors = [d for d in check(_recorded_desired(deployment, model)) if d.severity == "error"]
        problems.extend(f"{change.name}: the recorded specification breaks a rule: {d.message}" for d in errors)
        if errors:
            continue
        for step in change.replicas:
            problem = _replica_problem(change, step, deployment, model, hosts, plan.state_lineage)
            if problem:
                problems.append(problem)
    return problems


__all__ = ["PlanFileError", "decode_plan", "stale_reasons", "state_for_plan", "tampering"]
