"""`engine-ctl import`: a state rebuilt from what the hosts run, so that a lost state never means duplicate
engines or orphaned units. Pure: documents, inventory, facts and the current state in; the records out.

Each unit's header (engine_ctl.core.fit.unitheader) says its deployment, replica, slot, revision, port, GPUs and
the lineage of the state that made it; the documents give each deployment's specification. A unit is adopted
when a document names its deployment and its lineage is the one being rebuilt (or it has none: an older
engine-ctl wrote it). Each adopted unit is rendered again from the documents at its own revision:
- the same file: recorded as it is (the next plan has nothing to do for it);
- the file engine-ctl wrote, edited since (its content hash says so): recorded as written, so the next plan shows
  the drift and repairs it;
- anything else (the documents changed since): recorded as it runs, with no specification hash, so the next
  plan gives the deployment a new revision and replaces it, one replica at a time.

A replica group (spec.nodes > 1) is adopted whole: each worker's unit (its head's name and -w<rank>,
engine_ctl.core.render.units.member_name) is read from its own host and header, checked against the rendering like
its head's, and recorded as a member of its head's replica, rank order; the head's header gives its runtime port
(group-port). A worker whose head runs nowhere is left, with why; a worker its head's header names and no host runs
is recorded from that line, so the next plan shows the member missing and repairs the group (group_drift). What
import cannot know of a member is the build it was applied with (engine_version, engine_sha256: the host has only
the binary there now), as for a head: recorded empty, so not checked until an apply starts the member again.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping

from pydantic import BaseModel, ValidationError

from engine_ctl.core.documents.inventory import Host, Inventory
from engine_ctl.core.documents.rules import resolve_engine
from engine_ctl.core.fit.hostfacts import HostFacts, UnitFact
from engine_ctl.core.fit.modelfacts import ModelFacts
from engine_ctl.core.fit.runspec import FitPlan
from engine_ctl.core.fit.unitheader import HEADER_LINES, HeaderMember, UnitHeader, header_members, parse_unit_header
from engine_ctl.core.model import ApiKey, DesiredState
from engine_ctl.core.names import parse_unit_name
from engine_ctl.core.plan.diff import spec_digest
from engine_ctl.core.plan.gateway import Replica, recorded_replicas, render_for, stopped_map
from engine_ctl.core.plan.planner import make_plan, render_replica
from engine_ctl.core.plan.status import recorded_verdict
from engine_ctl.core.plan.world import recorded_placement
from engine_ctl.core.record.model import (
    ULID,
    DeploymentRecord,
    GatewayRecord,
    MemberRecord,
    OperatorAction,
    ReplicaRecord,
    State,
)
from engine_ctl.core.render.gateway import CONFIG_FILE, GATEWAY_UNIT, RenderedGateway, created_of
from engine_ctl.core.render.guard import guarded_by
from engine_ctl.core.render.scaler import GATEWAY_HOST_UNITS
from engine_ctl.core.render.units import RenderedMember, parse_member_name


class AdoptionError(Exception):
    """Nothing can be imported as asked; the message says why and what to pass."""


class AdoptedMember(BaseModel):
    """A worker of an adopted replica group: found on its host, or missing (named by its head's header only)."""

    rank: int
    host: str
    unit: str
    port: int
    gpus: list[str]
    status: str
    note: str = ""


class AdoptedReplica(BaseModel):
    deployment: str
    index: int
    slot: str
    host: str
    unit: str
    revision: int
    port: int
    gpus: list[str]
    status: str
    lineage: str | None
    note: str = ""
    """How it compares with the documents, when it is not what they render."""
    members: list[AdoptedMember] = []
    """A replica group's workers, rank 1 first (empty: a replica on one machine)."""


class SkippedUnit(BaseModel):
    host: str
    unit: str
    deployment: str | None = None
    why: str


class AdoptedGateway(BaseModel):
    host: str
    endpoint: str
    note: str = ""
    """How its files compare with what the adopted deployments render, when they are not the same."""


class Adoption(BaseModel):
    lineage: str
    lineage_reason: str
    deployments: dict[str, DeploymentRecord]
    adopted: list[AdoptedReplica]
    skipped: list[SkippedUnit]
    gateways: dict[str, GatewayRecord] = {}
    adopted_gateways: list[AdoptedGateway] = []
    ids: dict[str, str] = {}
    """Where each deployment's ID came from (the scaler's state on a gateway host), or why it has none."""
    stopped: dict[str, str] = {}
    """Deployments recorded as stopped by an operator, and which gateway says so (its running stopped.map)."""


Found = tuple[str, UnitFact, UnitHeader]
Worker = tuple[str, UnitFact, UnitHeader, str, int]
"""A group worker's unit: its host, unit, header, its head's unit name and its rank."""
MISSING = "missing"


def _header_problem(unit: UnitFact, wanted: set[str], head: str | None = None) -> str | None:
    """Why the unit (a worker's: `head`, its head's unit name) cannot be adopted; None: it can."""
    parsed = parse_unit_name(head or unit.name)
    h = unit.header
    if parsed is None:
        return "not a name engine-ctl gives its units"
    if h is None:
        return "it has no engine-ctl header"
    if (h.deployment, h.replica, h.slot) != (parsed.deployment, parsed.index, parsed.slot):
        return "its header does not match its name"
    if h.port is None:
        return "its header names no port"
    if h.deployment not in wanted:
        return f"no document names deployment {h.deployment} (pass its document to adopt it)"
    return None


def _candidates(desired: DesiredState, inventory: Inventory, facts: Mapping[str, HostFacts]) -> tuple[
    list[Found], list[Worker], list[SkippedUnit]
]:  # fmt: skip
    """Units of the documents' deployments with a usable header, host by host in inventory order: replicas (a
    group's head among them) and group workers."""
    wanted = {ld.deployment.name for ld in desired.deployments}
    found: list[Found] = []
    workers: list[Worker] = []
    skipped: list[SkippedUnit] = []
    for host in (h.name for h in inventory.hosts if h.name in facts):
        for u in sorted(facts[host].units, key=lambda u: u.name):
            if guarded_by(u.name) is not None:  # a replica's guard goes with it (apply writes it from its unit)
                continue
            if u.name in GATEWAY_HOST_UNITS:  # engine-ctl's own, not replicas: adopt_gateways reads the gateway's
                continue  # with its files; apply makes the scaler's, and deployment_ids reads its state's IDs
            member = parse_member_name(u.name)
            why = _header_problem(u, wanted, member[0] if member else None)
            if why is not None or u.header is None:
                deployment = u.header.deployment if u.header else None
                skipped.append(SkippedUnit(host=host, unit=u.name, deployment=deployment, why=why or ""))
                continue
            if member is not None:
                workers.append((host, u, u.header, *member))
            else:
                found.append((host, u, u.header))
    return found, workers, skipped


def choose_lineage(found: list[Found], state: State, explicit: str | None) -> tuple[str, str]:
    """The lineage to rebuild, and why that one."""
    if explicit:
        return explicit, "given with --lineage"
    lineages: dict[str, list[str]] = {}
    for host, _unit, h in found:
        if h.lineage is not None:
            lineages.setdefault(h.lineage, []).append(f"{h.deployment} on {host}")
    if state.serial > 0 and state.lineage in lineages:
        return state.lineage, "the state's own"
    if len(lineages) == 1:
        return next(iter(lineages)), "the lineage in the units' headers"
    if not lineages:
        return state.lineage, "the state's (the units carry no lineage: an older engine-ctl wrote them)"
    listed = "; ".join(f"{lin}: {', '.join(where[:3])}" for lin, where in sorted(lineages.items()))
    raise AdoptionError(
        f"the units of these deployments were made by {len(lineages)} different states ({listed}); pass --lineage "
        "to say which one to rebuild (the others' units are left to their states)"
    )


def _status(unit: UnitFact, on_demand: bool = False) -> str:
    if unit.active_state == "active":
        return "serving"
    if on_demand:  # installed and not running: the scaler starts it (apply records it so)
        return "standby"
    return "failed" if unit.active_state == "failed" else "stopped"


def on_demand_slot(index: int, unit: UnitFact, desired: DesiredState, deployment: str) -> bool:
    """The scaling envelope (README, Scaling and scale to zero): slots 0..min-1 are always on, min..max-1 on demand.
    A unit at a slot above `min` that is not enabled (apply installs an on-demand unit and never enables it) is on
    demand; an enabled one there was always on (an older envelope), and the next plan changes its role."""
    loaded = desired.deployment(deployment)
    always = loaded.deployment.replicas_min if loaded is not None else 1
    return index >= always and unit.unit_file_state != "enabled"


def _replica(host: str, u: UnitFact, h: UnitHeader, facts: HostFacts, on_demand: bool = False) -> ReplicaRecord:
    by_uuid = {g.uuid: g.index for g in facts.gpus}
    return ReplicaRecord(
        index=h.replica, slot=h.slot, host=host, unit=u.name, port=h.port or 0, gpus=list(h.gpus),
        gpu_indexes=[by_uuid[g] for g in h.gpus if g in by_uuid], unit_sha256=u.sha256 or "", revision=h.revision,
        status=_status(u, on_demand), on_demand=on_demand,
    )  # fmt: skip


def _records(
    desired: DesiredState, found: list[Found], facts: Mapping[str, HostFacts], lineage: str
) -> tuple[dict[str, DeploymentRecord], list[SkippedUnit], dict[tuple[str, str], Found]]:
    """One record per deployment from its units of `lineage` (or none); each replica and slot once."""
    replicas: dict[str, list[ReplicaRecord]] = {}
    skipped: list[SkippedUnit] = []
    taken: dict[tuple[str, int, str], str] = {}
    sources: dict[tuple[str, str], Found] = {}
    for host, u, h in found:
        if h.lineage is not None and h.lineage != lineage:
            why = f"owned by another state (lineage {h.lineage})"
            skipped.append(SkippedUnit(host=host, unit=u.name, deployment=h.deployment, why=why))
            continue
        key = (h.deployment, h.replica, h.slot)
        if key in taken:
            why = f"the same replica and slot is adopted on {taken[key]}"
            skipped.append(SkippedUnit(host=host, unit=u.name, deployment=h.deployment, why=why))
            continue
        try:
            record = _replica(host, u, h, facts[host], on_demand_slot(h.replica, u, desired, h.deployment))
        except ValidationError as exc:
            why = f"its header is not valid: {exc.errors()[0]['msg']}"
            skipped.append(SkippedUnit(host=host, unit=u.name, deployment=h.deployment, why=why))
            continue
        taken[key] = host
        sources[(host, u.name)] = (host, u, h)
        replicas.setdefault(h.deployment, []).append(record)
    records = {}
    for name, reps in sorted(replicas.items()):
        loaded = desired.deployment(name)
        model = desired.model(loaded.deployment.model) if loaded else None
        assert loaded is not None and model is not None
        digest = spec_digest(loaded.deployment, model)
        reps.sort(key=lambda r: (r.index, r.slot))
        revision = max(r.revision for r in reps)
        records[name] = DeploymentRecord(
            name=name, revision=revision, spec=loaded.deployment, model=model, spec_hash=digest, replicas=reps
        )
    return records, skipped, sources


def _head_members(u: UnitFact, h: UnitHeader) -> tuple[HeaderMember, ...]:
    """The workers a head's header names: from its whole text where the facts carry it (the probe sends only the
    first HEADER_LINES lines of a unit)."""
    return header_members(u.text.splitlines()) if u.text else h.members


def _chosen_workers(
    heads: Mapping[str, ReplicaRecord], workers: list[Worker], lineage: str
) -> tuple[dict[str, dict[int, Worker]], list[SkippedUnit]]:
    """The workers of the adopted heads, by head and rank; the others left, with why (never a worker alone)."""
    chosen: dict[str, dict[int, Worker]] = {}
    skipped: list[SkippedUnit] = []
    for w in workers:
        host, u, h, head, rank = w
        r, mine = heads.get(head), chosen.setdefault(head, {})
        if h.lineage is not None and h.lineage != lineage:
            why = f"owned by another state (lineage {h.lineage})"
        elif r is None:
            why = f"group member {rank} of {head}, which runs on no host: a group is adopted whole, not a worker alone"
        elif h.revision != r.revision:
            why = f"group member {rank} of {head} at revision {h.revision}, its head at {r.revision}: not one group"
        elif rank in mine:
            why = f"group member {rank} of {head} is adopted on {mine[rank][0]}"
        else:
            mine[rank] = w
            continue
        skipped.append(SkippedUnit(host=host, unit=u.name, deployment=h.deployment, why=why))
    return chosen, skipped


def _members(
    records: Mapping[str, DeploymentRecord], workers: list[Worker], sources: Mapping[tuple[str, str], Found],
    lineage: str,
) -> tuple[list[SkippedUnit], dict[tuple[str, str], Worker]]:  # fmt: skip
    """Each adopted head's workers as the members of its replica, rank order, with its group port: those found on
    their hosts, and those its header names that no host runs (recorded from that line: the next plan shows them
    missing and repairs the group). The workers left, with why; the adopted ones by (host, unit)."""
    heads = {r.unit: r for rec in records.values() for r in rec.replicas}
    chosen, skipped = _chosen_workers(heads, workers, lineage)
    adopted: dict[tuple[str, str], Worker] = {}
    for r in heads.values():
        _host, u, h = sources[(r.host, r.unit)]
        listed = {m.rank: m for m in _head_members(u, h) if parse_member_name(m.unit) == (r.unit, m.rank)}
        found = chosen.get(r.unit, {})
        members: list[MemberRecord] = []
        for rank in sorted(set(found) | set(listed)):
            w = found.get(rank)
            try:
                if w is not None:
                    members.append(MemberRecord(rank=rank, host=w[0], unit=w[1].name, port=w[2].port or 0,
                                                gpus=list(w[2].gpus), unit_sha256=w[1].sha256 or ""))  # fmt: skip
                    adopted[(w[0], w[1].name)] = w
                else:
                    m = listed[rank]
                    members.append(MemberRecord(rank=rank, host=m.host, unit=m.unit, port=m.port, unit_sha256=m.sha256))
            except ValidationError as exc:
                if w is not None:
                    why = f"its header is not valid: {exc.errors()[0]['msg']}"
                    skipped.append(SkippedUnit(host=w[0], unit=w[1].name, deployment=w[2].deployment, why=why))
        r.members, r.group_port = members, h.group_port if members else None
    return skipped, adopted


def _adopted_members(
    r: ReplicaRecord, workers: Mapping[tuple[str, str], Worker], notes: Mapping[tuple[str, str], str]
) -> list[AdoptedMember]:
    """An adopted group's members as import shows them: each found one's state, a missing one said so."""
    out = []
    for m in r.members:
        w = workers.get((m.host, m.unit))
        note = notes.get((m.host, m.unit), "")
        if w is None:
            note = note or "no host runs it: recorded as its head's header names it; the next plan repairs the group"
        out.append(AdoptedMember(rank=m.rank, host=m.host, unit=m.unit, port=m.port, gpus=list(m.gpus),
                                 status=_status(w[1]) if w else MISSING, note=note))  # fmt: skip
    return out


def adopt(
    desired: DesiredState,
    inventory: Inventory,
    facts: Mapping[str, HostFacts],
    model_facts: Mapping[str, ModelFacts | None],
    state: State,
    lineage: str | None = None,
    now: str = "",
) -> Adoption:
    """The records of every deployment of the documents that runs on the hosts, as the state would have them.
    `now`: when the import runs, the time a stop found on the hosts is recorded with (none: no stop adopted)."""
    found, workers, skipped = _candidates(desired, inventory, facts)
    heads = found or [(host, u, h) for host, u, h, _head, _rank in workers]  # only workers: theirs
    chosen, reason = choose_lineage(heads, state, lineage)
    records, more, sources = _records(desired, found, facts, chosen)
    left, members = _members(records, workers, sources, chosen)
    skipped += more + left
    if not records:
        return Adoption(lineage=chosen, lineage_reason=reason, deployments={}, adopted=[], skipped=skipped)
    ids = {**deployment_ids(facts, records), **header_ids(list(sources.values()), records)}
    for name, rec in records.items():
        rec.id = ids.get(name, "")
        rec.revision = max(rec.revision, recorded_revision(facts, name, rec.id))
    stopped = held_stops(records, facts, now)
    draft = State(lineage=chosen, deployments=records)
    plan = make_plan(desired, draft, inventory, facts, model_facts, targets=sorted(records))
    adopted: list[AdoptedReplica] = []
    for change in plan.changes:
        record = records[change.name]
        record.plan, record.chosen = change.fit, dict(change.chosen)
        notes = _compare(desired, inventory, facts, change.fit, record, sources, members, change.pending_reason
                         or change.failed_reason)  # fmt: skip
        if any(n.startswith("differs") or n.startswith("not compared") for n in notes.values()):
            record.spec_hash = ""  # the next plan gives it a new revision and replaces what differs
        wanted = record.spec.replicas_min if record.spec else len(record.replicas)  # as apply counts it (min 0: 0)
        found_verdict = recorded_verdict(record.replicas, wanted, record.revision)
        record.state, record.reason = found_verdict.state, found_verdict.reason
        for r in record.replicas:
            h = sources[(r.host, r.unit)][2]
            adopted.append(
                AdoptedReplica(
                    deployment=change.name,
                    index=r.index,
                    slot=r.slot,
                    host=r.host,
                    unit=r.unit,
                    revision=r.revision,
                    port=r.port,
                    gpus=list(r.gpus),
                    status=r.status,
                    lineage=h.lineage,
                    note=notes.get((r.host, r.unit), ""),
                    members=_adopted_members(r, members, notes),
                )
            )
    gateways, seen = adopt_gateways(State(lineage=chosen, deployments=records), inventory, facts, desired.api_keys)
    return Adoption(lineage=chosen, lineage_reason=reason, deployments=records, adopted=adopted, skipped=skipped,
                    gateways=gateways, adopted_gateways=seen, ids=ids, stopped=stopped)  # fmt: skip


def held_stops(records: Mapping[str, DeploymentRecord], facts: Mapping[str, HostFacts], now: str) -> dict[str, str]:
    """The deployments an operator stopped, as the hosts still say it: a running gateway's stopped.map names them
    (it answers them deployment_stopped), and no unit of theirs runs. Recorded stopped (at `now`: the stop's own
    time is on no host), so that the next plan keeps them stopped: before, an import forgot the stop, and the next
    apply started them and opened them in the gateway again (a probe, session 17). Returns name -> which gateway."""
    out: dict[str, str] = {}
    if not now:
        return out
    for name, rec in records.items():
        gateway = next((h for h, f in sorted(facts.items())
                        if name in ((f.gateway_maps or {}).get("stopped.map") or {})), None)  # fmt: skip
        runs = any(u.name == r.unit and u.active_state in ("active", "activating") for r in rec.replicas
                   for u in facts[r.host].units)  # fmt: skip
        if gateway is None or runs:
            continue
        rec.operator = OperatorAction(verb="stopped", when=now)
        for r in rec.replicas:
            r.status = "stopped"
        out[name] = gateway
    return out


def _compare(
    desired: DesiredState, inventory: Inventory, facts: Mapping[str, HostFacts], fit: FitPlan | None,
    record: DeploymentRecord, sources: dict[tuple[str, str], Found], workers: Mapping[tuple[str, str], Worker],
    why_not: str | None,
) -> dict[tuple[str, str], str]:  # fmt: skip
    """Each adopted replica (and each worker of a group) against what the documents render at its revision (with
    the lineage its header has): a note for each that is not the same file; the argv and, for an edited unit, the
    sha256 engine-ctl wrote."""
    notes: dict[tuple[str, str], str] = {}
    if fit is None:
        for r in record.replicas:
            notes[(r.host, r.unit)] = f"not compared with the documents ({why_not or 'no fit yet'})"
        return notes
    loaded = desired.deployment(record.name)
    model = desired.model(loaded.deployment.model) if loaded else None
    provider = resolve_engine(loaded.deployment, model) if loaded else None
    assert loaded is not None and model is not None and provider is not None
    fitted = fit
    hosts = {h.name: h for h in inventory.hosts}
    for r in record.replicas:
        _host, u, h = sources[(r.host, r.unit)]
        placement = recorded_placement(r, facts[r.host], fitted, facts)
        if placement is None:
            notes[(r.host, r.unit)] = f"differs from the documents (its GPUs are not on {r.host} now)"
            continue
        unit = render_replica(loaded.deployment, model, provider, fitted, placement, hosts, r.revision, r.slot,
                              h.lineage, h.deployment_id)  # fmt: skip
        if unit.sha256 == u.sha256:
            r.argv = list(unit.argv)
        elif h.content_sha256 == unit.content_hash and u.edited:
            r.argv, r.unit_sha256 = list(unit.argv), unit.sha256
            notes[(r.host, r.unit)] = "edited by hand since engine-ctl wrote it: the next plan repairs it"
        else:
            notes[(r.host, r.unit)] = (
                f"differs from what the documents render at revision {r.revision}: the next plan replaces it"
            )
        notes |= _compare_members(r, unit.members, workers)
    return notes


def _content_hash(rendered: RenderedMember) -> str | None:
    header = parse_unit_header(rendered.text.splitlines()[:HEADER_LINES])
    return header.content_sha256 if header else None


def _compare_members(
    r: ReplicaRecord, rendered: tuple[RenderedMember, ...], workers: Mapping[tuple[str, str], Worker]
) -> dict[tuple[str, str], str]:
    """Each worker of an adopted group against its rendering beside its head's, as _compare does a replica; a
    missing one (recorded from its head's header) takes the rendered argv when its head names that very file."""
    notes: dict[tuple[str, str], str] = {}
    by_rank = {m.rank: m for m in rendered}
    for m in r.members:
        mine, w = by_rank.get(m.rank), workers.get((m.host, m.unit))
        on_host = w[1].sha256 if w is not None else m.unit_sha256
        if mine is not None and (mine.name, mine.host) == (m.unit, m.host) and mine.sha256 == on_host:
            m.argv = list(mine.argv)
        elif mine is not None and w is not None and w[1].edited and w[2].content_sha256 == _content_hash(mine):
            m.argv, m.unit_sha256 = list(mine.argv), mine.sha256
            notes[(m.host, m.unit)] = "edited by hand since engine-ctl wrote it: the next plan repairs it"
        else:
            notes[(m.host, m.unit)] = (
                f"differs from what the documents render at revision {r.revision}: the next plan replaces the group"
            )
    return notes


def deployment_ids(facts: Mapping[str, HostFacts], names: Iterable[str]) -> dict[str, str]:
    """Each deployment's ID where a host carries it: the scaler's state (its state.json on a gateway host, in the
    facts) names each deployment it acts on with its ID. Only a ULID, and only one: scalers that disagree give none."""
    seen: dict[str, set[str]] = {}
    for hf in facts.values():
        views = (hf.scaler_state or {}).get("deployments")
        for name, view in views.items() if isinstance(views, dict) else ():
            value = view.get("id") if isinstance(view, dict) else None
            if isinstance(value, str) and ULID.fullmatch(value):
                seen.setdefault(name, set()).add(value)
    return {n: min(seen[n]) for n in names if len(seen.get(n, ())) == 1}


def header_ids(found: list[Found], names: Iterable[str]) -> dict[str, str]:
    """Each deployment's ID as its units' headers carry it (engine-ctl writes it there): only where they agree on
    one."""
    seen: dict[str, set[str]] = {}
    for _host, _unit, h in found:
        if h.deployment_id is not None:
            seen.setdefault(h.deployment, set()).add(h.deployment_id)
    return {n: next(iter(seen[n])) for n in names if len(seen.get(n, ())) == 1}


def recorded_revision(facts: Mapping[str, HostFacts], name: str, deployment_id: str) -> int:
    """The deployment's revision as the scaler's state carries it beside its ID (0: none does). A change that
    reaches no unit (an in-place one: idle_minutes, say) records a revision the units' headers do not have."""
    found = [0]
    for hf in facts.values() if deployment_id else ():
        views = (hf.scaler_state or {}).get("deployments")
        view = views.get(name) if isinstance(views, dict) else None
        if isinstance(view, dict) and view.get("id") == deployment_id and type(view.get("revision")) is int:
            found.append(max(view["revision"], 0))
    return max(found)


Replicas = dict[str, dict[tuple[str, int, str], Replica]]
MAX_ON_DEMAND_TRIED = 8
"""On-demand servers whose every running/not-running combination is tried against a gateway's files (2^8 renders)."""


Sizing = dict[str, tuple[str | None, int | None, str, int]]


def _gateway_inputs(state: State, facts: Mapping[str, HostFacts]) -> tuple[Replicas, Sizing]:
    """The replicas each deployment's backend has (as the recorded state has them), and its (engine, parallel, api,
    created)."""
    after: Replicas = {}
    sizing: Sizing = {}
    for name, rec in sorted(state.deployments.items()):
        after[name] = {(r.host, r.index, r.slot): r for r in recorded_replicas(rec, facts)}
        api = rec.spec.api if rec.spec else "chat"
        created = created_of(rec.id)
        sizing[name] = (rec.plan.engine, rec.plan.parallel, api, created) if rec.plan else (None, None, api, created)
    return after, sizing


def _running(after: Replicas, active: frozenset[tuple[str, tuple[str, int, str]]]) -> Replicas:
    """The replicas with exactly the on-demand ones in `active` running (their servers not in maintenance)."""
    return {
        name: {k: r.model_copy(update={"active": (name, k) in active}) if r.on_demand else r for k, r in reps.items()}
        for name, reps in after.items()
    }  # fmt: skip


def _renderings(after: Replicas, render: Callable[[Replicas], RenderedGateway]) -> Iterator[RenderedGateway]:
    """What a gateway renders for each set of running on-demand replicas (the last apply wrote one of them, and the
    scaler has started or stopped some since): those running now first."""
    yield render(after)
    idle = [(name, k) for name, reps in after.items() for k, r in reps.items() if r.on_demand]
    if not idle or len(idle) > MAX_ON_DEMAND_TRIED:
        return
    now = frozenset((n, k) for n, k in idle if after[n][k].active)
    for size in range(len(idle) + 1):
        for chosen in itertools.combinations(idle, size):
            if frozenset(chosen) != now:
                yield render(_running(after, frozenset(chosen)))


def _gateway_record(unit_sha: str, on_host: Mapping[str, str], renderings: Iterator[RenderedGateway]) -> tuple[
    GatewayRecord, str
]:  # fmt: skip
    """The record of a gateway whose files are one of `renderings` (and a note when its unit is not engine-ctl's);
    else its files as they are, so that the next plan updates them."""
    first = next(renderings)
    for g in itertools.chain([first], renderings):
        if all(on_host.get(n) == sha for n, sha in g.file_sha256.items()):
            record = GatewayRecord(endpoint=g.endpoint, files_sha256=g.file_sha256, unit_sha256=unit_sha,
                                   config=g.files[CONFIG_FILE])  # fmt: skip
            same = unit_sha == g.unit_sha256
            return record, "" if same else f"{GATEWAY_UNIT} is not what engine-ctl renders: the next plan updates it"
    files = {n: on_host[n] for n in first.files if n in on_host}
    record = GatewayRecord(endpoint=first.endpoint, files_sha256=files, unit_sha256=unit_sha)
    return record, "its files are not what these documents render: the next plan updates them"


def adopt_gateways(state: State, inventory: Inventory, facts: Mapping[str, HostFacts], keys: Iterable[ApiKey]) -> tuple[
    dict[str, GatewayRecord], list[AdoptedGateway]
]:  # fmt: skip
    """The record of each gateway host that runs engine-ctl's gateway (its unit and files), as the last apply left
    it: the files' sha256 and configuration of the rendering (of the adopted deployments, the documents' keys) that
    they are. A gateway whose files are not one of them is recorded as it is, so the next plan updates it; a host
    without engine-ctl's gateway has no record, so the next plan creates it."""
    hosts = {h.name: h for h in inventory.hosts}
    after, sizing = _gateway_inputs(state, facts)
    stopped, keys = stopped_map(state.deployments), list(keys)
    records: dict[str, GatewayRecord] = {}
    adopted: list[AdoptedGateway] = []
    for host in inventory.gateways():
        hf = facts.get(host.name)
        unit = next((u for u in hf.units if u.name == GATEWAY_UNIT), None) if hf is not None else None
        if hf is None or not hf.gateway_files or unit is None or unit.sha256 is None:
            continue

        def render(replicas: Replicas, host: Host = host) -> RenderedGateway:
            return render_for(host, replicas, sizing, keys, hosts, inventory.gateway, stopped, (), state.lineage)

        record, note = _gateway_record(unit.sha256, hf.gateway_files, _renderings(after, render))
        records[host.name] = record
        adopted.append(AdoptedGateway(host=host.name, endpoint=record.endpoint, note=note))
    return records, adopted


__all__ = [
    "AdoptedGateway",
    "AdoptedMember",
    "AdoptedReplica",
    "Adoption",
    "AdoptionError",
    "SkippedUnit",
    "adopt",
    "adopt_gateways",
    "choose_lineage",
    "deployment_ids",
    "header_ids",
    "recorded_revision",
]
