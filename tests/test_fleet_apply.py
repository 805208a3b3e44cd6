"""plan and apply on the real fleet, with the real llama-server and the tiny real model."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.fleetproject import MODELS_DIR, ROOT, Project

pytestmark = pytest.mark.fleet


def test_plan_apply_plan_is_empty_and_every_replica_answers(project: Project) -> None:
    project.write("replicas: {min: 2, max: 2}\ncontext_length: 512")
    first = project.cli("plan", "--detailed-exitcode")
    assert first.returncode == 2, first.stdout + first.stderr
    assert (
        f'+ deployment "{project.name}"' in first.stdout
        and "Plan: 1 to add, 0 to change, 0 to destroy." in first.stdout
    )
    project.cli("apply", "--auto-approve", check=True)
    again = project.cli("plan", "--detailed-exitcode")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "No changes." in again.stdout
    replicas = project.replicas()
    assert len(replicas) == 2 and {r["status"] for r in replicas} == {"serving"}
    assert len({r["host"] for r in replicas}) == 2  # spread over hosts
    for r in replicas:
        assert project.chat(r)["model"] == project.name
    status = project.cli("status", project.name, "--json", check=True)
    (dep,) = json.loads(status.stdout)["deployments"]
    assert dep["state"] == "Ready" and dep["ready"] == 2 and dep["revision"] == 1
    listed = project.cli("list", check=True).stdout
    assert project.name in listed and "ready" in listed and "2/2" in listed


def test_a_changed_context_length_rolls_with_the_deployment_answering_throughout(project: Project) -> None:
    project.write("context_length: 512")
    project.cli("apply", "--auto-approve", check=True)
    (old,) = project.replicas()
    project.write("context_length: 1024")
    planned = project.cli("plan", "--json", check=True)
    doc = json.loads(planned.stdout)
    (change,) = doc["changes"]
    assert change["action"] == ["create", "delete"] and change["strategy"] == "surge"  # create before destroy
    assert any(
        f["path"] == "spec.context_length" and f["old"] == 512 and f["new"] == 1024 for f in change["field_changes"]
    )
    (replica,) = change["replicas"]
    assert replica["old_unit"] == old["unit"] and replica["unit"] != old["unit"]
    human = project.cli("plan").stdout
    assert "+/-" in human and "- --ctx-size 1024" in human and "+ --ctx-size 2048" in human

    samples: list[bool] = []
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            try:
                serving = [r for r in project.replicas() if r["status"] == "serving"]
            except (OSError, ValueError, KeyError):
                continue
            samples.append(any(project.health(r) == 200 for r in serving))
            time.sleep(0.05)

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        project.cli("apply", "--auto-approve", check=True)
    finally:
        done.set()
        poller.join()
    assert len(samples) > 10 and all(samples), f"{samples.count(False)} of {len(samples)} samples had no answer"
    (new,) = project.replicas()
    assert new["unit"] != old["unit"] and "--ctx-size" in new["argv"]
    assert new["argv"][new["argv"].index("--ctx-size") + 1] == "2048"
    assert project.health(old) is None or (old["port"] == new["port"] and old["host"] == new["host"])
    assert project.cli("plan", "--detailed-exitcode").returncode == 0


def test_replicas_1_3_1_restart_nothing_that_stays(project: Project) -> None:
    """A fixed count (min = max) from 1 to 3 and back: only replicas are added and removed. (A change of the
    envelope, min below max, is tests/test_fleet_scaling_envelope.py's.)"""
    project.write("replicas: {min: 1, max: 1}")
    project.cli("apply", "--auto-approve", check=True)
    (first,) = project.replicas()
    pid = project.main_pid(first)
    project.write("replicas: {min: 3, max: 3}")
    planned = json.loads(project.cli("plan", "--json", check=True).stdout)
    (change,) = planned["changes"]
    assert change["action"] == ["update"]
    assert sorted(r["action"][0] for r in change["replicas"]) == ["create", "create"]
    project.cli("apply", "--auto-approve", check=True)
    assert len(project.replicas()) == 3 and all(project.health(r) == 200 for r in project.replicas())
    assert project.main_pid(first) == pid
    project.write("replicas: {min: 1, max: 1}")
    project.cli("apply", "--auto-approve", check=True)
    (kept,) = project.replicas()
    assert kept["unit"] == first["unit"] and project.main_pid(kept) == pid
    assert project.cli("plan", "--detailed-exitcode").returncode == 0


def test_a_unit_edited_by_hand_is_drift_and_apply_repairs_it(project: Project) -> None:
    project.write("context_length: 512")
    project.cli("apply", "--auto-approve", check=True)
    (r,) = project.replicas()
    h = project.host_of(r)
    project.fleet.ssh(h, f"sed -i 's/^RestartSec=5/RestartSec=1/' /etc/systemd/system/{r['unit']}")
    planned = project.cli("plan", "--detailed-exitcode")
    assert planned.returncode == 2
    assert "Changed outside engine-ctl (drift):" in planned.stdout and "edited by hand" in planned.stdout
    project.cli("apply", "--auto-approve", check=True)
    text = project.fleet.ssh(h, f"cat /etc/systemd/system/{r['unit']}").stdout
    assert "RestartSec=5" in text and project.health(project.replicas()[0]) == 200
    assert project.cli("plan", "--detailed-exitcode").returncode == 0


def test_kill_9_of_the_engine_shows_in_status_and_plan_repairs_a_stopped_one(project: Project) -> None:
    project.write("context_length: 512")
    project.cli("apply", "--auto-approve", check=True)
    (r,) = project.replicas()
    h = project.host_of(r)
    project.fleet.ssh(h, f"kill -9 $(systemctl show -p MainPID --value {r['unit']})")
    time.sleep(0.5)
    (dep,) = json.loads(project.cli("status", project.name, "--json").stdout)["deployments"]
    (inst,) = dep["members"]
    assert inst["state"] != "ready" or inst["restarts"] >= 1
    deadline = time.monotonic() + 30  # systemd restarts it (Restart=on-failure)
    while time.monotonic() < deadline and project.health(r) != 200:
        time.sleep(0.5)
    (dep,) = json.loads(project.cli("status", project.name, "--json").stdout)["deployments"]
    member = dep["members"][0]
    assert member["restarts"] >= 1 and "crashed 1 time(s), last killed by signal KILL" in member["last_error"], member
    # stopped by hand: drift that plan repairs
    project.fleet.ssh(h, f"systemctl stop {r['unit']}")
    planned = project.cli("plan", "--detailed-exitcode")
    assert planned.returncode == 2 and "inactive" in planned.stdout
    project.cli("apply", "--auto-approve", check=True)
    assert project.health(project.replicas()[0]) == 200


def test_a_replica_that_cannot_start_halts_the_roll_and_the_previous_one_serves(project: Project) -> None:
    project.write("context_length: 512")
    project.cli("apply", "--auto-approve", check=True)
    (old,) = project.replicas()
    project.write("context_length: 512", model_file="corrupt.gguf")
    failed = project.cli("apply", "--auto-approve")
    assert failed.returncode == 1, failed.stdout + failed.stderr
    (still,) = project.replicas()
    assert still["unit"] == old["unit"] and project.health(still) == 200
    assert project.chat(still)["model"] == project.name
    record = project.state()["deployments"][project.name]
    # Ready (a replica serves, seed 000 States) with why the last change failed; status says the same
    assert record["state"] == "Ready" and record["last_error"].startswith("launch_failed:")
    (dep,) = json.loads(project.cli("status", project.name, "--json").stdout)["deployments"]
    assert dep["ready"] == 1 and "last change failed: launch_failed" in dep["reason"]
    assert dep["state"] == record["state"] and dep["reason"].startswith(record["reason"])
    assert "the documents changed since revision 1 was applied" in dep["reason"]  # issue 24, 16c: not served yet
    h = project.host_of(old)
    units = project.fleet.ssh(h, f"ls /etc/systemd/system/ | grep engine-ctl-{project.name}- || true").stdout.split()
    assert units == [old["unit"]]


def test_a_stale_plan_file_is_refused(project: Project, tmp_path: Path) -> None:
    project.write("context_length: 512")
    saved = tmp_path / "reviewed.plan.json"
    project.cli("plan", "--out", str(saved))
    project.cli("apply", "--auto-approve", check=True)  # the state moves on
    refused = project.cli("apply", str(saved), docs=False)
    assert refused.returncode == 1 and "the saved plan is stale" in refused.stderr and "serial" in refused.stderr
    project.write("context_length: 1024")
    fresh = tmp_path / "fresh.plan.json"
    project.cli("plan", "--out", str(fresh))
    h = project.fleet.hosts[3 % len(project.fleet.hosts)]
    unit = "/etc/systemd/system/engine-ctl-x-0a.service"
    project.fleet.ssh(
        h,
        f"printf '[Service]\\nExecStart=/usr/bin/sleep 600\\n' > {unit} && systemctl daemon-reload "
        "&& systemctl start engine-ctl-x-0a.service",
    )
    try:
        refused = project.cli("apply", str(fresh), docs=False)
        assert refused.returncode == 1 and f"the facts of host {h.name} changed" in refused.stderr
    finally:
        project.fleet.ssh(
            h, f"systemctl stop engine-ctl-x-0a.service; rm -f {unit}; systemctl daemon-reload", check=False
        )
    again = tmp_path / "again.plan.json"
    project.cli("plan", "--out", str(again))
    applied = project.cli("apply", str(again), docs=False)
    assert applied.returncode == 0, applied.stdout + applied.stderr


def test_two_applies_at_once_one_is_refused_with_the_locks_who_and_when(project: Project) -> None:
    project.write("replicas: {min: 2, max: 2}")
    lock = project.state_file.with_name(project.state_file.name + ".lock")
    argv = [
        sys.executable,
        "-m",
        "engine_ctl",
        "apply",
        "--auto-approve",
        str(project.path),
        "--inventory",
        project.fleet.inventory,
    ]
    first = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    deadline = time.monotonic() + 20
    while not lock.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert lock.exists()
    first.send_signal(signal.SIGSTOP)  # it holds the lock, whatever the machine's load: the second meets it
    try:
        second = project.cli("apply", "--auto-approve")
    finally:
        first.send_signal(signal.SIGCONT)
    out, err = first.communicate(timeout=300)
    assert first.returncode == 0, out + err
    assert second.returncode == 1
    info = json.loads(lock.read_text()) if lock.exists() else None
    assert info is None  # released by the first
    assert "the state is locked by" in second.stderr and " since " in second.stderr and "force-unlock" in second.stderr


def test_destroy_removes_the_units_and_keeps_the_models(project: Project) -> None:
    project.write("replicas: {min: 2, max: 2}")
    project.cli("apply", "--auto-approve", check=True)
    replicas = project.replicas()
    gone = project.cli("destroy", "--auto-approve", check=True)
    assert "will be destroyed" in gone.stdout
    assert project.state()["deployments"] == {}
    for r in replicas:
        h = project.host_of(r)
        assert project.fleet.ssh(h, f"test -e /etc/systemd/system/{r['unit']}", check=False).returncode == 1
        assert project.fleet.ssh(h, f"test -f {MODELS_DIR}/tiny/tiny.gguf", check=False).returncode == 0
        assert project.health(r) is None


def recorded_yet(project: Project) -> bool:
    """Whether the state records the project's deployment (an apply's first step is recorded)."""
    try:
        return project.name in project.state()["deployments"]
    except (OSError, ValueError, KeyError):
        return False


def test_ctrl_c_finishes_the_step_in_flight_records_the_state_and_exits(project: Project) -> None:
    project.write("replicas: {min: 3, max: 3}\ncontext_length: 512")
    argv = [sys.executable, "-m", "engine_ctl", "apply", "--auto-approve", str(project.path), "--inventory",
            project.fleet.inventory]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    lock = project.state_file.with_name(project.state_file.name + ".lock")
    deadline = time.monotonic() + 30
    while not recorded_yet(project) and time.monotonic() < deadline:
        time.sleep(0.02)  # the first step has been recorded: the roll is under way
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode in (0, 130), out + err
    assert "Traceback" not in err and not lock.exists()
    recorded = project.replicas()
    assert all(r["status"] in ("serving", "pending") for r in recorded)
    project.cli("apply", "--auto-approve", check=True)
    assert project.cli("plan", "--detailed-exitcode").returncode == 0
    assert len(project.replicas()) == 3 and all(project.health(r) == 200 for r in project.replicas())


def test_apply_with_the_state_in_postgresql(project: Project) -> None:
    dsn = os.environ.get("ENGINE_CTL_TEST_PG", "postgresql:///engine_ctl_test") + f"#{project.name}-{os.getpid()}"
    project.write("context_length: 512")
    try:
        project.cli("apply", "--auto-approve", "--state", dsn, check=True)
        assert project.cli("plan", "--detailed-exitcode", "--state", dsn).returncode == 0
        status = json.loads(project.cli("status", project.name, "--json", "--state", dsn, check=True).stdout)
        (dep,) = status["deployments"]
        assert dep["state"] == "Ready" and not project.state_file.exists()
    finally:
        project.cli("destroy", "--auto-approve", "--state", dsn)


def _units_planned(doc: object) -> list[tuple[str, str]]:
    """(host, unit) of every replica a `plan --json` document creates."""
    found: list[tuple[str, str]] = []
    if isinstance(doc, dict):
        if isinstance(doc.get("unit"), str) and isinstance(doc.get("host"), str):
            found.append((doc["host"], doc["unit"]))
        for value in doc.values():
            found += _units_planned(value)
    elif isinstance(doc, list):
        for value in doc:
            found += _units_planned(value)
    return found


def test_a_unit_file_that_cannot_be_written_fails_the_step_and_starts_nothing(project: Project) -> None:
    """The unit file goes on the stdin of the command that starts it: where it cannot be written (here its
    temporary file's name is taken by a directory), the step fails as the host's, naming the file, and nothing
    was started or left behind."""
    project.write("context_length: 512")
    planned = _units_planned(json.loads(project.cli("plan", "--json", check=True).stdout))
    assert planned, "the plan creates no replica"
    host_name, unit = planned[0]
    h = next(x for x in project.fleet.hosts if x.name == host_name)
    blocker = f"/etc/systemd/system/{unit}.engine-ctl-tmp"
    project.fleet.ssh(h, f"mkdir -p {blocker}")
    try:
        failed = project.cli("apply", "--auto-approve")
        assert failed.returncode == 1, failed.stdout + failed.stderr
        assert f"writing /etc/systemd/system/{unit} failed" in failed.stdout + failed.stderr
        left = project.fleet.ssh(h, f"test -e /etc/systemd/system/{unit} && echo present; "
                                 f"systemctl is-active {unit} || true").stdout.split()  # fmt: skip
        assert "present" not in left and "active" not in left
    finally:
        project.fleet.ssh(h, f"rmdir {blocker}", check=False)
