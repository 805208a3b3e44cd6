"""Shell completion as the shell asks for it (click's bash protocol, the installed console script in a new
process): commands, deployment names from the state the command would use, host names from the inventory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from engine_ctl.state import LocalState

from engine_ctl.core.record.model import DeploymentRecord, State

SCRIPT = Path(sys.executable).with_name("engine-ctl")


def complete(cwd: Path, *words: str) -> list[str]:
    line = ["engine-ctl", *words]
    env = {**os.environ, "_ENGINE_CTL_COMPLETE": "bash_complete", "COMP_WORDS": " ".join(line),
           "COMP_CWORD": str(len(line) - 1)}  # fmt: skip
    done = subprocess.run([str(SCRIPT)], cwd=cwd, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert "Traceback" not in done.stderr, done.stderr
    return [item.split(",", 1)[1] for item in done.stdout.splitlines() if "," in item]


def test_deployment_and_host_names_complete_from_the_state_and_the_inventory(tmp_path: Path) -> None:
    hosts = ["  - {name: gpu-01, address: 10.0.0.11}", "  - {name: gpu-02, address: 10.0.0.12}",
             "  - {name: edge, address: 10.0.0.2}"]  # fmt: skip
    (tmp_path / "hosts.yaml").write_text("hosts:\n" + "\n".join(hosts) + "\n")
    state = State(deployments={n: DeploymentRecord(name=n) for n in ("chat", "chat-large", "embed")})
    LocalState(tmp_path / "engine-ctl.state.json").write(state)
    assert complete(tmp_path, "st") == ["start", "state", "status", "stop"]
    assert complete(tmp_path, "stop", "ch") == ["chat", "chat-large"]
    assert set(complete(tmp_path, "stop", "")) >= {"deployment", "chat", "chat-large", "embed"}
    assert complete(tmp_path, "stop", "deployment", "e") == ["embed"]
    assert complete(tmp_path, "status", "c") == ["chat", "chat-large"]
    assert complete(tmp_path, "logs", "em") == ["embed"]
    assert complete(tmp_path, "facts", "gpu") == ["gpu-01", "gpu-02"]
    deeper = tmp_path / "deploy"
    deeper.mkdir()
    assert complete(deeper, "park", "chat-") == ["chat-large"]  # the state found upwards, as the command finds it


def test_no_state_completes_nothing_and_writes_nothing(tmp_path: Path) -> None:
    (tmp_path / "hosts.yaml").write_text("hosts: [{name: a, address: 10.0.0.1}]\n")
    assert complete(tmp_path, "stop", "c") == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hosts.yaml"]


def test_state_list_json_has_stable_fields(tmp_path: Path) -> None:
    import json

    state = State(deployments={"chat": DeploymentRecord(name="chat", revision=3)})
    LocalState(tmp_path / "engine-ctl.state.json").write(state)
    done = subprocess.run([str(SCRIPT), "state", "list", "--json"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["format_version"] == 1 and doc["serial"] == 1 and doc["lineage"]
    assert [(d["name"], d["revision"], d["replicas"]) for d in doc["deployments"]] == [("chat", 3, [])]
