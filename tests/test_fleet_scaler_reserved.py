"""An always-on replica and a `min: 0` deployment's on-demand slot on the real fleet (issue 24, point 5), with the
real scaler, HAProxy and llama-server. The always-on replica keeps off the cores the slot reserved (the plan says
so); pinned onto the slot's host, it takes them and the slot moves (the plan says why). Either way the
deployment still wakes on a request. (The project and its short timings: tests/test_fleet_scaler.py.)"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.fleet import Fleet
from tests.test_fleet_scaler import ScalerProject, ask

pytestmark = pytest.mark.fleet
CORES = os.cpu_count() or 2
"""Each fleet host has the machine's cores: a replica of this many takes a whole host."""
ZERO = f"""
    metadata: {{name: zero}}
    spec: {{model: tiny, accelerator: cpu, cpu_cores: {CORES}, context_length: 512,
            replicas: {{min: 0, max: 1, idle_minutes: 30}}}}
    """


def busy(host: str | None = None) -> str:
    pin = f", host: {host}" if host else ""
    return f"""
    metadata: {{name: busy}}
    spec: {{model: tiny, accelerator: cpu, cpu_cores: {CORES}, context_length: 512{pin}}}
    """


@pytest.fixture(scope="module")
def rp(fleet: Fleet, weights: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ScalerProject]:
    p = ScalerProject(tmp_path_factory.mktemp("scaler-reserved"), fleet)
    p.write(ZERO)
    with p.applied():
        yield p


def slot_host(p: ScalerProject) -> str:
    (slot,) = p.state().deployments["zero"].replicas
    return slot.host


def test_a_new_always_on_replica_keeps_off_the_cores_of_an_on_demand_slot(rp: ScalerProject) -> None:
    reserved = slot_host(rp)
    rp.write(ZERO + "---\n" + busy())
    plan = rp.cli("plan", check=True).stdout
    assert f"kept off {reserved} (on-demand zero replica 0 reserves it)" in plan, plan
    rp.cli("apply", "--auto-approve", check=True)
    (replica,) = rp.state().deployments["busy"].replicas
    assert replica.host != reserved and slot_host(rp) == reserved
    assert ask(rp.client(), "zero") == "zero"  # it wakes: its cores are free
    assert ask(rp.client(), "busy") == "busy"
    assert rp.cli("plan", "--detailed-exitcode").returncode == 0


def test_an_always_on_replica_pinned_onto_the_slots_host_moves_the_slot_and_the_plan_says_why(
    rp: ScalerProject,
) -> None:
    reserved = slot_host(rp)
    unit = rp.state().deployments["zero"].replicas[0].unit
    rp.fleet.ssh(rp.host_of(reserved), f"systemctl stop {unit}")  # (at zero again: the slot is only reinstalled)
    rp.write(ZERO + "---\n" + busy(reserved))
    plan = rp.cli("plan", "--detailed-exitcode")
    assert plan.returncode == 2
    assert f"moved: always-on replicas hold {CORES} of the {CORES} cores of {reserved}" in plan.stdout, plan.stdout
    rp.cli("apply", "--auto-approve", check=True)
    assert rp.state().deployments["busy"].replicas[0].host == reserved
    assert slot_host(rp) != reserved
    assert ask(rp.client(), "zero") == "zero"  # it wakes where it moved
    assert rp.cli("plan", "--detailed-exitcode").returncode == 0
