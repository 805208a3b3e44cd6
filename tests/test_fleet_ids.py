"""A fleet never stomps another: up() refuses a fleet id owned by a live process of another run, and a run with
ENGINE_CTL_FLEET_ID unset takes the lowest id no live run owns. Real processes, real owner files; no root needed
(the refusal comes before any set-up command)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import fleet as fleet_mod

ROOT = Path(__file__).resolve().parents[1]


def _start_time(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "120"])
    yield proc
    proc.kill()
    proc.wait()


def _own(root: Path, fleet_id: int, pid: int, start: str, checkout: str = "/elsewhere/checkout") -> Path:
    owners = root / "engine-ctl-fleet-owners"
    owners.mkdir(parents=True, exist_ok=True)
    path = owners / f"{fleet_id}.json"
    path.write_text(json.dumps({"pid": pid, "start": start, "checkout": checkout, "since": "2026-12-04T09:00:00Z"}))
    return path


def _python(root: Path, code: str, fleet_id: int | None = None) -> subprocess.Popen[str]:
    # a run of its own: not this run's fleet id, nor pytest-xdist's worker (whose number offsets the id)
    dropped = ("ENGINE_CTL_FLEET_ID", "PYTEST_XDIST_WORKER")
    env = {k: v for k, v in os.environ.items() if k not in dropped} | {"ENGINE_CTL_FLEET_ROOT": str(root)}
    if fleet_id is not None:
        env["ENGINE_CTL_FLEET_ID"] = str(fleet_id)
    argv = [sys.executable, "-c", code]
    return subprocess.Popen(argv, cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_up_refuses_a_fleet_owned_by_a_live_process_of_another_run_and_clears_nothing(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    # this run's own id: were the guard broken, the only fleet at risk is this run's own
    fleet_id = fleet_mod.FLEET_ID
    owner = _own(tmp_path, fleet_id, sleeper.pid, _start_time(sleeper.pid))
    before = owner.read_text()
    theirs = fleet_mod.base_of(fleet_id).relative_to(fleet_mod.FLEETS)
    (tmp_path / theirs).mkdir(parents=True)
    (tmp_path / theirs / "fleet.json").write_text('{"hosts": []}')
    for action in ("up(1)", "down()"):
        proc = _python(tmp_path, f"from tests import fleet; fleet.{action}", fleet_id)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 1, err
        assert f"FleetBusy: fleet {fleet_id}" in err, err
        assert f"in use by PID {sleeper.pid} of the checkout /elsewhere/checkout" in err, err
        assert "Unset ENGINE_CTL_FLEET_ID to take the next free id" in err, err
        assert (tmp_path / theirs / "fleet.json").exists()
        assert owner.read_text() == before


def test_a_dead_owner_or_a_reused_pid_does_not_hold_an_id(tmp_path: Path, sleeper: subprocess.Popen[bytes]) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    _own(tmp_path, 0, gone.pid, "12345")  # exited
    _own(tmp_path, 1, sleeper.pid, "1")  # a live PID, but not the process that owned the fleet
    proc = _python(tmp_path, "from tests import fleet; print(fleet.FLEET_ID)")
    out, err = proc.communicate(timeout=60)
    assert (proc.returncode, out.strip()) == (0, "0"), err


def test_a_second_run_takes_the_next_free_id_by_itself(tmp_path: Path, sleeper: subprocess.Popen[bytes]) -> None:
    _own(tmp_path, 0, sleeper.pid, _start_time(sleeper.pid))  # a live run of another checkout
    legacy = tmp_path / "engine-ctl-fleet-2"  # a fleet booted without an owner file, its host still running
    legacy.mkdir()
    (legacy / "fleet.json").write_text(json.dumps({"hosts": [{"pid": sleeper.pid}]}))
    code = "import sys, time; from tests import fleet; print(fleet.FLEET_ID, fleet.PREFIX, fleet.SUBNET, flush=True)"
    first = _python(tmp_path, code + "; sys.stdin.close(); time.sleep(60)")
    try:
        assert first.stdout is not None
        assert first.stdout.readline().split() == ["1", "ecta", "198.18.1"]
        owner = json.loads((tmp_path / "engine-ctl-fleet-owners" / "1.json").read_text())
        assert (owner["pid"], owner["checkout"]) == (first.pid, str(ROOT))
        second = _python(tmp_path, code)
        out, err = second.communicate(timeout=60)
        assert out.split() == ["3", "ectc", "198.18.3"], err
    finally:
        first.kill()
        first.wait()
    third = _python(tmp_path, code)  # the first run is gone: its id is free again
    assert third.communicate(timeout=60)[0].split() == ["1", "ecta", "198.18.1"]
