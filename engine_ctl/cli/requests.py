"""Request identities of the commands that change something (apply, restart, destroy): a ULID printed first
(`Request identity: <ULID> (reuse --request-id <ULID> to recover this command)`) and recorded in the state with
the steps the command completed. Run again with --request-id, a command that was cut off continues from what was
recorded, and one that finished reports its result and does nothing."""

from __future__ import annotations

import contextvars
import functools
import sys
from collections.abc import Callable
from typing import Any

import click
from ulid import ULID

from engine_ctl.cli.context import backend_for, state_exists
from engine_ctl.cli.views.output import console
from engine_ctl.core.diagnostics import Diagnostic, InputError, Location
from engine_ctl.core.record.model import REQUESTS_KEPT, RequestRecord, State, StateError
from engine_ctl.core.record.model import ULID as ULID_FORM
from engine_ctl.core.record.requests import begin, finish
from engine_ctl.state.base import StateBackend, now, who


def request_option(f: Any) -> Any:
    return click.option(
        "--request-id", "request_id", metavar="ULID",
        help="Recover the command printed with this request identity: one cut off (kill -9, a lost SSH "
        "connection, Ctrl-C) continues from what the state recorded, with no step done twice; one that finished "
        "reports its result and does nothing.",
    )(f)  # fmt: skip


def request_identity(given: str | None) -> str:
    """The ULID given with --request-id (refused unless it is one), or a new one."""
    if given is None:
        return str(ULID())
    if not ULID_FORM.fullmatch(given.upper()):
        raise InputError([Diagnostic(
            Location("--request-id"), "", f"{given!r} is not a request identity (a ULID: 26 characters of "
            "Crockford's base 32)", hint="pass the ULID a command printed after `Request identity:`",
            code="invalid_request_id",
        )])  # fmt: skip
    return given.upper()


def announce(request_id: str) -> None:
    """The first line of a command that changes something, on stderr: on a terminal it comes first, and stdout
    stays the command's result (the events under --json, what a verb did) for scripts."""
    line = f"Request identity: {request_id} (reuse --request-id {request_id} to recover this command)"
    console(stderr=True).print(line, markup=False, highlight=False, soft_wrap=True)


def recorded(state: State, request_id: str, command: str, location: str) -> RequestRecord | None:
    """The request as the state records it (None: new); refused when it was recorded for another command."""
    found = state.request(request_id)
    if found is not None and found.command != command:
        raise InputError([Diagnostic(
            Location(location), "", f"request {request_id} was recorded for `{found.command}`, not `{command}`; "
            "nothing was done", hint=f"rerun `{found.command} --request-id {request_id}`, or leave --request-id out "
            "for a new request", code="request_mismatch",
        )])  # fmt: skip
    return found


def report_finished(found: RequestRecord, stderr: bool = False) -> int:
    """A finished request run again: its result, and nothing done. Returns its exit status."""
    console(stderr=stderr).print(
        f"Request {found.id} (`{found.command}`) finished at {found.finished}: {found.result} (exit status "
        f"{found.exit_code}); nothing was done again", markup=False, highlight=False, soft_wrap=True,
    )  # fmt: skip
    return found.exit_code or 0


def report_continuing(found: RequestRecord, stderr: bool = False) -> None:
    console(stderr=stderr).print(
        f"Continuing request {found.id} (`{found.command}`, started {found.started} by {found.who}): "
        f"{len(found.steps)} step(s) it completed are not run again", markup=False, highlight=False, soft_wrap=True,
    )  # fmt: skip


def recorded_verb(verb: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """An operator verb (`stop|start|park|delete deployment NAME`) with its request identity: printed first,
    a finished request run again reports its result and does nothing, and the verb's outcome (its exit status) is
    recorded under it. A verb cut off is run again whole with the same identity (each verb is idempotent: a
    stop of a stopped deployment, a start of a started one, do nothing more)."""
    return recorded_command(lambda kw: f"{verb} deployment {kw['name']}", inline=False)


CURRENT: contextvars.ContextVar[str | None] = contextvars.ContextVar("engine_ctl_request", default=None)
"""The request identity of the state command running (state rm, state mv, import): its one write records it."""


def recorded_command(
    command_of: Callable[[dict[str, Any]], str | None], inline: bool
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """A command with its request identity (`command_of` its recorded form from its arguments; None: this run
    changes nothing, e.g. --dry-run). `inline`: the command's own state write records the request (with_request,
    one write); else it is recorded after the command with its exit status."""

    def wrap(f: Callable[..., None]) -> Callable[..., None]:
        @functools.wraps(f)
        def with_request_id(*args: Any, request_id: str | None = None, **kwargs: Any) -> None:
            command = command_of(kwargs)
            if command is None:
                f(*args, **kwargs)
                return
            rid = request_identity(request_id)
            announce(rid)
            backend = backend_for(kwargs.get("state_path"), kwargs.get("paths", ()))
            found = recorded(backend.read(), rid, command, backend.location) if request_id else None
            if found is not None and found.finished is not None:
                sys.exit(report_finished(found))
            if found is not None and not inline:  # a verb cut off: run again whole (each verb is idempotent)
                report_continuing(found, stderr=True)
            if inline:
                token = CURRENT.set(rid)
                try:
                    f(*args, **kwargs)
                finally:
                    CURRENT.reset(token)
                return
            _run_then_record(f, args, kwargs, backend, rid, command)

        return request_option(with_request_id)

    return wrap


def _run_then_record(
    f: Callable[..., None], args: Any, kwargs: Any, backend: StateBackend, rid: str, command: str
) -> None:
    code: int | None = 1
    try:
        f(*args, **kwargs)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        raise
    except KeyboardInterrupt:
        code = None  # cut off (Ctrl-C): recorded unfinished, so that --request-id runs it again
        raise
    finally:
        _record_verb(backend, rid, command, code)


def with_request(state: State, command: str, result: str) -> State:
    """`state` with the running state command's request (CURRENT) recorded, finished: in the command's one write."""
    rid = CURRENT.get()
    if rid is None or state.request(rid) is not None:
        return state
    done = RequestRecord(id=rid, command=command, who=who(), started=now(), finished=now(), result=result,
                         exit_code=0)  # fmt: skip
    return state.model_copy(update={"requests": [*state.requests, done][-REQUESTS_KEPT:]})


def _record_verb(backend: StateBackend, request_id: str, command: str, code: int | None) -> None:
    """The verb's request, finished with its exit status; None: cut off, recorded unfinished (a state that cannot be
    written is said, not raised)."""
    result = "done" if code == 0 else f"refused or failed (exit status {code})"
    if not state_exists(backend):  # a verb refused where no state is: none is made to record it
        return
    try:
        with backend.lock(f"{command} (request {request_id})", timeout=10):
            state = backend.read()
            begin(state, request_id, command, who(), now())
            if code is not None:
                finish(state, request_id, result, code, now())
            backend.write(state)
    except StateError as exc:
        console(stderr=True).print(f"error: request {request_id} was not recorded: {exc}", markup=False)
