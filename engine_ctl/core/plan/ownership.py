"""Units belong to one state: the lineage in each unit's header says which. Pure.

- A unit whose header names another lineage is *owned elsewhere*: the plan lists it apart (never as drift), its
  port, GPUs and CPU cores count as taken (placement works around them, and the plan says what each holds; the
  memory of one that runs is gone from the host's available memory), and no step of this state's plan touches it
  (a step that would is held back and reported as not reconciled).
- A unit without a lineage (written by an engine-ctl from before lineage headers) keeps the behaviour it had: it
  is this state's when this state records it, and left alone otherwise.
- Upgrading engine-ctl replaces nothing: a replica recorded with the lineage-less text of its unit is compared
  with that text (`as_recorded`), and its unit gets the lineage line when a change rewrites it anyway.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping

from engine_ctl.core.fit.hostfacts import HostFacts, UnitFact
from engine_ctl.core.fit.placement import Taken
from engine_ctl.core.plan.changes import ForeignUnit, Plan, ReplicaChange
from engine_ctl.core.render.units import CPU_WEIGHT_PER_CORE, RenderedUnit


def owner(unit: UnitFact) -> str | None:
    """The lineage in the unit's header; None when it has none (or no header)."""
    return unit.header.lineage if unit.header is not None else None


def is_foreign(unit: UnitFact, lineage: str) -> bool:
    found = owner(unit)
    return found is not None and found != lineage


_CORES_COMMENT = re.compile(r"(?m)^# Its ([0-9]{1,4}) CPU core\(s\) are its share")
_CPU_WEIGHT = re.compile(r"(?m)^CPUWeight=([0-9]{1,5})\s*$")


def unit_cores(text: str | None) -> int:
    """The CPU cores an engine-ctl unit was given (templates/engine.service.j2 writes them in a comment beside its
    CPUWeight=, 100 a core); 0 when its text says neither."""
    if text is None:
        return 0
    found = _CORES_COMMENT.search(text)
    if found is not None:
        return int(found[1])
    weight = _CPU_WEIGHT.search(text)
    return int(weight[1]) // CPU_WEIGHT_PER_CORE if weight is not None else 0


def foreign_units(facts: Mapping[str, HostFacts], lineage: str) -> list[ForeignUnit]:
    """Every unit another state owns, host by host (sorted)."""
    out = []
    for host, f in sorted(facts.items()):
        for u in sorted(f.units, key=lambda u: u.name):
            if u.header is None or not is_foreign(u, lineage):
                continue
            h = u.header
            found = ForeignUnit(
                host=host, unit=u.name, deployment=h.deployment, lineage=str(h.lineage), revision=h.revision,
                port=h.port, active_state=u.active_state, gpus=h.gpus, cpu_cores=unit_cores(u.text),
            )  # fmt: skip
            out.append(found)
    return out


def hold_foreign(taken: Taken, foreign: Iterable[ForeignUnit]) -> None:
    """Another state's replicas keep their ports, GPUs and CPU cores (a stopped one starts again with them)."""
    for f in foreign:
        taken.hold(f.host, port=f.port, gpus=f.gpus, cores=f.cpu_cores)


def as_recorded(
    render: Callable[[str | None, str | None], RenderedUnit], lineage: str | None, recorded_sha256: str,
    deployment_id: str | None = None,
) -> RenderedUnit:  # fmt: skip
    """The unit of a recorded replica as this state renders it: with the lineage and the deployment's ID in its
    header, or, for a replica recorded with the text engine-ctl wrote before ID (or lineage) headers, that text
    (same sha256, so nothing is replaced by the upgrade; the lines come with the next change that rewrites the
    unit). `render(lineage, deployment_id)`."""
    unit = render(lineage, deployment_id)
    if unit.sha256 == recorded_sha256:
        return unit
    for owner, ident in ((lineage, None), (None, None)):
        if (owner, ident) != (lineage, deployment_id):
            legacy = render(owner, ident)
            if legacy.sha256 == recorded_sha256:
                return legacy
    return unit


def _touches(step: ReplicaChange) -> list[tuple[str, str]]:
    """(host, unit) of every unit a step writes, starts, stops or removes."""
    out = [(step.host, step.unit)] if step.action != ["delete"] else []
    if step.old_unit is not None or step.action == ["delete"]:
        out.append((step.old_host or step.host, step.old_unit or step.unit))
    return out


def hold_back(plan: Plan, foreign: list[ForeignUnit]) -> None:
    """No step touches a unit another state owns: such a step is dropped and reported as not reconciled (the
    deployment's name is another state's there, or its unit was taken over), and that unit is never drift; the
    plan lists every such unit as owned elsewhere."""
    plan.owned_elsewhere = list(foreign)
    owned = {(f.host, f.unit): f for f in foreign}
    if not owned:
        return
    for change in plan.changes:
        kept = []
        for step in change.replicas:
            hit = next((owned[t] for t in _touches(step) if t in owned), None)
            if hit is None:
                kept.append(step)
                continue
            change.blocked.append(
                f"replica {step.index}: {hit.unit} on {hit.host} belongs to another state (lineage "
                f"{hit.lineage}, deployment {hit.deployment}), so it is left as it is; rename this deployment, or "
                "remove it from one of the states (`engine-ctl state rm`)"
            )
        change.replicas = kept
    plan.drift = [d for d in plan.drift if (d.host, d.unit) not in owned]


__all__ = [
    "ForeignUnit", "as_recorded", "foreign_units", "hold_back", "hold_foreign", "is_foreign", "owner", "unit_cores",
]  # fmt: skip
