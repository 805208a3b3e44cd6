"""State backends: where engine-ctl records what it did. The local JSON file is the default."""

from pathlib import Path

from engine_ctl.state.base import LockHeld, StateBackend
from engine_ctl.state.local import LocalState
from engine_ctl.state.model import (
    DeploymentRecord,
    HostRecord,
    LockInfo,
    Operation,
    ReplicaRecord,
    State,
    StateError,
)
from engine_ctl.state.postgres import PostgresState


def open_backend(where: str | Path) -> StateBackend:
    """`postgresql://…[#name]` (or postgres://) for the PostgreSQL backend; anything else is a file path.
    Opening never fails: the first use says what is wrong (psycopg missing, the server unreachable)."""
    text = str(where)
    if text.startswith(("postgresql://", "postgres://")):
        return PostgresState(text)
    return LocalState(Path(text))


__all__ = [
    "DeploymentRecord",
    "HostRecord",
    "LocalState",
    "LockHeld",
    "LockInfo",
    "Operation",
    "PostgresState",
    "ReplicaRecord",
    "State",
    "StateBackend",
    "StateError",
    "open_backend",
]
