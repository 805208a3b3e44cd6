"""Seed 000's `capabilities` and `plan` object in status --json (issue 25 point 14): capabilities derived from the
model and the engine as the seed lists them (tools with tools_reason and tools_engine_args when not,
reasoning_switch, the engine, the parsers), not copied from the Model document; the plan with `image` (the engine
build's path and digest), `amd_images`, `cpu_burst` and `port`. Pure, then through the real CLI on a state file."""

from __future__ import annotations

import json
from pathlib import Path

from engine_ctl.providers import provider
from engine_ctl.state.local import LocalState

from engine_ctl.core.fit.hostfacts import EngineInstall
from engine_ctl.core.model import Deployment, Model
from engine_ctl.core.plan.capabilities import capabilities, plan_extras
from engine_ctl.core.record.model import DeploymentRecord, ReplicaRecord, State
from tests.fleetfacts import cpu_host, mi300x2
from tests.helpers import run
from tests.test_records import FIT

LLAMA, VLLM = provider("llama.cpp"), provider("vllm")
KEYS = ["chat", "embeddings", "vision", "audio", "video", "transcription", "tools", "reasoning", "reasoning_switch",
        "structured_output", "logprobs", "engine", "tool_call_parser", "reasoning_parser"]  # fmt: skip


def test_capabilities_are_the_seeds_list_derived_from_the_model_and_the_engine() -> None:
    qwen = Model(name="qwen3-8b", format="safetensors", path="/m", capabilities=("chat", "tools", "reasoning"),
                 tool_call_parser="hermes", reasoning_parser="qwen3")  # fmt: skip
    on_vllm = capabilities(qwen, VLLM)
    assert list(on_vllm) == KEYS
    assert on_vllm["tools"] and on_vllm["tool_call_parser"] == "hermes" and on_vllm["reasoning_parser"] == "qwen3"
    assert on_vllm["reasoning_switch"] == "enable_thinking" and on_vllm["engine"] == "vllm"
    # no parser: tools are not served, and the seed's tools_reason and tools_engine_args say what to add
    bare = capabilities(qwen.model_copy(update={"tool_call_parser": None}), VLLM)
    assert bare["tools"] is False and bare["tool_call_parser"] is None
    assert bare["tools_reason"] == "vLLM needs a tool-call parser for this model: set the model's tool_call_parser"
    assert bare["tools_engine_args"] == ["--enable-auto-tool-choice", "--tool-call-parser", "<parser>"]
    assert capabilities(qwen.model_copy(update={"tool_call_parser": None}), VLLM, "chat",
                        ("--enable-auto-tool-choice", "--tool-call-parser", "hermes"))["tools"]  # fmt: skip
    # llama.cpp reads the template (--jinja): no parsers; a video the model claims is not served by it
    gguf = Model(name="gpt-oss-20b", format="gguf", path="g.gguf", capabilities=("chat", "tools", "reasoning", "video"),
                 tool_call_parser="openai", reasoning_parser="gpt_oss")  # fmt: skip
    on_llama = capabilities(gguf, LLAMA)
    assert on_llama["tools"] and on_llama["tool_call_parser"] is None and on_llama["reasoning_parser"] is None
    assert on_llama["reasoning_switch"] == "reasoning_effort" and on_llama["video"] is False
    assert "tools_reason" not in on_llama
    # vision on llama.cpp needs the model's mmproj; an embedding model answers embeddings only
    assert capabilities(Model(name="v", format="gguf", path="v.gguf", capabilities=("chat", "vision")), LLAMA)[
        "vision"] is False  # fmt: skip
    embed = capabilities(Model(name="e", format="gguf", path="e.gguf", capabilities=("embeddings",)), LLAMA)
    assert embed["embeddings"] and not embed["chat"] and not embed["tools"] and embed["tools_reason"]
    assert embed["structured_output"] is False and embed["reasoning_switch"] is None


def test_the_plan_names_the_build_its_replicas_run_the_amd_builds_cpu_burst_and_port() -> None:
    replica = ReplicaRecord(index=0, host="cpu-01", unit="engine-ctl-chat-0a.service", port=8003, unit_sha256="",
                            revision=1, argv=["/opt/llama/bin/llama-server", "--model", "m"],
                            engine_version="0.6.0-dev", engine_sha256="ab" * 32)  # fmt: skip
    rocm = EngineInstall(path="/opt/llama-rocm/llama-server", version="b5000", sha256="cd" * 32)
    amd = mi300x2().model_copy(update={"engine_builds": {"llama.cpp": {"rocm": rocm}}})
    extras = plan_extras(LLAMA, [replica], {"cpu-01": cpu_host(), "gpu-mi300": amd})
    assert extras == {
        "image": {"path": "/opt/llama/bin/llama-server", "sha256": "ab" * 32, "version": "0.6.0-dev"},
        "amd_images": {"rocm": {"path": rocm.path, "sha256": "cd" * 32, "version": "b5000"}},
        "cpu_burst": True, "port": 8003,
    }  # fmt: skip


def test_status_json_carries_the_seeds_plan_and_derived_capabilities(tmp_path: Path) -> None:
    model = Model(name="m", format="gguf", path="m.gguf", capabilities=("chat", "tools"))
    replica = ReplicaRecord(index=0, host="cpu-01", unit="engine-ctl-chat-0a.service", port=8001, unit_sha256="",
                            revision=1, argv=["/opt/llama/bin/llama-server"], engine_sha256="ef" * 32)  # fmt: skip
    record = DeploymentRecord(name="chat", revision=1, plan=FIT, model=model, spec=Deployment(name="chat", model="m"),
                              replicas=[replica], state="Ready")  # fmt: skip
    LocalState(tmp_path / "engine-ctl.state.json").write(State(deployments={"chat": record}))
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text("hosts:\n  - {name: cpu-01, address: 127.0.0.1, transport: local}\n")  # facts of this machine
    result = run("status", "chat", str(tmp_path), "--json", "--inventory", str(inventory))
    (doc,) = json.loads(result.stdout)["deployments"]
    assert doc["plan"]["image"] == {"path": "/opt/llama/bin/llama-server", "sha256": "ef" * 32, "version": None}
    assert doc["plan"]["cpu_burst"] is True and doc["plan"]["port"] == 8001 and doc["plan"]["amd_images"] == {}
    assert "capabilities" not in doc["plan"]
    assert doc["capabilities"]["tools"] is True and doc["capabilities"]["engine"] == "llama.cpp"
    assert list(doc["capabilities"]) == KEYS
