"""`engine-ctl plan`, `apply` and `destroy`: the reconciler's shell."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import click

from engine_ctl.cli.common import (
    inventory_option,
    load_checked,
    load_for_plan,
    report_failures,
    resolve_inventory,
    ssh_options,
    ssh_settings,
)
from engine_ctl.cli.context import (
    backend_for,
    lock_operation,
    locked,
    read_state,
    reopen_string,
    replace_option,
    state_option,
    target_option,
    writing_options,
)
from engine_ctl.cli.environments import current_env, inventory_names, state_for_env
from engine_ctl.cli.requests import (
    announce,
    recorded,
    report_continuing,
    report_finished,
    request_identity,
    request_option,
)
from engine_ctl.cli.views.output import console, emit_json
from engine_ctl.cli.views.plan import RICH_STYLES, plan_json, plan_markdown, render_plan
from engine_ctl.core.diagnostics import Diagnostic, InputError, Location
from engine_ctl.core.documents.inventory import Inventory, load_inventory
from engine_ctl.core.jsonbounds import MAX_PLAN_BYTES
from engine_ctl.core.model import DesiredState
from engine_ctl.core.plan.changes import DELETE, Plan
from engine_ctl.core.plan.gateway import GatewayChange, gateway_tampering
from engine_ctl.core.plan.planner import destroy_refusals
from engine_ctl.core.plan.refresh import refresh_state
from engine_ctl.core.plan.revisions import mismatches as revision_mismatches
from engine_ctl.core.plan.revisions import parse_checks as parse_revision_checks
from engine_ctl.core.plan.savedplan import PlanFileError, decode_plan, stale_reasons, state_for_plan, tampering
from engine_ctl.core.plan.scaler import lock_tampering
from engine_ctl.core.record.model import HostRecord, Operation, State
from engine_ctl.core.record.requests import begin as begin_request
from engine_ctl.core.record.requests import finish as finish_request
from engine_ctl.core.weights import Checkout
from engine_ctl.shell.apply import ApplyEvent, Executor, Recorder, utc_now
from engine_ctl.shell.fetch import HubAccess
from engine_ctl.shell.gateway.teardown import teardown
from engine_ctl.shell.gather import gather
from engine_ctl.shell.pinning import Pinner, unresolved
from engine_ctl.shell.transport import Ahead, HostFailure, Kept, SSHOptions, connect_ahead
from engine_ctl.shell.world import plan_world
from engine_ctl.state import StateBackend, open_backend
from engine_ctl.state.local import now, who


def write_private(path: Path, text: str) -> None:
    """A file only its owner reads (0600): a saved plan names hosts, addresses, ports and key names."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # an existing file keeps its mode through O_TRUNC
    with os.fdopen(fd, "w") as f:
        f.write(text)


def connect_early(explicit: Path | None, options: SSHOptions, parallel: int) -> tuple[Ahead | None, Inventory | None]:
    """With --inventory (or its variable), begin the hosts' SSH handshakes now (transport.connect_ahead), so that
    they overlap the documents' loading and the state's reading instead of following them. Nothing runs on a host
    before the plan's gathering, and the checks that come first (unknown --target, bad documents) still stop the
    command before any host is asked anything. An inventory that does not load is reported in its usual place.
    The inventory loaded is returned too, for resolve_inventory (read once)."""
    if explicit is None:
        return None, None
    try:
        inventory = load_inventory(explicit)
    except InputError:
        return None, None
    return connect_ahead(inventory.hosts, options, parallel), inventory


@dataclass(frozen=True)
class Deploying:
    """`engine-ctl deploy`'s run of a plan (core.plan.deploy): its operation's ID (a ULID, recorded in the
    operations log), the deployments it saves without starting, and those whose checkpoint it fingerprints."""

    operation: str
    save_only: frozenset[str] = frozenset()
    fingerprint: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Request:
    """The request identity of a command that changes something, and the revisions its apply checks."""

    id: str
    revisions: dict[str, int] = field(default_factory=dict)

    def check(self, state: State, command: str, location: str, stderr: bool = False) -> int | None:
        """Under the lock: a finished request's exit status (reported; nothing is done again), or None to go on
        (a cut-off one said to continue); refused when a --revision check fails."""
        found = recorded(state, self.id, command, location)
        if found is not None and found.finished is not None:
            return report_finished(found, stderr)
        if found is not None:
            report_continuing(found, stderr)
        refused = revision_mismatches(self.revisions, {n: d.revision for n, d in state.deployments.items()}, location)
        if refused and found is None:  # a cut-off request continues: it was checked when it began
            raise InputError(refused)
        return None


def show_plan(plan: Plan, command: str = "apply", stderr: bool = False, verbose: bool = False) -> None:
    """The plan: coloured on a terminal (argv and unit diff lines by their sign), plain otherwise; on stderr
    under --json (stdout carries the events). `verbose`: a new gateway's whole configuration, not its summary."""
    out = console(stderr=stderr)
    for style, line in render_plan(plan, command, verbose):
        out.print(line, style=RICH_STYLES[style] or None)


@click.command()
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@inventory_option
@state_option
@ssh_options
@target_option
@click.option("--out", "out_path", type=click.Path(path_type=Path), help="Save the plan for `apply PLANFILE`.")
@click.option("--json", "as_json", is_flag=True, help="The plan as versioned JSON (actions as arrays).")
@click.option("--markdown", is_flag=True, help="The plan as Markdown, for a pull-request comment.")
@click.option("--detailed-exitcode", is_flag=True, help="Exit 0 no changes, 1 error, 2 changes present.")
@click.option("--refresh-only", is_flag=True, help="Only record in the state what drifted on the hosts.")
@click.option("--verbose", "-v", is_flag=True, help="A new gateway's whole HAProxy configuration, not its summary.")
@replace_option
def plan(
    paths: tuple[Path, ...], inventory_path: Path | None, state_path: str | None, parallel: int,
    accept_new_host_keys: bool, targets: tuple[str, ...], out_path: Path | None, as_json: bool, markdown: bool,
    detailed_exitcode: bool, refresh_only: bool, verbose: bool, replace: tuple[str, ...],
) -> None:  # fmt: skip
    """Show what apply would change: documents + recorded state + live host facts.

    PATHS are the documents (default: the current directory); the inventory may be among them."""
    options = ssh_settings(accept_new_host_keys)
    ahead, early = connect_early(inventory_path, options, parallel)
    pinner = Pinner()
    loaded, errors = load_for_plan(paths, pin=pinner)
    if errors and as_json:  # a script gets the documented error object, not a partial plan
        raise InputError(errors, printed=True)
    inventory = resolve_inventory(inventory_path, loaded, early)
    backend = backend_for(state_path, paths)
    state = read_state(backend)
    held = f"{len(errors)} error(s) in the documents (above)" if errors else None
    result, failures = plan_for(
        loaded.desired, inventory, state, backend, options, parallel, targets, refresh_only, paths,
        hold_absent=held, replace=replace, checkouts=pinner.checkouts, ahead=ahead,
    )  # fmt: skip
    if out_path is not None and errors:
        console(stderr=True).print(f"error: the plan was not saved to {out_path}: the documents have errors")
    elif out_path is not None:
        write_private(out_path, json.dumps(plan_json(result), indent=2) + "\n")
    if as_json:
        emit_json(plan_json(result))
    elif markdown:
        saved = str(out_path) if out_path is not None and not errors else None
        sys.stdout.write(plan_markdown(result, full_plan=saved))
    else:
        show_plan(result, verbose=verbose)
        if out_path is not None and not errors:
            console().print(f"\nSaved the plan to {out_path}; apply exactly it with: engine-ctl apply {out_path}")
    report_failures(failures)
    if failures or result.problems or errors:
        sys.exit(1)
    sys.exit(2 if detailed_exitcode and result.has_changes else 0)


def _load_plan_file(path: Path) -> Plan | None:
    try:
        with path.open("rb") as f:
            text = f.read(MAX_PLAN_BYTES + 1).decode()  # never more than a plan may be, whatever the file's size
    except (OSError, UnicodeDecodeError):
        return None
    try:
        return decode_plan(text)
    except PlanFileError as exc:
        where = Location(str(path), exc.line, exc.column)
        raise InputError([Diagnostic(where, "", str(exc), code="not_a_plan")]) from None


PROMPTS = {
    "apply": ("Do you want to perform these actions? Only 'yes' will be accepted", "Apply cancelled; nothing changed."),
    "destroy": (
        "Do you really want to destroy these deployments? Their units are stopped and removed; the models stay. "
        "Only 'yes' will be accepted",
        "Destroy cancelled; nothing was destroyed.",
    ),
}
"""command -> (the confirmation prompt, what is said when it is not answered yes)."""


def _confirm(auto_approve: bool, command: str = "apply", as_json: bool = False) -> None:
    if auto_approve:
        return
    if not sys.stdin.isatty():
        hint = "review the plan, then pass --auto-approve"
        raise InputError(
            [
                Diagnostic(
                    Location("stdin"),
                    "",
                    f"{command} asks for confirmation, and stdin is not a terminal",
                    hint=hint + (" (or apply a saved plan file)" if command == "apply" else ""),
                    code="confirmation_needed",
                )
            ]
        )
    question, cancelled = PROMPTS[command]
    stream = sys.stderr if as_json else sys.stdout
    stream.write(f"{question}: ")
    stream.flush()
    answer = sys.stdin.readline()  # Ctrl-C here is KeyboardInterrupt: exit 130 (cli.main); Ctrl-D is no
    if answer.strip() != "yes":
        console(stderr=as_json).print(cancelled)
        sys.exit(1)


class JsonEvents:
    """`--json` of apply, destroy and restart: each event one JSON line on stdout, whole, from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def __call__(self, event: ApplyEvent) -> None:
        self.emit(event.as_json())

    def emit(self, doc: dict[str, object]) -> None:
        line = json.dumps(doc, sort_keys=False) + "\n"
        with self._lock:
            sys.stdout.write(line)
            sys.stdout.flush()

    def plain(self, event: str, **fields: object) -> None:
        self.emit({"event": event, "timestamp": utc_now(), **fields})


def outcome_line(plan: Plan, command: str, code: int, result_text: str) -> str:
    """The last line of apply or destroy: complete, with what was planned (all of it done), or stopped, with what
    was planned only (the lines above say what was done: never counts as if it all had been)."""
    s = plan.summary()
    if command == "destroy":
        n = sum(1 for c in plan.changes if c.actions == DELETE)  # deployments; the gateways are said apart
        gateways = sum(1 for g in plan.gateways if g.action == ["delete"])
        what = f"{n} deployment{'s' if n != 1 else ''}" + (f" and {gateways} gateway{'s' if gateways != 1 else ''}"
                                                          if gateways else "")  # fmt: skip
        if code != 0:
            return f"\nDestroy stopped: {result_text}. (planned: {what} to destroy)"
        return f"\nDestroy complete: {result_text}. ({what} destroyed as planned)"
    if code != 0:
        return (f"\nApply stopped: {result_text}. (planned: {s['add']} to add, {s['change']} to change, "
                f"{s['destroy']} to destroy; what was done is above)")  # fmt: skip
    done = f"{s['add']} added, {s['change']} changed, {s['destroy']} destroyed as planned"
    return f"\nApply complete: {result_text}. ({done})"


def execute(
    plan: Plan, inventory: Inventory, backend: StateBackend, state: State, options: SSHOptions, command: str,
    events: JsonEvents | None = None, request_id: str | None = None, fanout: int = 32, transports: Kept | None = None,
    deploy: Deploying | None = None,
) -> int:  # fmt: skip
    """Run the plan with the state recorded after every step; Ctrl-C finishes the step in flight. With `events`
    (--json) every step is also one JSON line on stdout, and the people's lines go to stderr. With `request_id`
    the request is recorded first, each completed step under it, and its result at the end. At most `fanout`
    hosts (--fanout) are worked on at once; `transports` are hosts' connections the plan's gathering left open.
    `deploy`: `engine-ctl deploy`'s run (its lines on stderr, its operation's ID, what it saves and fingerprints)."""
    out = console(stderr=events is not None or deploy is not None)
    if events is not None:
        s = plan.summary()
        extra = {"request_id": request_id} if request_id else {}
        events.plain("planned", command=command, refresh_only=plan.refresh_only, **s, **extra)
    refused = destroy_refusals(plan, state)  # also for a saved plan: the state says what may not be destroyed
    if refused:
        raise InputError([Diagnostic(Location(backend.location), "", r, code="destroy_refused") for r in refused])
    recorder = Recorder(backend, state)
    if request_id is not None:
        recorder.change(lambda s: begin_request(s, request_id, command, who(), now()))
    stop = threading.Event()

    def on_interrupt(signum: int, frame: object) -> None:
        if not stop.is_set():
            out.print("Interrupted: finishing the step in flight, then recording the state…")
        stop.set()

    previous = signal.signal(signal.SIGINT, on_interrupt)
    try:
        if plan.refresh_only:
            recorder.change(lambda s: refresh_state(s, plan))
            result_text, code, unrecorded = "refreshed", 0, list[str]()
        else:
            # On a terminal a live status line shows that the roll is under way (or, while weights come in, a
            # progress bar per file); otherwise plain lines only.
            bars = None
            if out.is_terminal and any(c.fetches for c in plan.changes):
                from engine_ctl.cli.views.fetch import FetchBars  # rich.progress: loaded only to show weights coming in

                bars = FetchBars(out)
            hub = HubAccess.from_environment(inventory.downloads, bars.update if bars else None)
            executor = Executor(
                plan, {h.name: h for h in inventory.hosts}, recorder, options, out.print, stop, observer=events,
                hub=hub, request_id=request_id, fanout=fanout, transports=transports,
                save_only=deploy.save_only if deploy else frozenset(),
                fingerprint=deploy.fingerprint if deploy else frozenset(),
            )  # fmt: skip
            busy = "Applying: one replica at a time per deployment, health-gated…"
            live = bars or (out.status(busy) if out.is_terminal else None)
            with live or contextlib.nullcontext():
                result = executor.run()
            unrecorded = result.unrecorded
            code = 130 if result.interrupted else (1 if result.failed or unrecorded else 0)
            failures = "; ".join(f"{k}: {v}" for k, v in sorted(result.failed.items()))
            done = "destroyed" if command == "destroy" else "applied"
            result_text = "interrupted" if result.interrupted else (f"failed: {failures}" if failures else done)
    finally:
        signal.signal(signal.SIGINT, previous)

    def log(s: State) -> None:
        for host, fp in plan.host_fingerprints.items():
            s.hosts[host] = HostRecord(facts_fingerprint=fp, machine_id=plan.host_machines.get(host))
        s.operations.append(
            Operation(
                id=deploy.operation if deploy else str(uuid.uuid4()),
                who=who(),
                when=now(),
                command=command,
                plan_hash=plan.digest(),
                result=result_text,
            )
        )
        del s.operations[:-200]
        if request_id is not None and result_text != "interrupted":  # Ctrl-C: a re-run continues it
            finish_request(s, request_id, result_text, code, now())

    try:
        recorder.change(log)
    except Exception as exc:  # the backend's own failure: reported, never an internal error
        out.print(f"error: the operation could not be logged in the state: {exc}")
        code = code or 1
    for what in unrecorded:
        out.print(f"error: not recorded in the state: {what}; run engine-ctl plan to see what the hosts run")
    out.print(outcome_line(plan, command.split()[0], code, result_text))
    if events is not None:
        events.plain("finished", command=command, result=result_text, exit_code=code, unrecorded=unrecorded)
    return code


def for_destroy(plan: Plan) -> Plan:
    """The plan of `destroy`: only its deletions, each said as destroy asked for it (never "removed from the
    documents": destroy reads no documents), and no deployment counted as absent."""
    asked = "engine-ctl destroy" + "".join(f" --target {t}" for t in plan.targets)
    changes = []
    for c in plan.changes:
        if c.actions != DELETE:
            continue
        replicas = [r.model_copy(update={"reason": "destroyed"}) for r in c.replicas]
        changes.append(c.model_copy(update={"reasons": [f"{asked} destroys it"], "replicas": replicas}))
    gateways = plan.gateways
    if not plan.targets:  # everything: each gateway engine-ctl set up goes too (its role in the inventory or not)
        gateways = [GatewayChange(host=g.host, action=["delete"], endpoint=g.endpoint, reasons=[f"{asked} removes it"])
                    for g in plan.gateways if g.action != ["create"]]  # fmt: skip
    return plan.model_copy(update={"changes": changes, "absent": [], "gateways": gateways})


def _teardown(plan: Plan, inventory: Inventory, options: SSHOptions, stderr: bool) -> int:
    """After a destroy of everything: engine-ctl's keys, gateway and scaler files off every host it reached (the
    replicas' key kept where another state still has units). 1 when a host could not be cleared."""
    shared = {u.host for u in plan.owned_elsewhere}
    gateways = {g.host for g in plan.gateways} | {h.name for h in inventory.gateways()}
    hosts = [h for h in inventory.hosts if h.name in plan.host_fingerprints]
    out = console(stderr=stderr)
    failed = teardown(hosts, gateways, shared, options, out.print)
    for why in failed:
        out.print(f"error: destroy could not clear {why}; run engine-ctl destroy again")
    return 1 if failed else 0


def plan_for(
    desired: DesiredState, inventory: Inventory, state: State, backend: StateBackend, options: SSHOptions,
    parallel: int, targets: tuple[str, ...], refresh_only: bool = False, documents: tuple[Path, ...] = (),
    hold_absent: str | None = None, replace: tuple[str, ...] = (), checkouts: dict[str, Checkout] | None = None,
    ahead: Ahead | None = None, keep: Kept | None = None,
) -> tuple[Plan, dict[str, HostFailure]]:  # fmt: skip
    result, failures = plan_world(
        desired, inventory, state, backend.location, reopen_string(backend), options, parallel, targets,
        refresh_only, documents, hold_absent, replace, checkouts, ahead, keep,
    )  # fmt: skip
    result.context.env = current_env()  # the header names it; `apply PLANFILE` refuses it in another environment
    return result, failures


def _refuse_plan(path: Path, message: str, hint: str, code: str) -> InputError:
    return InputError([Diagnostic(Location(str(path)), "", message, hint=hint, code=code)])


def _apply_saved(
    saved: Plan, path: Path, inventory_path: Path | None, state_path: str | None, options: SSHOptions,
    parallel: int, lock_timeout: float, events: JsonEvents | None, request: Request,
) -> int:  # fmt: skip
    """`apply PLANFILE`: exactly what was reviewed, or a refusal that says why."""
    ctx = saved.context
    env = current_env()
    if ctx.env != env:
        made, now_env = ctx.env or "the default environment", env or "the default environment"
        hint = "apply it with the --env (or ENGINE_CTL_ENV) it was planned with"
        raise _refuse_plan(path, f"the saved plan was made for {made}, and this is {now_env}", hint, code="plan_stale")
    here = next((Path(n) for n in inventory_names(env) if env and Path(n).is_file()), None)
    inventory = load_inventory(Path(inventory_path or here or ctx.inventory or ""))
    forged = tampering(saved, {h.name: h for h in inventory.hosts})
    if forged:
        raise _refuse_plan(
            path,
            "the saved plan is not what engine-ctl renders from its own recorded inputs: " + "; ".join(forged),
            "it was edited, or the inventory changed since; run engine-ctl plan again and review the new plan",
            code="plan_tampered",
        )
    backend = open_backend(state_for_env(state_path, env) if state_path else (ctx.state or ""))
    for problem in lock_tampering(saved.scaler, backend.location, inventory):
        raise _refuse_plan(path, problem, "run engine-ctl plan again and review the new plan", code="plan_tampered")
    with locked(backend, lock_operation("apply", request.id), lock_timeout, request.id):
        recorded_state = read_state(backend)
        finished = request.check(recorded_state, "apply " + str(path), backend.location, stderr=events is not None)
        if finished is not None:
            return finished
        state = state_for_plan(saved, recorded_state)
        hosts = [h for h in inventory.hosts if h.name in saved.host_fingerprints]
        kept: Kept = {}  # the roll reuses these connections: one handshake per host
        facts, _ = gather(hosts, options, parallel, ctx.model_paths, keep=kept)
        stale = stale_reasons(saved, state, {h: f.fingerprint() for h, f in facts.items()})
        if stale:
            hint = "run engine-ctl plan again and review the new plan"
            raise _refuse_plan(path, "the saved plan is stale: " + "; ".join(stale), hint, code="plan_stale")
        forged_gateway = gateway_tampering(saved.gateways, saved.changes, state, inventory)
        if forged_gateway:
            raise _refuse_plan(path, "the saved plan's gateway is not engine-ctl's: " + "; ".join(forged_gateway),
                               "it was edited; run engine-ctl plan again and review the new plan",
                               code="plan_tampered")  # fmt: skip
        show_plan(saved, stderr=events is not None)
        code = execute(saved, inventory, backend, state, options, "apply " + str(path), events, request.id,
                       fanout=parallel, transports=kept)  # fmt: skip
        return code or (1 if saved.problems else 0)  # Pending or Failed: not served, never exit 0


@click.command()
@click.argument("args", nargs=-1, type=click.Path(path_type=Path))
@writing_options
@click.option("--refresh-only", is_flag=True, help="Only record in the state what drifted on the hosts; no host "
              "is changed.")  # fmt: skip
@replace_option
@click.option(
    "--revision", "revision_checks", multiple=True, metavar="NAME=N",
    help="Apply only while deployment NAME's recorded revision is N (the REVISION column of `engine-ctl list`): "
    "refused with revision_mismatch (exit 26) when someone applied a change since (repeatable).",
)  # fmt: skip
@request_option
def apply(
    args: tuple[Path, ...], inventory_path: Path | None, state_path: str | None, parallel: int,
    accept_new_host_keys: bool, targets: tuple[str, ...], lock_timeout: float, auto_approve: bool, as_json: bool,
    refresh_only: bool, replace: tuple[str, ...], revision_checks: tuple[str, ...], request_id: str | None,
) -> None:  # fmt: skip
    """Make the hosts match the documents: plan, confirm, then roll replicas one at a time, health-gated.

    ARGS are the documents, or one saved PLANFILE (from `plan --out`), which is applied exactly as reviewed
    or refused if the state or a host's facts changed since."""
    options = ssh_settings(accept_new_host_keys)
    events = JsonEvents() if as_json else None
    checks, bad = parse_revision_checks(revision_checks)
    if bad:
        raise InputError(bad)
    request = Request(request_identity(request_id), checks)
    announce(request.id)
    saved = _load_plan_file(args[0]) if len(args) == 1 and args[0].is_file() else None
    if saved is not None:
        sys.exit(_apply_saved(saved, args[0], inventory_path, state_path, options, parallel, lock_timeout, events,
                              request))  # fmt: skip
    command = "apply" + "".join(f" --replace {n}" for n in replace) + (" --refresh-only" if refresh_only else "")
    sys.exit(_apply_documents(args, inventory_path, state_path, options, parallel, targets, lock_timeout,
                              auto_approve, events, refresh_only, replace, command, request))  # fmt: skip


def _apply_documents(
    args: tuple[Path, ...], inventory_path: Path | None, state_path: str | None, options: SSHOptions,
    parallel: int, targets: tuple[str, ...], lock_timeout: float, auto_approve: bool, events: JsonEvents | None,
    refresh_only: bool, replace: tuple[str, ...], command: str, request: Request,
) -> int:  # fmt: skip
    """Plan from the documents, show, confirm, execute: apply and restart. Without --auto-approve the roll opens its
    own connections: the ones the plan used may have sat idle at the prompt for as long as someone read it."""
    ahead, early = connect_early(inventory_path, options, parallel)
    kept: Kept | None = {} if auto_approve else None
    pinner = Pinner()
    loaded = load_checked(args, pin=pinner)
    inventory = resolve_inventory(inventory_path, loaded, early)
    backend = backend_for(state_path, args)
    with locked(backend, lock_operation("apply", request.id), lock_timeout, request.id):
        state = read_state(backend)
        finished = request.check(state, command, backend.location, stderr=events is not None)
        if finished is not None:
            return finished
        result, failures = plan_for(
            loaded.desired, inventory, state, backend, options, parallel, targets, refresh_only, args,
            replace=replace, checkouts=pinner.checkouts, ahead=ahead, keep=kept,
        )  # fmt: skip
        show_plan(result, stderr=events is not None)
        report_failures(failures)
        if not result.has_changes or result.refused:  # refused (prevent_destroy): nothing is applied
            code = 1 if failures or result.problems else 0
            if events is not None:
                events.plain("finished", command=command, result="no changes", exit_code=code, unrecorded=[])
            return code
        _confirm(auto_approve, as_json=events is not None)
        code = execute(result, inventory, backend, state, options, command, events, request.id, fanout=parallel,
                       transports=kept)  # fmt: skip
        return code or (1 if failures or result.problems else 0)


@click.command()
@click.argument("name")
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@writing_options
@request_option
def restart(
    name: str, paths: tuple[Path, ...], inventory_path: Path | None, state_path: str | None, parallel: int,
    accept_new_host_keys: bool, targets: tuple[str, ...], lock_timeout: float, auto_approve: bool, as_json: bool,
    request_id: str | None,
) -> None:  # fmt: skip
    """Restart deployment NAME: replace its replicas one at a time, health-gated, without editing a document
    (the same as `apply --target NAME --replace NAME`). PATHS are the documents (default: the current directory)."""
    options = ssh_settings(accept_new_host_keys)
    events = JsonEvents() if as_json else None
    chosen = tuple(dict.fromkeys((*targets, name)))
    request = Request(request_identity(request_id))
    announce(request.id)
    sys.exit(_apply_documents(paths, inventory_path, state_path, options, parallel, chosen, lock_timeout,
                              auto_approve, events, False, (name,), f"restart {name}", request))  # fmt: skip


@click.command()
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@writing_options
@request_option
def destroy(
    paths: tuple[Path, ...], inventory_path: Path | None, state_path: str | None, parallel: int,
    accept_new_host_keys: bool, targets: tuple[str, ...], lock_timeout: float, auto_approve: bool, as_json: bool,
    request_id: str | None,
) -> None:  # fmt: skip
    """Stop and remove the units of every deployment in the state (or --target ones). The models stay."""
    request = Request(request_identity(request_id))
    announce(request.id)
    options = ssh_settings(accept_new_host_keys)
    ahead, early = connect_early(inventory_path, options, parallel)
    kept: Kept | None = {} if auto_approve else None  # as apply's: reused only when no prompt waits in between
    loaded = load_checked(paths, documents_required=False, pin=unresolved) if paths else None
    inventory = resolve_inventory(inventory_path, loaded, early)
    backend = backend_for(state_path, paths)
    with locked(backend, lock_operation("destroy", request.id), lock_timeout, request.id):
        state = read_state(backend)
        finished = request.check(state, "destroy", backend.location, stderr=as_json)
        if finished is not None:
            sys.exit(finished)
        keep = DesiredState()  # nothing is wanted: every (targeted) deployment in the state is deleted
        result, failures = plan_for(keep, inventory, state, backend, options, parallel, targets, ahead=ahead,
                                     keep=kept)  # fmt: skip
        result = for_destroy(result)
        events = JsonEvents() if as_json else None
        show_plan(result, "destroy", stderr=as_json)
        report_failures(failures)
        if not (result.changes or result.gateways) or result.refused:  # refused (prevent_destroy): nothing is
            code = 1 if result.refused else 0  # destroyed
            if events is not None:
                events.plain("finished", command="destroy", result="no changes", exit_code=code, unrecorded=[])
            sys.exit(code)
        _confirm(auto_approve, "destroy", as_json)
        code = execute(result, inventory, backend, state, options, "destroy", events, request.id, fanout=parallel,
                       transports=kept)  # fmt: skip
        if code == 0 and not targets:
            code = _teardown(result, inventory, options, stderr=as_json)
        sys.exit(code)


__all__ = ["apply", "destroy", "plan", "restart"]
