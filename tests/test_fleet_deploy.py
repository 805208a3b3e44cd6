"""`engine-ctl deploy model --file FILE` on the real fleet (seed 003, "Deploy and start"): real llama-server units
under systemd, the real HAProxy gateway in front, the real CLI in a subprocess.

One deployment, `dp` (one replica, pinned to the second host; the first host is the gateway), in its own file
beside the model and key documents: deployed without --activate (saved: the created block, its unit written and
not started, the gateway refuses it as stopped), started with `start deployment dp --wait` (the checkpoint
fingerprinted first, then a real completion), changed and deployed again with its current --revision (the updated
block, revision 2), and with a stale --revision (revision_mismatch, exit 26, nothing changed). Then a second
deployment, `dq`, in its own file: saved, edited and saved again (revision 2, still held), then deployed with
--activate --wait (the `Deployed dq: ready` block)."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine_ctl.core.documents.apikey import key_sha256
from engine_ctl.core.plan.deploy import SAVED
from engine_ctl.core.weights import checkpoint_digest
from tests.fleet import Fleet
from tests.fleetproject import gateway_chat
from tests.llama import tiny_model

pytestmark = pytest.mark.fleet
KEY = "ak-test-deploy-" + "e5" * 24
ULID = re.compile(r"[0-9A-HJKMNP-TV-Z]{26}")
UNIT = "engine-ctl-dp-0a.service"


class Deploying:
    """Documents in one directory (model and key in one file, each deployment in its own), the inventory (the
    fleet's first two hosts, the first a gateway) and the state beside it, and the real CLI."""

    def __init__(self, path: Path, fleet: Fleet) -> None:
        self.path, self.fleet = path, fleet
        self.gateway, self.engine_host = fleet.hosts[0], fleet.hosts[1]
        inventory = Path(fleet.inventory).read_text()
        line = f"  - {{name: {self.gateway.name}, address: {self.gateway.address}}}"
        assert line in inventory
        self.inventory = path / "hosts.yaml"
        others = [f"  - {{name: {h.name}, address: {h.address}}}\n" for h in fleet.hosts[2:]]
        for other in others:  # the two hosts it uses only: each command gathers facts from fewer hosts
            assert other in inventory
            inventory = inventory.replace(other, "")
        self.inventory.write_text(inventory.replace(line, line[:-1] + ", roles: [gateway]}"))
        self.state_file = path / "engine-ctl.state.json"
        self.docs = path / "docs"
        self.docs.mkdir()
        (self.docs / "common.yaml").write_text(
            "kind: Model\nmetadata: {name: tiny}\nspec: {format: gguf, path: tiny/tiny.gguf, parameters: 4170048}\n"
            f"---\nkind: ApiKey\nmetadata: {{name: all}}\nspec: {{sha256: {key_sha256(KEY)}}}\n"
        )
        self.write("dp", 512)

    def write(self, name: str, context: int) -> Path:
        file = self.docs / f"{name}.yaml"
        file.write_text(textwrap.dedent(f"""
            metadata: {{name: {name}}}
            spec: {{model: tiny, accelerator: cpu, cpu_cores: 1, context_length: {context},
                    host: {self.engine_host.name}}}
            """))  # fmt: skip
        return file

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "engine_ctl", *args, "--inventory", str(self.inventory), "--state",
                str(self.state_file)]  # fmt: skip
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False, cwd=self.docs)
        assert "Traceback" not in proc.stderr, proc.stderr
        return proc

    def deploy(self, name: str, *flags: str) -> subprocess.CompletedProcess[str]:
        return self.cli("deploy", "model", "--file", str(self.docs / f"{name}.yaml"), *flags)

    def state(self) -> dict:  # type: ignore[type-arg]
        return json.loads(self.state_file.read_text())

    def on_engine_host(self, command: str) -> str:
        return self.fleet.ssh(self.engine_host, command, check=False).stdout.strip()

    def ask(self, model: str = "dp") -> tuple[int, dict]:  # type: ignore[type-arg]
        """One chat request through the gateway: its HTTP status and JSON body."""
        return gateway_chat(self.gateway.address, KEY, model)


@pytest.fixture(scope="module")
def dp(fleet: Fleet, weights: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deploying]:
    p = Deploying(tmp_path_factory.mktemp("deploy"), fleet)
    yield p
    if p.state_file.exists():
        p.cli("destroy", str(p.docs), "--auto-approve")
    fleet.ssh(p.gateway, "systemctl disable --now engine-ctl-gateway.service", check=False)


def identity(line: str) -> str:
    found = re.fullmatch(r"Request identity: ([0-9A-Z]{26}) \(reuse --request-id \1 to recover this command\)", line)
    assert found, line
    return found.group(1)


def tiny_digest() -> str:
    """The checkpoint digest of the tiny model's one file, computed here from the same bytes the host has."""
    return checkpoint_digest({"tiny.gguf": hashlib.sha256(Path(tiny_model()).read_bytes()).hexdigest()})


def test_deploy_without_activate_saves_it_and_starts_nothing(dp: Deploying) -> None:
    saved = dp.deploy("dp")
    assert saved.returncode == 0, saved.stdout + saved.stderr
    identity(saved.stderr.splitlines()[0])
    record = dp.state()["deployments"]["dp"]
    lines = saved.stdout.splitlines()
    assert lines[:2] == ["Deployment dp created (revision 1)", ""], saved.stdout
    assert lines[2] == f"  Deployment ID       {record['id']}" and ULID.fullmatch(record["id"]), lines
    operation = re.fullmatch(r"  Operation           ([0-9A-Z]{26})", lines[3])
    assert operation and operation.group(1) in {o["id"] for o in dp.state()["operations"]}, lines
    assert lines[4:] == [
        "  Checkpoint digest   being measured",
        "the checkpoint digest of dp is being measured; `engine-ctl start deployment dp --wait` waits for it and "
        "starts the deployment",
    ]
    held = (record["revision"], record["operator"]["verb"], record["last_operation"])
    assert held == (1, "stopped", "saved, not started")
    assert [r["status"] for r in record["replicas"]] == ["stopped"]
    # its unit is written and loaded, never enabled or started: nothing runs on the host
    assert dp.on_engine_host(f"test -e /etc/systemd/system/{UNIT} && echo there") == "there"
    assert dp.on_engine_host(f"systemctl is-active {UNIT}") == "inactive"
    assert dp.on_engine_host(f"systemctl is-enabled {UNIT}") == "disabled"
    assert dp.on_engine_host("pgrep -x llama-server || echo none") == "none"
    status, body = dp.ask()
    assert (status, body["code"]) == (409, "deployment_stopped"), body
    shown = dp.cli("status", "dp")
    assert re.search(r"^dp\s+stopped\s+0/1\s+1\s.*saved, not started$", shown.stdout, re.MULTILINE), shown.stdout


def test_start_wait_fingerprints_the_checkpoint_then_starts_it(dp: Deploying) -> None:
    started = dp.cli("start", "deployment", "dp", "--wait")
    assert started.returncode == 0, started.stdout + started.stderr
    identity(started.stderr.splitlines()[0])
    assert started.stdout.splitlines() == [
        "Waiting for the checkpoint digest of dp to be measured (at most 900s)",
        "Started dp: ready",
        "",
        "  Ready       1/1",
        f"  Hosts       {dp.engine_host.name}",
        "  Operation   initialize succeeded",
    ]
    record = dp.state()["deployments"]["dp"]
    assert [r["checkpoint_digest"] for r in record["replicas"]] == [tiny_digest()]
    assert "operator" not in record and record["last_operation"] == "initialize succeeded"
    status, body = dp.ask()
    assert status == 200 and body["model"] == "dp", body
    assert body["choices"][0]["message"]["role"] == "assistant" and body["usage"]["completion_tokens"] >= 1, body


def test_deploy_with_the_current_revision_updates_it(dp: Deploying) -> None:
    dp.write("dp", 1024)
    updated = dp.deploy("dp", "--revision", "1")
    assert updated.returncode == 0, updated.stdout + updated.stderr
    record = dp.state()["deployments"]["dp"]
    lines = updated.stdout.splitlines()
    assert lines[:3] == ["Deployment dp updated (revision 2)", "", f"  Deployment ID       {record['id']}"], lines
    assert re.fullmatch(r"  Operation           [0-9A-Z]{26}", lines[3]) and len(lines) == 5, lines
    assert lines[4] == f"  Checkpoint digest   {tiny_digest()[:12]}"  # known: the files are not read again
    assert record["revision"] == 2 and record["spec"]["context_length"] == 1024
    unit = record["replicas"][0]["unit"]  # a new unit (the other slot) replaced the first
    assert [r["status"] for r in record["replicas"]] == ["serving"] and "--ctx-size 2048" in " ".join(
        record["replicas"][0]["argv"]
    )
    assert dp.on_engine_host(f"systemctl is-active {unit}") == "active"
    assert dp.ask()[0] == 200
    listed = dp.cli("list", str(dp.docs))
    assert re.search(rf"^dp\s+ready\s+1/1\s+2\s+{dp.engine_host.name}$", listed.stdout, re.MULTILINE), listed.stdout


def test_deploy_with_a_stale_revision_is_refused_and_changes_nothing(dp: Deploying) -> None:
    before = dp.state_file.read_text()
    unit = dp.state()["deployments"]["dp"]["replicas"][0]["unit"]
    pid = dp.on_engine_host(f"systemctl show -p MainPID --value {unit}")
    dp.write("dp", 768)
    refused = dp.deploy("dp", "--revision", "1")
    assert refused.returncode == 26, refused.stdout + refused.stderr
    assert "dp is at revision 2, not revision 1: a change was deployed since you read it; nothing was changed" in (
        refused.stderr
    ), refused.stderr
    assert "deploy again with --revision 2" in refused.stderr
    assert dp.state_file.read_text() == before  # not even the request was recorded
    assert pid != "0" and dp.on_engine_host(f"systemctl show -p MainPID --value {unit}") == pid
    dp.write("dp", 1024)


def test_a_saved_deployment_edited_is_saved_again_then_activate_starts_it(dp: Deploying) -> None:
    dp.write("dq", 512)
    assert dp.deploy("dq").returncode == 0
    dp.write("dq", 1024)
    again = dp.deploy("dq", "--revision", "1")
    assert again.returncode == 0, again.stdout + again.stderr
    assert again.stdout.splitlines()[0] == "Deployment dq updated (revision 2)", again.stdout
    record = dp.state()["deployments"]["dq"]
    assert (record["revision"], record["operator"]["verb"], record["last_operation"]) == (2, "stopped", SAVED)
    assert [r["status"] for r in record["replicas"]] == ["stopped"]
    assert dp.on_engine_host(f"systemctl is-active {record['replicas'][0]['unit']}") == "inactive"
    assert dp.ask("dq")[1]["code"] == "deployment_stopped"
    deployed = dp.deploy("dq", "--activate", "--wait")
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr
    lines = deployed.stdout.splitlines()
    assert lines[:8] == [
        "Waiting for the checkpoint digest of dq to be measured (at most 900s)",
        "Deployed dq: ready",
        "",
        "  Revision    2",
        f"  Hosts       {dp.engine_host.name}",
        "  Ready       1/1",
        lines[6],
        "  Context     1024 tokens",
    ], lines
    assert re.fullmatch(r"  Startup     \d+\.\d (MiB|GiB)", lines[6]), lines
    assert lines[8:] == ["  Operation   initialize succeeded"], lines
    record = dp.state()["deployments"]["dq"]
    assert [r["checkpoint_digest"] for r in record["replicas"]] == [tiny_digest()]
    assert "operator" not in record and dp.ask("dq")[0] == 200
    assert dp.state()["deployments"]["dp"]["revision"] == 2  # only the file's deployment was acted on
