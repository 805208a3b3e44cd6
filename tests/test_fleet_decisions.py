"""Decision models (api: decisions, seed 003) on the real fleet with the real llama-server built for the tests:
a tiny real decision GGUF (tests/tools/make_tiny_decision_model.py: the metadata llama.cpp's
tools/server/server-decision.cpp reads) is proven ready with the seed's readiness decision, never with
GET /health alone and never with a chat request; one that answers malformed never becomes ready.

That llama-server reports version 0.6.0-dev, below the seed's 0.7.0 floor for decisions: the inventory
registers the build as serving decision models (engines.llama.cpp.decisions: true); without that registration
the host is refused with host_capability_missing:decisions."""

from __future__ import annotations

import dataclasses
import json
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine_ctl.core.decisions import READINESS_CHECK_VERSION, readiness_body
from tests.fleet import Fleet
from tests.fleetproject import MODELS_DIR, Project
from tests.llama import llama_server_dir
from tests.tools.make_tiny_decision_model import tiny_decision_model

SPEC = "api: decisions\ncontext_length: 512"


@pytest.fixture(scope="module")
def decision_weights(fleet: Fleet, weights: None) -> None:
    """The tiny decision model and the one answering malformed in every host's models_dir."""
    good, bad = tiny_decision_model(), tiny_decision_model(malformed=True)
    for h in fleet.hosts:
        fleet.ssh(h, f"cp {good} {MODELS_DIR}/tiny/decide.gguf && cp {bad} {MODELS_DIR}/tiny/decide-bad.gguf")


def _inventory(fleet: Fleet, tmp_path: Path, registered: bool) -> Fleet:
    """The fleet's inventory with the llama.cpp build named per platform, registered as serving decisions."""
    inventory = tmp_path / "inv" / "hosts.yaml"
    inventory.parent.mkdir(exist_ok=True)
    build = json.dumps({"cpu": str(llama_server_dir() / "bin" / "llama-server"), "decisions": registered})
    text = re.sub(r"  engines: .*\n", f'  engines: {{"llama.cpp": {build}}}\n', Path(fleet.inventory).read_text())
    inventory.write_text(text)
    return dataclasses.replace(fleet, inventory=str(inventory))


@pytest.fixture
def decider(tmp_path: Path, fleet: Fleet, decision_weights: None) -> Iterator[Project]:
    docs = tmp_path / "docs"
    docs.mkdir()
    p = Project(docs, _inventory(fleet, tmp_path, registered=True), "t-decider")
    yield p
    if p.state_file.exists():
        p.cli("destroy", "--auto-approve")


def _journal(p: Project, host: str, unit: str) -> str:
    return p.fleet.ssh(p.fleet.host(host), f"journalctl _SYSTEMD_UNIT={unit} --no-pager -o cat").stdout


def _decide(p: Project, replica: dict) -> dict:  # type: ignore[type-arg]
    req = urllib.request.Request(
        f"http://{p.address(replica['host'])}:{replica['port']}/v1/systemone",
        data=readiness_body(p.name).encode(), headers={"Content-Type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


# llama-server writes `print_timing … eval time` for every generating (chat) request, never for a decision
CHAT_SERVED = "print_timing"
TASK_PROCESSED = "processing task"


def test_a_decisions_deployment_is_ready_once_it_answers_the_readiness_decision(decider: Project) -> None:
    p = decider
    p.write(SPEC, model_file="decide.gguf")
    applied = p.cli("apply", "--auto-approve")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert "answered the readiness decision: " in applied.stdout + applied.stderr
    (replica,) = p.replicas()
    assert replica["status"] == "serving"
    reference = p.state()["deployments"][p.name]["decision_reference"]
    assert reference["version"] == READINESS_CHECK_VERSION
    assert set(reference["probabilities"]) == {"billing", "shipping", "technical"}
    assert abs(sum(reference["probabilities"].values()) - 1) < 0.001
    assert reference["choice"] in reference["probabilities"]
    # the engine itself answers the same question the same way (the reference is the engine's own answer)
    again = _decide(p, replica)["answers"]["route"]
    assert again["choice"] == reference["choice"]
    journal = _journal(p, replica["host"], replica["unit"])
    assert TASK_PROCESSED in journal and CHAT_SERVED not in journal, journal[-2000:]

    status = json.loads(p.cli("status", p.name, "--json", check=True).stdout)
    (dep,) = status["deployments"]
    assert dep["api"] == "decisions" and dep["state"] == "Ready"
    assert re.search(r"^API +decisions$", p.cli("status", p.name, check=True).stdout, re.M)


def test_a_model_answering_malformed_never_becomes_ready_and_gets_no_chat_request(decider: Project) -> None:
    p = decider
    p.write(SPEC, model_file="decide-bad.gguf")
    applied = p.cli("apply", "--auto-approve")
    out = applied.stdout + applied.stderr
    assert applied.returncode == 1, out
    # the real engine's answer: every probability NaN, which llama-server writes as null
    assert "the readiness decision failed: answers.route.probabilities.billing is None" in out, out
    state = p.state()["deployments"][p.name]
    assert not [r for r in state["replicas"] if r["status"] == "serving"]
    assert state["state"] != "Ready" and "decision_reference" not in state
    unit = re.search(r"(engine-ctl-t-decider-\S+?\.service)", out)
    assert unit is not None, out
    host = p.fleet.hosts[0].name if len(p.fleet.hosts) == 1 else re.search(r" on (\S+?)[:\s]", out).group(1)  # type: ignore[union-attr]
    journal = _journal(p, host, unit.group(1))
    # the decision was asked (the engine processed a task), and no chat request was sent in its place
    assert TASK_PROCESSED in journal and CHAT_SERVED not in journal, journal[-2000:]


def test_a_build_below_the_floor_is_refused_unless_the_inventory_registers_it(
    tmp_path: Path, fleet: Fleet, decision_weights: None
) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    p = Project(docs, _inventory(fleet, tmp_path, registered=False), "t-floor")
    host = fleet.hosts[0].name
    p.write(f"{SPEC}\nhost: {host}", model_file="decide.gguf")
    planned = p.cli("plan")
    out = planned.stdout + planned.stderr
    assert "host_capability_missing:decisions: llama.cpp at " in out, out
    assert f"on {host} is version 0.6.0-dev; decision models need 0.7.0 or newer" in out
    assert not p.state_file.exists() or not p.replicas()
