"""Request identities of the commands that change something (apply, restart, destroy): a ULID printed first
(`Request identity: <ULID> (reuse --request-id <ULID> to recover this command)`) and recorded in the state with
the steps the command completed. Run again with --request-id, a command that was cut off continues from what was
recorded, and one that finished reports its result and does nothing."""

from __future__ import annotations

from typing import Any

import click
from ulid import ULID

from engine_ctl.cli.output import console
from engine_ctl.core.diagnostics import Diagnostic, InputError, Location
from engine_ctl.state.model import ULID as ULID_FORM
from engine_ctl.state.model import RequestRecord, State


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


def announce(request_id: str, stderr: bool = False) -> None:
    """The first line of a command that changes something (on stderr under --json: stdout carries the events)."""
    line = f"Request identity: {request_id} (reuse --request-id {request_id} to recover this command)"
    console(stderr=stderr).print(line, markup=False, highlight=False, soft_wrap=True)


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
