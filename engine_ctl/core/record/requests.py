"""Request identities in the state: each command that changes something is recorded under its ULID, with the
steps it completed, so that a re-run with --request-id continues where it was cut off and does no step twice, and
a re-run of a finished one reports its result and does nothing. Pure functions on a State (values only)."""

from __future__ import annotations

from engine_ctl.core.record.model import REQUESTS_KEPT, RequestRecord, State


def begin(state: State, request_id: str, command: str, who: str, when: str) -> None:
    """The request's record, created (and the oldest beyond REQUESTS_KEPT dropped) when it is new."""
    if state.request(request_id) is None:
        state.requests.append(RequestRecord(id=request_id, command=command, who=who, started=when))
        del state.requests[:-REQUESTS_KEPT]


def step_done(state: State, request_id: str, step: str) -> None:
    found = state.request(request_id)
    if found is not None and step not in found.steps:
        found.steps.append(step)


def finish(state: State, request_id: str, result: str, exit_code: int, when: str) -> None:
    found = state.request(request_id)
    if found is not None:
        found.finished, found.result, found.exit_code = when, result, exit_code


def done_steps(state: State, request_id: str | None) -> frozenset[str]:
    found = state.request(request_id) if request_id else None
    return frozenset(found.steps) if found else frozenset()
