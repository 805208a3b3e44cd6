"""Trust and faults on the real fleet: the pull-request flow on a fresh repository, tampered plans, one replica at
a time, partial applies with a host cut off, a failed stop-then-start brought back, and kill -9 of apply at ten
points with a health poller running throughout. Real hosts, real SSH, the real llama-server, the tiny model."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from engine_ctl.state import LocalState

from tests.fleet import BRIDGE, FleetHost, sh
from tests.fleetproject import MODELS_DIR, ROOT, Project

pytestmark = pytest.mark.fleet


def _unit_times(p: Project, replica: dict) -> tuple[int, int]:  # type: ignore[type-arg]
    """(ExecMainStartTimestampMonotonic, ActiveEnterTimestampMonotonic) in µs: one kernel clock for every fleet
    host (containers share it), so the order across hosts is real."""
    out = p.fleet.ssh(
        p.host_of(replica),
        f"systemctl show -p ExecMainStartTimestampMonotonic -p ActiveEnterTimestampMonotonic {replica['unit']}",
    ).stdout
    props = dict(line.split("=", 1) for line in out.split())
    return int(props["ExecMainStartTimestampMonotonic"]), int(props["ActiveEnterTimestampMonotonic"])


@contextmanager
def cut_off(host: FleetHost) -> Iterator[None]:
    """A network outage: the host's link to the bridge goes down (the host keeps running). On the way back it waits
    until the host's SSH port accepts a connection: the kernel keeps a failed neighbour entry for a few seconds after
    the link comes up, and a test that carries on at once would see "unreachable" from the restored host."""
    link = f"{host.name}-v"
    sh("ip", "link", "set", link, "down")
    try:
        yield
    finally:
        sh("ip", "link", "set", link, "master", BRIDGE, "up")
        _wait_for_ssh_port(host.address)


def _wait_for_ssh_port(address: str, within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while True:
        try:
            with socket.create_connection((address, 22), timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _two_replicas(p: Project, extra: str = "") -> list[dict]:  # type: ignore[type-arg]
    p.write("replicas: {min: 2, max: 2}\ncontext_length: 512\n" + extra)
    p.cli("apply", "--auto-approve", check=True)
    replicas = p.replicas()
    assert len({r["host"] for r in replicas}) == 2
    return replicas


def test_the_pull_request_flow_on_a_fresh_repository(project: Project, tmp_path: Path) -> None:
    """plan --out with no state yet, apply the plan file, converge; the same file again is refused as stale."""
    project.write("context_length: 512")
    saved = tmp_path / "pr.plan.json"
    planned = project.cli("plan", "--out", str(saved))
    assert planned.returncode == 0 and saved.exists() and not project.state_file.exists()
    applied = project.cli("apply", str(saved), docs=False)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert json.loads(saved.read_text())["state_lineage"] == project.state()["lineage"]
    (r,) = project.replicas()
    assert r["status"] == "serving" and project.health(r) == 200
    assert project.cli("plan", "--detailed-exitcode").returncode == 0
    again = project.cli("apply", str(saved), docs=False)
    assert again.returncode == 1 and "the saved plan is stale" in again.stderr and "serial 0 → " in again.stderr


def test_a_tampered_plan_file_is_refused_and_nothing_runs(project: Project, tmp_path: Path) -> None:
    project.write("context_length: 512")
    saved = tmp_path / "pr.plan.json"
    project.cli("plan", "--out", str(saved), check=True)
    doc = json.loads(saved.read_text())
    step = doc["changes"][0]["replicas"][0]
    marker = f"/tmp/owned-{project.name}"
    step["unit_text"] = step["unit_text"].replace("[Service]\n", f"[Service]\nExecStartPre=+/usr/bin/touch {marker}\n")
    saved.write_text(json.dumps(doc))
    refused = project.cli("apply", str(saved), docs=False)
    assert refused.returncode == 1
    assert "not what engine-ctl renders from its own recorded inputs" in refused.stderr
    assert not project.state_file.exists()
    for h in project.fleet.hosts:
        assert project.fleet.ssh(h, f"test -e {marker}", check=False).returncode == 1
        assert project.fleet.ssh(h, f"ls /etc/systemd/system/{step['unit']}", check=False).returncode != 0


def test_a_roll_replaces_one_replica_at_a_time_and_a_failure_halts_it(project: Project) -> None:
    before = _two_replicas(project)
    first, second = sorted(before, key=lambda r: r["index"])
    # a revision whose weights cannot load (wherever the surge lands): the first replica's new slot fails
    for h in project.fleet.hosts:
        project.fleet.ssh(h, f"cp {MODELS_DIR}/tiny/corrupt.gguf {MODELS_DIR}/tiny/flaky.gguf")
    second_pid = project.main_pid(second)
    project.write("replicas: {min: 2, max: 2}\ncontext_length: 512", model_file="flaky.gguf")
    failed = project.cli("apply", "--auto-approve")
    assert failed.returncode == 1, failed.stdout + failed.stderr
    # halted before the second replica was touched: same unit, same process, the old revision
    after = {r["index"]: r for r in project.replicas()}
    assert after[1]["unit"] == second["unit"] and after[1]["revision"] == 1 and project.main_pid(second) == second_pid
    assert after[0]["unit"] == first["unit"] and project.health(after[0]) == 200  # surge: the old one serves
    record = project.state()["deployments"][project.name]
    # the engine's own words, not systemd's "Failed to start"
    assert "error loading model: check_tensor_dims: tensor 'token_embd.weight' has wrong shape" in record["last_error"]
    assert "Failed to start" not in record["last_error"]
    assert record["state"] == "Ready" and "last change failed: launch_failed" in record["reason"]
    (dep,) = json.loads(project.cli("status", project.name, "--json").stdout)["deployments"]
    assert dep["state"] == record["state"] and "last change failed" in dep["reason"]  # status and state agree
    assert "the previous replica serves" not in failed.stdout and "2 replica(s) still serve" in failed.stdout
    # putting the previous document back clears the failure without touching a host
    project.write("replicas: {min: 2, max: 2}\ncontext_length: 512")
    cleared = project.cli("plan", "--detailed-exitcode")
    assert cleared.returncode == 2 and "nothing changes on the hosts" in cleared.stdout
    project.cli("apply", "--auto-approve", check=True)
    record = project.state()["deployments"][project.name]
    assert record["state"] == "Ready" and record["last_error"] is None and record["reason"] == "2 of 2 replicas serving"
    assert project.main_pid(second) == second_pid
    # now a revision that loads everywhere: the second replica starts only once the first one serves
    project.write("replicas: {min: 2, max: 2}\ncontext_length: 1024")
    project.cli("apply", "--auto-approve", check=True)
    new = {r["index"]: r for r in project.replicas()}
    assert all(r["revision"] == 2 for r in new.values())
    _, first_ready = _unit_times(project, new[0])
    second_start, _ = _unit_times(project, new[1])
    assert second_start > first_ready, (second_start, first_ready)


def test_a_host_cut_off_mid_change_is_recorded_as_it_is_and_apply_exits_1(project: Project) -> None:
    before = _two_replicas(project)
    second = max(before, key=lambda r: r["index"])
    with cut_off(project.host_of(second)):
        project.write("replicas: {min: 2, max: 2}\ncontext_length: 1024")
        partial = project.cli("apply", "--auto-approve", timeout=600)
        assert partial.returncode == 1, partial.stdout + partial.stderr
        by_index = {r["index"]: r for r in project.replicas()}
        assert by_index[0]["revision"] == 2 and by_index[1]["revision"] == 1 and by_index[1]["unit"] == second["unit"]
        record = project.state()["deployments"][project.name]
        assert record["revision"] == 2 and "1 of 2 at revision 2" in record["reason"], record
        status = project.cli("status", project.name)
        assert "1 of 2 at revision 2" in status.stdout, status.stdout
        # nothing left to change on the reachable host: still exit 1, never "No changes"
        again = project.cli("apply", "--auto-approve", timeout=600)
        assert again.returncode == 1 and "No changes. The hosts match the documents." not in again.stdout
        assert "could not be reached" in again.stdout
        # a link that is down reads as a connect that timed out or, once the neighbour entry has failed, as "no
        # route": either way the host is named unreachable, never as a host whose key or login is wrong
        name = project.host_of(second).name
        assert f"host {name}: timeout: " in again.stderr or f"host {name}: unreachable: " in again.stderr, again.stderr
        assert "authentication failed" not in again.stderr and "host key" not in again.stderr
    project.cli("apply", "--auto-approve", check=True)
    assert all(r["revision"] == 2 and project.health(r) == 200 for r in project.replicas())
    assert project.cli("plan", "--detailed-exitcode").returncode == 0


def test_a_failed_stop_then_start_brings_the_previous_unit_back(project: Project) -> None:
    """Pinned to one host with all its cores: no room for a surge, so stop-then-start; the new one cannot load."""
    host = project.fleet.hosts[0].name
    cores = os.cpu_count() or 2
    project.write(f"host: {host}\ncpu_cores: {cores}\ncontext_length: 512")
    project.cli("apply", "--auto-approve", check=True)
    (old,) = project.replicas()
    project.write(f"host: {host}\ncpu_cores: {cores}\ncontext_length: 512", model_file="corrupt.gguf")
    planned = project.cli("plan")
    assert "stop-then-start" in planned.stdout, planned.stdout
    failed = project.cli("apply", "--auto-approve")
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert f"the previous {old['unit']} on {host} restored (serving)" in failed.stdout
    (still,) = project.replicas()
    assert still["unit"] == old["unit"] and still["status"] == "serving" and project.health(still) == 200
    units = project.fleet.ssh(project.host_of(old), f"ls /etc/systemd/system/ | grep engine-ctl-{project.name}-")
    assert units.stdout.split() == [old["unit"]]


class HealthPoller:
    """Polls every replica the state names, ten times a second, and counts the moments none answers 200."""

    def __init__(self, p: Project) -> None:
        self.p = p
        self.samples = 0
        self.dark = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                replicas = LocalState(self.p.state_file).read().deployments[self.p.name].replicas
            except Exception:
                replicas = []
            if replicas:
                self.samples += 1
                rows = [r.model_dump() for r in replicas]
                if not any(self.p.health(r) == 200 for r in rows):
                    self.dark += 1
            time.sleep(0.1)

    def __enter__(self) -> HealthPoller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


KILL_POINTS = (0.3, 0.6, 0.9, 1.2, 1.6, 2.0, 2.4, 2.8, 3.3, 4.0)


def test_kill_9_of_apply_at_ten_points_loses_nothing_and_never_goes_dark(project: Project) -> None:
    project.write("replicas: {min: 2, max: 2}\ncontext_length: 512")
    project.cli("apply", "--auto-approve", check=True)
    figures = []
    with HealthPoller(project) as poller:
        for i, delay in enumerate(KILL_POINTS):
            context = 1024 if i % 2 == 0 else 512
            project.write(f"replicas: {{min: 2, max: 2}}\ncontext_length: {context}")
            argv = [sys.executable, "-m", "engine_ctl", "apply", "--auto-approve", str(project.path),
                    "--inventory", project.fleet.inventory]  # fmt: skip
            proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
            time.sleep(delay)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            state = LocalState(project.state_file).read()  # readable after every kill
            assert project.name in state.deployments
            held = LocalState(project.state_file).lock_info()
            if held is not None:
                project.cli("force-unlock", held.id, str(project.path), check=True)
            planned = project.cli("plan")
            assert planned.returncode == 0, planned.stdout + planned.stderr  # an accurate plan, no error
            project.cli("apply", "--auto-approve", check=True)
            assert project.cli("plan", "--detailed-exitcode").returncode == 0
            replicas = project.replicas()
            assert len(replicas) == 2 and all(r["status"] == "serving" and project.health(r) == 200 for r in replicas)
            want = str(context * 2)  # --ctx-size is context × parallel 2 on CPU
            assert all(r["argv"][r["argv"].index("--ctx-size") + 1] == want for r in replicas)
            for h in project.fleet.hosts:  # no leftover unit of this deployment on any host
                listed = project.fleet.ssh(h, f"ls /etc/systemd/system/ | grep engine-ctl-{project.name}- || true")
                assert set(listed.stdout.split()) == {r["unit"] for r in replicas if r["host"] == h.name}
            figures.append((delay, "converged"))
    print(f"\nkill -9 points: {len(figures)}, health samples: {poller.samples}, "
          f"without a healthy replica: {poller.dark}")  # fmt: skip
    assert len(figures) == len(KILL_POINTS)
    assert poller.samples > 100 and poller.dark == 0


def test_a_deployment_that_cannot_be_served_as_asked_is_failed_and_the_others_are_applied(project: Project) -> None:
    """The weights' own maximum (the tiny GGUF takes 2048 tokens) refuses a larger context at plan; the other
    deployment in the same documents is still planned and applied."""
    other = f"{project.name[:30]}-ok"
    (project.path / "docs.yaml").write_text(
        "kind: Model\nmetadata: {name: tiny}\nspec: {format: gguf, path: tiny/tiny.gguf, parameters: 4170048}\n"
        f"---\nmetadata: {{name: {project.name}}}\nspec: {{model: tiny, accelerator: cpu, context_length: 4096}}\n"
        f"---\nmetadata: {{name: {other}}}\nspec: {{model: tiny, accelerator: cpu, context_length: 512}}\n"
    )
    planned = project.cli("plan")
    assert planned.returncode == 1, planned.stdout + planned.stderr
    reason = "spec.context_length 4096: model tiny takes at most 2048 tokens"
    assert f"Failed: {project.name}: {reason}" in planned.stdout and f'deployment "{other}"' in planned.stdout
    assert "No changes. The hosts match the documents." not in planned.stdout
    applied = project.cli("apply", "--auto-approve")
    assert applied.returncode == 1, applied.stdout + applied.stderr
    state = project.state()["deployments"]
    assert state[project.name]["state"] == "Failed" and state[project.name]["reason"] == reason
    assert state[other]["state"] == "Ready" and project.health(state[other]["replicas"][0]) == 200
    status = json.loads(project.cli("status", "--json").stdout)["deployments"]
    by_name = {d["name"]: d for d in status}
    assert by_name[project.name]["state"] == "Failed" and by_name[project.name]["reason"] == reason
    assert by_name[other]["state"] == "Ready"
