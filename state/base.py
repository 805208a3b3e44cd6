"""What a state backend offers: read, atomic write (serial up by one), a lock that records who holds it."""

from __future__ import annotations

import contextlib
from typing import Protocol

from engine_ctl.state.model import LockInfo, State


class StateBackend(Protocol):
    location: str
    """Where the state is, for messages: a file path or a database and state name."""

    def read(self) -> State: ...

    def write(self, state: State) -> State: ...

    def lock_info(self) -> LockInfo | None: ...

    def lock(self, operation: str, timeout: float = 0.0) -> contextlib.AbstractContextManager[LockInfo]: ...

    def force_unlock(self, lock_id: str) -> LockInfo: ...
