"""The PostgreSQL state backend against a real PostgreSQL server (.ci/run starts one and sets
ENGINE_CTL_TEST_PG; without a server these tests fail, they never skip).

The lock is a session advisory lock: two real engine-ctl processes on one state, one holding the lock (an
`apply` waiting at its confirmation prompt on a pseudo-terminal), the other refused with who and since; the
holder killed with SIGKILL, and the next command going on at once, saying that the lock was stale."""

from __future__ import annotations

import json
import os
import pty
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from engine_ctl.state import LockHeld, PostgresState, open_backend
from engine_ctl.state.base import boot_id, process_start
from engine_ctl.state.postgres import advisory_key

from engine_ctl.core.record.model import DeploymentRecord, State, StateError
from tests.helpers import quickstart_copy, run

DSN = os.environ.get("ENGINE_CTL_TEST_PG", "postgresql:///engine_ctl_test")
ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "examples/quickstart"
ENV = {k: v for k, v in os.environ.items() if not k.startswith("ENGINE_CTL_")}


@pytest.fixture
def backend() -> Iterator[PostgresState]:
    b = open_backend(f"{DSN}#test-{uuid.uuid4().hex[:8]}")
    assert isinstance(b, PostgresState)
    yield b
    with psycopg.connect(b.dsn) as conn:
        for table in ("engine_ctl_state", "engine_ctl_state_history", "engine_ctl_lock"):
            conn.execute(f"DELETE FROM {table} WHERE name = %s", (b.name,))


def engine_ctl(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "engine_ctl", *args], capture_output=True, text=True, timeout=timeout, env=ENV, cwd=ROOT
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


@pytest.fixture
def holder(backend: PostgresState) -> Iterator[subprocess.Popen[str]]:
    """A real `engine-ctl apply` holding the state's lock: it waits at its confirmation prompt (stdin a terminal)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "engine_ctl", "apply", str(QUICKSTART), "--state", backend.location],
        stdin=slave, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV, cwd=ROOT,
    )  # fmt: skip
    os.close(slave)
    try:
        deadline = time.monotonic() + 60
        while backend.lock_info() is None:
            assert proc.poll() is None and time.monotonic() < deadline, "the holder never took the lock"
            time.sleep(0.1)
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        os.close(master)


DIE_HOLDING = (
    "import os, sys; from engine_ctl.state import open_backend; "
    "held = open_backend(sys.argv[1]).lock('apply'); held.__enter__(); os._exit(0)"
)


def die_holding_the_lock(backend: PostgresState) -> None:
    """A process that takes the lock and exits without releasing it (its row stays; its session ends)."""
    subprocess.run([sys.executable, "-c", DIE_HOLDING, backend.location], check=True, env=ENV)


def destroy(backend: PostgresState, *more: str) -> list[str]:
    """A writing command that needs no host: the state has no deployments, so it takes the lock and ends."""
    return [
        sys.executable, "-m", "engine_ctl", "destroy", "--inventory", str(QUICKSTART / "hosts.yaml"),
        "--state", backend.location, "--auto-approve", *more,
    ]  # fmt: skip


def test_roundtrip_serial_and_history(backend: PostgresState) -> None:
    assert backend.read().serial == 0
    first = backend.write(State())
    second = backend.write(first.model_copy(update={"deployments": {"a": DeploymentRecord(name="a")}}))
    assert (first.serial, second.serial) == (1, 2) and second.lineage == first.lineage
    again = backend.read()
    assert again.serial == 2 and again.deployments["a"].name == "a"
    import psycopg

    with psycopg.connect(backend.dsn) as conn:
        query = "SELECT serial FROM engine_ctl_state_history WHERE name = %s ORDER BY serial"
        serials = [r[0] for r in conn.execute(query, (backend.name,))]
    assert serials == [1]


def test_two_writers_from_the_same_serial_one_is_refused(backend: PostgresState) -> None:
    base = backend.write(State())
    backend.write(base)
    with pytest.raises(StateError, match="the state changed under this command"):
        backend.write(base)
    assert backend.read().serial == 2


def test_lock_records_who_and_when_and_force_unlock(backend: PostgresState) -> None:
    with backend.lock("apply") as info:
        with pytest.raises(LockHeld) as err, backend.lock("apply", timeout=0.3):
            pass
        assert info.id in str(err.value) and info.who in str(err.value)
        held = run("force-unlock", "wrong-id", "--state", f"{backend.dsn}#{backend.name}")
        assert held.exit_code == 1 and info.id in held.stderr
    assert backend.lock_info() is None


def test_a_newer_format_is_refused(backend: PostgresState) -> None:
    import psycopg

    backend.write(State())
    with psycopg.connect(backend.dsn) as conn:
        conn.execute("UPDATE engine_ctl_state SET format_version = 99 WHERE name = %s", (backend.name,))
    with pytest.raises(StateError, match="newer engine-ctl"):
        backend.read()


def test_the_location_never_shows_a_password() -> None:
    b = PostgresState("postgresql://ops:s3cret@db.example:5433/engine?sslmode=require#prod")
    assert b.location == "postgresql://ops@db.example:5433/engine?sslmode=require#prod"
    assert "s3cret" not in b.location


def test_plan_reads_its_state_from_postgres(backend: PostgresState, tmp_path: Path) -> None:
    quickstart = quickstart_copy(tmp_path)  # the tiny model in its models_dir: not Pending (that exits 1)
    result = run("plan", str(quickstart), "--state", f"{backend.dsn}#{backend.name}", "--detailed-exitcode")
    assert result.exit_code == 2, result.output
    assert "Plan: 1 to add, 0 to change, 0 to destroy." in result.stdout


def test_two_processes_the_second_is_refused_with_who_and_since(
    backend: PostgresState, holder: subprocess.Popen[str]
) -> None:
    held = backend.lock_info()
    assert held is not None and held.pid == holder.pid
    refused = engine_ctl("apply", str(QUICKSTART), "--state", backend.location, "--auto-approve")
    assert refused.returncode == 1
    # the holder's command, then the request identity it prints (Request identity: <ULID>), then the lock's ID
    lock_said = r"the state is locked by (.+?) since (\S+) for `apply \(request \w{26}\)` \(lock ID (\S+)\)"
    said = re.search(lock_said, refused.stderr)
    assert said is not None and said.groups() == (held.who, held.when, held.id), refused.stderr
    assert f"pid {holder.pid}" in held.who and "pg_terminate_backend(" in refused.stderr
    assert backend.lock_info() == held and holder.poll() is None  # the holder keeps its lock


def test_kill_9_of_the_holder_the_next_command_proceeds_at_once_and_says_the_lock_was_stale(
    backend: PostgresState, holder: subprocess.Popen[str]
) -> None:
    held = backend.lock_info()
    assert held is not None
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    assert backend.lock_info() == held  # the row is left behind …
    start = time.monotonic()
    after = engine_ctl(*destroy(backend)[3:])
    took = time.monotonic() - start
    assert after.returncode == 0, after.stdout + after.stderr  # … and no force-unlock is needed
    stale = [line for line in after.stderr.splitlines() if "was stale" in line]
    assert len(stale) == 1 and f"the state lock of {held.who} since {held.when}" in stale[0] and held.id in stale[0]
    assert took < 30, took
    assert backend.lock_info() is None
    (logged,) = backend.read().operations
    assert re.fullmatch(r"destroy \(request \w{26}\): cleared a stale lock", logged.command), logged.command
    assert held.id in (logged.result or "")


def test_lock_timeout_waits_on_the_lock_and_goes_on_when_the_holder_dies(
    backend: PostgresState, holder: subprocess.Popen[str]
) -> None:
    waiting = subprocess.Popen(
        destroy(backend, "--lock-timeout", "120"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
        cwd=ROOT,
    )  # fmt: skip
    try:
        time.sleep(4)
        assert waiting.poll() is None  # it waits, and is not refused
        os.kill(holder.pid, signal.SIGKILL)
        out, err = waiting.communicate(timeout=60)
    finally:
        if waiting.poll() is None:
            waiting.kill()
    assert waiting.returncode == 0, out + err
    assert "was stale" in err


def test_a_lock_timeout_that_runs_out_says_who_holds_it(backend: PostgresState) -> None:
    with backend.lock("apply") as info:
        start = time.monotonic()
        refused = engine_ctl(*destroy(backend, "--lock-timeout", "2")[3:])
        assert refused.returncode == 1 and f"since {info.when} for `apply` (lock ID {info.id})" in refused.stderr
        assert time.monotonic() - start >= 2


def test_force_unlock_of_a_live_holder_is_refused_and_says_how_its_lock_ends(backend: PostgresState) -> None:
    with backend.lock("apply") as info:
        refused = run("force-unlock", info.id, "--state", backend.location)
        assert refused.exit_code == 1 and "held by a live database session" in refused.stderr
        assert "pg_terminate_backend(" in refused.stderr
        assert backend.lock_info() == info
    assert backend.lock_info() is None


def test_force_unlock_clears_the_row_of_a_holder_that_died(backend: PostgresState) -> None:
    die_holding_the_lock(backend)
    held = backend.lock_info()
    assert held is not None
    assert run("force-unlock", held.id, "--state", backend.location).exit_code == 0
    assert backend.lock_info() is None


def test_the_stale_lock_is_logged_by_the_commands_first_write_not_a_write_of_its_own(
    backend: PostgresState, capsys: pytest.CaptureFixture[str]
) -> None:
    """A saved plan made before the holder died still sees the serial it was made at: the note rides along."""
    first = backend.write(State())
    die_holding_the_lock(backend)
    with backend.lock("apply"):
        assert backend.read().serial == first.serial  # nothing written yet: a plan's serial check still holds
        written = backend.write(first)
    assert "was stale" in capsys.readouterr().err
    again = backend.read()
    assert again.serial == written.serial == 2 and [o.command for o in again.operations] == [
        "apply: cleared a stale lock"
    ]


def test_a_lock_whose_session_is_lost_writes_nothing(backend: PostgresState) -> None:
    """The server ended the lock's session (a network cut, a restart): the next write is refused, never made
    without the lock, and another command can take the lock at once."""
    backend.write(State())
    with backend.lock("apply"):
        with psycopg.connect(backend.dsn, autocommit=True) as conn:
            row = conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (f"engine-ctl lock {backend.name}",)
            ).fetchone()
            assert row is not None
            conn.execute("SELECT pg_terminate_backend(%s)", (row[0],))
        time.sleep(0.5)
        with pytest.raises(StateError, match="the state lock was lost"):
            backend.write(backend.read())
        other = open_backend(backend.location)
        with other.lock("apply", timeout=5):
            pass
    assert backend.read().serial == 2  # only the other command's note of the stale row it cleared


def test_an_advisory_lock_without_its_row_is_refused_after_a_grace(backend: PostgresState) -> None:
    """A holder that has taken the lock but not yet written its row (or is releasing it)."""
    backend.lock_info()  # the tables
    with psycopg.connect(backend.dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (advisory_key(backend.name),))
        start = time.monotonic()
        with pytest.raises(StateError, match="no lock row says who yet"), backend.lock("apply"):
            pass
        assert time.monotonic() - start >= 2


def test_a_row_lock_of_an_older_engine_ctl_is_still_a_lock_and_lock_timeout_waits_for_it(
    backend: PostgresState,
) -> None:
    """An engine-ctl from before advisory locks holds the state with its row alone (no database session in it)."""
    backend.lock_info()  # the tables
    holder = {
        "host": socket.gethostname(),
        "boot_id": boot_id(),
        "pid": os.getpid(),
        "pid_start": process_start(os.getpid()),
    }
    with psycopg.connect(backend.dsn) as conn:
        conn.execute(
            "INSERT INTO engine_ctl_lock (name, id, operation, who, since, holder) "
            "VALUES (%s, 'old-one', 'apply', 'ops@box', 'then', %s)",
            (backend.name, json.dumps(holder)),
        )
    with pytest.raises(LockHeld, match="locked by ops@box since then") as err, backend.lock("apply"):
        pass
    assert err.value.stale is None

    def release_in_a_second() -> None:
        time.sleep(1)
        with psycopg.connect(backend.dsn) as conn:
            conn.execute("DELETE FROM engine_ctl_lock WHERE name = %s", (backend.name,))

    releaser = threading.Thread(target=release_in_a_second)
    releaser.start()
    with backend.lock("apply", timeout=30) as mine:
        assert backend.lock_info() == mine
    releaser.join()
