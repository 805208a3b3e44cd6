"""What a state backend offers: read, atomic write (serial up by one), a lock that records who holds it.

Also what every backend says about a lock: who holds it, whether that holder is a process that has died on
this same machine (then the lock is stale), and the exact command that clears it."""

from __future__ import annotations

import contextlib
import datetime
import getpass
import os
import shlex
import socket
from typing import Protocol

from engine_ctl.core.record.model import LockInfo, State, StateError

BOOT_ID = "/proc/sys/kernel/random/boot_id"


class StateBackend(Protocol):
    location: str
    """Where the state is, for messages: a file path or a database and state name."""

    def read(self) -> State: ...

    def write(self, state: State) -> State: ...

    def lock_info(self) -> LockInfo | None: ...

    def lock(self, operation: str, timeout: float = 0.0) -> contextlib.AbstractContextManager[LockInfo]: ...

    def force_unlock(self, lock_id: str) -> LockInfo: ...

    def put(self, state: State, replacing: State) -> None:
        """Write `state` exactly as it is (its serial and lineage kept, as `state push` and `pull` move it), in
        place of `replacing` (what was read under the lock), leaving the replaced version as the backup."""
        ...


def who() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()} pid {os.getpid()}"


def now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def boot_id() -> str | None:
    """The kernel's ID of this boot: two locks with the same one were taken on the same machine, same boot."""
    try:
        with open(BOOT_ID) as f:
            return f.read().strip() or None
    except OSError:
        return None


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks since boot) of a process; None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except FileNotFoundError:
        return None
    fields = text.rpartition(")")[2].split()
    return fields[0], int(fields[19])


def process_start(pid: int) -> int | None:
    try:
        stat = _proc_stat(pid)
    except (OSError, ValueError, IndexError):
        return None
    return stat[1] if stat else None


def process_started_at(pid: int) -> float | None:
    """When a process started, in seconds since the epoch (None when not known, or there is no such process)."""
    start = process_start(pid)
    if start is None:
        return None
    try:
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
        return boot + start / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def writer_gone(pid: int, written: float) -> bool:
    """Whether the process `pid` that wrote a file at `written` (its mtime) is gone from this machine: no such
    process runs, or the pid is another process's now, started after the file was written (a reused pid).
    Never this process."""
    if pid == os.getpid():
        return False
    if not process_alive(pid):
        return True
    started = process_started_at(pid)
    return started is not None and started > written + 1


def process_alive(pid: int, start: int | None = None) -> bool:
    """Whether `pid` still runs here and is the same process (same start time, when known); a zombie is dead."""
    if pid <= 0:
        return False
    try:
        stat = _proc_stat(pid)
    except (OSError, ValueError, IndexError):  # no /proc as we know it: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    if stat is None:
        return False
    state, started = stat
    return state not in ("Z", "X") and (start is None or start == started)


def new_lock(lock_id: str, operation: str, path: str) -> LockInfo:
    """A lock for this process, with what tells later whether it still runs."""
    pid = os.getpid()
    return LockInfo(
        id=lock_id, operation=operation, who=who(), when=now(), path=path,
        host=socket.gethostname(), boot_id=boot_id(), pid=pid, pid_start=process_start(pid),
    )  # fmt: skip


def stale_reason(info: LockInfo) -> str | None:
    """Why the holder is known to be gone: same host name and boot as this process, and its pid not running.
    None when it may still run (or runs elsewhere, or the lock predates these fields)."""
    if info.host is None or info.boot_id is None or info.pid is None:
        return None
    if info.host != socket.gethostname() or info.boot_id != boot_id():
        return None
    if process_alive(info.pid, info.pid_start):
        return None
    return f"its process (pid {info.pid} on {info.host}, this machine, since this boot) is no longer running"


def unlock_command(lock_id: str, location: str) -> str:
    return f"engine-ctl force-unlock {shlex.quote(lock_id)} --state {shlex.quote(location)}"


class LockHeld(StateError):
    """Another holder has the lock; the message says who, whether it is stale, and how to clear it."""

    def __init__(
        self, info: LockInfo, location: str | None = None, lock_file: str | None = None, session: int | None = None
    ) -> None:
        """`session`: the database session (its server pid) that holds the lock, when the lock lives as long as
        its holder's connection: then the holder is alive, and the lock needs no clearing when it dies."""
        self.info = info
        self.stale = None if session is not None else stale_reason(info)
        clear = unlock_command(info.id, location) if location else f"engine-ctl force-unlock {info.id}"
        if session is not None:
            message = (
                f"the state is locked by {info.who} since {info.when} for `{info.operation}` (lock ID {info.id}); "
                "wait for it to finish, or pass --lock-timeout: the lock is released when that command ends, even "
                f"if it is killed (its database session, server pid {session}, holds it; if that command hangs, "
                f"ending the session releases it: SELECT pg_terminate_backend({session}))"
            )
        elif info.unreadable is not None:
            where = lock_file or "the lock"
            message = (
                f"the state is locked, but its lock file {where} is unreadable ({info.unreadable}), so who holds "
                f"it is unknown; if no engine-ctl command is running on this state, clear it with: {clear}"
            )
            if lock_file:
                message += f" (or: rm {shlex.quote(lock_file)})"
        elif self.stale is not None:
            message = (
                f"the state is locked by {info.who} since {info.when} for `{info.operation}` (lock ID {info.id}), "
                f"but the lock is stale: {self.stale}; clear it with: {clear}"
            )
        else:
            message = (
                f"the state is locked by {info.who} since {info.when} for `{info.operation}` (lock ID {info.id}); "
                f"wait for it to finish, pass --lock-timeout, or if it died: {clear}"
            )
        super().__init__(message)
