"""What the commands share about the state: the --state, --lock-timeout and writing options, which backend a
command uses (backend_for), the locked section of a writing command, and reading the state with located errors."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from engine_ctl.cli.common import ENVIRONMENT, inventory_option, ssh_options
from engine_ctl.cli.environments import (
    current_env,
    env_option,
    project_root,
    state_file_name,
    state_for_env,
    states_below,
)
from engine_ctl.cli.views.output import console
from engine_ctl.core.diagnostics import Diagnostic, InputError, Location
from engine_ctl.core.documents.yamlsource import parse_text
from engine_ctl.core.record.model import DeploymentRecord, State, StateError
from engine_ctl.state import LocalState, StateBackend, open_backend
from engine_ctl.state.local import DEFAULT_NAME


def state_option(f: Any) -> Any:
    f = click.option(
        "--state",
        "state_path",
        envvar=ENVIRONMENT["--state"],
        show_envvar=True,
        help=f"The state: a file (default: {DEFAULT_NAME} in the project's root: the documents' directory, or the "
        "current one, or the nearest above it holding an inventory or a state) or postgresql://…[#name]; "
        "with --env NAME, NAME's own state there.",
    )(f)
    return env_option(f)


def lock_timeout_option(f: Any) -> Any:
    return click.option(
        "--lock-timeout", default=0.0, show_default=True, type=click.FloatRange(min=0),
        envvar=ENVIRONMENT["--lock-timeout"], show_envvar=True, help="Seconds to wait for the state lock.",
    )(f)  # fmt: skip


def target_option(f: Any) -> Any:
    return click.option(
        "--target", "targets", multiple=True, envvar=ENVIRONMENT["--target"], show_envvar=True,
        help="Only this deployment (repeatable; the variable takes names separated by spaces).",
    )(f)  # fmt: skip


def replace_option(f: Any) -> Any:
    return click.option(
        "--replace", "replace", multiple=True, metavar="NAME",
        help="Replace every replica of deployment NAME (a rolling restart, one replica at a time, health-gated) "
        "without editing a document (repeatable).",
    )(f)  # fmt: skip


def json_events_option(f: Any) -> Any:
    return click.option(
        "--json", "as_json", is_flag=True,
        help="One JSON event per line on stdout (planned, started, healthy, removed, failed, recorded, finished) "
        "for pipelines; the plan and progress go to stderr.",
    )(f)  # fmt: skip


def writing_options(f: Any) -> Any:
    """The options of the commands that change hosts and state (apply, destroy, restart)."""
    for option in (
        json_events_option,
        click.option("--auto-approve", is_flag=True, help="Do not ask for confirmation."),
        lock_timeout_option,
        target_option,
        ssh_options,
        state_option,
        inventory_option,
    ):
        f = option(f)
    return f


def default_state_path(paths: tuple[Path, ...]) -> Path:
    """The state file every command finds the same way: engine-ctl.state.json (engine-ctl.NAME.state.json with
    --env NAME) in the project's root, the directory of the documents (or the current directory without them) or
    the nearest one above it that holds an inventory or a state (environments.project_root)."""
    first = paths[0] if paths else Path(".")
    base = first if first.is_dir() else first.parent
    return project_root(base) / state_file_name(current_env(), DEFAULT_NAME)


def backend_for(explicit: str | None, paths: tuple[Path, ...]) -> StateBackend:
    """The state: --state (with --env NAME, NAME's own state in that backend), else the file in the project's
    root (default_state_path)."""
    if explicit:
        return open_backend(state_for_env(explicit, current_env()))
    return LocalState(default_state_path(paths))


def state_exists(backend: StateBackend) -> bool:
    """Whether the backend holds a state yet: a command that finds none never creates one (only apply and import
    write a first state)."""
    if isinstance(backend, LocalState):
        return backend.path.exists()
    try:
        return backend.read().serial > 0
    except StateError:
        return True


def reopen_string(backend: StateBackend) -> str:
    """How `apply PLANFILE` finds the same state again (no password: libpq reads PGPASSWORD or ~/.pgpass)."""
    if isinstance(backend, LocalState):
        return str(backend.path.resolve())
    return backend.location


def lock_operation(command: str, request_id: str | None) -> str:
    """What the lock says its holder does: the command, and its request identity."""
    return f"{command} (request {request_id})" if request_id else command


@contextlib.contextmanager
def locked(backend: StateBackend, operation: str, timeout: float, request_id: str | None = None) -> Iterator[None]:
    """Hold the state lock for a writing command; state problems become located errors (exit 1). A stale lock
    left by this same request (its process killed on this machine) is cleared, so a re-run with --request-id
    continues it."""
    from engine_ctl.state.base import LockHeld

    try:
        with contextlib.ExitStack() as stack:
            try:
                stack.enter_context(backend.lock(operation, timeout=timeout))
            except LockHeld as exc:
                if not (request_id and exc.stale and f"(request {request_id})" in exc.info.operation):
                    raise
                backend.force_unlock(exc.info.id)
                console(stderr=True).print(f"Cleared the lock request {request_id} left ({exc.stale})",
                                           markup=False, highlight=False)  # fmt: skip
                stack.enter_context(backend.lock(operation, timeout=timeout))
            yield
    except StateError as exc:
        raise InputError([Diagnostic(Location(backend.location), "", str(exc), code="state_error")]) from None


def read_state(backend: StateBackend) -> State:
    try:
        return backend.read()
    except StateError as exc:
        raise InputError([Diagnostic(Location(backend.location), "", str(exc), code="state_error")]) from None


NO_STATE_HINT = (
    "run it where you run apply: the state is engine-ctl.state.json in the project's root (the documents' directory, "
    "or the current one, or the nearest directory above it holding an inventory or a state); or pass the documents' "
    "directory, or --state"
)


def no_state_hint(backend: StateBackend) -> str:
    """Where to look when no state is here; a state right below (beside documents in deploy/, where an engine-ctl
    before this rule wrote it) is named, with the move that makes every command find it."""
    if isinstance(backend, LocalState):
        found = states_below(backend.given.parent, backend.given.name)
        if found:
            names = ", ".join(str(f) for f in found)
            return (f"found {names} below: move it here, with its .backup (mv {found[0]}* {backend.given.parent}/), "
                    "or pass --state")  # fmt: skip
    return NO_STATE_HINT


def no_such_deployment(name: str, state: State, backend: StateBackend) -> InputError:
    """The error for a deployment the state does not hold; where no state is at all, where it was looked for."""
    if not state_exists(backend):
        why = f"no state here: no deployment {name!r} was applied from this project"
        return InputError([Diagnostic(Location(backend.location), "", why, hint=no_state_hint(backend),
                                      code="unknown_deployment")])  # fmt: skip
    known = ", ".join(sorted(state.deployments)) or "none"
    return InputError([Diagnostic(Location("state"), "", f"no deployment named {name!r} in the state",
                                  hint=f"deployments: {known}", code="unknown_deployment")])  # fmt: skip


def unknown_hosts(
    unknown: list[tuple[str, int, str]], records: list[DeploymentRecord], inventory: str,
    backend: StateBackend | None,
) -> list[Diagnostic]:  # fmt: skip
    """Each replica on a host the inventory lacks, located where the state file names the host
    (file:line:column of deployments.NAME.replicas[I].host)."""
    source = None
    if isinstance(backend, LocalState) and backend.path.is_file():
        found, _ = parse_text(backend.path.read_text(errors="replace"), backend.location)
        source = found[0] if found else None
    out = []
    index = {d.name: d for d in records}
    for name, i, host in unknown:
        where = ("deployments", name, "replicas", i, "host")
        location = source.locate(where) if source is not None else Location(backend.location if backend else "state")
        replica = index[name].replicas[i].index
        out.append(Diagnostic(
            location, f"deployments.{name}.replicas[{i}].host",
            f"host {host!r}, where replica {replica} of {name} runs as the state records it, is not in the inventory "
            f"{inventory}",
            hint=f"pass the inventory {name} was applied with (--inventory, or --env NAME), or add {host} to it",
            code="unknown_host",
        ))  # fmt: skip
    return out
