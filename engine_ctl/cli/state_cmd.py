"""`engine-ctl state rm NAME`, `state mv OLD NEW` and `state history`: the state's records, no host touched.

rm and mv run under the state's lock, keep what they replace as the backup (the file's .backup, PostgreSQL's
engine_ctl_state_history), and are recorded in the state's operations log, which `state history` prints."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import click
from rich.table import Table

from engine_ctl.cli.context import backend_for, lock_timeout_option, locked, read_state, state_option
from engine_ctl.cli.requests import recorded_command, with_request
from engine_ctl.cli.state_move import backup_of
from engine_ctl.cli.views.output import console, emit_json
from engine_ctl.core.diagnostics import Diagnostic, InputError, Location
from engine_ctl.core.record.edit import StateEditError, forget, rename
from engine_ctl.core.record.model import Operation, State, StateError
from engine_ctl.state import StateBackend
from engine_ctl.state.base import now, who

FORMAT_VERSION = 1
OPERATIONS_KEPT = 200


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


__all__ = ["edit_state", "log_operation", "state_history", "state_mv", "state_rm"]
