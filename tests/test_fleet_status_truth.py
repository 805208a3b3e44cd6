"""status and list tell the truth after lifecycle moves, and every command finds one state (issues 24 and 26), on
the real fleet: a real llama-server unit under systemd on the second host, the real HAProxy gateway and scaler on
the first, the real CLI in a subprocess, run as the README's layout has it: the documents in deploy/, hosts.yaml
at the project's root, every command run from the root (and one from deploy/) with no --state and no --inventory.

- `apply deploy/` and then `status`, `list`, `park`, `start` from the root all use one state, the root's.
- `park NAME` and `start NAME` are accepted as `status NAME` is.
- Right after a park, and until it is done, `list` says what `status` says.
- After park, a wake by a request and `start`, READY is 1/1 (one replica: never counted twice).
- A min-1 deployment whose only unit was stopped by hand is not `scaledtozero 0/0` with the reason an older,
  destroyed deployment of the same name left in the scaler's state.json: status reads only its own deployment ID's
  entry, says the unit was stopped outside engine-ctl, and agrees with the plan (drift, exit 2).
- A replica on a host the inventory does not have is an error at the state's place (file:line:column, field),
  exit 1, not "unreachable" with exit 0."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine_ctl.core.documents.apikey import key_sha256
from engine_ctl.core.render.scaler import SCALER_STATE, SCALER_UNIT
from tests.fleet import Fleet
from tests.fleetproject import gateway_chat

pytestmark = pytest.mark.fleet
KEY = "ak-test-status-truth-" + "e5" * 24
NAME = "truth"
UNIT = f"engine-ctl-{NAME}-0a.service"
OLD_ID = "01J0000000000000000000OLD0"
OLD_REASON = "no request for 5 minutes: scaled to zero (an older deployment)"


class Repo:
    """The README's layout: hosts.yaml at the root (the first host a gateway), the documents in deploy/."""

    def __init__(self, root: Path, fleet: Fleet) -> None:
        self.root, self.fleet = root, fleet
        self.gateway, self.engine_host = fleet.hosts[0], fleet.hosts[1]
        inventory = Path(fleet.inventory).read_text()
        line = f"  - {{name: {self.gateway.name}, address: {self.gateway.address}}}"
        assert line in inventory
        (root / "hosts.yaml").write_text(inventory.replace(line, line[:-1] + ", roles: [gateway]}"))
        self.deploy = root / "deploy"
        self.deploy.mkdir()
        (self.deploy / "docs.yaml").write_text(textwrap.dedent(f"""\
            kind: Model
            metadata: {{name: tiny}}
            spec: {{format: gguf, path: tiny/tiny.gguf, parameters: 4170048}}
            ---
            metadata: {{name: {NAME}}}
            spec: {{model: tiny, accelerator: cpu, cpu_cores: 1, context_length: 512, host: {self.engine_host.name}}}
            ---
            kind: ApiKey
            metadata: {{name: all}}
            spec: {{sha256: {key_sha256(KEY)}}}
            """))  # fmt: skip

    def cli(self, *args: str, cwd: Path | None = None, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "engine_ctl", *args]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, cwd=cwd or self.root)
        assert "Traceback" not in proc.stderr, proc.stderr
        return proc

    def on_engine_host(self, command: str) -> str:
        return self.fleet.ssh(self.engine_host, command, check=False).stdout.strip()

    def unit_state(self) -> str:
        return self.on_engine_host(f"systemctl is-active {UNIT}")

    def ask(self) -> int:
        return gateway_chat(self.gateway.address, KEY, NAME)[0]


def row(shown: str) -> str:
    """The deployment's row of status or list, its columns single-spaced."""
    found = [" ".join(line.split()) for line in shown.splitlines() if line.startswith(f"{NAME} ")]
    assert found, shown
    return found[0]


def seen(repo: Repo, command: str) -> tuple[str, int, int, str | None]:
    """(state, ready, replicas, reason) as `status --json` or `list --json` says them."""
    out = repo.cli(command, "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    (d,) = json.loads(out.stdout)["deployments"]
    return d["state"], d["ready"], d["replicas"], d["reason"]


@pytest.fixture(scope="module")
def repo(fleet: Fleet, weights: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Repo]:
    r = Repo(tmp_path_factory.mktemp("truth"), fleet)
    yield r
    if (r.root / "engine-ctl.state.json").exists():
        r.cli("destroy", "deploy/", "--auto-approve")
    fleet.ssh(r.gateway, f"systemctl disable --now engine-ctl-gateway.service {SCALER_UNIT}; rm -f {SCALER_STATE}",
              check=False)  # fmt: skip


def test_every_command_run_from_the_root_finds_the_state_apply_deploy_wrote(repo: Repo) -> None:
    applied = repo.cli("apply", "deploy/", "--auto-approve")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert (repo.root / "engine-ctl.state.json").is_file() and not (repo.deploy / "engine-ctl.state.json").exists()
    assert row(repo.cli("status", NAME).stdout).startswith(f"{NAME} ready 1/1 1 ")
    assert row(repo.cli("list").stdout).startswith(f"{NAME} ready 1/1 1 ")
    below = repo.cli("status", NAME, cwd=repo.deploy)  # from deploy/: found upwards, as git finds its root
    assert below.returncode == 0 and row(below.stdout).startswith(f"{NAME} ready 1/1 1 "), below.stdout + below.stderr
    assert repo.cli("plan", "deploy/", "--detailed-exitcode").returncode == 0


def test_right_after_a_park_list_says_what_status_says(repo: Repo) -> None:
    parked = repo.cli("park", NAME)  # the short form, as `status NAME`
    assert parked.returncode == 0 and f"Park requested for {NAME}" in parked.stdout, parked.stdout + parked.stderr
    deadline = time.monotonic() + 90
    while True:
        before, listed, after = seen(repo, "status"), seen(repo, "list"), seen(repo, "status")
        assert listed in (before, after), (before, listed, after)  # the same verdict, whichever moment it saw
        assert listed[1:3] == (0, 1), listed  # one replica, serving nothing while held
        if before[0] == after[0] == "parked":
            break
        assert time.monotonic() < deadline, after
    assert repo.unit_state() == "inactive"


def test_after_park_a_wake_by_a_request_then_start_ready_is_one_of_one(repo: Repo) -> None:
    assert repo.ask() == 200  # held by the gateway while the scaler wakes it
    shown = row(repo.cli("status", NAME).stdout)
    assert shown.startswith(f"{NAME} ready 1/1 ") and shown.endswith("wake succeeded (request)"), shown
    started = repo.cli("start", NAME)
    assert started.returncode == 0, started.stdout + started.stderr
    assert repo.ask() == 200
    for command in ("status", "list"):
        assert seen(repo, command)[:3] == ("Ready", 1, 1), command
        shown = repo.cli(command, *([NAME] if command == "status" else [])).stdout
        assert row(shown).split()[1:3] == ["ready", "1/1"], shown


def test_a_unit_stopped_by_hand_is_not_read_through_an_older_deployments_scaler_entry(repo: Repo) -> None:
    old = {"format": 1, "updated": "2026-12-01T00:00:00+00:00", "deployments": {NAME: {
        "id": OLD_ID, "state": "ScaledToZero", "reason": OLD_REASON, "wanted": 0, "ready": 0, "running": [],
        "decisions": [{"at": "2026-12-01T00:00:00+00:00", "action": "zero", "reason": OLD_REASON}],
    }}}  # fmt: skip
    repo.fleet.ssh(repo.gateway, f"systemctl stop {SCALER_UNIT}; mkdir -p {Path(SCALER_STATE).parent} && "
                   f"echo '{json.dumps(old)}' > {SCALER_STATE}")  # fmt: skip
    repo.on_engine_host(f"systemctl stop {UNIT}")
    assert repo.unit_state() == "inactive"
    for command in ("status", "list"):
        state, ready, replicas, reason = seen(repo, command)
        assert (state, ready, replicas) == ("Failed", 0, 1), (command, state, ready, replicas, reason)
        assert reason is not None and "stopped outside engine-ctl" in reason and OLD_REASON not in reason, reason
    shown = repo.cli("status", NAME, "--decisions").stdout
    assert OLD_REASON not in shown and row(shown).split()[1:3] == ["failed", "0/1"], shown
    plan = repo.cli("plan", "deploy/", "--detailed-exitcode")
    assert plan.returncode == 2 and UNIT in plan.stdout, plan.stdout + plan.stderr  # the plan calls it drift too
    repaired = repo.cli("apply", "deploy/", "--auto-approve")
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    assert seen(repo, "status")[:3] == ("Ready", 1, 1)


def test_a_replica_on_a_host_the_inventory_lacks_is_an_error_at_the_states_place(repo: Repo) -> None:
    host = repo.engine_host.name
    lines = (repo.root / "hosts.yaml").read_text().splitlines()
    (repo.root / "other.yaml").write_text("\n".join(x for x in lines if f"name: {host}," not in x) + "\n")
    state = repo.root / "engine-ctl.state.json"
    for command in ("status", "list"):
        shown = repo.cli(command, "--inventory", "other.yaml")
        assert shown.returncode == 1, command + shown.stdout + shown.stderr
        assert "unreachable" not in shown.stdout + shown.stderr
        text = state.read_text().splitlines()
        replicas = next(i for i, x in enumerate(text) if '"replicas"' in x)
        line = next(i for i, x in enumerate(text, 1) if i > replicas and f'"host": "{host}"' in x)
        column = text[line - 1].index('"host"') + len('"host": ') + 1
        assert (
            f"{state.name}:{line}:{column}: error: deployments.{NAME}.replicas[0].host: host '{host}', where replica 0 "
            f"of {NAME} runs as the state records it, is not in the inventory other.yaml"
        ) in shown.stderr, shown.stderr
