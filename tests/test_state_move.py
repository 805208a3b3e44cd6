"""`engine-ctl state push --to URL` and `state pull --from URL` between a local file and a real PostgreSQL
state (.ci/run starts the server): the state arrives as it is (lineage and serial kept), under the target's
lock, with a backup of what it replaced, and every overwrite that could lose work is refused without --force."""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from engine_ctl.state import LocalState, PostgresState, open_backend

from engine_ctl.core.record.model import DeploymentRecord, State
from tests.helpers import run

DSN = os.environ.get("ENGINE_CTL_TEST_PG", "postgresql:///engine_ctl_test")


@pytest.fixture
def pg() -> Iterator[PostgresState]:
    b = open_backend(f"{DSN}#move-{uuid.uuid4().hex[:8]}")
    assert isinstance(b, PostgresState)
    yield b
    with psycopg.connect(b.dsn) as conn:
        for table in ("engine_ctl_state", "engine_ctl_state_history", "engine_ctl_lock"):
            conn.execute(f"DELETE FROM {table} WHERE name = %s", (b.name,))


def written(backend: LocalState | PostgresState, *names: str, base: State | None = None) -> State:
    """A state with these deployments, written once per name (serial up by one each)."""
    state = base or State()
    for name in names:
        state = state.model_copy(deep=True)
        state.deployments[name] = DeploymentRecord(name=name, revision=1)
        state = backend.write(state)
    return state


def history(pg: PostgresState) -> list[tuple[int, str]]:
    with psycopg.connect(pg.dsn) as conn:
        rows = conn.execute(
            "SELECT serial, body->>'lineage' FROM engine_ctl_state_history WHERE name = %s ORDER BY serial",
            (pg.name,),
        )
        return [(int(r[0]), str(r[1])) for r in rows]


def test_push_to_postgresql_and_pull_back_keep_lineage_serial_and_contents(tmp_path: Path, pg: PostgresState) -> None:
    local = LocalState(tmp_path / "engine-ctl.state.json")
    mine = written(local, "chat", "embed")
    pushed = run("state", "push", "--to", pg.location, "--state", str(local.path))
    assert pushed.exit_code == 0, pushed.output
    assert f"serial {mine.serial}, lineage {mine.lineage}" in pushed.stdout
    there = pg.read()
    assert (there.serial, there.lineage, sorted(there.deployments)) == (2, mine.lineage, ["chat", "embed"])
    # the team works on in PostgreSQL; a laptop pulls the newer state into a fresh file
    newer = written(pg, "rerank", base=there)
    elsewhere = tmp_path / "laptop" / "engine-ctl.state.json"
    pulled = run("state", "pull", "--from", pg.location, "--state", str(elsewhere))
    assert pulled.exit_code == 0, pulled.output
    copy = json.loads(elsewhere.read_text())
    assert copy == json.loads(json.dumps(newer.model_dump(mode="json")))
    # pulling into the first file replaces serial 2 with 3, and leaves serial 2 as its backup
    again = run("state", "pull", "--from", pg.location, "--state", str(local.path))
    assert again.exit_code == 0 and str(local.backup) in again.stdout
    assert local.read().serial == 3 and json.loads(local.backup.read_text())["serial"] == 2
    unchanged = run("state", "push", "--to", pg.location, "--state", str(local.path))
    assert unchanged.exit_code == 0 and "no change" in unchanged.stdout
    assert history(pg) == [(2, mine.lineage)]  # only the write of serial 3 replaced anything there


def test_the_default_state_beside_the_documents_is_the_current_one(tmp_path: Path, pg: PostgresState) -> None:
    written(pg, "chat")
    (tmp_path / "deploy").mkdir()
    pulled = run("state", "pull", str(tmp_path / "deploy"), "--from", pg.location)
    assert pulled.exit_code == 0, pulled.output
    assert LocalState(tmp_path / "deploy" / "engine-ctl.state.json").read().lineage == pg.read().lineage


def test_push_over_another_lineage_is_refused_and_force_keeps_the_replaced_one(
    tmp_path: Path, pg: PostgresState
) -> None:
    theirs = written(pg, "theirs", "theirs-too", "and-more")
    local = LocalState(tmp_path / "s.json")
    mine = written(local, "mine")
    refused = run("state", "push", "--to", pg.location, "--state", str(local.path))
    assert refused.exit_code == 1
    assert f"holds another state (lineage {theirs.lineage}, serial 3)" in refused.stderr
    assert "nothing was overwritten" in refused.stderr and "--force" in refused.stderr
    assert pg.read().lineage == theirs.lineage
    forced = run("state", "push", "--to", pg.location, "--state", str(local.path), "--force")
    assert forced.exit_code == 0, forced.output
    assert "engine_ctl_state_history (name" in forced.stdout and "serial 3)" in forced.stdout
    assert (pg.read().lineage, pg.read().serial) == (mine.lineage, 1)
    assert (3, theirs.lineage) in history(pg)
    # the state goes on from its own serial, and the backup of the version it replaces is that version
    written(pg, "next", base=pg.read())
    assert (1, mine.lineage) in history(pg)


def test_push_over_a_newer_serial_is_refused_and_says_to_pull(tmp_path: Path, pg: PostgresState) -> None:
    local = LocalState(tmp_path / "s.json")
    mine = written(local, "chat")
    assert run("state", "push", "--to", pg.location, "--state", str(local.path)).exit_code == 0
    written(pg, "embed", base=pg.read())  # someone applied since, on the shared state
    refused = run("state", "push", "--to", pg.location, "--state", str(local.path))
    assert refused.exit_code == 1
    assert "is newer (serial 2) than" in refused.stderr and "engine-ctl state pull" in refused.stderr
    assert sorted(pg.read().deployments) == ["chat", "embed"]
    forced = run("state", "push", "--to", pg.location, "--state", str(local.path), "--force")
    assert forced.exit_code == 0 and pg.read().serial == mine.serial == 1


def test_pull_over_a_newer_or_diverged_current_state_is_refused(tmp_path: Path, pg: PostgresState) -> None:
    local = LocalState(tmp_path / "s.json")
    written(local, "chat")
    assert run("state", "push", "--to", pg.location, "--state", str(local.path)).exit_code == 0
    written(local, "embed", base=local.read())  # local serial 2, PostgreSQL serial 1
    newer = run("state", "pull", "--from", pg.location, "--state", str(local.path))
    assert newer.exit_code == 1 and "is newer (serial 2)" in newer.stderr and "engine-ctl state push" in newer.stderr
    written(pg, "other", base=pg.read())  # both serial 2 now, written apart
    diverged = run("state", "pull", "--from", pg.location, "--state", str(local.path))
    assert diverged.exit_code == 1 and "both are serial 2" in diverged.stderr and "other contents" in diverged.stderr
    assert sorted(local.read().deployments) == ["chat", "embed"]
    forced = run("state", "pull", "--from", pg.location, "--state", str(local.path), "--force")
    assert forced.exit_code == 0 and sorted(local.read().deployments) == ["chat", "other"]
    assert sorted(json.loads(local.backup.read_text())["deployments"]) == ["chat", "embed"]


def test_nothing_to_move_and_the_same_state_are_refused(tmp_path: Path, pg: PostgresState) -> None:
    empty = run("state", "push", "--to", pg.location, "--state", str(tmp_path / "none.json"))
    assert empty.exit_code == 1 and "there is no state at" in empty.stderr
    assert not (tmp_path / "none.json").exists() and pg.read().serial == 0
    nowhere = run("state", "pull", "--from", pg.location, "--state", str(tmp_path / "s.json"))
    assert nowhere.exit_code == 1 and "nothing was ever written there" in nowhere.stderr
    assert not (tmp_path / "s.json").exists()
    written(pg, "chat")
    same = run("state", "push", "--to", pg.location, "--state", pg.location)
    assert same.exit_code == 1 and "the source and the target are the same state" in same.stderr


def test_push_waits_for_and_is_refused_by_the_targets_lock(tmp_path: Path, pg: PostgresState) -> None:
    local = LocalState(tmp_path / "s.json")
    written(local, "chat")
    with pg.lock("apply") as info:
        refused = run("state", "push", "--to", pg.location, "--state", str(local.path))
        assert refused.exit_code == 1 and f"(lock ID {info.id})" in refused.stderr
        assert pg.read().serial == 0
    released = threading.Event()

    def hold_for_a_second() -> None:
        with pg.lock("apply"):
            released.set()
            time.sleep(1)

    holder = threading.Thread(target=hold_for_a_second)
    holder.start()
    released.wait(10)
    waited = run("state", "push", "--to", pg.location, "--state", str(local.path), "--lock-timeout", "30")
    holder.join()
    assert waited.exit_code == 0, waited.output
    assert pg.read().serial == 1


def test_pull_holds_the_current_states_lock(tmp_path: Path, pg: PostgresState) -> None:
    written(pg, "chat")
    local = LocalState(tmp_path / "s.json")
    with local.lock("apply") as info:
        refused = run("state", "pull", "--from", pg.location, "--state", str(local.path))
        assert refused.exit_code == 1 and f"(lock ID {info.id})" in refused.stderr
    assert not local.path.exists()
