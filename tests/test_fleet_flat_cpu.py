"""The flat form on CPU-only hosts (seed 003, "the host decides"): a flat `engine: llamacpp` document has no
accelerator field, so the host decides. On the fleet's CPU-only hosts it runs on the CPU with the real
llama-server, as the spec form's `accelerator: cpu` does, chat and decision models (api: decisions) alike; before
this it was Pending forever, "Waiting for a machine with GPUs llama.cpp runs on"."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fleet import Fleet
from tests.fleetproject import MODELS_DIR, Project
from tests.test_fleet_decisions import _inventory, decision_weights  # noqa: F401 (a fixture)

pytestmark = pytest.mark.fleet


def _flat(p: Project, body: str) -> None:
    (p.path / "docs.yaml").write_text(f"name: {p.name}\nengine: llamacpp\n{body}")


@pytest.fixture
def flat(tmp_path: Path, fleet: Fleet, weights: None, decision_weights: None) -> Iterator[Project]:  # noqa: F811
    docs = tmp_path / "docs"
    docs.mkdir()
    p = Project(docs, _inventory(fleet, tmp_path, registered=True), "t-flat-cpu")
    yield p
    if p.state_file.exists():
        p.cli("destroy", "--auto-approve")


def _runs_on_the_cpu(p: Project) -> dict:  # type: ignore[type-arg]
    planned = p.cli("plan")
    out = planned.stdout + planned.stderr
    assert "Waiting for a machine with GPUs" not in out, out
    assert "accelerator" in out and "cpu" in out, out
    applied = p.cli("apply", "--auto-approve")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    (replica,) = p.replicas()
    assert replica["status"] == "serving"
    assert "--n-gpu-layers" not in replica["argv"] and "--threads" in replica["argv"], replica["argv"]
    record = p.state()["deployments"][p.name]
    assert record["plan"]["accelerator"] == "cpu" and record["plan"]["gpus"] == 0
    again = p.cli("plan", "--detailed-exitcode")
    assert again.returncode == 0, again.stdout + again.stderr  # no changes: the choice is kept with the revision
    (dep,) = json.loads(p.cli("status", p.name, "--json", check=True).stdout)["deployments"]
    assert dep["state"] == "Ready", dep
    return replica


def test_a_flat_llamacpp_document_runs_on_a_cpu_only_host(flat: Project) -> None:
    p = flat
    _flat(p, "model: tiny/tiny.gguf\n")
    replica = _runs_on_the_cpu(p)
    answer = p.chat(replica)
    assert answer["model"] == p.name


def test_a_flat_decisions_document_runs_on_a_cpu_only_host(flat: Project) -> None:
    p = flat
    _flat(p, "model: tiny/decide.gguf\napi: decisions\nengine_config: {context_length: 512}\n")
    _runs_on_the_cpu(p)
    reference = p.state()["deployments"][p.name]["decision_reference"]
    assert abs(sum(reference["probabilities"].values()) - 1) < 0.001


def test_a_model_directory_others_may_write_is_named_not_called_weights_on_no_host(flat: Project) -> None:
    """B41: a model directory writable by other users (an absolute path, a Hugging Face cache snapshot, say) was
    reported as weights on no host; seed 003: "its directory must not be writable by other users"."""
    p = flat
    snapshot = "/srv/b41/snapshot"
    for h in p.fleet.hosts:
        p.fleet.ssh(h, f"mkdir -p {snapshot} && cp {MODELS_DIR}/tiny/tiny.gguf {snapshot}/ && chmod 777 {snapshot}")
    _flat(p, f"model: {snapshot}/tiny.gguf\n")
    planned = p.cli("plan")
    out = planned.stdout + planned.stderr
    assert planned.returncode == 1, out
    assert f"{snapshot} is writable by other users: refused; remove their write access (chmod o-w {snapshot})" in out
    assert "on no reachable host" not in out and "put the weights on a host" not in out, out
    assert "remove the other users' write access" in out and "replace the file" not in out, out
    applied = p.cli("apply", "--auto-approve")
    assert applied.returncode == 1 and "is writable by other users" in applied.stdout + applied.stderr
    shown = p.cli("status", p.name).stdout  # status says what it waits for: the apply's recorded reason
    assert "pending" in shown and "Reason    the weights of tiny.gguf are not usable on any reachable host " in shown
