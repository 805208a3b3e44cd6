"""`engine-ctl state rm` and `state mv`: edits of the recorded state that touch no host. Values only: each takes a
state and returns a new one, or raises StateEditError saying why not (with a did-you-mean for a mistyped name)."""

from __future__ import annotations

import difflib

from engine_ctl.core.names import NAME_MESSAGE, deployment_name_ok, parse_unit_name
from engine_ctl.core.record.model import State, StateError


class StateEditError(StateError):
    """The edit is refused; `hint` says what to do instead."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


def did_you_mean(name: str, known: list[str]) -> str | None:
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}?" if close else None


def _known(state: State, name: str) -> None:
    if name in state.deployments:
        return
    names = sorted(state.deployments)
    hint = did_you_mean(name, names) or (f"deployments: {', '.join(names)}" if names else "the state is empty")
    raise StateEditError(f"no deployment named {name!r} in the state", hint)


def forget(state: State, name: str) -> State:
    """The state without deployment `name`; its units on the hosts are left as they are (unmanaged)."""
    _known(state, name)
    deployments = {k: v for k, v in state.deployments.items() if k != name}
    return state.model_copy(update={"deployments": deployments})


def rename(state: State, old: str, new: str) -> State:
    """The state with deployment `old`'s record under `new`. Its replicas keep the units they run (named after
    `old`, which the record keeps in `moved_from`): the next apply of a document named `new` replaces them, one
    at a time, with units of the new name."""
    _known(state, old)
    if not deployment_name_ok(new):
        raise StateEditError(f"{new!r} is not a deployment name ({NAME_MESSAGE})")
    if new == old:
        raise StateEditError(f"{old!r} and {new!r} are the same name; nothing to move")
    if new in state.deployments:
        raise StateEditError(
            f"the state already has a deployment named {new!r}; nothing was moved",
            f"`engine-ctl state rm {new}` first if its record should go",
        )
    record = state.deployments[old]
    named = {parse_unit_name(r.unit) for r in record.replicas}
    moved_from = sorted({n.deployment for n in named if n is not None} - {new})
    moved = record.model_copy(update={"name": new, "moved_from": moved_from})
    deployments = {k: v for k, v in state.deployments.items() if k != old}
    deployments[new] = moved
    return state.model_copy(update={"deployments": dict(sorted(deployments.items()))})


__all__ = ["StateEditError", "did_you_mean", "forget", "rename"]
