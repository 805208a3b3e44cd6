"""State backends: where engine-ctl records what it did. The local JSON file is the default."""

from engine_ctl.state.local import LocalState, LockHeld
from engine_ctl.state.model import (
    DeploymentRecord,
    HostRecord,
    LockInfo,
    Operation,
    ReplicaRecord,
    State,
    StateError,
)

__all__ = [
    "DeploymentRecord",
    "HostRecord",
    "LocalState",
    "LockHeld",
    "LockInfo",
    "Operation",
    "ReplicaRecord",
    "State",
    "StateError",
]
