"""The scaling envelope on the real fleet (issue 12 §1), with the real llama-server and the tiny real model: apply
installs on-demand units (file + daemon-reload) and neither enables nor starts them; raising max restarts no
running replica; an on-demand unit the scaler starts is not drift; raising min starts nothing anew and restarts
nothing; min: 0 leaves nothing running (ScaledToZero)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.fleetproject import Project

pytestmark = pytest.mark.fleet


def unit_state(project: Project, replica: dict) -> dict[str, str]:  # type: ignore[type-arg]
    out = project.fleet.ssh(
        project.host_of(replica),
        f"systemctl show -p LoadState,ActiveState {replica['unit']}; "
        f"echo UnitFileState=$(systemctl is-enabled {replica['unit']}); "  # from the disk: show's is cached
        f"test -f /etc/systemd/system/{replica['unit']} && echo File=present",
        check=False,
    ).stdout
    return dict(line.split("=", 1) for line in out.split() if "=" in line)


def by_index(project: Project) -> dict[int, dict]:  # type: ignore[type-arg]
    return {r["index"]: r for r in project.replicas()}


def test_raising_max_installs_on_demand_units_not_started_and_restarts_no_running_replica(project: Project) -> None:
    project.write("cpu_cores: 1\ncontext_length: 512\nreplicas: {min: 1, max: 1}")
    project.cli("apply", "--auto-approve", check=True)
    (first,) = project.replicas()
    pid = project.main_pid(first)

    project.write("cpu_cores: 1\ncontext_length: 512\nreplicas: {min: 1, max: 3}")
    planned = project.cli("plan", "--detailed-exitcode")
    assert planned.returncode == 2, planned.stdout + planned.stderr
    assert f"{project.name}: replicas 1..3: 1 always on, 2 on demand" in planned.stdout
    assert "installed, not started (the scaler starts it)" in planned.stdout
    assert f"  replica 0 on {first['host']} (1 core," in planned.stdout and "): always on" in planned.stdout
    (change,) = json.loads(project.cli("plan", "--json", check=True).stdout)["changes"]
    assert [(r["index"], r["action"], r["on_demand"]) for r in change["replicas"]] == [
        (1, ["create"], True), (2, ["create"], True),
    ]  # fmt: skip
    project.cli("apply", "--auto-approve", check=True)

    replicas = by_index(project)
    assert replicas[0]["unit"] == first["unit"] and project.main_pid(replicas[0]) == pid  # not restarted
    for i in (1, 2):
        r = replicas[i]
        assert r["on_demand"] is True and r["status"] == "standby"
        assert unit_state(project, r) == {
            "LoadState": "loaded", "ActiveState": "inactive", "UnitFileState": "disabled", "File": "present",
        }  # fmt: skip
    again = project.cli("plan", "--detailed-exitcode")
    assert again.returncode == 0, again.stdout + again.stderr
    (dep,) = json.loads(project.cli("status", project.name, "--json", check=True).stdout)["deployments"]
    assert dep["state"] == "Ready" and dep["ready"] == 1

    # the scaler starts an on-demand unit (here by hand, as it would): it serves, and it is not drift
    project.fleet.ssh(project.host_of(replicas[1]), f"systemctl start {replicas[1]['unit']}")
    assert project.health(replicas[1]) == 200
    started = project.main_pid(replicas[1])
    quiet = project.cli("plan", "--detailed-exitcode")
    assert quiet.returncode == 0 and "drift" not in quiet.stdout, quiet.stdout + quiet.stderr

    # min rises to 2: the slot the scaler runs becomes always on, enabled, not restarted
    project.write("cpu_cores: 1\ncontext_length: 512\nreplicas: {min: 2, max: 3}")
    rise = project.cli("plan", check=True).stdout
    assert "now always on: enabled, and started unless the scaler already runs it" in rise
    project.cli("apply", "--auto-approve", check=True)
    replicas = by_index(project)
    assert project.main_pid(replicas[0]) == pid and project.main_pid(replicas[1]) == started
    assert replicas[1]["on_demand"] is False and replicas[1]["status"] == "serving"
    assert unit_state(project, replicas[1])["UnitFileState"] == "enabled"
    assert unit_state(project, replicas[2])["ActiveState"] == "inactive"


def test_min_zero_installs_every_slot_and_runs_none(project: Project) -> None:
    project.write("cpu_cores: 1\ncontext_length: 512\nreplicas: {min: 0, max: 2}")
    project.cli("apply", "--auto-approve", check=True)
    replicas = project.replicas()
    assert len(replicas) == 2 and all(r["on_demand"] and r["status"] == "standby" for r in replicas)
    assert all(unit_state(project, r)["ActiveState"] == "inactive" for r in replicas)
    (dep,) = json.loads(project.cli("status", project.name, "--json", check=True).stdout)["deployments"]
    assert dep["state"] == "ScaledToZero" and dep["ready"] == 0
    assert project.state()["deployments"][project.name]["state"] == "ScaledToZero"
    assert project.cli("plan", "--detailed-exitcode").returncode == 0


def test_behind_a_gateway_an_on_demand_server_is_in_maintenance_and_the_scaler_starting_it_plans_nothing(
    project: Project,
) -> None:
    """The first host is a gateway (HAProxy under engine-ctl's unit, the scaler beside it): apply renders the
    on-demand replica's server `disabled`; once its unit runs (started by hand here, as the scaler does), the
    plan has nothing to do: neither drift nor a gateway change."""
    gateway = project.fleet.hosts[0]
    line = f"  - {{name: {gateway.name}, address: {gateway.address}}}"
    inventory = project.path / "hosts.yaml"
    inventory.write_text(Path(project.fleet.inventory).read_text().replace(line, line[:-1] + ", roles: [gateway]}"))
    project.write(f"cpu_cores: 1\ncontext_length: 512\nhost: {project.fleet.hosts[1].name}\n"
                  "replicas: {min: 0, max: 1}")  # fmt: skip

    def cli(*args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
        return project.cli(*args, "--inventory", str(inventory), check=check, docs=False)

    docs = str(project.path / "docs.yaml")
    try:
        cli("apply", docs, "--auto-approve", check=True)
        (replica,) = project.replicas()
        assert replica["on_demand"] and replica["status"] == "standby"
        config = project.fleet.ssh(gateway, "cat /etc/engine-ctl/gateway/haproxy.cfg").stdout
        assert f"server r0a {project.address(replica['host'])}:{replica['port']} " in config
        assert next(ln for ln in config.splitlines() if "server r0a " in ln).endswith(" disabled")
        assert cli("plan", docs, "--detailed-exitcode").returncode == 0
        project.fleet.ssh(project.host_of(replica), f"systemctl start {replica['unit']}")
        assert project.health(replica) == 200
        quiet = cli("plan", docs, "--detailed-exitcode")
        assert quiet.returncode == 0 and "drift" not in quiet.stdout, quiet.stdout + quiet.stderr
    finally:
        cli("destroy", docs, "--auto-approve")
        project.fleet.ssh(gateway, "systemctl disable --now engine-ctl-gateway.service engine-ctl-scaler.service",
                          check=False)  # fmt: skip
