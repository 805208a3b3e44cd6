"""`engine-ctl state push --to URL` and `state pull --from URL`: move a state between backends.

The *current* state is the one every other command uses: `--state`, or engine-ctl.state.json beside the
documents. `push` copies the current state to URL; `pull` copies URL's state into the current one. Either
way the state arrives as it is, its lineage and serial kept (so a plan saved against it still applies), under
the lock of the side written to, and what it replaces stays as the backup (the file's .backup, PostgreSQL's
engine_ctl_state_history). A different lineage, a newer serial, or the same serial with other contents is
refused unless --force."""

from __future__ import annotations

from pathlib import Path

import click

from engine_ctl.cli.context import backend_for, lock_timeout_option, locked, read_state, state_option
from engine_ctl.cli.views.output import console
from engine_ctl.core.diagnostics import Diagnostic, InputError, Location
from engine_ctl.core.record.model import State, StateError
from engine_ctl.state import LocalState, PostgresState, StateBackend, open_backend

FORCE_HELP = "Overwrite even a different lineage, a newer serial, or the same serial with other contents."


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
