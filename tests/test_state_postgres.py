"""The PostgreSQL state backend against a real PostgreSQL server (.ci/run starts one and sets
ENGINE_CTL_TEST_PG; without a server these tests fail, they never skip)."""

from __future__ import annotations

import os
import uuid

import pytest
from engine_ctl.state import LockHeld, PostgresState, State, StateError, open_backend
from engine_ctl.state.model import DeploymentRecord

from tests.helpers import run

DSN = os.environ.get("ENGINE_CTL_TEST_PG", "postgresql:///engine_ctl_test")


@pytest.fixture
def backend() -> PostgresState:
    b = open_backend(f"{DSN}#test-{uuid.uuid4().hex[:8]}")
    assert isinstance(b, PostgresState)
    return b


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


def test_plan_reads_its_state_from_postgres(backend: PostgresState) -> None:
    from pathlib import Path

    quickstart = Path(__file__).resolve().parents[1] / "examples/quickstart"
    result = run("plan", str(quickstart), "--state", f"{backend.dsn}#{backend.name}", "--detailed-exitcode")
    assert result.exit_code == 2, result.output
    assert "Plan: 1 to add, 0 to change, 0 to destroy." in result.stdout
