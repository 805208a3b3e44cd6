"""State backends: where engine-ctl records what it did. The local JSON file is the default.

The recorded state's values live in the core (`engine_ctl.core.record`); this package holds the backends only
(the file, PostgreSQL), loaded on first use through its attributes, so importing it loads neither."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine_ctl.state.base import LockHeld, StateBackend
    from engine_ctl.state.local import LocalState
    from engine_ctl.state.postgres import PostgresState

_BACKENDS = {
    "LockHeld": "engine_ctl.state.base",
    "StateBackend": "engine_ctl.state.base",
    "LocalState": "engine_ctl.state.local",
    "PostgresState": "engine_ctl.state.postgres",
}


def __getattr__(name: str) -> Any:
    if name in _BACKENDS:
        return getattr(importlib.import_module(_BACKENDS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def open_backend(where: str | Path) -> StateBackend:
    """`postgresql://…[#name]` (or postgres://) for the PostgreSQL backend; anything else is a file path.
    Opening never fails: the first use says what is wrong (psycopg missing, the server unreachable)."""
    text = str(where)
    if text.startswith(("postgresql://", "postgres://")):
        from engine_ctl.state.postgres import PostgresState

        return PostgresState(text)
    from engine_ctl.state.local import LocalState

    return LocalState(Path(text))


__all__ = [
    "LocalState",
    "LockHeld",
    "PostgresState",
    "StateBackend",
    "open_backend",
]
