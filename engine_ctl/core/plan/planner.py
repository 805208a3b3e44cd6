"""Planning: desired documents + recorded state + live facts -> a Plan. Pure: values in, a value out.

make_plan orders the deployments (priority first), places every deployment's always-on replicas
(deployment.start_deployment: resolve, fit, place), then each one's on-demand slots and the rest
(deployment.finish_deployment: render, diff, drift), adds the units no state records, and what refuses the whole
plan. The plan's value
types are in changes.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from engine_ctl.core.collector import collector_held
from engine_ctl.core.documents.inventory import Inventory
from engine_ctl.core.documents.rules import field_name, resolve_engine
from engine_ctl.core.fit.hostfacts import HostFacts
from engine_ctl.core.fit.modelfacts import ModelFacts
from engine_ctl.core.model import DesiredState, LoadedDeployment
from engine_ctl.core.plan.changes import (
    DELETE,
    FORMAT_VERSION,
    NO_OP,
    Action,
    DeploymentChange,
    Drift,
    FieldChange,
    Plan,
    ReplicaChange,
)  # fmt: skip
from engine_ctl.core.plan.deployment import (
    Target,
    deletion,
    fetched_at_apply,
    finish_deployment,
    out_of_reach,
    render_replica,
    start_deployment,
)
from engine_ctl.core.plan.diff import Names
from engine_ctl.core.plan.drift import unmanaged_units
from engine_ctl.core.plan.envelope import envelopes
from engine_ctl.core.plan.gateway import plan_gateways
from engine_ctl.core.plan.operator import file_drift, hold, keeps_stopped, without_held_drift
from engine_ctl.core.plan.ownership import foreign_units, hold_back, hold_foreign
from engine_ctl.core.plan.prune import prunes
from engine_ctl.core.plan.replace import forced, mark_replaced
from engine_ctl.core.plan.scaler import lock_refusals, plan_scaler, scaler_views_of, without_scaler
from engine_ctl.core.plan.unitdiff import attach_unit_diffs
from engine_ctl.core.plan.wake import woken_parks
from engine_ctl.core.plan.world import Allocation, Hosts
from engine_ctl.core.record.model import DeploymentRecord, State, deployment_id_for
from engine_ctl.core.render.gateway import GATEWAY_UNIT
from engine_ctl.core.render.scaler import GATEWAY_HOST_UNITS
from engine_ctl.core.render.scalerlock import ScalerLock


def host_identity(facts: Mapping[str, HostFacts]) -> dict[str, dict[str, str]]:
    """What a plan records of each host: its facts' fingerprint, and which machine answered (its machine-id)."""
    return {"host_fingerprints": {name: f.fingerprint() for name, f in sorted(facts.items())},
            "host_machines": {name: f.machine_id for name, f in sorted(facts.items()) if f.machine_id}}  # fmt: skip


def refusals(plan: Plan, state: State, facts: Mapping[str, HostFacts]) -> list[str]:
    """Why the plan cannot be applied as it is (exit 1)."""
    moved = [] if plan.refresh_only else other_machines(state, facts)
    return [*moved, *destroy_refusals(plan, state), *lock_refusals(plan.scaler, facts),
            *others_gateways(plan, state, facts)]  # fmt: skip


def other_machines(state: State, facts: Mapping[str, HostFacts]) -> list[str]:
    """Hosts whose address now reaches another machine than the one this state recorded under that name (its
    /etc/machine-id): addresses swapped or moved in the inventory, or the host reinstalled. Nothing is applied then:
    the replicas recorded there run on the machine they were on, so a removal there would stop nothing and a start
    would write over whatever that machine runs (a probe, session 17: apply said "stopped and removed" while the
    replica ran on, forgotten, and the next plan said "No changes")."""
    recorded = {h: r.machine_id for h, r in state.hosts.items() if r.machine_id}
    out = []
    for host, f in sorted(facts.items()):
        was = recorded.get(host)
        if was is None or f.machine_id is None or f.machine_id == was:
            continue
        known = [h for h, m in sorted(recorded.items()) if m == f.machine_id and h != host]
        which = f": it is the machine this state knows as {known[0]}" if known else ""
        out.append(f"{host} is not the machine this state recorded under that name (machine-id {f.machine_id[:12]}…, "
                   f"recorded {was[:12]}…){which}. Its address in the inventory changed, or it was reinstalled: "
                   "nothing is applied. Put its address back; for the same host reinstalled, `engine-ctl apply "
                   "--refresh-only` records the new machine")  # fmt: skip
    return out


def others_gateways(plan: Plan, state: State, facts: Mapping[str, HostFacts]) -> list[str]:
    """A gateway this state would create on a host where another state's gateway runs (its haproxy.cfg names
    another lineage): one gateway serves one state's deployments, so the plan is refused, never a take-over that
    would drop that state's routes and keys (a probe, session 16: a second checkout's apply answered every request
    of the first one's deployments 401, and its destroy removed that gateway)."""
    out = []
    for g in plan.gateways:
        found = facts[g.host].gateway_lineage if g.host in facts else None
        if g.action == ["create"] and found and found != state.lineage:
            out.append(f"the gateway on {g.host} is another state's (lineage {found}; this state's is "
                       f"{state.lineage}): one gateway serves one state's deployments. Apply from the state that "
                       f"made it, or give this inventory another gateway host; if that state is gone for good, "
                       f"remove its gateway from {g.host} (systemctl disable --now engine-ctl-gateway.service; rm -r "
                       "/etc/engine-ctl/gateway) or adopt it with `engine-ctl import`")  # fmt: skip
    return out


def destroy_refusals(plan: Plan, state: State) -> list[str]:
    """prevent_destroy: true (recorded from the deployment's document) refuses every plan that destroys it."""
    out = []
    for c in plan.changes:
        record = state.deployments.get(c.name)
        spec = record.spec if record is not None else None
        if c.actions == DELETE and spec is not None and spec.prevent_destroy:
            out.append(
                f"{c.name} has prevent_destroy: true, and this plan destroys it; nothing is applied "
                "(to destroy it, set prevent_destroy: false in its document and apply that first)"
            )
    return out


def held_back(record: DeploymentRecord, why: str) -> DeploymentChange:
    """A deployment no valid document names while some documents could not be read: never taken as removed."""
    return DeploymentChange(
        name=record.name, old_revision=record.revision, revision=record.revision, action=list(NO_OP),
        blocked=[f"not destroyed, though no valid document names it: {why}"],
    )  # fmt: skip


def removed(record: DeploymentRecord, hosts: Hosts) -> DeploymentChange:
    """A deployment the documents no longer name: each replica deleted (or, out of reach, left and said)."""
    return DeploymentChange(
        name=record.name, action=list(DELETE), reasons=["removed from the documents"], old_revision=record.revision,
        revision=record.revision,
        replicas=[deletion(r, "not in the documents") for r in record.replicas if r.host in hosts.facts],
        blocked=[out_of_reach(r, hosts) for r in record.replicas if r.host not in hosts.facts],
    )  # fmt: skip


def with_gateways(
    plan: Plan, desired: DesiredState, state: State, inventory: Inventory, facts: Mapping[str, HostFacts],
    scaler_lock: ScalerLock | None = None,
) -> set[tuple[str, str]]:  # fmt: skip
    """The gateway hosts' changes and drift into the plan (engine_ctl.core.plan.gateway); returns the gateway's
    and the scaler's units, (host, unit), which are engine-ctl's own and so never listed as unmanaged."""
    plan.gateways, found = plan_gateways(plan.changes, state, inventory, facts, desired.api_keys)
    plan.scaler = plan_scaler(plan.changes, state, inventory, facts, scaler_lock)
    alone = without_scaler(plan.changes, inventory)
    for change in plan.changes:
        if change.name in alone:
            change.warnings.append(alone[change.name])
    plan.drift += [Drift(host=d["host"], unit=GATEWAY_UNIT, kind=d["kind"], detail=d["detail"]) for d in found]
    return {(host, unit) for host in facts for unit in GATEWAY_HOST_UNITS}


def planning_order(desired: DesiredState, state: State, targets: list[str] | None) -> list[str]:
    """Every deployment wanted or recorded (only the targets, when given): the highest priority first, then by
    name; a recorded deployment the documents drop counts as priority 0."""
    wanted = {ld.deployment.name: ld.deployment.priority for ld in desired.deployments}
    names = sorted(set(wanted) | set(state.deployments))
    if targets:
        names = [n for n in names if n in targets]
    return sorted(names, key=lambda n: (-wanted.get(n, 0), n))


def wanted_change(
    loaded: LoadedDeployment, desired: DesiredState, record: DeploymentRecord | None,
    model_facts: Mapping[str, ModelFacts | None], hosts: Hosts, alloc: Allocation, lineage: str | None = None,
    serial: int = 0, created_at: str = "", held_down: bool = True,
) -> tuple[DeploymentChange, Target | None]:  # fmt: skip
    """The deployment's first phase (its always-on replicas placed): deployment.start_deployment. `held_down`: a
    stopped one is kept stopped (False for a parked one a request woke: it serves)."""
    d = loaded.deployment
    model = desired.model(d.model)
    provider = resolve_engine(d, model)
    assert model is not None and provider is not None  # the documents passed the rules
    names = field_names(loaded)
    ident = deployment_id_for(record, lineage or "", d.name, serial, created_at)
    return start_deployment(d, model, provider, model_facts.get(model.name), record, hosts, alloc, names, lineage,
                            ident, held_down and keeps_stopped(record, created_at, hosts.facts))  # fmt: skip


def field_names(loaded: LoadedDeployment) -> Names:
    def names(internal: str) -> str:
        return field_name(loaded.origin, internal)

    return names


def finish_all(
    started: list[tuple[str, DeploymentChange, Target | None]], state: State,
    wanted: Mapping[str, LoadedDeployment], alloc: Allocation, replace: frozenset[str],
) -> list[Drift]:  # fmt: skip
    """Once every deployment's always-on replicas are placed: each one's on-demand slots, in the same order (the
    highest priority first), then shrink and decide (deployment.finish_deployment); the envelopes last. Returns
    the drift found."""
    drift: list[Drift] = []
    for name, change, target in started:
        if target is not None:
            seen = state.deployments.get(name)
            seen = forced(seen) if seen is not None and name in replace else seen
            finish_deployment(target, alloc, seen, wanted[name].deployment, field_names(wanted[name]))
            drift += target.drift
        if name in replace:
            mark_replaced(change)
    envelopes([t for _, _, t in started if t is not None], alloc.taken)
    return drift


def held_by_operator(
    change: DeploymentChange, state: State, wanted: Mapping[str, LoadedDeployment], woken: Mapping[str, str],
    drift: Sequence[Drift] = (),
) -> DeploymentChange:  # fmt: skip
    """A wanted deployment an operator's stop, park or delete holds: nothing of it runs or stops
    (core.plan.operator); `woken`: parked ones a request woke, and when (core.plan.wake), which serve and are left
    serving; `drift`: the plan's, whose file drift a stopped one's repair writes back (kept stopped)."""
    record = state.deployments.get(change.name)
    if change.name in wanted and record is not None and record.operator is not None:
        return hold(change, record, woken.get(change.name), file_drift(drift))
    return change


@collector_held
def make_plan(
    desired: DesiredState,
    state: State,
    inventory: Inventory,
    facts: Mapping[str, HostFacts],
    model_facts: Mapping[str, ModelFacts | None],
    *,
    unreachable: Mapping[str, str] | None = None,
    targets: list[str] | None = None,
    refresh_only: bool = False,
    created_at: str = "",
    hold_absent: str | None = None,
    replace: frozenset[str] = frozenset(),
    scaler_lock: ScalerLock | None = None,
) -> Plan:
    """`hold_absent`, when set, says why deployments absent from the documents are not destroyed (some
    documents could not be read: a deployment whose document is broken is never taken as removed). `replace`
    names deployments whose replicas are all replaced (a rolling restart: engine_ctl.core.plan.replace).
    `scaler_lock`: with PostgreSQL state, the lock that lets a scaler run on every gateway host
    (engine_ctl.core.render.scalerlock)."""
    plan = Plan(created_at=created_at, state_serial=state.serial, state_lineage=state.lineage, **host_identity(facts),
                unreachable=dict(unreachable or {}), targets=sorted(targets or []),
                refresh_only=refresh_only)  # fmt: skip
    hosts = Hosts.of(inventory, facts)
    wanted = {ld.deployment.name: ld for ld in desired.deployments}
    alloc = Allocation(state, hosts.reached, {n: ld.deployment.replicas_min for n, ld in wanted.items()})
    foreign = foreign_units(facts, state.lineage)
    hold_foreign(alloc.taken, foreign)
    started: list[tuple[str, DeploymentChange, Target | None]] = []
    woken = woken_parks(state.deployments, scaler_views_of(facts.values()))
    for name in planning_order(desired, state, targets):  # always-on replicas first, every deployment
        record = state.deployments.get(name)
        if name in wanted:
            seen = forced(record) if record is not None and name in replace else record
            change, target = wanted_change(wanted[name], desired, seen, model_facts, hosts, alloc, state.lineage,
                                           state.serial, created_at, name not in woken)  # fmt: skip
            started.append((name, change, target))
            plan.changes.append(change)
        else:
            assert record is not None
            plan.changes.append(held_back(record, hold_absent) if hold_absent else removed(record, hosts))
    plan.drift += finish_all(started, state, wanted, alloc, replace)
    plan.changes = [held_by_operator(c, state, wanted, woken, plan.drift) for c in plan.changes]
    hold_back(plan, foreign)
    gateway_units = with_gateways(plan, desired, state, inventory, facts, scaler_lock)
    plan.drift.extend(unmanaged_units(state, facts, {(f.host, f.unit) for f in foreign} | gateway_units))
    plan.drift = without_held_drift(plan.drift, state)
    attach_unit_diffs(plan, facts)
    if refresh_only:
        for c in plan.changes:
            c.action, c.replicas = list(NO_OP), []
        for g in plan.gateways:
            g.action = ["no-op"]
    plan.absent = [c.name for c in plan.changes if c.actions == DELETE]
    plan.refused = refusals(plan, state, facts)
    plan.prunes = [] if refresh_only else prunes(desired, plan.changes, facts)
    return plan


__all__ = [
    "FORMAT_VERSION", "Action", "DeploymentChange", "Drift", "FieldChange", "Plan", "ReplicaChange",
    "fetched_at_apply", "make_plan", "render_replica",
]  # fmt: skip
