"""`engine-ctl status`, `list`, `state list|show` and `force-unlock`."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from pathlib import Path

import click

from engine_ctl.cli.common import inventory_option, report_failures, resolve_inventory, ssh_options, ssh_settings
from engine_ctl.cli.completion import deployment_names
from engine_ctl.cli.context import (
    backend_for,
    no_state_hint,
    no_such_deployment,
    read_state,
    state_exists,
    state_option,
    unknown_hosts,
)
from engine_ctl.cli.views.output import console, emit_json
from engine_ctl.cli.views.status import (
    list_json,
    list_table,
    show_statuses,
    status_json,
)
from engine_ctl.core.diagnostics import Diagnostic, InputError, Location
from engine_ctl.core.documents.loader import LoadResult, load_paths
from engine_ctl.core.fit.hostfacts import HostFacts
from engine_ctl.core.plan.decisions import readiness_checks
from engine_ctl.core.plan.grouplinks import member_links
from engine_ctl.core.plan.internalkey import key_checks
from engine_ctl.core.plan.scaler import ScalerView, scaler_views_of, with_scaler
from engine_ctl.core.plan.status import (
    DeploymentStatus,
    against_documents,
    deployment_status,
    held_view,
    hosts_not_in,
    scaler_entries,
)
from engine_ctl.core.plan.wake import WOKEN_OPERATION, woken_at, woken_status
from engine_ctl.core.record.model import DeploymentRecord, State, StateError
from engine_ctl.core.render.gateway import endpoint_of
from engine_ctl.providers import PROVIDERS
from engine_ctl.shell.gather import gather
from engine_ctl.shell.transport import HostFailure, SSHOptions
from engine_ctl.state import StateBackend

DOCUMENT_SUFFIXES = (".yaml", ".yml", ".json")


def is_path(arg: str) -> bool:
    """status's NAME is a path when it looks like one (a / or a document suffix, `.`, `..`) or exists here.

    Deployment names are lowercase letters, digits and -, so a path-looking argument is never one."""
    looks = "/" in arg or arg in (".", "..") or arg.endswith(DOCUMENT_SUFFIXES)
    return looks or Path(arg).exists()


def name_and_paths(name: str | None, paths: tuple[Path, ...]) -> tuple[str | None, tuple[Path, ...]]:
    if name is not None and is_path(name):
        return None, (Path(name), *paths)
    return name, paths


def _live(
    records: list[DeploymentRecord], inventory_path: Path | None, paths: tuple[Path, ...], options: SSHOptions,
    parallel: int, addresses: dict[str, str] | None = None, gateways: list[tuple[str, str]] | None = None,
    backend: StateBackend | None = None, loaded: LoadResult | None = None,
) -> tuple[dict[str, HostFacts], dict[str, HostFailure]]:  # fmt: skip
    """Facts and health of the hosts the shown deployments run on, and of the gateway hosts (whose (host,
    endpoint) pairs are added to `gateways`); none (and no inventory) when they run nowhere. `addresses`, when
    given, is filled with each such host's address from the inventory. A replica recorded on a host the inventory
    does not have is an error at the state's place that names it (never shown as merely unreachable)."""
    used = {host for d in records for r in d.replicas for host in r.hosts}  # a replica group's workers' too
    if not used:
        return {}, {}
    loaded = loaded if loaded is not None or not paths else load_paths(list(paths))
    inventory = resolve_inventory(inventory_path, loaded)
    unknown = hosts_not_in(records, {h.name for h in inventory.hosts})
    if unknown:
        raise InputError(unknown_hosts(unknown, records, inventory.file or "the inventory", backend))
    if gateways is not None:
        gateways += [(h.name, endpoint_of(h)) for h in inventory.gateways()]
    used |= {h.name for h in inventory.gateways()}
    hosts = [h for h in inventory.hosts if h.name in used]
    if addresses is not None:
        addresses.update({h.name: h.address for h in hosts})
    checks: dict[str, list[tuple[int, str]]] = {}
    for d in records:
        engine = PROVIDERS.get(d.plan.engine) if d.plan else None
        path = engine.health_path if engine else "/health"
        for r in d.replicas:
            checks.setdefault(r.host, []).append((r.port, path))
    decisions: dict[str, list[dict[str, object]]] = {}
    for d in records:  # a decisions deployment's replicas are asked the readiness decision too
        for host, asked in readiness_checks(d).items():
            decisions.setdefault(host, []).extend(asked)
    keys = key_checks(records)  # a replica behind a gateway is asked with the internal key too: it may refuse it
    links = member_links(records, {h.name: h.address for h in inventory.hosts})  # a group's head to its workers
    return gather(hosts, options, parallel, health=checks, decisions=decisions, key_checks=keys, links=links)


def _statuses(
    state: State,
    names: list[str],
    facts: dict[str, HostFacts],
    gateways: list[tuple[str, str]] | None = None,
    loaded: LoadResult | None = None,
) -> list[DeploymentStatus]:
    """Each deployment's status from live facts; with the documents, also whether they ask for a change that is
    not served yet (status.against_documents)."""
    own = [facts[h].model_copy(update={"scaler_state": scaler_entries(facts[h].scaler_state, state.deployments)})
           for h, _ in gateways or [] if h in facts]  # fmt: skip
    views = scaler_views_of(own)
    desired = loaded.desired if loaded is not None else None
    return [against_documents(_one_status(state.deployments[n], facts, gateways or [], views.get(n)),
                              state.deployments[n], desired) for n in names]  # fmt: skip


def _one_status(
    rec: DeploymentRecord, facts: dict[str, HostFacts], gateways: list[tuple[str, str]], view: ScalerView | None
) -> DeploymentStatus:
    """One deployment's status; a parked one a request woke (core.plan.wake) as it serves, not as parked."""
    at = woken_at(rec, view.woken if view is not None else None)
    if at is None:
        return with_scaler(deployment_status(rec, facts, gateways, datetime.now(UTC).isoformat()), view)
    awake = deployment_status(rec.model_copy(update={"operator": None}), facts, gateways)
    return woken_status(with_scaler(awake, view), at)


@click.command(name="list")
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@inventory_option
@state_option
@ssh_options
@click.option(
    "--json", "as_json", is_flag=True,
    help="Every deployment as versioned JSON, one summary row each: state, ready and replica counts, revision, "
    "hosts (status --json has the members).",
)  # fmt: skip
def list_cmd(
    paths: tuple[Path, ...], inventory_path: Path | None, state_path: str | None, parallel: int,
    accept_new_host_keys: bool, as_json: bool,
) -> None:  # fmt: skip
    """Every deployment: NAME STATE READY REVISION HOSTS, from the state and live health."""
    backend = backend_for(state_path, paths)
    state = read_state(backend)
    names = sorted(state.deployments)
    records = [state.deployments[n] for n in names]
    gateways: list[tuple[str, str]] = []
    loaded = load_paths(list(paths)) if paths else None
    facts, failures = _live(
        records,
        inventory_path,
        paths,
        ssh_settings(accept_new_host_keys),
        parallel,
        gateways=gateways,
        backend=backend,
        loaded=loaded,
    )
    statuses = _statuses(state, names, facts, gateways, loaded)
    statuses = _asleep(statuses, records, inventory_path, paths, ssh_settings(accept_new_host_keys))
    if as_json:
        emit_json(list_json(statuses))
    else:
        console().print(list_table(statuses) if statuses else _no_deployments(backend))
        _sleep_warning(records)
        report_failures(failures)
    sys.exit(1 if failures else 0)


@click.command()
@click.argument("name", required=False, shell_complete=deployment_names)
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@inventory_option
@state_option
@ssh_options
@click.option(
    "--json", "as_json", is_flag=True,
    help="The deployment(s) as versioned JSON, each with its members: host, address, port, URL, unit, GPUs, "
    "last error, and the scaler's decisions.",
)  # fmt: skip
@click.option(
    "--decisions", is_flag=True,
    help="Also the scaler's last decisions (up, down, zero, wake, preempt, hold), each with the figure it acted on.",
)  # fmt: skip
@click.option(
    "--watch", "-w", is_flag=True,
    help="A live board, redrawn every 2 s: each deployment's state, ready replicas, requests in flight and queued "
    "at the gateways, requests, time to first byte, the scaler's last decision. Ctrl-C ends it.",
)  # fmt: skip
def status(
    name: str | None, paths: tuple[Path, ...], inventory_path: Path | None, state_path: str | None, parallel: int,
    accept_new_host_keys: bool, as_json: bool, decisions: bool = False, watch: bool = False,
) -> None:  # fmt: skip
    """A deployment's state and each instance: NAME STATE READY REVISION STARTUP INITIALIZE LAST
    OPERATION, then INSTANCE HOST STATE LIFECYCLE DEVICES LAST ERROR (all deployments without NAME).

    `status deployment NAME` and `status NAME` are the same. NAME is read as a path, not a deployment, when it
    looks like one (it has a / or ends in .yaml, .yml or .json, or is . or ..) or is an existing file or
    directory: `engine-ctl status .` shows every deployment of the current directory's project. The state is
    engine-ctl.state.json in the project's root: the documents' directory (or the current one), or the nearest
    directory above it that holds an inventory or a state, as apply finds it.
    """
    if name == "deployment" and paths and not is_path(str(paths[0])):
        name, paths = str(paths[0]), paths[1:]
    if watch:
        if as_json:
            raise InputError([Diagnostic(Location("--watch"), "--watch", "--watch draws a board for a person; "
                                         "--json is for programs", hint="leave out one of them",
                                         code="conflicting_options")])  # fmt: skip
        _watch(name, paths, inventory_path, state_path, parallel, accept_new_host_keys)
    _status(name, paths, inventory_path, state_path, parallel, accept_new_host_keys, as_json, decisions)


def _status(
    name: str | None, paths: tuple[Path, ...], inventory_path: Path | None, state_path: str | None, parallel: int,
    accept_new_host_keys: bool, as_json: bool, decisions: bool = False,
) -> None:  # fmt: skip
    name, paths = name_and_paths(name, paths)
    backend = backend_for(state_path, paths)
    state = read_state(backend)
    names = [name] if name else sorted(state.deployments)
    if name and name not in state.deployments:
        raise no_such_deployment(name, state, backend)
    records = [state.deployments[n] for n in names]
    addresses: dict[str, str] = {}
    gateways: list[tuple[str, str]] = []
    loaded = load_paths(list(paths)) if paths else None
    facts, failures = _live(
        records,
        inventory_path,
        paths,
        ssh_settings(accept_new_host_keys),
        parallel,
        addresses,
        gateways,
        backend,
        loaded,
    )
    statuses = _statuses(state, names, facts, gateways, loaded)
    statuses = _asleep(statuses, records, inventory_path, paths, ssh_settings(accept_new_host_keys))
    if as_json:
        emit_json(status_json(statuses, addresses))
        sys.exit(1 if failures else 0)
    out = console()
    if not statuses:
        out.print(_no_deployments(backend))
    _sleep_warning(records)
    show_statuses(out, statuses, decisions)
    report_failures(failures)
    sys.exit(1 if failures else 0)


def _watch(
    name: str | None, paths: tuple[Path, ...], inventory_path: Path | None, state_path: str | None, parallel: int,
    accept_new_host_keys: bool,
) -> None:  # fmt: skip
    """status --watch (cli.watch_cmd): each round reads the state, gathers the hosts as status does, and asks each
    gateway host's stats socket for its figures over a connection kept open for the next rounds."""
    from engine_ctl.cli.logs_cmd import gateway_journal_argv, request_of
    from engine_ctl.cli.watch_cmd import RECENT_LINES, RECENT_SINCE, BackendFigures, backend_figures, watch
    from engine_ctl.shell.gateway.runtime import GatewayFailure, runtime
    from engine_ctl.shell.transport import LocalTransport, SSHTransport, transport_for

    name, paths = name_and_paths(name, paths)
    backend = backend_for(state_path, paths)
    options = ssh_settings(accept_new_host_keys)
    first = read_state(backend)
    if name and name not in first.deployments:
        raise no_such_deployment(name, first, backend)
    inventory = resolve_inventory(inventory_path, load_paths(list(paths)) if paths else None)
    open_to: dict[str, SSHTransport | LocalTransport] = {}

    def figures(failures: dict[str, HostFailure]) -> dict[str, BackendFigures]:
        texts, recent = [], []
        for host in inventory.gateways():
            try:
                t = open_to.get(host.name) or open_to.setdefault(host.name, transport_for(host, options))
                texts.append(runtime(t, ["show stat"])[0])
                logged = t.run(gateway_journal_argv(None, RECENT_SINCE, RECENT_LINES, follow=False))
                recent += [r for raw in logged.stdout.splitlines() if (r := request_of(raw, host.name, {}, None))]
            except (HostFailure, GatewayFailure) as exc:
                open_to.pop(host.name, None)
                failures.setdefault(host.name, exc if isinstance(exc, HostFailure) else
                                    HostFailure(host.name, "command", str(exc)))  # fmt: skip
        return backend_figures(texts, recent)

    def fetch() -> tuple[list[DeploymentStatus], dict[str, BackendFigures], dict[str, HostFailure]]:
        state = read_state(backend)
        names = [name] if name else sorted(state.deployments)
        records = [state.deployments[n] for n in names if n in state.deployments]
        gateways: list[tuple[str, str]] = []
        facts, failures = _live(records, inventory_path, paths, options, parallel, None, gateways, backend)
        statuses = _statuses(state, [r.name for r in records], facts, gateways)
        statuses = _asleep(statuses, records, inventory_path, paths, options)
        failed = dict(failures)
        return statuses, figures(failed) if inventory.gateways() else {}, failed

    watch(fetch)


def _asleep(
    statuses: list[DeploymentStatus], records: list[DeploymentRecord], inventory_path: Path | None,
    paths: tuple[Path, ...], options: SSHOptions,
) -> list[DeploymentStatus]:  # fmt: skip
    """A deployment parked asleep is `parking` while its park job (drain, then the engine's sleep) still runs on
    its hosts, then `parked`: asked of the hosts, only for such deployments (their units' facts cannot tell)."""
    woken = {s.name for s in statuses if s.last_operation == WOKEN_OPERATION}  # a request woke it: it serves
    asleep = {r.name: r for r in records if r.operator is not None and r.operator.verb == "parked" and r.operator.level
              and r.name not in woken}  # fmt: skip
    if not asleep:
        return statuses
    from engine_ctl.shell.lifecycle.hosts import OperatorFailure
    from engine_ctl.shell.lifecycle.verbs import Verbs

    loaded = load_paths(list(paths)) if paths else None
    verbs = Verbs(backend=None, inventory=resolve_inventory(inventory_path, loaded), options=options)  # type: ignore[arg-type]
    try:
        phases = {name: verbs.phase(rec) for name, rec in asleep.items()}
    except (HostFailure, OperatorFailure, OSError):
        return statuses
    finally:
        verbs.close()
    return [held_view(s, phases[s.name], None, asleep[s.name]) if phases.get(s.name) else s for s in statuses]  # type: ignore[arg-type]


def _sleep_warning(records: list[DeploymentRecord]) -> None:
    """While parking is on for a deployment shown: the warning that its engine runs with its sleep controls."""
    from engine_ctl.core.plan.operator import sleep_controls_warning

    warning = sleep_controls_warning(records)
    if warning:
        console(stderr=True).print(warning, markup=False, highlight=False)


def _no_deployments(backend: StateBackend) -> str:
    if not state_exists(backend):
        hint = no_state_hint(backend)
        hint = hint[0].upper() + hint[1:]
        return f"No state at {backend.location}: nothing was applied from this project. {hint}."
    return f"No deployments in the state ({backend.location}); `engine-ctl apply` records them."


@click.command(name="force-unlock")
@click.argument("lock_id")
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@state_option
def force_unlock(lock_id: str, paths: tuple[Path, ...], state_path: str | None) -> None:
    """Remove the state lock LOCK_ID left by a command that died. Only when no command is running."""
    backend = backend_for(state_path, paths)
    try:
        held = backend.force_unlock(lock_id)
    except StateError as exc:
        raise InputError([Diagnostic(Location(backend.location), "", str(exc), code="state_error")]) from None
    console().print(f"Unlocked {backend.location} (the lock of {held.who} since {held.when} for `{held.operation}`)")
