"""`engine-ctl state ...`: the recorded state, no host touched. `list` and `show` read it; `push` and `pull` move
it between backends; `rm` and `mv` forget or rename a deployment's record; `history` prints the operations log.

The *current* state is the one every other command uses: `--state`, or engine-ctl.state.json at the project's
root. push copies the current state to URL; pull copies URL's state into the current one. Either way the state
arrives as it is, its lineage and serial kept (so a plan saved against it still applies), under the lock of the
side written to, and what it replaces stays as the backup (the file's .backup, PostgreSQL's
engine_ctl_state_history). A different lineage, a newer serial, or the same serial with other contents is refused
unless --force. rm and mv run under the state's lock, keep what they replace as the backup, and are recorded in
the state's operations log."""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import click
from rich.table import Table

from engine_ctl.cli.context import backend_for, lock_timeout_option, locked, read_state, state_option
from engine_ctl.cli.requests import recorded_command, with_request
from engine_ctl.cli.views.output import console, emit_json
from engine_ctl.core.diagnostics import Diagnostic, InputError, Location
from engine_ctl.core.record.edit import StateEditError, forget, rename
from engine_ctl.core.record.model import Operation, State, StateError
from engine_ctl.state import LocalState, PostgresState, StateBackend, open_backend
from engine_ctl.state.base import now, who

FORCE_HELP = "Overwrite even a different lineage, a newer serial, or the same serial with other contents."
FORMAT_VERSION = 1
OPERATIONS_KEPT = 200


@click.group(name="state")
def state_group() -> None:
    """Inspect the recorded state, move it between backends (push, pull), forget or rename a deployment's record
    (rm, mv), read the operations log (history)."""


@state_group.command(name="list")
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@state_option
@click.option("--json", "as_json", is_flag=True, help="A versioned JSON document: the state's serial, lineage and "
              "each deployment's ID, revision, state and replicas.")  # fmt: skip
def state_list(paths: tuple[Path, ...], state_path: str | None, as_json: bool) -> None:
    """The deployments in the state, with revision and replicas."""
    backend = backend_for(state_path, paths)
    state = read_state(backend)
    if as_json:
        emit_json({
            "format_version": FORMAT_VERSION, "state": backend.location, "serial": state.serial,
            "lineage": state.lineage,
            "deployments": [
                {"name": name, "id": rec.id, "revision": rec.revision, "state": rec.state,
                 "replicas": [{"index": r.index, "host": r.host, "unit": r.unit, "port": r.port,
                               "revision": r.revision, "status": r.status} for r in rec.replicas]}
                for name, rec in sorted(state.deployments.items())
            ],
        })  # fmt: skip
        return
    out = console()
    out.print(f"# {backend.location}: serial {state.serial}, lineage {state.lineage}")
    for name, rec in sorted(state.deployments.items()):
        out.print(f"{name}  revision {rec.revision}  {rec.state}  {len(rec.replicas)} replica(s)")


@state_group.command(name="show")
@click.argument("name")
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@state_option
def state_show(name: str, paths: tuple[Path, ...], state_path: str | None) -> None:
    """One deployment's record as JSON."""
    state = read_state(backend_for(state_path, paths))
    if name not in state.deployments:
        raise InputError(
            [Diagnostic(Location("state"), "", f"no deployment named {name!r} in the state", code="unknown_deployment")]
        )
    sys.stdout.write(json.dumps(state.deployments[name].model_dump(mode="json"), indent=2) + "\n")


def _same_place(a: StateBackend, b: StateBackend) -> bool:
    if isinstance(a, LocalState) and isinstance(b, LocalState):
        return a.path.resolve() == b.path.resolve()
    return a.location == b.location


def _contents(state: State) -> dict[str, object]:
    return state.model_dump(mode="json", exclude={"engine_ctl_version"})


def refusal(moving: State, there: State, source: str, target: str, direction: str) -> tuple[str, str] | None:
    """Why `moving` (from `source`) must not replace `there` (at `target`) without --force, with a hint; None
    when it may (nothing there yet, or an older serial of the same lineage)."""
    if there.serial == 0:
        return None
    force = "--force replaces it (what it replaces stays as the backup)"
    if there.lineage != moving.lineage:
        return (
            f"{target} holds another state (lineage {there.lineage}, serial {there.serial}), not this one "
            f"(lineage {moving.lineage}, serial {moving.serial}); nothing was overwritten",
            f"check that this is the state you mean; {force}",
        )
    if there.serial > moving.serial:
        other = "pull" if direction == "push" else "push"
        return (
            f"{target} is newer (serial {there.serial}) than {source} (serial {moving.serial}), same lineage; "
            "nothing was overwritten",
            f"`engine-ctl state {other}` moves the newer one the other way; {force}",
        )
    if there.serial == moving.serial and _contents(there) != _contents(moving):
        return (
            f"{target} and {source} both are serial {there.serial} of lineage {there.lineage}, with other contents "
            "(each was written apart from the other); nothing was overwritten",
            f"compare them with `engine-ctl state list`; {force}",
        )
    return None


def backup_of(target: StateBackend, replaced: State) -> str:
    if isinstance(target, LocalState):
        return f"{target.backup}"
    if isinstance(target, PostgresState):
        return f"the table engine_ctl_state_history (name {target.name!r}, serial {replaced.serial})"
    return "the backend's backup"


def move(source: StateBackend, target: StateBackend, direction: str, timeout: float, force: bool) -> None:
    """Copy the state at `source` to `target` as it is, under the target's lock; say what was done."""
    if _same_place(source, target):
        raise InputError(
            [
                Diagnostic(
                    Location(target.location),
                    "",
                    "the source and the target are the same state",
                    code="state_move_refused",
                )
            ]
        )
    moving = read_state(source)
    if moving.serial == 0:
        message = f"there is no state at {source.location} to {direction} (nothing was ever written there)"
        raise InputError([Diagnostic(Location(source.location), "", message, code="state_move_refused")])
    out = console()
    with locked(target, f"state {direction}", timeout):
        there = read_state(target)
        refused = refusal(moving, there, source.location, target.location, direction)
        if refused is not None and not force:
            raise InputError(
                [Diagnostic(Location(target.location), "", refused[0], hint=refused[1], code="state_move_refused")]
            )
        if there.serial == moving.serial and _contents(there) == _contents(moving):
            out.print(f"{target.location} already holds serial {moving.serial} of lineage {moving.lineage}: no change")
            return
        try:
            target.put(moving, there)
        except StateError as exc:
            raise InputError([Diagnostic(Location(target.location), "", str(exc), code="state_error")]) from None
    verb = "Pushed" if direction == "push" else "Pulled"
    kept = f"; what it replaced (serial {there.serial}) is kept in {backup_of(target, there)}" if there.serial else ""
    out.print(f"{verb} {source.location} to {target.location}: serial {moving.serial}, lineage {moving.lineage}{kept}")


@click.command(name="push")
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@click.option("--to", "url", required=True, metavar="URL", help="Where to: postgresql://…[#name] or a file.")
@state_option
@lock_timeout_option
@click.option("--force", is_flag=True, help=FORCE_HELP)
def state_push(paths: tuple[Path, ...], url: str, state_path: str | None, lock_timeout: float, force: bool) -> None:
    """Copy the current state to URL (another backend), lineage and serial kept.

    The current state is --state, or engine-ctl.state.json beside the documents (PATHS).

    Refused when URL holds another lineage, a newer serial, or the same serial with other contents, unless
    --force; what URL held stays as its backup. Runs under URL's lock (--lock-timeout waits for it)."""
    move(backend_for(state_path, paths), open_backend(url), "push", lock_timeout, force)


@click.command(name="pull")
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@click.option("--from", "url", required=True, metavar="URL", help="Where from: postgresql://…[#name] or a file.")
@state_option
@lock_timeout_option
@click.option("--force", is_flag=True, help=FORCE_HELP)
def state_pull(paths: tuple[Path, ...], url: str, state_path: str | None, lock_timeout: float, force: bool) -> None:
    """Copy URL's state (another backend) into the current state, lineage and serial kept.

    The current state is --state, or engine-ctl.state.json beside the documents (PATHS).

    Refused when the current state is another lineage, a newer serial, or the same serial with other contents,
    unless --force; what it held stays as its backup. Runs under the current state's lock."""
    move(open_backend(url), backend_for(state_path, paths), "pull", lock_timeout, force)


__all__ = ["move", "refusal", "state_pull", "state_push"]


def log_operation(state: State, command: str, result: str) -> State:
    """The state with one more entry in its operations log (the oldest dropped past OPERATIONS_KEPT)."""
    entry = Operation(id=str(uuid.uuid4()), who=who(), when=now(), command=command, result=result)
    logged = state.model_copy(update={"operations": [*state.operations, entry][-OPERATIONS_KEPT:]})
    return with_request(logged, command, result)  # the request identity of state rm, mv, import


def edit_state(
    backend: StateBackend, operation: str, timeout: float, edit: Callable[[State], tuple[State, str]]
) -> tuple[State, State]:
    """Under the lock: read, edit (refusals become located errors, exit 1), log and write. Returns (before,
    after as written)."""
    with locked(backend, operation, timeout):
        before = read_state(backend)
        try:
            edited, result = edit(before)
        except StateEditError as exc:
            raise InputError(
                [Diagnostic(Location(backend.location), "", str(exc), hint=exc.hint, code="state_edit_refused")]
            ) from None
        try:
            written = backend.write(log_operation(edited, operation, result))
        except StateError as exc:
            raise InputError([Diagnostic(Location(backend.location), "", str(exc), code="state_error")]) from None
    return before, written


@click.command(name="rm")
@click.argument("name")
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@recorded_command(lambda kw: f"state rm {kw['name']}", inline=True)
@state_option
@lock_timeout_option
def state_rm(name: str, paths: tuple[Path, ...], state_path: str | None, lock_timeout: float) -> None:
    """Forget deployment NAME in the state; its units on the hosts are not touched.

    Its replicas keep running, no longer managed by this state (plans list them as not in this state);
    `engine-ctl import` adopts them again. The previous state is kept as the backup."""
    backend = backend_for(state_path, paths)

    def edit(state: State) -> tuple[State, str]:
        edited = forget(state, name)
        left = sorted(f"{r.unit} on {r.host}" for r in state.deployments[name].replicas)
        return edited, f"forgot {name}" + (f"; left on the hosts: {', '.join(left)}" if left else "")

    before, written = edit_state(backend, f"state rm {name}", lock_timeout, edit)
    out = console()
    replicas = before.deployments[name].replicas
    out.print(f"Removed {name} from the state {backend.location} (serial {written.serial}); no host was touched.")
    for r in replicas:
        out.print(f"  {r.unit} on {r.host} keeps running, unmanaged (`engine-ctl import` adopts it again)")
    out.print(f"The previous state (serial {before.serial}) is kept in {backup_of(backend, before)}.")


@click.command(name="mv")
@click.argument("old")
@click.argument("new")
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@recorded_command(lambda kw: f"state mv {kw['old']} {kw['new']}", inline=True)
@state_option
@lock_timeout_option
def state_mv(old: str, new: str, paths: tuple[Path, ...], state_path: str | None, lock_timeout: float) -> None:
    """Rename deployment OLD's record to NEW; no host is touched.

    For a deployment renamed in its document: its replicas keep running (their units are still named after
    OLD), and the next apply replaces them one at a time, health-gated, with units of the new name, instead of
    destroying OLD and creating NEW. Refused when NEW is already in the state. The previous state is kept as
    the backup."""
    backend = backend_for(state_path, paths)

    def edit(state: State) -> tuple[State, str]:
        return rename(state, old, new), f"renamed {old} to {new}"

    before, written = edit_state(backend, f"state mv {old} {new}", lock_timeout, edit)
    out = console()
    replicas = written.deployments[new].replicas
    out.print(f"Moved {old} to {new} in the state {backend.location} (serial {written.serial}); no host was touched.")
    if replicas:
        out.print(
            f"Its {len(replicas)} replica(s) keep running under their units' names; the next apply of a document "
            f"named {new} replaces them one at a time with units of the new name."
        )
    out.print(f"The previous state (serial {before.serial}) is kept in {backup_of(backend, before)}.")


@click.command(name="history")
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@state_option
@click.option("--json", "as_json", is_flag=True, help="The operations log as versioned JSON.")
def state_history(paths: tuple[Path, ...], state_path: str | None, as_json: bool) -> None:
    """The state's operations log, oldest first: when, who, what command, and its result."""
    backend = backend_for(state_path, paths)
    state = read_state(backend)
    if as_json:
        emit_json(
            {
                "format_version": FORMAT_VERSION,
                "state": backend.location,
                "lineage": state.lineage,
                "serial": state.serial,
                "operations": [op.model_dump(mode="json") for op in state.operations],
            }
        )
        sys.exit(0)
    out = console()
    out.print(f"# {backend.location}: serial {state.serial}, lineage {state.lineage}")
    if not state.operations:
        out.print("No operations recorded yet.")
        return
    table = Table(box=None, pad_edge=False)
    for col in ("WHEN", "WHO", "COMMAND", "RESULT"):
        table.add_column(col, overflow="fold")
    for op in state.operations:
        table.add_row(op.when, op.who, op.command, op.result or "-")
    out.print(table)


state_group.add_command(state_push)
state_group.add_command(state_pull)
state_group.add_command(state_rm)
state_group.add_command(state_mv)
state_group.add_command(state_history)
