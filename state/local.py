"""The local state file: atomic writes (temporary file, fsync, rename), a backup of the previous state,
and a lock file that records who holds it."""

from __future__ import annotations

import contextlib
import datetime
import getpass
import json
import os
import shutil
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from engine_ctl.state.model import FORMAT_VERSION, LockInfo, State, StateError
from pydantic import ValidationError

from engine_ctl import __version__

DEFAULT_NAME = "engine-ctl.state.json"


class LockHeld(StateError):
    def __init__(self, info: LockInfo) -> None:
        self.info = info
        super().__init__(
            f"the state is locked by {info.who} since {info.when} for `{info.operation}` (lock ID {info.id}); "
            f"wait for it to finish, pass --lock-timeout, or if it died: engine-ctl force-unlock {info.id}"
        )


def who() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()} pid {os.getpid()}"


def now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


class LocalState:
    """A JSON file beside the documents (engine-ctl.state.json), its backup and its lock."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.location = str(path)
        self.backup = path.with_name(path.name + ".backup")
        self.lock_path = path.with_name(path.name + ".lock")

    def read(self) -> State:
        if not self.path.exists():
            return State(engine_ctl_version=__version__)
        try:
            raw = json.loads(self.path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise StateError(
                f"{self.path}: cannot read the state ({exc}); the previous state is in {self.backup}"
            ) from None
        version = raw.get("format_version") if isinstance(raw, dict) else None
        if not isinstance(version, int):
            raise StateError(f"{self.path}: not an engine-ctl state file (no format_version)")
        if version > FORMAT_VERSION:
            raise StateError(
                f"{self.path}: written by a newer engine-ctl (state format {version}, this one reads "
                f"{FORMAT_VERSION} and older); upgrade engine-ctl. The file was not changed."
            )
        try:
            return State.model_validate(raw)
        except ValidationError as exc:
            raise StateError(f"{self.path}: the state does not match its format: {exc.errors()[0]['msg']}") from None

    def write(self, state: State) -> State:
        """Write atomically with a backup of the previous state; the serial goes up by one."""
        new = state.model_copy(update={"serial": state.serial + 1, "engine_ctl_version": __version__})
        data = json.dumps(new.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        with open(tmp, "w") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if self.path.exists():
            backup_tmp = self.backup.with_name(f".{self.backup.name}.{os.getpid()}.tmp")
            shutil.copyfile(self.path, backup_tmp)
            os.replace(backup_tmp, self.backup)
        os.replace(tmp, self.path)
        dir_fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        return new

    def lock_info(self) -> LockInfo | None:
        try:
            return LockInfo.model_validate_json(self.lock_path.read_text())
        except (OSError, ValidationError, ValueError):
            return None

    @contextlib.contextmanager
    def lock(self, operation: str, timeout: float = 0.0) -> Iterator[LockInfo]:
        info = LockInfo(id=str(uuid.uuid4()), operation=operation, who=who(), when=now(), path=str(self.path))
        deadline = time.monotonic() + timeout
        self.lock_path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            try:
                fd = os.open(self.lock_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                break
            except FileExistsError:
                held = self.lock_info()
                if time.monotonic() >= deadline:
                    raise LockHeld(held or LockInfo(id="?", operation="?", who="?", when="?")) from None
                time.sleep(0.2)
        with os.fdopen(fd, "w") as f:
            f.write(info.model_dump_json())
        try:
            yield info
        finally:
            current = self.lock_info()
            if current is not None and current.id == info.id:
                self.lock_path.unlink(missing_ok=True)

    def force_unlock(self, lock_id: str) -> LockInfo:
        held = self.lock_info()
        if held is None:
            raise StateError(f"{self.path}: the state is not locked")
        if held.id != lock_id:
            raise StateError(f"the lock's ID is {held.id} (held by {held.who} since {held.when}), not {lock_id}")
        self.lock_path.unlink()
        return held
