"""`engine-ctl logs DEPLOYMENT`: each replica's engine log from its host's journal, every line prefixed by host
and instance (as `kamal app logs` does); `--follow` streams from every host at once until Ctrl-C.

The state says where each replica runs (host, unit); the inventory says how to reach the host. What to run
(journalctl's argv) and how to show a journal entry are plain functions, apart from running them.
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

import click

from engine_ctl.cli.common import inventory_option, report_failures, resolve_inventory, ssh_options, ssh_settings
from engine_ctl.cli.completion import deployment_names
from engine_ctl.cli.context import backend_for, no_such_deployment, read_state, state_option, unknown_hosts
from engine_ctl.core.accesslog import RequestLine, format_request, parse_request
from engine_ctl.core.diagnostics import Diagnostic, InputError, Location
from engine_ctl.core.documents.inventory import Host
from engine_ctl.core.documents.loader import load_paths
from engine_ctl.core.plan.status import hosts_not_in
from engine_ctl.core.record.model import DeploymentRecord, ReplicaRecord
from engine_ctl.core.render.gateway import GATEWAY_UNIT
from engine_ctl.shell import systemd
from engine_ctl.shell.transport import HostFailure, SSHOptions, Transport, fan_out, transport_for
from engine_ctl.state import StateBackend

DEFAULT_LINES = 100
FIELDS = "MESSAGE,_SYSTEMD_UNIT,UNIT,SYSLOG_IDENTIFIER"
DURATION = re.compile(r"(?:(\d+)([smhd]))+")
DURATION_PART = re.compile(r"(\d+)([smhd])")
SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
KEYWORDS = ("today", "yesterday", "now")
SINCE_HINT = (
    "a duration back from now (30s, 10m, 2h, 1d, 1h30m), a time (2024-05-01T12:00, 2024-05-01 12:00:00+02:00), "
    "today or yesterday"
)
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


@dataclass(frozen=True)
class Replica:
    """One replica to read: where it runs and how its lines are prefixed."""

    host: str
    unit: str
    index: int

    def label(self, width: int) -> str:
        return f"{self.host} instance {self.index}".ljust(width)


def since_argument(value: str) -> str:
    """--since as journalctl takes it: a duration back from the host's own clock, or an absolute time (epoch)."""
    text = value.strip()
    if text in KEYWORDS:
        return text
    if DURATION.fullmatch(text):
        seconds = sum(int(n) * SECONDS[u] for n, u in DURATION_PART.findall(text))
        return f"-{seconds}s"
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise InputError(
            [
                Diagnostic(
                    Location("--since"),
                    "--since",
                    f"{value!r} is not a duration or a time",
                    hint=SINCE_HINT,
                    code="invalid_since",
                )
            ]
        ) from None
    return f"@{int(moment.timestamp())}"


def journal_argv(units: list[str], since: str | None, lines: int | None, follow: bool) -> list[str]:
    """journalctl for these units, one JSON entry a line (so each line is known to be the unit's, and when)."""
    return systemd.journal_argv(units, FIELDS, since, lines, follow)


def _message(value: object) -> str:
    """MESSAGE is a string, or a list of bytes when it is not valid UTF-8; control characters are shown escaped,
    so a log line cannot move the cursor or recolour the reader's terminal."""
    if isinstance(value, list):
        value = bytes(b for b in value if isinstance(b, int) and 0 <= b < 256).decode("utf-8", "replace")
    text = "" if value is None else str(value)
    return CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text.replace("\n", " "))


def parse_entry(raw: str, by_unit: dict[str, Replica]) -> tuple[int, Replica, str] | None:
    """One journal entry (a JSON line) -> (microseconds since the epoch, its replica, its text: systemd's own
    words prefixed `systemd: `); None when the line is not an entry of one of these units."""
    found = parse_fields(raw, by_unit)
    if found is None:
        return None
    micros, replica, text, source = found
    return micros, replica, f"systemd: {text}" if source == "systemd" else text


def parse_fields(raw: str, by_unit: dict[str, Replica]) -> tuple[int, Replica, str, str] | None:
    """One journal entry -> (microseconds since the epoch, its replica, its message, its source: `engine` for
    the engine's own line, `systemd` for systemd's words about the unit); None when not one of these units'."""
    try:
        entry = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(entry, dict):
        return None
    replica = by_unit.get(str(entry.get("_SYSTEMD_UNIT")))
    source = "engine"
    if replica is None:  # systemd's own words about the unit (started, stopped, failed)
        replica, source = by_unit.get(str(entry.get("UNIT"))), "systemd"
    if replica is None:
        return None
    try:
        micros = int(entry.get("__REALTIME_TIMESTAMP", 0))
    except (TypeError, ValueError):
        micros = 0
    return micros, replica, _message(entry.get("MESSAGE")), source


def _when(micros: int) -> str:
    return datetime.fromtimestamp(micros / 1e6, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def format_line(micros: int, replica: Replica, text: str, width: int) -> str:
    return f"{replica.label(width)} | {_when(micros)} {text}"


JSON_FIELDS = ("time", "deployment", "host", "instance", "unit", "source", "message")
"""`logs --json`: one object a line with these fields, in this order."""


def json_line(micros: int, replica: Replica, message: str, source: str, deployment: str) -> str:
    """One entry as `logs --json` prints it (JSON_FIELDS)."""
    values = (_when(micros), deployment, replica.host, replica.index, replica.unit, source, message)
    return json.dumps(dict(zip(JSON_FIELDS, values, strict=True)), ensure_ascii=False)


Formatter = Callable[[tuple[int, Replica, str, str]], str]


def formatter(deployment: str, as_json: bool, width: int) -> Formatter:
    """How each parsed entry is printed: a prefixed line, or a JSON object (`--json`)."""
    if as_json:
        return lambda e: json_line(*e, deployment)
    return lambda e: format_line(e[0], e[1], f"systemd: {e[2]}" if e[3] == "systemd" else e[2], width)


def _replicas(name: str, instance: int | None, records: list[ReplicaRecord]) -> list[Replica]:
    chosen = [Replica(r.host, r.unit, r.index) for r in records if instance is None or r.index == instance]
    if not records:
        raise InputError([Diagnostic(Location("state"), "", f"{name} has no replicas recorded: nothing runs",
                                     hint="engine-ctl apply starts them", code="nothing_runs")])  # fmt: skip
    if not chosen:
        known = ", ".join(str(i) for i in sorted({r.index for r in records}))
        raise InputError([Diagnostic(Location("--instance"), "--instance", f"{name} has no instance {instance}",
                                     hint=f"its instances: {known}", code="unknown_instance")])  # fmt: skip
    return sorted(chosen, key=lambda r: (r.index, r.host, r.unit))


def _hosts(
    record: DeploymentRecord, replicas: list[Replica], inventory_path: Path | None, paths: tuple[Path, ...],
    backend: StateBackend,
) -> list[Host]:  # fmt: skip
    """The hosts the replicas run on; one the inventory lacks is an error at the state's place that names it."""
    loaded = load_paths(list(paths)) if paths else None
    inventory = resolve_inventory(inventory_path, loaded)
    by_name = {h.name: h for h in inventory.hosts}
    shown = {(r.host, r.unit) for r in replicas}
    unknown = [u for u in hosts_not_in([record], set(by_name)) if (u[2], record.replicas[u[1]].unit) in shown]
    if unknown:
        raise InputError(unknown_hosts(unknown, [record], inventory.file or "the inventory", backend))
    return [by_name[h] for h in sorted({r.host for r in replicas})]


class Printer:
    """Lines to stdout from many threads, one whole line at a time; a closed pipe (`| head`) stops everything."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop, self.lock, self.closed = stop, threading.Lock(), False

    def line(self, text: str) -> None:
        with self.lock:
            if self.closed:
                return
            try:
                sys.stdout.write(text + "\n")
                sys.stdout.flush()
            except BrokenPipeError:
                self.closed = True
                self.stop.set()
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())

    def note(self, host: str, text: str) -> None:
        """What a host's journalctl said that is not a log line (`No journal files were found.`), on stderr."""
        with self.lock:
            sys.stderr.write(f"{host}: journalctl: {_message(text)}\n")
            sys.stderr.flush()


def _show(by_host: dict[str, list[Replica]], hosts: list[Host], since: str | None, lines: int | None,
          options: SSHOptions, parallel: int, show: Formatter) -> dict[str, HostFailure]:  # fmt: skip
    """Each replica's log (its own journalctl, one connection per host), all lines merged in time order."""
    printer = Printer(threading.Event())

    def read(transport: Transport) -> list[tuple[int, str]]:
        out: list[tuple[int, str]] = []
        for replica in by_host[transport.host.name]:
            result = transport.run(journal_argv([replica.unit], since, lines, follow=False))
            if result.exit_code != 0:
                said = (result.stderr or result.stdout).strip().splitlines()
                why = said[-1] if said else f"exit status {result.exit_code}"
                raise HostFailure(transport.host.name, "command", f"journalctl for {replica.unit}: {_message(why)}")
            before = len(out)
            for raw in result.stdout.splitlines():
                parsed = parse_fields(raw, {replica.unit: replica})
                if parsed is not None:
                    out.append((parsed[0], show(parsed)))
            if len(out) == before and result.stderr.strip():  # e.g. "No journal files were found."
                printer.note(transport.host.name, result.stderr.strip())
        return out

    found, failures = fan_out(hosts, read, options=options, parallel=parallel)
    for _, text in sorted((e for entries in found.values() for e in entries), key=lambda e: e[0]):
        printer.line(text)
    return failures


def _follow(by_host: dict[str, list[Replica]], hosts: list[Host], since: str | None, lines: int | None,
            options: SSHOptions, show: Formatter) -> dict[str, HostFailure]:  # fmt: skip
    """One thread per host, one journalctl --follow for the host's replicas, lines printed as they come."""
    stop = threading.Event()
    printer = Printer(stop)
    failures: dict[str, HostFailure] = {}

    def one(host: Host) -> None:
        units = {r.unit: r for r in by_host[host.name]}
        transport = transport_for(host, options)

        def on_line(raw: str) -> None:
            parsed = parse_fields(raw, units)
            if parsed is not None:
                printer.line(show(parsed))
            elif raw.strip() and not raw.startswith("{"):
                printer.note(host.name, raw)

        try:
            code = transport.stream(journal_argv(list(units), since, lines, follow=True), on_line, stop)
            if code is not None:
                failures[host.name] = HostFailure(host.name, "command", f"journalctl ended (exit status {code})")
        except HostFailure as exc:
            failures[host.name] = exc
        finally:
            transport.close()

    _follow_each(hosts, one, stop)
    return failures


REQUEST_LINE = '^\\{"ts":'
"""A request line of the gateway's journal (engine_ctl.core.render.gateway.ACCESS_LOG_FIELDS: `ts` first), as a
grep pattern of the journal: HAProxy's own messages (a server down, a reload) are not requests."""


def gateway_journal_argv(deployment: str | None, since: str | None, lines: int | None, follow: bool) -> list[str]:
    """journalctl for the gateway's unit: its MESSAGE only, its request lines only; for one deployment, only those
    that name it (a request line holds `"deployment":"<name>"`: a deployment's name needs no escaping in JSON).
    `lines` counts requests (systemd.journal_argv)."""
    grep = REQUEST_LINE + (f'.*"deployment":"{deployment}"' if deployment is not None else "")
    return systemd.journal_argv([GATEWAY_UNIT], "MESSAGE", since, lines, follow, grep=grep)


def request_of(raw: str, gateway: str, by_address: dict[str, str], deployment: str | None) -> RequestLine | None:
    """One journal entry of a gateway (journalctl --output=json) -> the request it logs, or None."""
    try:
        entry = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(entry, dict):
        return None
    found = parse_request(_message(entry.get("MESSAGE")), by_address)
    if found is None or (deployment is not None and found.deployment != deployment):
        return None
    return found if found.gateway else replace(found, gateway=gateway)


def journal_requests(
    transport: Transport, by_address: dict[str, str], deployment: str | None, since: str | None, lines: int | None
) -> list[RequestLine]:  # fmt: skip
    """One gateway host's request lines, from its journal (one journalctl); a HostFailure when it cannot be read."""
    result = transport.run(gateway_journal_argv(deployment, since, lines, follow=False))
    if result.exit_code not in (0, 1) or (result.exit_code == 1 and result.stdout.strip()):
        said = (result.stderr or result.stdout).strip().splitlines()
        why = said[-1] if said else f"exit status {result.exit_code}"
        raise HostFailure(transport.host.name, "command", f"journalctl for the gateway: {_message(why)}")
    found = (request_of(raw, transport.host.name, by_address, deployment) for raw in result.stdout.splitlines())
    return [r for r in found if r is not None]


def read_gateway_requests(
    hosts: list[Host], by_address: dict[str, str], deployment: str | None, since: str | None, lines: int | None,
    options: SSHOptions, parallel: int,
) -> tuple[list[RequestLine], dict[str, HostFailure]]:  # fmt: skip
    """Every gateway host's request lines (one journalctl each, at once), merged in time order."""

    def read(transport: Transport) -> list[RequestLine]:
        return journal_requests(transport, by_address, deployment, since, lines)

    found, failures = fan_out(hosts, read, options=options, parallel=parallel)
    return merged(found), failures


def merged(by_host: dict[str, list[RequestLine]]) -> list[RequestLine]:
    """The hosts' request lines in one list, in time order."""
    return sorted((r for rs in by_host.values() for r in rs), key=lambda r: r.ts)


def _gateway_hosts(inventory_path: Path | None, paths: tuple[Path, ...]) -> tuple[list[Host], dict[str, str]]:
    """The inventory's gateway hosts (an error when it has none), and every host's name by its address."""
    loaded = load_paths(list(paths)) if paths else None
    inventory = resolve_inventory(inventory_path, loaded)
    gateways = inventory.gateways()
    if not gateways:
        raise InputError([Diagnostic(Location(inventory.file or "the inventory"), "hosts", "no host has the "
                                     "gateway role: no gateway logs requests", hint="give a host roles: [gateway]",
                                     code="no_gateway")])  # fmt: skip
    return gateways, {h.address: h.name for h in inventory.hosts}


def _gateway_logs(
    deployment: str | None, paths: tuple[Path, ...], since: str | None, lines: int | None, follow: bool,
    as_json: bool, inventory_path: Path | None, parallel: int, options: SSHOptions,
) -> dict[str, HostFailure]:  # fmt: skip
    hosts, by_address = _gateway_hosts(inventory_path, paths)
    width = max(len(h.name) for h in hosts)

    def show(r: RequestLine) -> str:
        return json.dumps(r.as_json(), separators=(",", ":")) if as_json else format_request(r, width)

    if not follow:
        found, failed = read_gateway_requests(hosts, by_address, deployment, since, None if since else lines,
                                              options, parallel)  # fmt: skip
        printer = Printer(threading.Event())
        for r in found[-lines:] if lines is not None and not since else found:
            printer.line(show(r))
        return failed
    stop = threading.Event()
    printer = Printer(stop)
    failures: dict[str, HostFailure] = {}

    def one(host: Host) -> None:
        transport = transport_for(host, options)

        def on_line(raw: str) -> None:
            found = request_of(raw, host.name, by_address, deployment)
            if found is not None:
                printer.line(show(found))

        try:
            code = transport.stream(gateway_journal_argv(deployment, since, lines, follow=True), on_line, stop)
            if code is not None:
                failures[host.name] = HostFailure(host.name, "command", f"journalctl ended (exit status {code})")
        except HostFailure as exc:
            failures[host.name] = exc
        finally:
            transport.close()

    _follow_each(hosts, one, stop)
    return failures


def _follow_each(hosts: list[Host], one: Callable[[Host], None], stop: threading.Event) -> None:
    """One thread a host, each following its journal, until all end or Ctrl-C (exit 130, the threads told to
    stop)."""
    threads = [threading.Thread(target=one, args=(h,), name=f"logs-{h.name}", daemon=True) for h in hosts]
    for t in threads:
        t.start()
    try:
        while any(t.is_alive() for t in threads) and not stop.is_set():
            for t in threads:
                t.join(timeout=0.2)
    except KeyboardInterrupt:
        stop.set()
        for t in threads:
            t.join(timeout=5)
        sys.exit(130)


@click.command()
@click.argument("deployment", required=False, shell_complete=deployment_names)
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@click.option(
    "--gateway",
    is_flag=True,
    help="The gateways' request log instead: one line per request from every gateway host, in time order "
    "(only DEPLOYMENT's, when given).",
)
@click.option("--instance", type=click.IntRange(min=0), help="Only this instance (as status numbers them).")
@click.option("--since", help="Only lines since T: 30s, 10m, 2h, 1d, or a time such as 2024-05-01T12:00.")
@click.option(
    "--lines",
    "-n",
    type=click.IntRange(min=0),
    help=f"The last N lines of each replica (default "
    f"{DEFAULT_LINES}, or all since --since); with --follow, of each host, then new lines as they come.",
)
@click.option("--follow", "-f", is_flag=True, help="Stream new lines from every replica at once, until Ctrl-C.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object a line: " + ", ".join(JSON_FIELDS) + "; "
              "with --gateway, each request.")  # fmt: skip
@inventory_option
@state_option
@ssh_options
def logs(
    deployment: str | None, paths: tuple[Path, ...], gateway: bool, as_json: bool, instance: int | None,
    since: str | None, lines: int | None, follow: bool, inventory_path: Path | None, state_path: str | None,
    parallel: int, accept_new_host_keys: bool,
) -> None:  # fmt: skip
    """Each replica's engine log, lines prefixed by host and instance; with --gateway, the gateways' request log.

    The log is the unit's journal on its host, read over SSH. The state says where each replica runs; PATHS
    (or --state) find the state as for status. Lines of all replicas are merged in time order; --follow
    streams from all of them at once and stops on Ctrl-C.

    With --gateway: every request each gateway host answered (time, request ID, key name, deployment, replica,
    status, bytes, queue, connect, first-byte and total times), read from the inventory's gateway hosts. No
    key, prompt or body is ever in it."""
    since_arg = since_argument(since) if since is not None else None
    count = lines if lines is not None else (None if since_arg else DEFAULT_LINES)
    if gateway:
        if instance is not None:
            raise InputError([Diagnostic(Location("--instance"), "--instance", "--instance goes with an engine's log, "
                                         "not --gateway", code="conflicting_options")])  # fmt: skip
        if deployment is not None and (Path(deployment).exists() or deployment.endswith((".yaml", ".yml"))):
            paths, deployment = (Path(deployment), *paths), None
        failures = _gateway_logs(deployment, paths, since_arg, count, follow, as_json, inventory_path, parallel,
                                 ssh_settings(accept_new_host_keys))  # fmt: skip
        report_failures(failures)
        sys.exit(1 if failures else 0)
    if deployment is None:
        raise InputError([Diagnostic(Location("DEPLOYMENT"), "DEPLOYMENT", "name the deployment whose engine log "
                                     "to show", hint="or --gateway for the gateways' request log",
                                     code="missing_argument")])  # fmt: skip
    backend = backend_for(state_path, paths)
    state = read_state(backend)
    record = state.deployments.get(deployment)
    if record is None:
        raise no_such_deployment(deployment, state, backend)
    replicas = _replicas(deployment, instance, record.replicas)
    hosts = _hosts(record, replicas, inventory_path, paths, backend)
    by_host: dict[str, list[Replica]] = {}
    for r in replicas:
        by_host.setdefault(r.host, []).append(r)
    options = ssh_settings(accept_new_host_keys)
    show = formatter(deployment, as_json, max(len(r.label(0)) for r in replicas))
    if follow:
        failures = _follow(by_host, hosts, since_arg, count, options, show)
    else:
        failures = _show(by_host, hosts, since_arg, count, options, parallel, show)
    report_failures(failures)
    sys.exit(1 if failures else 0)


__all__ = [
    "gateway_journal_argv", "journal_argv", "journal_requests", "json_line", "logs", "merged", "parse_entry",
    "parse_fields", "read_gateway_requests", "request_of", "since_argument",
]  # fmt: skip
