"""The local state's temporary files after a kill (issue 24, point 16): a writer killed between its temporary
write and the rename leaves `.engine-ctl.state.json.<pid>.tmp`; the next command that takes the lock removes it,
and never a temporary file of a process that still runs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from engine_ctl.state.local import LEFTOVER_AGE_S, LocalState

from engine_ctl.core.record.model import State

KILLED_AT_RENAME = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    from engine_ctl.core.record.model import State
    from engine_ctl.state.local import LocalState

    backend = LocalState(Path(sys.argv[1]))
    real = os.replace

    def replace(src, dst):
        if Path(dst) == backend.path:  # the state's own rename: killed just before it
            os.kill(os.getpid(), signal.SIGKILL)
        real(src, dst)

    os.replace = replace
    with backend.lock("apply"):
        backend.write(backend.read())
    """
)


def _old(path: Path, seconds: float = LEFTOVER_AGE_S + 60) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_writer_killed_before_its_rename_leaves_a_temporary_file_the_next_lock_removes(tmp_path: Path) -> None:
    backend = LocalState(tmp_path / "engine-ctl.state.json")
    first = backend.write(State())
    killed = subprocess.Popen([sys.executable, "-c", KILLED_AT_RENAME, str(backend.path)])
    assert killed.wait(60) == -signal.SIGKILL
    left = [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert [p.name for p in left] == [f".engine-ctl.state.json.{killed.pid}.tmp"]
    assert backend.read().serial == first.serial  # the state itself is whole: the previous one
    held = backend.lock_info()
    assert held is not None
    backend.force_unlock(held.id)  # the killed command's stale lock, cleared as its message says
    _old(left[0])
    with backend.lock("plan"):
        pass
    assert not left[0].exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "engine-ctl.state.json",
        "engine-ctl.state.json.backup",
        "engine-ctl.state.json.flock",  # the kernel lock
    ]


def test_only_the_temporary_files_of_writers_that_are_gone_are_removed(tmp_path: Path) -> None:
    backend = LocalState(tmp_path / "engine-ctl.state.json")
    backend.write(State())
    dead = _dead_pid()
    live = subprocess.Popen(["sleep", "60"])  # started now: a file older than it is not its own (a reused pid)
    try:
        files = {
            "dead, old": tmp_path / f".engine-ctl.state.json.{dead}.tmp",
            "dead backup, old": tmp_path / f".engine-ctl.state.json.backup.{dead}.tmp",
            "dead lock, old": tmp_path / f".engine-ctl.state.json.lock.{dead}.0a1b2c3d.tmp",
            "reused pid, old": tmp_path / f".engine-ctl.state.json.{live.pid}.tmp",
            "dead, fresh": tmp_path / f".engine-ctl.state.json.lock.{dead}.ffffffff.tmp",
            "running since boot (pid 1), old": tmp_path / ".engine-ctl.state.json.1.tmp",
            "this process, old": tmp_path / f".engine-ctl.state.json.{os.getpid()}.tmp",
            "another state's": tmp_path / f".other.state.json.{dead}.tmp",
        }
        for what, path in files.items():
            path.write_text("{}")
            if what.endswith("old") or what == "another state's":
                _old(path)
        link = tmp_path / f".engine-ctl.state.json.backup.{dead}.0.tmp"
        os.symlink(tmp_path / "elsewhere", link)
        removed = backend.clean_leftovers()
        gone = {what for what, path in files.items() if not path.exists()}
        assert gone == {"dead, old", "dead backup, old", "dead lock, old", "reused pid, old"}
        assert sorted(removed) == sorted(files[w] for w in gone)
        assert link.is_symlink()  # never a link
    finally:
        live.kill()
        live.wait()


def test_the_state_and_its_backup_are_their_owners_only(tmp_path: Path) -> None:
    """The state names hosts, addresses, ports and key names: 0600, its backup too, whatever the umask."""
    backend = LocalState(tmp_path / "engine-ctl.state.json")
    old = os.umask(0o022)
    try:
        backend.write(State())
        backend.path.chmod(0o644)  # an older engine-ctl's file
        backend.write(backend.read())
    finally:
        os.umask(old)
    assert backend.path.stat().st_mode & 0o777 == 0o600
    assert backend.backup.stat().st_mode & 0o777 == 0o600


def test_a_full_disk_leaves_the_state_whole_no_half_file_and_a_clear_error(tmp_path: Path) -> None:
    """A 64 KiB file system (a real tmpfs), filled: the write fails, the state on disk is the last one written whole,
    no temporary file is left to eat what little space is left, and the CLI says where and what to do (before:
    "internal error … this is a bug in engine-ctl", and a .tmp file left by each try; a probe, session 15)."""
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], check=True)
    try:
        backend = LocalState(mount / "engine-ctl.state.json")
        with backend.lock("apply"):
            first = backend.write(State(lineage="full-disk"))
        kept = (mount / "engine-ctl.state.json").read_bytes()
        subprocess.run(["sh", "-c", f"head -c 10M /dev/zero > {mount}/filler"], check=False)  # fills it
        bigger = first.model_copy(update={"operations": []})
        try:
            with backend.lock("apply"):
                backend.write(bigger.model_copy(update={"serial": first.serial}))
            raised = None
        except OSError as exc:
            raised = exc
        assert raised is not None and raised.errno == 28, raised  # ENOSPC
        assert (mount / "engine-ctl.state.json").read_bytes() == kept
        assert sorted(p.name for p in mount.iterdir() if p.name.endswith(".tmp")) == []
        state = str(mount / "engine-ctl.state.json")
        listed = subprocess.run([sys.executable, "-m", "engine_ctl", "state", "rm", "nothing", "--state", state],
                                capture_output=True, text=True, timeout=60)  # fmt: skip
        assert "Traceback" not in listed.stderr and "internal error" not in listed.stderr, listed.stderr
        assert listed.returncode == 1 and f"error: {mount}: No space left on device; this command stopped there" in \
            listed.stderr and "hint: free space there" in listed.stderr, listed.stderr  # fmt: skip
    finally:
        subprocess.run(["umount", str(mount)], check=True)
