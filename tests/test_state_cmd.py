"""`engine-ctl state rm`, `state mv` and `state history` through the real CLI, on the local state file and on a
real PostgreSQL state (ENGINE_CTL_TEST_PG; .ci/run starts the server): locked, backed up, logged, refused
clearly."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from engine_ctl.state import LocalState, PostgresState, StateBackend, open_backend

from engine_ctl.core.record.model import DeploymentRecord, ReplicaRecord, State
from tests.helpers import run

DSN = os.environ.get("ENGINE_CTL_TEST_PG", "postgresql:///engine_ctl_test")


def record(name: str, hosts: tuple[str, ...] = ("h1", "h2")) -> DeploymentRecord:
    replicas = [
        ReplicaRecord(
            index=i,
            host=h,
            unit=f"engine-ctl-{name}-{i}a.service",
            port=8000 + i,
            unit_sha256="a" * 64,
            revision=2,
            status="serving",
        )
        for i, h in enumerate(hosts)
    ]
    return DeploymentRecord(name=name, revision=2, state="Ready", replicas=replicas)


def seeded(backend: StateBackend) -> State:
    with backend.lock("test"):
        return backend.write(State(deployments={"chat": record("chat"), "search": record("search", ("h3",))}))


@pytest.fixture
def local(tmp_path: Path) -> LocalState:
    return LocalState(tmp_path / "engine-ctl.state.json")


@pytest.fixture
def postgres() -> Iterator[PostgresState]:
    b = open_backend(f"{DSN}#test-{uuid.uuid4().hex[:8]}")
    assert isinstance(b, PostgresState)
    yield b
    with psycopg.connect(b.dsn) as conn:
        for table in ("engine_ctl_state", "engine_ctl_state_history", "engine_ctl_lock"):
            conn.execute(f"DELETE FROM {table} WHERE name = %s", (b.name,))


def where(backend: StateBackend) -> str:
    return str(backend.path) if isinstance(backend, LocalState) else f"{backend.dsn}#{backend.name}"


def previous(backend: StateBackend) -> State:
    """The backup: the file's .backup, or the version PostgreSQL's history table kept."""
    if isinstance(backend, LocalState):
        return State.model_validate_json(backend.backup.read_text())
    assert isinstance(backend, PostgresState)
    with psycopg.connect(backend.dsn) as conn:
        row = conn.execute(
            "SELECT body FROM engine_ctl_state_history WHERE name = %s ORDER BY serial DESC LIMIT 1", (backend.name,)
        ).fetchone()
    assert row is not None
    return State.model_validate(row[0])


@pytest.mark.parametrize("kind", ["local", "postgres"])
def test_state_rm_forgets_a_deployment_with_a_backup_and_a_log_entry(kind: str, request: pytest.FixtureRequest) -> None:
    backend: StateBackend = request.getfixturevalue(kind)
    before = seeded(backend)
    result = run("state", "rm", "chat", "--state", where(backend))
    assert result.exit_code == 0, result.output
    assert "Removed chat from the state" in result.output and "no host was touched" in result.output
    assert "engine-ctl-chat-0a.service on h1 keeps running, unmanaged" in result.output
    after = backend.read()
    assert list(after.deployments) == ["search"] and after.serial == before.serial + 1
    assert after.lineage == before.lineage
    assert "chat" in previous(backend).deployments  # the backup holds what was removed
    (op,) = after.operations
    assert op.command == "state rm chat" and "engine-ctl-chat-0a.service on h1" in (op.result or "")


@pytest.mark.parametrize("kind", ["local", "postgres"])
def test_state_mv_renames_a_record_and_refuses_a_name_in_use(kind: str, request: pytest.FixtureRequest) -> None:
    backend: StateBackend = request.getfixturevalue(kind)
    seeded(backend)
    taken = run("state", "mv", "chat", "search", "--state", where(backend))
    assert taken.exit_code == 1 and "already has a deployment named 'search'" in taken.output
    assert "Traceback" not in taken.output
    moved = run("state", "mv", "chat", "assistant", "--state", where(backend))
    assert moved.exit_code == 0, moved.output
    assert "Moved chat to assistant" in moved.output and "replaces them one at a time" in moved.output
    after = backend.read()
    assert sorted(after.deployments) == ["assistant", "search"]
    rec = after.deployments["assistant"]
    assert rec.moved_from == ["chat"] and rec.replicas[0].unit == "engine-ctl-chat-0a.service"
    assert [op.command for op in after.operations] == ["state mv chat assistant"]


@pytest.mark.parametrize("kind", ["local", "postgres"])
def test_unknown_names_get_a_did_you_mean_and_change_nothing(kind: str, request: pytest.FixtureRequest) -> None:
    backend: StateBackend = request.getfixturevalue(kind)
    before = seeded(backend)
    for args in (("rm", "caht"), ("mv", "caht", "x")):
        result = run("state", *args, "--state", where(backend))
        assert result.exit_code == 1, result.output
        assert "no deployment named 'caht' in the state" in result.output and "did you mean 'chat'?" in result.output
    bad = run("state", "mv", "chat", "Not_A_Name", "--state", where(backend))
    assert bad.exit_code == 1 and "is not a deployment name" in bad.output
    assert backend.read().serial == before.serial  # nothing was written


def test_state_rm_waits_for_no_one_while_the_state_is_locked(local: LocalState) -> None:
    seeded(local)
    with local.lock("apply"):
        result = run("state", "rm", "chat", "--state", str(local.path))
    assert result.exit_code == 1 and "the state is locked by" in result.output and "`apply`" in result.output
    assert "chat" in local.read().deployments


@pytest.mark.parametrize("kind", ["local", "postgres"])
def test_state_history_prints_the_operations_log(kind: str, request: pytest.FixtureRequest) -> None:
    backend: StateBackend = request.getfixturevalue(kind)
    empty = run("state", "history", "--state", where(backend))
    assert empty.exit_code == 0 and "No operations recorded yet." in empty.output
    seeded(backend)
    assert run("state", "rm", "search", "--state", where(backend)).exit_code == 0
    assert run("state", "mv", "chat", "assistant", "--state", where(backend)).exit_code == 0
    table = run("state", "history", "--state", where(backend))
    assert table.exit_code == 0, table.output
    lines = table.output.splitlines()
    assert lines[1].split() == ["WHEN", "WHO", "COMMAND", "RESULT"]
    assert table.output.index("state rm search") < table.output.index("state mv chat assistant")
    doc = json.loads(run("state", "history", "--json", "--state", where(backend)).output)
    assert doc["format_version"] == 1 and doc["lineage"] == backend.read().lineage
    assert [op["command"] for op in doc["operations"]] == ["state rm search", "state mv chat assistant"]
    assert all(op["who"] and op["when"] and op["id"] for op in doc["operations"])
