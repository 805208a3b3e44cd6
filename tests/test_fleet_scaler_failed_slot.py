"""A scale-to-zero deployment after one failed wake (issue 24, point 14), on the real fleet with the real scaler,
HAProxy and llama-server. A start on corrupt weights fails, and systemd's start limit (StartLimitIntervalSec: up to
42 minutes) would refuse every later start: the scaler resets a failed slot before a new wake, and `plan` reports
a slot that cannot start (a change, exit 2) which apply resets. (The project: tests/test_fleet_scaler.py.)"""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from tests.fleet import Fleet, FleetHost
from tests.fleetproject import MODELS_DIR
from tests.test_fleet_scaler import ScalerProject, ask

pytestmark = pytest.mark.fleet
UNIT = "engine-ctl-relock-0a.service"
TINY = f"{MODELS_DIR}/tiny/tiny.gguf"


@pytest.fixture(scope="module")
def fp(fleet: Fleet, weights: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ScalerProject]:
    p = ScalerProject(tmp_path_factory.mktemp("scaler-failed"), fleet)
    p.write(f"""
        metadata: {{name: relock}}
        spec: {{model: tiny, accelerator: cpu, cpu_cores: 1, context_length: 512, host: {fleet.hosts[1].name},
                replicas: {{min: 0, max: 1, idle_minutes: 30}}}}
        """)  # fmt: skip
    fleet.ssh(fleet.hosts[1], f"cp {TINY} {TINY}.good")
    with p.applied():
        yield p


def unit_state(p: ScalerProject, host: FleetHost) -> str:
    return p.fleet.ssh(host, f"systemctl show -p ActiveState --value {UNIT}").stdout.strip()


def corrupt(p: ScalerProject, host: FleetHost) -> None:
    p.fleet.ssh(host, f"cp {MODELS_DIR}/tiny/corrupt.gguf {TINY}")


def restore(p: ScalerProject, host: FleetHost) -> None:
    p.fleet.ssh(host, f"cp {TINY}.good {TINY}")


def in_start_limit(p: ScalerProject, host: FleetHost) -> None:
    """Failed after its restarts: systemd refuses every start in StartLimitIntervalSec ("Start request repeated
    too quickly"; its Result stays the engine's exit-code)."""
    p.wait("the slot failed", lambda: unit_state(p, host) == "failed", 120)
    journal = p.fleet.ssh(host, f"journalctl -u {UNIT} --no-pager -n 50").stdout
    assert "Start request repeated too quickly" in journal, journal[-2000:]


def test_a_failed_wake_does_not_lock_the_deployment_out(fp: ScalerProject) -> None:
    host = fp.fleet.hosts[1]
    fp.wait("relock at zero", lambda: not fp.active("relock", 0), 60)
    corrupt(fp, host)
    with pytest.raises(openai.APIStatusError) as raised:  # the wake fails: the engine cannot load the weights
        ask(fp.client(), "relock")
    assert raised.value.status_code == 503
    in_start_limit(fp, host)
    restore(fp, host)
    plan = fp.cli("plan", "--detailed-exitcode")
    assert plan.returncode == 2, plan.stdout + plan.stderr
    assert "No changes" not in plan.stdout and "its last start failed" in plan.stdout, plan.stdout
    assert ask(fp.client(), "relock") == "relock"  # the next wake: the scaler reset the slot, then started it
    assert fp.active("relock", 0)
    resets = [d for d in fp.decisions("relock") if d["action"] == "reset"]
    assert resets and resets[-1]["slot"] == 0 and "had failed its last start" in resets[-1]["reason"]
    assert fp.cli("plan", "--detailed-exitcode").returncode == 0


def test_the_plan_reports_a_slot_that_cannot_start_and_apply_resets_it(fp: ScalerProject) -> None:
    host = fp.fleet.hosts[1]
    fp.fleet.ssh(host, f"systemctl stop {UNIT}")  # (the scaler puts its server into maintenance)
    corrupt(fp, host)
    fp.fleet.ssh(host, f"systemctl start {UNIT}", check=False)  # a failed start, as a failed wake leaves it
    in_start_limit(fp, host)
    restore(fp, host)
    plan = fp.cli("plan", "--detailed-exitcode")
    assert plan.returncode == 2 and "its last start failed" in plan.stdout, plan.stdout + plan.stderr
    fp.cli("apply", "--auto-approve", check=True)
    assert unit_state(fp, host) == "inactive"  # reset, and not started: the scaler starts it on a request
    after = fp.cli("plan", "--detailed-exitcode")
    assert after.returncode == 0 and "No changes" in after.stdout, after.stdout + after.stderr
    assert ask(fp.client(), "relock") == "relock"
