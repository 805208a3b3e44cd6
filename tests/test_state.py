"""The local state backend: atomic writes with a backup, serial and lineage, the lock, newer formats refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from engine_ctl.state import LocalState, LockHeld

from engine_ctl.core.record.model import DeploymentRecord, State, StateError
from tests.helpers import run


def test_write_bumps_serial_keeps_lineage_and_backs_up(tmp_path: Path) -> None:
    backend = LocalState(tmp_path / "engine-ctl.state.json")
    first = backend.write(State())
    assert first.serial == 1
    second = backend.write(first.model_copy(update={"deployments": {"a": DeploymentRecord(name="a")}}))
    assert second.serial == 2 and second.lineage == first.lineage
    assert json.loads(backend.backup.read_text())["serial"] == 1
    assert backend.read().deployments["a"].name == "a"
    assert not list(tmp_path.glob(".*.tmp"))


def test_a_newer_state_is_refused_and_never_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "engine-ctl.state.json"
    path.write_text(json.dumps({"format_version": 99, "serial": 5, "lineage": "x"}))
    with pytest.raises(StateError, match="written by a newer engine-ctl"):
        LocalState(path).read()
    result = run("plan", str(tmp_path), "--state", str(path), "--inventory", str(tmp_path / "none.yaml"))
    assert result.exit_code == 1
    assert json.loads(path.read_text())["format_version"] == 99


def test_corrupt_state_says_where_the_backup_is(tmp_path: Path) -> None:
    path = tmp_path / "engine-ctl.state.json"
    backend = LocalState(path)
    backend.write(backend.write(State()))
    path.write_text("{not json")
    with pytest.raises(StateError) as err:
        backend.read()
    assert f"The previous state is in {backend.backup}" in str(err.value)
    assert json.loads(backend.backup.read_text())["serial"] == 1


def test_lock_records_who_and_refuses_a_second_holder(tmp_path: Path) -> None:
    backend = LocalState(tmp_path / "engine-ctl.state.json")
    with backend.lock("apply") as info:
        held = backend.lock_info()
        assert held is not None and held.id == info.id and held.operation == "apply" and "pid" in held.who
        with pytest.raises(LockHeld) as err, backend.lock("apply", timeout=0.3):
            pass
        assert info.id in str(err.value) and info.when in str(err.value)
    assert backend.lock_info() is None


def test_force_unlock_needs_the_right_id(tmp_path: Path) -> None:
    backend = LocalState(tmp_path / "engine-ctl.state.json")
    lock = backend.lock("apply")
    info = lock.__enter__()
    wrong = run("force-unlock", "nope", "--state", str(backend.path))
    assert wrong.exit_code == 1 and info.id in wrong.stderr
    right = run("force-unlock", info.id, "--state", str(backend.path))
    assert right.exit_code == 0 and backend.lock_info() is None
