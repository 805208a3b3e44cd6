"""The local state file: atomic writes (temporary file, fsync, rename), a backup of the previous state,
and a lock.

The lock is the kernel's: an exclusive `flock` on `<state>.flock`, which the kernel releases when its holder
dies, however it dies (kill -9 included), as Terraform's local lock does. Beside it, `<state>.lock` says who holds
it (command, user, host, pid, since when). A `.lock` file left by a command that died on this machine is
cleared by the next command, which says so and goes on at once; one whose holder is alive, or runs on another
machine (a state on a shared file system), is refused with who holds it.

A state file reached through a symlink is locked, backed up and written where it really is, so the link stays
a link and two commands through different paths to one file exclude each other."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import stat
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from engine_ctl.state.base import LockHeld, new_lock, now, stale_reason, unlock_command, who, writer_gone
from pydantic import ValidationError

from engine_ctl import __version__
from engine_ctl.core.jsonbounds import MAX_STATE_BYTES, JsonBoundError, bounded_json_bytes
from engine_ctl.core.record.model import FORMAT_VERSION, LockInfo, State, StateError, parse_state

DEFAULT_NAME = "engine-ctl.state.json"
LEFTOVER_AGE_S = 60.0
"""A temporary file of a writer that is gone is removed once it is this old: a writer's own temporary file lives
for milliseconds (written, synced, renamed), so one this old was left by a kill between the write and the rename."""
UNREADABLE_PREFIX = "unreadable-"
"""The ID of a lock file that cannot be read: this prefix and the first 12 hex digits of the sha256 of its
bytes, so `force-unlock` clears exactly the file that was reported, never one written since."""


def unreadable_id(data: bytes) -> str:
    return UNREADABLE_PREFIX + hashlib.sha256(data).hexdigest()[:12]


def real_path(path: Path) -> Path:
    """The file itself when `path` is (or goes through) a symlink; `path` unchanged otherwise."""
    real = Path(os.path.realpath(path))
    return path if real == Path(os.path.abspath(path)) else real


def writable(state: State, location: str) -> None:
    """Never write a state this engine-ctl would refuse to read back."""
    try:
        parse_state(state.model_dump(mode="json"), location)
    except StateError as exc:
        raise StateError(f"refusing to write a state it could not read back (a bug in engine-ctl): {exc}") from None


def private(path: Path) -> IO[str]:
    """A new file (replacing any at `path`) that only its owner may read or write (0600)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    return os.fdopen(fd, "w")


class LocalState:
    """A JSON file beside the documents (engine-ctl.state.json), its backup and its lock."""

    def __init__(self, path: Path) -> None:
        self.given = path
        self.path = real_path(path)
        self.location = str(path) if self.path == path else f"{path} (→ {self.path})"
        self.backup = self.path.with_name(self.path.name + ".backup")
        self.lock_path = self.path.with_name(self.path.name + ".lock")
        self.kernel_lock_path = self.path.with_name(self.path.name + ".flock")

    def recovery(self) -> str | None:
        """Where the previous state is, only when there is one to name."""
        if not self.backup.is_file():
            return None
        return f"The previous state is in {self.backup}; to go back to it: cp {self.backup} {self.path}"

    def _then(self) -> str:
        recovery = self.recovery()
        return f". {recovery}" if recovery else ""

    def read(self) -> State:
        if not self.path.exists():
            return State(engine_ctl_version=__version__)
        try:
            with open(self.path, "rb") as f:  # never more than a state may be, whatever the file's size
                raw = bounded_json_bytes(f.read(MAX_STATE_BYTES + 1), "state", MAX_STATE_BYTES)
        except JsonBoundError as exc:
            where = f"{self.path}:{exc.line}:{exc.column}" if exc.line is not None else str(self.path)
            raise StateError(f"{where}: cannot read the state: {exc.message}" + self._then()) from None
        except (OSError, ValueError) as exc:  # not UTF-8, not JSON (or a number past Python's digits limit)
            raise StateError(f"{self.path}: cannot read the state ({exc})" + self._then()) from None
        version = raw.get("format_version") if isinstance(raw, dict) else None
        if not isinstance(version, int):
            raise StateError(f"{self.path}: not an engine-ctl state file (no format_version)")
        if version > FORMAT_VERSION:
            raise StateError(
                f"{self.path}: written by a newer engine-ctl (state format {version}, this one reads "
                f"{FORMAT_VERSION} and older); upgrade engine-ctl. The file was not changed."
            )
        return parse_state(raw, str(self.path), self.recovery())

    def write(self, state: State) -> State:
        """Write atomically with a backup of the previous state; the serial goes up by one."""
        new = state.model_copy(update={"serial": state.serial + 1, "engine_ctl_version": __version__})
        self._store(new)
        return new

    def put(self, state: State, replacing: State) -> None:
        """Write `state` as it is (serial and lineage kept), with the file it replaces as the backup. The caller
        holds the lock and read `replacing` under it, so nobody else wrote in between."""
        self._store(state)

    def _store(self, new: State) -> None:
        writable(new, self.location)
        data = json.dumps(new.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        backup_tmp = self.backup.with_name(f".{self.backup.name}.{os.getpid()}.tmp")
        try:
            with private(tmp) as f:  # hosts, addresses, ports, key names: its owner's only
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            if self.path.exists():
                shutil.copyfile(self.path, backup_tmp)
                os.chmod(backup_tmp, 0o600)
                os.replace(backup_tmp, self.backup)
        except OSError as exc:  # a full disk: the state stays the last one written whole, and no half file is left
            for left in (tmp, backup_tmp):
                left.unlink(missing_ok=True)
            raise OSError(exc.errno, exc.strerror, str(self.path.parent)) from exc
        os.replace(tmp, self.path)
        dir_fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def _temporary(self) -> re.Pattern[str]:
        """The names of this state's temporary files: .NAME.<pid>.tmp, .NAME.backup.<pid>.tmp (the state and its
        backup, written under the lock) and .NAME.lock.<pid>.<id>.tmp (a lock file being created)."""
        names = "|".join(re.escape(p.name) for p in (self.path, self.backup, self.lock_path))
        return re.compile(rf"\.(?:{names})\.([1-9][0-9]{{0,9}})(?:\.[0-9a-f]{{1,8}})?\.tmp")

    def clean_leftovers(self, age_s: float = LEFTOVER_AGE_S) -> list[Path]:
        """Remove the temporary files that writers killed between a write and its rename left beside the state:
        only those whose writer (the pid in the name) no longer runs on this machine (or whose pid another process
        took since), older than `age_s`, and plain files. Called under the lock, so no writer that respects it is
        between a write and a rename. Returns what was removed."""
        pattern, removed = self._temporary(), []
        try:
            entries = list(os.scandir(self.path.parent))
        except OSError:
            return []
        for entry in entries:
            m = pattern.fullmatch(entry.name)
            if m is None:
                continue
            try:
                st = entry.stat(follow_symlinks=False)
                if not stat.S_ISREG(st.st_mode) or time.time() - st.st_mtime < age_s:
                    continue
                if writer_gone(int(m[1]), st.st_mtime):
                    os.unlink(entry.path)
                    removed.append(Path(entry.path))
            except OSError:
                continue
        return removed

    def lock_info(self) -> LockInfo | None:
        """Who holds the lock; None when nobody does. A lock file that cannot be read is reported as such,
        with an ID (unreadable-…) that force-unlock accepts."""
        try:
            data = self.lock_path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            return self._unreadable(b"", exc.strerror or str(exc))
        try:
            return LockInfo.model_validate_json(data)
        except (ValidationError, ValueError):
            return self._unreadable(data, "empty" if not data.strip() else "not an engine-ctl lock")

    def _unreadable(self, data: bytes, why: str) -> LockInfo:
        try:
            since = time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(self.lock_path.stat().st_mtime))
        except OSError:
            since = "?"
        return LockInfo(
            id=unreadable_id(data), operation="unknown", who=f"an unreadable lock file ({why})", when=since,
            path=str(self.path), unreadable=why,
        )  # fmt: skip

    def _held(self, info: LockInfo) -> LockHeld:
        return LockHeld(info, str(self.path), str(self.lock_path))

    def _create_lock_file(self, info: LockInfo) -> bool:
        """Create the lock file with its content in one step (a hard link of a complete file), so nobody ever
        sees it empty; False when it exists already."""
        tmp = self.lock_path.with_name(f".{self.lock_path.name}.{os.getpid()}.{info.id[:8]}.tmp")
        try:
            with open(tmp, "w") as f:
                f.write(info.model_dump_json(exclude_none=True))
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:  # a full disk: no half file left behind
            tmp.unlink(missing_ok=True)
            raise OSError(exc.errno, exc.strerror, str(self.path.parent)) from exc
        try:
            os.link(tmp, self.lock_path)
            return True
        except FileExistsError:
            return False
        finally:
            tmp.unlink(missing_ok=True)

    def _kernel_lock(self, deadline: float) -> int:
        """The kernel's lock on <state>.flock (a file never deleted), waiting until `deadline`; LockHeld with the
        holder's information when a live process holds it."""
        fd = os.open(self.kernel_lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except BlockingIOError:
                held = self.lock_info()
                if time.monotonic() >= deadline and held is not None:
                    os.close(fd)
                    raise self._held(held) from None
                time.sleep(0.1)

    def _clear_stale(self, held: LockInfo, why: str) -> None:
        """The .lock file of a command that died here: the kernel's lock is free, so nobody holds the state."""
        with contextlib.suppress(FileNotFoundError):
            self.lock_path.unlink()
        print(
            f"warning: the state lock of {held.who} since {held.when} for `{held.operation}` (lock ID {held.id}) "
            f"was stale ({why}); cleared it and went on",
            file=sys.stderr,
        )

    @contextlib.contextmanager
    def lock(self, operation: str, timeout: float = 0.0) -> Iterator[LockInfo]:
        info = new_lock(str(uuid.uuid4()), operation, str(self.path))
        deadline = time.monotonic() + timeout
        self.lock_path.parent.mkdir(parents=True, exist_ok=True)
        kernel = self._kernel_lock(deadline)
        try:
            while not self._create_lock_file(info):
                held = self.lock_info()
                if held is None:  # released between the two looks: try again at once
                    continue
                why = stale_reason(held)
                if why is not None:  # its holder died on this machine: the kernel lock we hold proves it
                    self._clear_stale(held, why)
                    continue
                if time.monotonic() >= deadline:  # alive (an older engine-ctl) or on another machine
                    raise self._held(held)
                time.sleep(0.2)
            try:
                self.clean_leftovers()
                yield info
            finally:
                current = self.lock_info()
                if current is not None and current.id == info.id:
                    self.lock_path.unlink(missing_ok=True)
        finally:
            os.close(kernel)  # the kernel's lock goes with its descriptor

    def force_unlock(self, lock_id: str) -> LockInfo:
        held = self.lock_info()
        if held is None:
            raise StateError(f"{self.path}: the state is not locked (there is no {self.lock_path})")
        if held.id != lock_id:
            raise StateError(
                f"the lock's ID is {held.id} (held by {held.who} since {held.when}), not {lock_id}; "
                f"to clear it, once its command is no longer running: {unlock_command(held.id, str(self.path))}"
            )
        self.lock_path.unlink()
        return held


__all__ = ["DEFAULT_NAME", "LocalState", "LockHeld", "now", "who"]
