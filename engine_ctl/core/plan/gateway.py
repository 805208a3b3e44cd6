"""Planning the gateway hosts: the configuration each should run after this plan, against what the state
recorded and what is on the host (drift). Pure: values in, values out.

Servers are the deployments' replicas: during an apply the gateway first runs the union of the replicas that
serve now and those the plan starts (`interim`), so a new replica enters its backend once its check passes and
an old one is drained before it stops; after the apply it runs what serves then (`after`)."""

from __future__ import annotations

import difflib
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from engine_ctl.core.documents.apikey import RATE_RANGE, SHA256_HEX
from engine_ctl.core.documents.inventory import DEFAULT_GATEWAY_THREADS, GatewaySettings, Host, Inventory
from engine_ctl.core.fit.hostfacts import HostFacts, UnitFact
from engine_ctl.core.model import ApiKey
from engine_ctl.core.names import deployment_name_ok
from engine_ctl.core.plan.gatewayruntime import tampered_drift
from engine_ctl.core.plan.internalkey import gateway_key_drift, key_sent, loose_secret_drift
from engine_ctl.core.plan.keychanges import key_changes
from engine_ctl.core.plan.unitage import written_after_start
from engine_ctl.core.record.model import DeploymentRecord, GatewayRecord, State
from engine_ctl.core.render.gateway import (
    ADMIN_SOCKET,
    CONFIG_FILE,
    DRAIN_TIMEOUT_S,
    GATEWAY_UNIT,
    HOLD_CAP,
    HOLD_S,
    RUNTIME_MAPS,
    GatewayBackend,
    GatewayServer,
    RenderedGateway,
    backend_name,
    created_of,
    endpoint_of,
    gateway_argv,
    internal_sources,
    misrouted,
    render_gateway,
    server_lines,
    server_name,
    wake_addresses_for,
)
from engine_ctl.core.unitsetup import drop_ins_detail, not_enabled_detail, shared_drop_in_warning
from engine_ctl.providers import PROVIDERS


class Replica(BaseModel):
    """A replica as the gateway knows it: its unit, where it listens."""

    model_config = ConfigDict(frozen=True)

    index: int
    slot: str
    host: str
    port: int
    new: bool = False
    """Started by this apply: in maintenance in the interim configuration until apply lets it in."""
    on_demand: bool = False
    """Above `min`: the scaler starts it. Rendered in maintenance unless its unit is `active`."""
    active: bool = False


class GatewayChange(BaseModel):
    model_config = ConfigDict(extra="forbid")

    host: str
    action: list[str]
    endpoint: str
    reasons: list[str] = Field(default_factory=list)
    files: dict[str, str] = Field(default_factory=dict)
    """The files after the apply (GATEWAY_DIR/name -> text)."""
    unit_text: str = ""
    maps: dict[str, dict[str, str]] = Field(default_factory=dict)
    interim_files: dict[str, str] | None = None
    """Before the deployments change: the union of old and new replicas (None when it is `files`)."""
    diff: list[str] = Field(default_factory=list)
    """A unified diff of haproxy.cfg, recorded -> planned."""
    drain_timeout_s: int = DRAIN_TIMEOUT_S
    warnings: list[str] = Field(default_factory=list)
    hold_s: int = HOLD_S
    """The inventory's gateway.hold_s: how long a request waits for a serving replica."""
    hold_cap: int = HOLD_CAP
    """The inventory's gateway.hold_cap: requests held at once per deployment."""
    threads: int = DEFAULT_GATEWAY_THREADS
    """The inventory's gateway.threads: HAProxy's threads."""
    metrics_port: int | None = None
    """The inventory's monitoring.port (None: no metrics)."""
    metrics_allow: list[str] = Field(default_factory=list)
    """The inventory's monitoring hosts, as addresses and networks."""
    keys: list[ApiKey] = Field(default_factory=list)
    """The ApiKey documents (names, SHA-256, scopes, expiry: never a key) the key maps are rendered from: a saved
    plan's maps are rendered again from them at apply and must match (gateway_tampering)."""

    @property
    def symbol(self) -> str:
        return {"create": "+", "update": "~", "delete": "-"}.get(self.action[0], " ")

    @property
    def changed(self) -> bool:
        return self.action != ["no-op"]


def deployment_backend(
    name: str, replicas: Iterable[Replica], engine: str | None, parallel: int | None, hosts: Mapping[str, Host],
    api: str = "chat", created: int = 0,
) -> GatewayBackend:  # fmt: skip
    provider = PROVIDERS.get(engine or "")
    servers = tuple(
        GatewayServer(
            name=server_name(r.index, r.slot),
            address=hosts[r.host].address,
            port=r.port,
            maxconn=max(int(parallel or 1), 1),
            disabled=r.new or (r.on_demand and not r.active),
        )
        for r in sorted(replicas, key=lambda r: (r.index, r.slot))
        if r.host in hosts
    )
    health = provider.health_path if provider else "/health"
    return GatewayBackend(deployment=name, health_path=health, servers=servers, api=api, created=created)


def recorded_replicas(record: DeploymentRecord, facts: Mapping[str, HostFacts] | None = None) -> list[Replica]:
    """The replicas a record says run (not those being removed or that never became ready), and its on-demand
    ones: active when `facts` (else the record) says the unit runs."""
    return [
        Replica(index=r.index, slot=r.slot, host=r.host, port=r.port, on_demand=r.on_demand,
                active=r.on_demand and unit_active(r.host, r.unit, r.status, facts))
        for r in record.replicas
        if r.status in ("serving", "pending", "stopped", "standby", "starting")
    ]  # fmt: skip


def unit_active(host: str, unit: str, status: str, facts: Mapping[str, HostFacts] | None) -> bool:
    """Whether an on-demand unit runs: as the host's facts say, or (no facts of it) as apply recorded it."""
    hf = (facts or {}).get(host)
    if hf is None:
        return status == "serving"
    return any(u.name == unit and u.active_state == "active" for u in hf.units)


def backends_from_state(state: State, hosts: Mapping[str, Host]) -> list[GatewayBackend]:
    """What the gateway should route to, from the recorded state (after an apply, whatever it did). A deployment
    an operator deleted is not routed: its name is unknown at once (404 model_not_found), never held."""
    return [
        deployment_backend(
            name,
            recorded_replicas(rec),
            rec.plan.engine if rec.plan else None,
            rec.plan.parallel if rec.plan else None,
            hosts,
            rec.spec.api if rec.spec else "chat",
            created_of(rec.id),
        )
        for name, rec in sorted(state.deployments.items())
        if not deleted(rec)
    ]


def always_on_servers(state: State) -> list[tuple[str, str]]:
    """(backend, server) of every always-on replica that serves, of a deployment no operator holds: after an apply,
    each takes requests in every gateway. An on-demand slot's server is the scaler's to set (MAINT while it
    sleeps), and a held deployment's replicas are the operator's."""
    out = []
    for name, rec in sorted(state.deployments.items()):
        if rec.operator is not None:
            continue
        for r in rec.replicas:
            if not r.on_demand and r.status == "serving":
                out.append((backend_name(name), server_name(r.index, r.slot)))
    return out


def hold_servers(state: State) -> list[tuple[str, str]]:
    """(backend, "held") of every recorded deployment: the backup server through which a request that finds no
    replica is held (and a deployment scaled to zero woken), which always takes requests."""
    return [(backend_name(name), HELD_SERVER) for name in sorted(state.deployments)]


HELD_SERVER = "held"
"""The backup server of each deployment's backend (templates/haproxy.cfg.j2): its hold."""
SET_ASIDE = ("MAINT", "DRAIN")
"""A server's `show stat` status set aside by an admin command (`disable server`, `set server ... state maint` or
`drain`): no new request reaches it."""


def set_aside_drift(host: str, state: State, hf: HostFacts | None) -> list[dict[str, str]]:
    """Where the running gateway keeps an always-on replica out of rotation (set over its admin socket; HAProxy
    keeps it across reloads, from its server-state file): drift, which apply puts back (state ready)."""
    seen = hf.gateway_servers if hf is not None else {}
    out = []
    for backend, server in [*always_on_servers(state), *hold_servers(state)]:
        status = seen.get(f"{backend}/{server}", "")
        if status.startswith(SET_ASIDE):
            what = ("a request that finds no replica is answered 503 at once, never held (nor its deployment "
                    "woken)" if server == HELD_SERVER else "no request reaches it")  # fmt: skip
            detail = (f"the gateway on {host} holds {backend}/{server} in {status.split()[0]} (an admin command): "
                      f"{what}; apply puts it back")  # fmt: skip
            out.append({"host": host, "kind": "set-aside", "detail": detail})
    for where, weight in sorted((hf.gateway_weights if hf is not None else {}).items()):
        if weight not in ("", CONFIGURED_WEIGHT):
            out.append({"host": host, "kind": "set-aside", "detail": f"the gateway on {host} gives {where} weight "
                        f"{weight} (an admin command; its configuration gives {CONFIGURED_WEIGHT}): "
                        f"{'no request reaches it' if weight == '0' else 'its share of requests changed'}; apply "
                        "puts it back"})  # fmt: skip
    return out


CONFIGURED_WEIGHT = "1"
"""Every server's weight as the gateway's configuration gives it (HAProxy's default: the template sets none)."""


def deleted(record: DeploymentRecord | None) -> bool:
    """A tombstone: the record of a deployment an operator deleted (engine-ctl delete)."""
    return record is not None and record.operator is not None and record.operator.verb == "deleted"


Slots = dict[tuple[int, str], Replica]
"""A deployment's replicas by (index, slot): its servers in the gateway are named by these alone (r1b), so
two replicas with one name (the same slot on two hosts, as a kill in a roll can leave) are one server."""


def _by_server(replicas: Iterable[Replica]) -> Slots:
    return {(r.index, r.slot): r for r in replicas}


def _planned(
    plan_changes: Iterable[Any], state: State, facts: Mapping[str, HostFacts] | None = None
) -> tuple[dict[str, Slots], dict[str, Slots], dict[str, Any]]:
    """Per deployment: replicas after the plan, the union with those now, and (engine, parallel)."""
    after: dict[str, Slots] = {}
    union: dict[str, Slots] = {}
    sizing: dict[str, tuple[str | None, int | None, str, int]] = {}
    changes = {c.name: c for c in plan_changes}
    for name in sorted(set(state.deployments) | set(changes)):
        record = state.deployments.get(name)
        change = changes.get(name)
        if deleted(record) and (change is None or not change.replicas):
            continue  # deleted by an operator: not routed (404), until start or a new document brings it back
        now = _by_server(recorded_replicas(record, facts) if record else [])
        final, both = dict(now), dict(now)
        plan = (change.fit if change is not None and change.fit else None) or (record.plan if record else None)
        spec = (change.spec if change is not None and change.spec else None) or (record.spec if record else None)
        api = spec.api if spec else "chat"  # a decisions deployment's backend answers POST /v1/systemone only
        created = created_of(record.id) if record else 0
        sizing[name] = (plan.engine, plan.parallel, api, created) if plan else (None, None, api, created)
        for rc in change.replicas if change is not None else []:
            new = Replica(index=rc.index, slot=rc.slot, host=rc.host, port=rc.port, on_demand=rc.on_demand,
                          active=rc.active)  # fmt: skip
            if rc.action in (["delete"], ["delete", "create"], ["create", "delete"]):  # removed, or replaced
                final.pop((rc.index, rc.old_slot or rc.slot), None)
            if rc.action != ["delete"]:
                final[(new.index, new.slot)] = new
                both[(new.index, new.slot)] = new.model_copy(update={"new": True})
        if change is not None and change.action == ["delete"]:
            final = {}
        if final or (change is not None and change.action != ["delete"]):
            after[name] = final
        union[name] = both
    return after, union, sizing


def stopped_map(deployments: Mapping[str, DeploymentRecord]) -> dict[str, str]:
    """The gateway's stopped.map: deployment name -> its ID, for each one an operator stopped (engine-ctl stop):
    the gateway answers deployment_stopped for them and never holds or starts them (core.plan.operator)."""
    return {
        name: rec.id or name
        for name, rec in sorted(deployments.items())
        if rec.operator is not None and rec.operator.verb == "stopped"
    }


def _engine(sizing: tuple[str | None, int | None, str, int]) -> tuple[str | None, int | None]:
    """(engine, parallel) of a deployment's sizing."""
    return sizing[0], sizing[1]


def _route(sizing: tuple[str | None, int | None, str, int]) -> tuple[str, int]:
    """(api, created) of a deployment's sizing."""
    return sizing[2], sizing[3]


def render_for(
    host: Host, replicas: Mapping[str, Mapping[Any, Replica]], sizing: Mapping[str, Any], keys: Iterable[ApiKey],
    hosts: Mapping[str, Host], settings: GatewaySettings, stopped: Mapping[str, str] | None = None,
    held: Iterable[str] = (),
    lineage: str = "",
) -> RenderedGateway:  # fmt: skip
    """`held`: deployments an operator deleted (not routed; an unscoped key's scope still names them); `lineage`:
    the state's (haproxy.cfg says whose gateway it is)."""
    backends = [
        deployment_backend(name, reps.values(), *_engine(sizing[name]), hosts, *_route(sizing[name]))
        for name, reps in sorted(replicas.items())
    ]
    return render_gateway(host, backends, keys, hold_s=settings.hold_s, hold_cap=settings.hold_cap,
                          threads=settings.threads, stopped=stopped,
                          wake_addresses=wake_addresses_for(host, hosts.values()), scope_names=held,
                          requests_per_minute=settings.requests_per_minute,
                          metrics_port=settings.metrics_port, metrics_allow=settings.metrics_allow,
                          internal_allow=internal_sources(hosts.values()), lineage=lineage)  # fmt: skip


def config_diff(old: str, new: str) -> list[str]:
    lines = difflib.unified_diff(old.splitlines(), new.splitlines(), "haproxy.cfg (recorded)", "haproxy.cfg", n=1)
    return [ln.rstrip("\n") for ln in lines]


def plan_gateways(
    plan_changes: Iterable[Any],
    state: State,
    inventory: Inventory,
    facts: Mapping[str, HostFacts],
    keys: Iterable[ApiKey],
) -> tuple[list[GatewayChange], list[dict[str, str]]]:
    """One GatewayChange per gateway host (and a delete for a recorded gateway no longer in the inventory), and
    the drift found on them (host, detail)."""
    hosts = {h.name: h for h in inventory.hosts}
    keys = sorted(keys, key=lambda k: k.name)
    after, union, sizing = _planned(list(plan_changes), state, facts)
    stopped = stopped_map(state.deployments)
    held = sorted(n for n, rec in state.deployments.items() if deleted(rec) and n not in after)
    out: list[GatewayChange] = []
    drift: list[dict[str, str]] = []
    sent = key_sent(inventory.gateways(), facts)
    for host in inventory.gateways():
        final = render_for(host, after, sizing, keys, hosts, inventory.gateway, stopped, held, state.lineage)
        interim = render_for(host, union, sizing, keys, hosts, inventory.gateway, stopped, held, state.lineage)
        change = GatewayChange(
            host=host.name, action=["no-op"], endpoint=final.endpoint, files=final.files, unit_text=final.unit_text,
            maps=final.maps, interim_files=None if interim.files == final.files else interim.files, keys=keys,
            hold_s=inventory.gateway.hold_s, hold_cap=inventory.gateway.hold_cap, threads=inventory.gateway.threads,
            metrics_port=inventory.gateway.metrics_port, metrics_allow=list(inventory.gateway.metrics_allow),
        )  # fmt: skip
        hf = facts.get(host.name)
        change.warnings += _warnings(host.name, hf)
        if host.name == inventory.gateways()[0].name:  # the documents' keys: said once
            change.warnings += unknown_scopes(keys, {*after, *held, *state.deployments})
        record = state.gateways.get(host.name)
        change.diff = config_diff(record.config if record else "", final.files[CONFIG_FILE])
        if record is None:
            change.action = ["create"]
            change.reasons.append(f"new gateway on {host.name}: http://{final.endpoint}/v1")
            out.append(change)
            continue
        found = recorded_drift(host.name, record, final, hf, state, sent)
        if host.name == inventory.gateways()[0].name:  # the key's files on every host: listed once
            found += loose_secret_drift(facts)
        drift.extend(found)
        # on-demand servers as the recorded configuration had them: whether the scaler runs them is not a change
        was = render_for(host, as_recorded(after, record.config), sizing, keys, hosts, inventory.gateway, stopped,
                         held, state.lineage)  # fmt: skip
        changed = [n for n, s in was.file_sha256.items() if record.files_sha256.get(n) != s]
        if record.unit_sha256 != final.unit_sha256:
            changed.append(GATEWAY_UNIT)
        if changed or found or interim.files != final.files:
            change.action = ["update"]
            if changed or interim.files != final.files:
                change.reasons.append("changes: " + ", ".join(changed) if changed else "the replicas roll")
            change.reasons += key_changes(hf.gateway_maps if hf is not None else None, final.maps, changed)
            change.reasons += [d["detail"] for d in found]
        out.append(change)
    for name, record in sorted(state.gateways.items()):
        if name not in {h.name for h in inventory.gateways()}:
            out.append(GatewayChange(host=name, action=["delete"], endpoint=record.endpoint,
                                     reasons=[f"{name} is no longer a gateway host in the inventory"]))  # fmt: skip
    return out + strays(state, inventory, facts), drift


def strays(state: State, inventory: Inventory, facts: Mapping[str, HostFacts]) -> list[GatewayChange]:
    """A gateway of this state (its haproxy.cfg names this lineage) on a host that is no gateway host and that the
    state does not record: it serves this state's keys as they were when it was written (a key revoked since is
    answered there), and nothing else reaches it. apply removes it (a probe, session 17: such a gateway served on,
    forgotten, beside "No changes")."""
    out = []
    gateways = {h.name for h in inventory.gateways()} | set(state.gateways)
    for host in inventory.hosts:
        hf = facts.get(host.name)
        if host.name in gateways or hf is None or not state.lineage or hf.gateway_lineage != state.lineage:
            continue
        out.append(GatewayChange(host=host.name, action=["delete"], endpoint=endpoint_of(host), reasons=[
            f"{host.name} runs a gateway of this state (lineage {state.lineage}) though it is no gateway host in the "
            "inventory, nor recorded: it answers this state's keys as they were (revoked ones too); apply removes it"
        ]))  # fmt: skip
    return out


def recorded_drift(host: str, record: GatewayRecord, final: RenderedGateway, hf: HostFacts | None, state: State,
                   sent: str | None) -> list[dict[str, str]]:  # fmt: skip
    """Each way a recorded gateway's host differs from its record and from what runs should be: its files and
    unit, its running maps, routes, servers, ACLs, limits and states, and its internal key."""
    found = _drift(host, record.files_sha256, record.unit_sha256, hf, record.installing)
    rewritten = {n for n, sha in final.file_sha256.items() if record.files_sha256.get(n) != sha}
    found += runtime_drift(host, final.maps, hf, rewritten)
    found += address_drift(host, record.config, hf)
    found += tampered_drift(host, record.config, hf)
    found += loaded_drift(host, final.maps, hf)
    found += set_aside_drift(host, state, hf)
    return found + gateway_key_drift(host, hf, sent)


def unknown_scopes(keys: Iterable[ApiKey], deployments: Collection[str]) -> list[str]:
    """An ApiKey whose `deployments` names one that no document defines (a typo leaves its user a key that answers
    404 model_not_found there)."""
    out = []
    for k in keys:
        unknown = sorted(set(k.deployments or ()) - set(deployments))
        if unknown:
            out.append(f"ApiKey {k.name} names {', '.join(repr(d) for d in unknown)} in its deployments, which no "
                       "document defines: requests with it for that name are answered 404 model_not_found")  # fmt: skip
    return out


def _warnings(host: str, hf: HostFacts | None) -> list[str]:
    out = []
    if hf is not None and hf.haproxy_version is None:
        out.append(
            f"HAProxy is not installed on {host}: install it (apt install haproxy); apply fails there until it is"
        )
    if hf is not None and hf.ip_filtering is False:
        out.append(f"{host}'s systemd does not enforce IPAddressAllow= (cgroup v1): replicas there are guarded by the "
                   "gateway's internal key only")  # fmt: skip
    unit = next((u for u in hf.units if u.name == GATEWAY_UNIT), None) if hf is not None else None
    if unit is not None and unit.shared_drop_ins:
        out.append(shared_drop_in_warning("the gateway", host, GATEWAY_UNIT, unit.shared_drop_ins))
    return out


def _drift(host: str, files: Mapping[str, str], unit_sha: str, hf: HostFacts | None,
           installing: Mapping[str, str] | None = None) -> list[dict[str, str]]:  # fmt: skip
    """How a gateway host differs from its record. A file (or the unit) that is what an apply was installing when
    it was cut off (`installing`) is engine-ctl's own, left by that apply: never an edit by hand."""
    if hf is None:
        return []
    on_host = hf.gateway_files or {}
    installing = installing or {}
    out = []
    for name, sha in sorted(files.items()):
        if name not in on_host:
            out.append({"host": host, "kind": "missing", "detail": f"gateway file {name} is missing on {host}"})
        elif on_host[name] != sha and on_host[name] == installing.get(name):
            out.append({"host": host, "kind": "interrupted", "detail": f"gateway file {name} on {host} is what an "
                        "interrupted apply was installing: apply finishes it"})  # fmt: skip
        elif on_host[name] != sha:
            out.append({"host": host, "kind": "edited", "detail": f"gateway file {name} edited by hand on {host} "
                        f"(sha256 {on_host[name][:12]}… ≠ {sha[:12]}…)"})  # fmt: skip
    unit = next((u for u in hf.units if u.name == GATEWAY_UNIT), None)
    if unit is None or unit.sha256 is None:
        out.append({"host": host, "kind": "missing", "detail": f"{GATEWAY_UNIT} is missing on {host}"})
    elif unit.sha256 != unit_sha and unit.sha256 == installing.get(GATEWAY_UNIT):
        out.append({"host": host, "kind": "interrupted", "detail": f"{GATEWAY_UNIT} on {host} is what an "
                    "interrupted apply was installing: apply finishes it"})  # fmt: skip
    elif unit.sha256 != unit_sha:
        out.append({"host": host, "kind": "edited", "detail": f"{GATEWAY_UNIT} edited by hand on {host}"})
    elif unit.active_state != "active":
        out.append({"host": host, "kind": "stopped", "detail": f"{GATEWAY_UNIT} is {unit.active_state} on {host}"})
    elif hf.gateway_maps is None:
        out.append({"host": host, "kind": "unanswered", "detail": f"the gateway on {host} runs but does not answer "
                    f"on its admin socket ({ADMIN_SOCKET}): its keys in memory cannot be checked, and no roll can "
                    "drain a replica through it; apply restarts it"})  # fmt: skip
    elif hf.gateway_missing_sockets:
        names = ", ".join(path.rpartition("/")[2] for path in hf.gateway_missing_sockets)
        out.append({"host": host, "kind": "unanswered", "detail": f"the gateway on {host} runs without its socket "
                    f"{names} (deleted under it): a request it holds gets 503 at once, and one for a deployment "
                    "scaled to zero wakes nothing; apply restarts it"})  # fmt: skip
    if unit is not None and unit.drop_ins:
        out.append({"host": host, "kind": "drop-in", "detail": drop_ins_detail(GATEWAY_UNIT, host, unit.drop_ins)})
    when = written_after_start(unit) if unit is not None and unit.sha256 == unit_sha else None
    if when is not None:
        out.append({"host": host, "kind": "launch", "detail": f"the gateway on {host}: {GATEWAY_UNIT} changed after "
                    f"it started ({when}: edited, restarted, then put back?), so it may run settings its unit does "
                    "not give (a reload keeps them); apply restarts it"})  # fmt: skip
    launched = launch_words(unit) if unit is not None else None
    if launched is not None:
        out.append(
            {
                "host": host,
                "kind": "launch",
                "detail": f"the gateway on {host} {launched}: what it serves "
                "may not be its configuration; apply restarts it (a wrapper stays until it is removed)",
            }
        )
    if unit is not None and unit.sha256 is not None and unit.unit_file_state not in (None, "enabled"):
        out.append({"host": host, "kind": "disabled",
                    "detail": not_enabled_detail(host, GATEWAY_UNIT, unit.unit_file_state)})  # fmt: skip
    return out


def launch_words(unit: UnitFact) -> str | None:
    """How the gateway's running master differs from what its unit starts (a wrapper at HAProxy's path that adds a
    configuration: a frontend with no key check, beside "No changes" before; a probe, session 17): its executable
    and its command line. None: as its unit gives, or not read."""
    if unit.active_state != "active" or unit.proc_argv is None:
        return None
    want = gateway_argv()
    if unit.proc_exe is not None and unit.proc_exe != want[0]:
        return f"runs {unit.proc_exe}, not {want[0]}"
    if tuple(unit.proc_argv) != want:
        got = tuple(unit.proc_argv)
        added = got[len(want) :] if got[: len(want)] == want else [w for w in got[1:] if w not in want]
        return "runs with other arguments than its unit gives" + (f" ({' '.join(added[:6])})" if added else "")
    return None


def runtime_drift(
    host: str, wanted: Mapping[str, Mapping[str, str]], hf: HostFacts | None, rewritten: Collection[str] = ()
) -> list[dict[str, str]]:
    """Where the running gateway's key maps (in memory: what requests are checked against) are not the
    documents': a key, a scope or an expiry set over the stats socket and never on disk. Each is drift that apply
    removes (it replaces the running maps). Keys are named, never their hashes. A map the documents changed since
    the last apply (`rewritten`: its file is to be written again) is that change, listed as one, not drift: the
    running map is what that apply left."""
    running = hf.gateway_maps if hf is not None else None
    out = []
    for name in (n for n in RUNTIME_MAPS if n not in rewritten):
        now = (running or {}).get(name)
        if now is not None:
            details = map_differences(name, now, wanted.get(name) or {}, host)
            out += [{"host": host, "kind": "edited", "detail": d} for d in details]
    return out


ROUTES_MAP = "models.map"
"""The routes (deployment -> backend): only a reload changes them in a running gateway."""


def loaded_drift(host: str, wanted: Mapping[str, Mapping[str, str]], hf: HostFacts | None) -> list[dict[str, str]]:
    """Where the running gateway is not what its files say though the files are: its routes changed in memory
    (`del map`, `add map` on its admin socket), or a file changed after it loaded its configuration (edited,
    loaded, then put back). Drift that apply removes with a reload (`unloaded`)."""
    if hf is None:
        return []
    out = []
    routes = (hf.gateway_maps or {}).get(ROUTES_MAP)
    if routes is not None:
        details = map_differences(ROUTES_MAP, routes, wanted.get(ROUTES_MAP) or {}, host)
        out += [{"host": host, "kind": "unloaded", "detail": f"{d}: apply reloads it"} for d in details]
    for frontend, status in sorted(hf.gateway_frontends.items()):
        if status and status != "OPEN":
            out.append({"host": host, "kind": "unloaded", "detail": f"the gateway on {host} has its frontend "
                        f"{frontend} {status} (an admin command: `disable frontend`): it takes no connection there; "
                        "apply reloads it"})  # fmt: skip
    for limit, value in sorted(hf.gateway_rate_limits.items()):
        if value not in ("", "0"):
            out.append({"host": host, "kind": "unloaded", "detail": f"the gateway on {host} runs with {limit} "
                        f"{value} a second (an admin command: `set rate-limit`; its configuration sets none): "
                        "apply reloads it"})  # fmt: skip
    if hf.gateway_unloaded:
        out.append({"host": host, "kind": "unloaded", "detail": f"the gateway on {host} runs a configuration it "
                    f"loaded before {', '.join(hf.gateway_unloaded)} last changed (a file edited, loaded, then put "
                    "back): what it runs may not be its files; apply reloads it"})  # fmt: skip
    return out


def address_drift(host: str, config: str, hf: HostFacts | None) -> list[dict[str, str]]:
    """Where the running gateway sends a server's requests elsewhere than its configuration says (an address
    HAProxy kept from its state file across a reload): drift that apply removes with a reload."""
    running = hf.gateway_addresses if hf is not None else {}
    return [
        {"host": host, "kind": "misrouted", "detail": f"the gateway on {host} sends {server}'s requests to {live}, "
         f"not to {wanted} as its configuration says: apply reloads it"}
        for server, (live, wanted) in sorted(misrouted(config, running).items())
    ]  # fmt: skip


def _said(text: str) -> str:
    """A name from a running map, as the plan shows it (quoted, bounded: it may be anything)."""
    return repr(text if len(text) <= 40 else text[:40] + "…")


def map_differences(name: str, now: Mapping[str, str], wanted: Mapping[str, str], host: str) -> list[str]:
    """The entries of one running map that the documents do not give (or give otherwise), and those missing."""
    extra = sorted(k for k, v in now.items() if wanted.get(k) != v)
    missing = sorted(k for k in wanted if k not in now)
    where = f"the running gateway on {host} ({name}, in memory)"
    if name == "keys.map":  # hash -> key name: the hash is never shown
        return [f"{where} accepts a key that no ApiKey document gives, named {_said(now[k])}" for k in extra] + [
            f"{where} does not accept ApiKey {_said(wanted[k])}" for k in missing
        ]  # fmt: skip
    if name == "scopes.map":  # "<key>/<deployment>" -> 1
        return [f"{where} lets key {_said(k.split('/')[0])} call {_said(k.partition('/')[2])}, which no "
                "ApiKey document allows" for k in extra] + [
            f"{where} does not let key {_said(k.split('/')[0])} call {_said(k.partition('/')[2])}" for k in missing
        ]  # fmt: skip
    if name == "limits.map":  # key name -> requests a minute
        return [f"{where} limits key {_said(k)} to {_said(now[k])} requests a minute, not what the documents give"
                for k in extra] + [
            f"{where} does not limit key {_said(k)} to its {wanted[k]} requests a minute" for k in missing
        ]  # fmt: skip
    return [f"{where} holds {_said(k)} → {_said(now[k])}, not what the documents give" for k in extra] + [
        f"{where} lacks {_said(k)}" for k in missing
    ]  # fmt: skip


def gateway_after_apply(host: Host, state: State, hosts: Mapping[str, Host], change: GatewayChange) -> RenderedGateway:
    """What a gateway runs once the apply is done, from the state it recorded (the replicas that serve then,
    whatever failed), with the plan's key maps."""
    rendered = render_gateway(
        host,
        backends_from_state(state, hosts),
        [],
        hold_s=change.hold_s,
        hold_cap=change.hold_cap,
        threads=change.threads,
        wake_addresses=wake_addresses_for(host, hosts.values()),
        metrics_port=change.metrics_port,
        metrics_allow=change.metrics_allow,
        internal_allow=internal_sources(hosts.values()),
        lineage=state.lineage,
    )
    files = {**rendered.files, **{n: t for n, t in change.files.items() if n in RUNTIME_MAPS}}
    maps = {**rendered.maps, **{n: m for n, m in change.maps.items() if n in RUNTIME_MAPS}}
    return rendered.model_copy(update={"files": files, "maps": maps})


def planned_gateway(change: GatewayChange, interim: bool) -> RenderedGateway:
    """The plan's rendering of a gateway (its interim form while replicas roll, when there is one)."""
    files = change.interim_files if interim and change.interim_files is not None else change.files
    return RenderedGateway(host=change.host, listen="", endpoint=change.endpoint, files=files,
                           unit_text=change.unit_text, maps=change.maps)  # fmt: skip


def gateway_tampering(plan_gateways_: Iterable[GatewayChange], plan_changes: Iterable[Any], state: State,
                      inventory: Inventory) -> list[str]:  # fmt: skip
    """Where a saved plan's gateway is not what engine-ctl renders from the plan's own recorded inputs (its
    changes, its ApiKey documents) and the state: the configuration, the Lua, the unit, every map file and the
    maps apply sends to the running gateway over its stats socket. A plan file is untrusted input, and these run
    on the gateway hosts and decide who may call what."""
    saved = list(plan_gateways_)
    keys, problems = recorded_keys(saved)
    changes = list(plan_changes)
    expected, _ = plan_gateways(changes, state, inventory, {}, keys)
    idle = on_demand_servers(_planned(changes, state)[0])
    by_host = {g.host: g for g in expected}
    for g in saved:
        if g.action == ["delete"]:
            if g.host in by_host or g.host not in state.gateways:
                problems.append(f"gateway {g.host}: a removal engine-ctl would not plan")
        elif g.host not in by_host:
            problems.append(f"gateway {g.host}: not a gateway host of the inventory")
        else:
            problems += [f"gateway {g.host}: {p}" for p in _forged(g, by_host[g.host], idle)]
    return problems


def recorded_keys(saved: Iterable[GatewayChange]) -> tuple[list[ApiKey], list[str]]:
    """The ApiKey documents a saved plan records (every gateway renders the same ones), and what is wrong with
    them: a name, a hash or a scope the documents' own rules refuse, or gateways that disagree."""
    live = [g for g in saved if g.action != ["delete"]]
    keys = live[0].keys if live else []
    problems = [f"gateway {g.host}: its ApiKey documents differ from gateway {live[0].host}'s" for g in live
                if g.keys != keys]  # fmt: skip
    for k in keys:
        scope = k.deployments or ()
        rate_ok = k.requests_per_minute is None or RATE_RANGE[0] <= k.requests_per_minute <= RATE_RANGE[1]
        if not (deployment_name_ok(k.name) and SHA256_HEX.fullmatch(k.sha256) and all(map(deployment_name_ok, scope))
                and rate_ok):  # fmt: skip
            problems.append(f"ApiKey {_said(k.name)}: not a key document engine-ctl loads (name, sha256, scope, "
                            "requests_per_minute)")  # fmt: skip
    return keys, problems


def _forged(g: GatewayChange, mine: GatewayChange, idle: set[tuple[str, str]]) -> list[str]:
    """One gateway of a saved plan against engine-ctl's own rendering of it (on-demand servers' maintenance,
    which follows the scaler, left out)."""
    problems = []
    if set(g.files) != set(mine.files):
        problems.append("its files are not engine-ctl's")
    for name, text in sorted(g.files.items()):
        if name in mine.files and blind(mine.files[name], idle) != blind(text, idle):
            problems.append(f"{name} differs from what engine-ctl renders from the plan's inputs")
    if g.maps != mine.maps:
        names = sorted(n for n in set(g.maps) | set(mine.maps) if g.maps.get(n) != mine.maps.get(n))
        problems.append(f"the maps it sends to the running gateway ({', '.join(names)}) differ from what "
                        "engine-ctl renders from the plan's ApiKey documents")  # fmt: skip
    if g.unit_text != mine.unit_text:
        problems.append("its unit differs from what engine-ctl renders")
    if (g.hold_s, g.hold_cap, g.threads) != (mine.hold_s, mine.hold_cap, mine.threads):
        problems.append("its hold or thread settings are not the inventory's")
    if (g.metrics_port, g.metrics_allow) != (mine.metrics_port, mine.metrics_allow):
        problems.append("its metrics port or monitoring hosts are not the inventory's")
    if (g.endpoint, g.drain_timeout_s) != (mine.endpoint, mine.drain_timeout_s):
        problems.append("its endpoint or drain timeout is not engine-ctl's")
    interim, own = g.interim_files or g.files, mine.interim_files or mine.files
    if set(interim) != set(own) or any(blind(own[n], idle) != blind(t, idle) for n, t in interim.items()):
        problems.append("its interim configuration differs from what engine-ctl renders")
    if g.action == ["no-op"] and mine.action != ["no-op"]:
        problems.append("it changes the gateway, and the plan does not show it")
    return problems


def on_demand_servers(after: Mapping[str, Mapping[Any, Replica]]) -> set[tuple[str, str]]:
    """(backend, server) of every on-demand replica after the plan."""
    return {
        (backend_name(name), server_name(r.index, r.slot)) for name, reps in after.items() for r in reps.values()
        if r.on_demand
    }  # fmt: skip


def as_recorded(after: Mapping[str, Mapping[Any, Replica]], config: str) -> dict[str, dict[Any, Replica]]:
    """The replicas after the plan with each on-demand one active as the recorded haproxy.cfg had it (its server
    not `disabled`), whatever the facts say now."""
    disabled = {(b, s) for b, s, flag in servers_in(config) if flag}
    return {
        name: {k: r.model_copy(update={"active": (backend_name(name), server_name(r.index, r.slot)) not in disabled})
               if r.on_demand else r for k, r in reps.items()}
        for name, reps in after.items()
    }  # fmt: skip


def servers_in(config: str) -> list[tuple[str, str, bool]]:
    """(backend, server, disabled) of each server line of a haproxy.cfg."""
    return [(backend, server, disabled) for backend, server, _, disabled in server_lines(config)]


def blind(text: str, servers: set[tuple[str, str]]) -> str:
    """A gateway file without the maintenance of the `servers` given (on-demand ones): `disabled` in haproxy.cfg,
    the admin state in start.state; and without the header's content hash, which follows them. Whether the scaler
    runs them when a plan is made changes nothing to compare (the gateway's runtime state is the scaler's)."""
    out, backend = [], ""
    for line in text.splitlines():
        words = line.split()
        if line.startswith("# content-sha256:"):
            continue
        if words[:1] == ["backend"] and len(words) > 1:
            backend = words[1]
        elif words[:1] == ["server"] and len(words) > 1 and (backend, words[1]) in servers:
            line = line.removesuffix(" disabled")
        elif len(words) > 6 and words[0].isdigit() and (words[1], words[3]) in servers:  # start.state
            line = " ".join([*words[:6], "-", *words[7:]])
        out.append(line)
    return "\n".join(out)
