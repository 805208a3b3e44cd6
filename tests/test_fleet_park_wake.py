"""A request through the gateway wakes a parked deployment (issue 13), on the real fleet: a real llama-server unit
under systemd on the second host, the real HAProxy gateway and the real scaler (its key, its forced command) on
the first, the real CLI in a subprocess, and the official `openai` package as the client (max_retries=0).

llama.cpp has no sleep mode (restart_only): its park stops the unit, and the wake is the scaler's start of it,
health-gated, then its server put into the gateway's backend. Two requests arrive while it is parked: one whose
client gives up at once (the wake is not tied to it) and one held until the deployment serves. One wake runs
(single flight); status shows it serving (`wake succeeded (request)`), the plan says so with nothing to do, apply
leaves it serving (same engine process), a second park parks it again and `start --wait` says it wakes it."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator

import openai
import pytest

from engine_ctl.core.render.scaler import SCALER_CONFIG, SCALER_STATE, SCALER_UNIT
from tests.fleet import Fleet
from tests.test_fleet_lifecycle import KEY, UNIT, Lifecycle

pytestmark = pytest.mark.fleet


@pytest.fixture(scope="module")
def pw(fleet: Fleet, weights: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lifecycle]:
    p = Lifecycle(tmp_path_factory.mktemp("parkwake"), fleet)
    applied = p.cli("apply", "--auto-approve")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    yield p
    if (p.path / "engine-ctl.state.json").exists():
        p.cli("destroy", "--auto-approve")
    fleet.ssh(p.gateway, f"systemctl disable --now engine-ctl-gateway.service {SCALER_UNIT}", check=False)


def client(pw: Lifecycle, timeout: float) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://{pw.gateway.address}:8800/v1", api_key=KEY, max_retries=0, timeout=timeout)


def chat(pw: Lifecycle, timeout: float = 110) -> str:
    answer = client(pw, timeout).chat.completions.create(
        model="lc", messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    return answer.model


def on_gateway(pw: Lifecycle, command: str) -> str:
    return pw.fleet.ssh(pw.gateway, command, check=False).stdout


def park_and_wait(pw: Lifecycle) -> None:
    parked = pw.cli("park", "deployment", "lc")
    assert parked.returncode == 0 and "Park requested for lc" in parked.stdout, parked.stdout + parked.stderr
    deadline = time.monotonic() + 90
    while not re.search(r"^lc\s+parked\s", pw.cli("status", "lc").stdout, re.MULTILINE):
        assert time.monotonic() < deadline
        time.sleep(1)
    assert pw.unit_state() == "inactive"


def test_a_request_wakes_a_parked_llamacpp_deployment_once_and_engine_ctl_tells_the_truth(pw: Lifecycle) -> None:
    before = pw.main_pid()
    park_and_wait(pw)
    operation = pw.state()["deployments"]["lc"]["operator"]["operation"]
    config = json.loads(on_gateway(pw, f"cat {SCALER_CONFIG}"))
    (dep,) = config["deployments"]
    assert dep["name"] == "lc" and dep["parked"] == {"operation": operation, "level": 0, "calls": [], "check": None}

    answered: list[str] = []
    gave_up: list[BaseException] = []

    def impatient() -> None:
        try:
            chat(pw, timeout=0.5)
        except openai.APITimeoutError as exc:
            gave_up.append(exc)

    first = threading.Thread(target=impatient)
    first.start()
    first.join()
    assert gave_up, "the impatient client was answered before the engine could have restarted"
    held = threading.Thread(target=lambda: answered.append(chat(pw)))
    started = time.monotonic()
    held.start()
    held.join()
    assert answered == ["lc"]  # held by the gateway until the woken engine served it
    assert pw.unit_state() == "active" and pw.main_pid() != before  # restart_only: a new engine process
    waited = time.monotonic() - started

    scaler = json.loads(on_gateway(pw, f"cat {SCALER_STATE}"))["deployments"]["lc"]
    actions = [d["action"] for d in scaler["decisions"]]
    assert actions.count("wake") == 1 and actions[-1] == "woken", scaler["decisions"]  # single flight
    assert scaler["woken"]["park"] == operation

    shown = pw.cli("status", "lc").stdout
    rows = [" ".join(line.split()) for line in shown.splitlines() if line.strip()]
    assert "NAME STATE READY REVISION STARTUP INITIALIZE LAST OPERATION" in rows, shown
    row = next(r for r in rows if r.startswith("lc "))
    assert row.startswith("lc ready 1/1 1 ") and row.endswith("wake succeeded (request)"), shown
    listed = [" ".join(line.split()) for line in pw.cli("list").stdout.splitlines() if line.startswith("lc")]
    assert listed and listed[0].startswith("lc ready 1/1 1"), listed

    plan = pw.cli("plan", "--detailed-exitcode")
    assert plan.returncode == 0, plan.stdout + plan.stderr  # nothing to do, no drift
    assert "woken by a request through the gateway" in plan.stdout and "apply leaves it serving" in plan.stdout
    pid = pw.main_pid()
    applied = pw.cli("apply", "--auto-approve")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert pw.unit_state() == "active" and pw.main_pid() == pid  # not re-parked, not restarted
    again = time.monotonic()
    assert chat(pw) == "lc" and time.monotonic() - again < waited  # served at once, never held
    assert pw.state()["deployments"]["lc"]["operator"]["verb"] == "parked"  # until start clears it


def test_a_woken_deployments_hand_edited_unit_is_repaired_as_it_serves(pw: Lifecycle) -> None:
    """A parked deployment a request woke serves: its unit file edited by hand is what its engine runs at its next
    start. Before, plan listed the edit beside "No changes" (exit 0); now apply repairs it as any serving replica
    (drained, written again, restarted) and leaves the park record and the scaler's wake as they were."""
    path = f"/etc/systemd/system/{UNIT}"
    written = pw.on_engine_host(f"sha256sum {path}").split()[0]
    pw.on_engine_host(f"sed -i 's/^\\[Service\\]$/[Service]\\nEnvironment=ECTL_WOKEN_EDIT=1/' {path} && "
                      "systemctl daemon-reload")  # fmt: skip
    planned = pw.cli("plan", "--detailed-exitcode")
    said = planned.stdout + planned.stderr
    assert planned.returncode == 2, said
    assert "unit file edited by hand" in said and "rewritten and restarted" in said, said
    assert "woken by a request through the gateway" in said, said
    pid = pw.main_pid()
    applied = pw.cli("apply", "--auto-approve")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert pw.on_engine_host(f"sha256sum {path}").split()[0] == written
    assert pw.unit_state() == "active" and pw.main_pid() != pid
    assert "ECTL_WOKEN_EDIT" not in pw.on_engine_host(f"tr '\\0' '\\n' < /proc/{pw.main_pid()}/environ")
    assert chat(pw) == "lc"
    assert pw.state()["deployments"]["lc"]["operator"]["verb"] == "parked"  # still held by the park, woken
    again = pw.cli("plan", "--detailed-exitcode")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "woken by a request through the gateway" in again.stdout, again.stdout


def test_a_woken_park_parks_again_and_a_request_right_after_waits_for_the_park_then_start_clears_it(
    pw: Lifecycle,
) -> None:
    """A request that arrives while the park's job still drains: the wake waits for the job (which stops the unit),
    then brings it back, so the deployment serves at the end and the job has not stopped what the wake started."""
    first = pw.state()["deployments"]["lc"]["operator"]["operation"]
    parked = pw.cli("park", "deployment", "lc")  # parked again, though a request woke the last park
    assert parked.returncode == 0 and "Park requested for lc" in parked.stdout, parked.stdout + parked.stderr
    assert pw.state()["deployments"]["lc"]["operator"]["operation"] != first
    assert chat(pw) == "lc"  # held while the park's job drains and stops the engine, then woken
    assert pw.on_engine_host(f"systemctl is-active stop-{UNIT}") not in ("active", "activating")  # it finished
    time.sleep(3)
    assert pw.unit_state() == "active"
    actions = [d["action"] for d in json.loads(on_gateway(pw, f"cat {SCALER_STATE}"))["deployments"]["lc"]["decisions"]]
    assert actions[-2:] == ["wake", "woken"] and actions.count("wake") == 2, actions

    started = pw.cli("start", "deployment", "lc")  # it serves already: start clears the park record
    assert started.returncode == 0, started.stdout + started.stderr
    assert "operator" not in pw.state()["deployments"]["lc"]
    assert pw.unit_state() == "active" and chat(pw) == "lc"
    assert on_gateway(pw, f"test -e {SCALER_CONFIG} || echo gone").strip() == "gone"  # nothing left for it
    plan = pw.cli("plan", "--detailed-exitcode")
    assert plan.returncode == 0, plan.stdout + plan.stderr  # recorded serving: nothing to adopt
