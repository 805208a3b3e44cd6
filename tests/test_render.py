"""The engine unit: golden files, systemd-analyze verify, escaping, the real llama-server's flags."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from engine_ctl.core.documents.inventory import Host, Inventory
from engine_ctl.core.fit.hostfacts import HostFacts
from engine_ctl.core.fit.modelfacts import ModelFacts
from engine_ctl.core.plan.pipeline import DeploymentRender, render_deployment
from engine_ctl.core.record.model import State
from tests.fleetfacts import cpu_host, h100x8, mi300x2
from tests.helpers import load, messages
from tests.llama import llama_server_dir

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"

MODELS = """
kind: Model
metadata: {name: llama-3-2-3b}
spec: {format: gguf, path: llama/Llama-3.2-3B-Instruct-Q4_K_M.gguf, context_length: 131072, parameters: 3210000000}
---
kind: Model
metadata: {name: llama-70b-q4}
spec: {format: gguf, path: /srv/weights/llama-70b/Meta-Llama-3.1-70B-Instruct-Q4_K_M.gguf, context_length: 131072}
---
kind: Model
metadata: {name: llama-405b-q4}
spec: {format: gguf, path: llama-405b/Meta-Llama-3.1-405B-Instruct-Q4_K_M-00001-of-00006.gguf, context_length: 131072}
---
kind: Model
metadata: {name: tiny}
spec: {format: gguf, path: tiny/tiny.gguf, context_length: 2048, parameters: 4300000}
---
kind: Model
metadata: {name: qwen3-8b}
spec:
  format: safetensors
  hf: Qwen/Qwen3-8B@b968826d9c46dd6066d109eabc6255188de91218
  context_length: 40960
  capabilities: [chat, tools, reasoning]
  tool_call_parser: hermes
  reasoning_parser: qwen3
---
kind: Model
metadata: {name: llama-70b}
spec: {format: safetensors, path: /srv/models/Llama-3.1-70B-Instruct, context_length: 131072}
---
kind: Model
metadata: {name: tiny-jinja}
spec:
  format: gguf
  path: tiny/tiny.gguf
  context_length: 2048
  chat_template: "{%- for m in messages %}<|{{ m.role }}|>\\n{{ m.content }} 100%\\n{% endfor %}<|assistant|>\\n"
---
kind: Model
metadata: {name: bge-m3}
spec: {format: gguf, path: bge-m3/bge-m3-F16.gguf, context_length: 8192, capabilities: [embeddings], pooling: cls}
"""

SHAPES = {
    "llama-3-2-3b": ModelFacts(block_count=28, head_count=24, head_count_kv=8, embedding_length=3072,
                               key_length=128, value_length=128, weights_bytes=2_019_377_696),
    "llama-70b-q4": ModelFacts(block_count=80, head_count=64, head_count_kv=8, embedding_length=8192,
                               weights_bytes=42_520_398_432),
    "llama-405b-q4": ModelFacts(block_count=126, head_count=128, head_count_kv=8, embedding_length=16384,
                                weights_bytes=243_000_000_000),
    "tiny-jinja": ModelFacts(block_count=2, head_count=4, head_count_kv=2, embedding_length=64,
                             weights_bytes=17_000_000),
    "tiny": ModelFacts(block_count=2, head_count=4, head_count_kv=2, embedding_length=64, weights_bytes=17_000_000),
    "qwen3-8b": ModelFacts(block_count=36, head_count=32, head_count_kv=8, embedding_length=4096, key_length=128,
                           value_length=128, weights_bytes=16_381_470_720),
    "llama-70b": ModelFacts(block_count=80, head_count=64, head_count_kv=8, embedding_length=8192,
                            weights_bytes=141_107_412_992),
    "bge-m3": ModelFacts(block_count=24, head_count=16, head_count_kv=16, embedding_length=1024,
                         weights_bytes=1_157_671_968),
}  # fmt: skip

CASES = {
    "llamacpp-1gpu": ("model: llama-3-2-3b", h100x8),
    "llamacpp-2gpu": ("model: llama-70b-q4\ngpus: 2\nengine_args: [--flash-attn, 'on', --cache-type-k, q8_0]", h100x8),
    "llamacpp-8gpu": ("model: llama-405b-q4\ngpus: 8\ncontext_length: 16384", h100x8),
    "llamacpp-cpu": ("model: tiny\naccelerator: cpu\ncontext_length: 1024\nengine_args: [--temp, '0.7']", cpu_host),
    "llamacpp-amd": ("model: llama-3-2-3b\ngpu_vendor: amd", mi300x2),
    "vllm-1gpu": ("model: qwen3-8b\nengine_args: [--enable-prefix-caching]", h100x8),
    "vllm-4gpu": ("model: llama-70b\ngpus: 4\ncontext_length: 32768", h100x8),
    "embedding": ("model: bge-m3", h100x8),
    "sglang": ("model: qwen3-8b\nengine: sglang\ngpus: 2", h100x8),
    # the Model's Jinja chat template, provided to llama.cpp as a file (a systemd credential)
    "llamacpp-jinja": ("model: tiny-jinja\naccelerator: cpu\ncontext_length: 1024", cpu_host),
}


GOLDEN_LINEAGE = "5f0c2a8e-golden-lineage"


def render_case(case: str, engines: dict[str, str] | None = None) -> tuple[DeploymentRender, HostFacts]:
    spec, make_host = CASES[case]
    body = "metadata: {name: %s}\nspec:\n  %s\n" % (case, spec.replace("\n", "\n  "))
    result, diags = load(MODELS, body)
    assert messages(diags) == []
    facts = make_host()
    host = Host(name=facts.host, address="198.18.0.11", models_dir="/srv/models", engines=engines or {})
    model = result.desired.deployment(case).deployment.model  # type: ignore[union-attr]
    state = State(lineage=GOLDEN_LINEAGE)  # a fixed lineage: the golden units carry it in their headers
    rendered = render_deployment(
        result.desired, case, Inventory(hosts=(host,)), {facts.host: facts}, SHAPES[model], state=state
    )
    assert rendered.fit.failed_reason is None and rendered.fit.pending_reason is None, rendered.fit
    return rendered, facts


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden_units(case: str) -> None:
    rendered, _ = render_case(case)
    (unit,) = rendered.units
    path = GOLDEN / f"{case}.service"
    if UPDATE:
        path.write_text(unit.text)
    assert unit.text == path.read_text(), f"{case}: rerun with UPDATE_GOLDEN=1 after checking the change"


def argv_of(case: str) -> list[str]:
    rendered, _ = render_case(case)
    return list(rendered.units[0].argv)


def test_llamacpp_argv_per_seed() -> None:
    argv = argv_of("llamacpp-2gpu")
    assert argv[:9] == [
        "/usr/local/bin/llama-server", "--model", "/srv/weights/llama-70b/Meta-Llama-3.1-70B-Instruct-Q4_K_M.gguf",
        "--alias", "llamacpp-2gpu", "--ctx-size", str(8192 * 4), "--parallel", "4",
    ]  # fmt: skip
    assert argv[9:16] == ["--n-gpu-layers", "all", "--split-mode", "layer", "--metrics", "--jinja", "--no-webui"]
    assert argv[-4:] == ["--flash-attn", "on", "--cache-type-k", "q8_0"]  # the user's come last
    cpu = argv_of("llamacpp-cpu")
    assert "--n-gpu-layers" not in cpu and cpu[cpu.index("--threads") + 1] == "4"
    assert cpu[cpu.index("--ctx-size") + 1] == str(1024 * 2)
    assert "--split-mode" not in argv_of("llamacpp-1gpu")
    emb = argv_of("embedding")
    assert emb[emb.index("--embeddings") + 1 : emb.index("--embeddings") + 3] == ["--pooling", "cls"]


def test_vllm_argv_and_environment_per_seed() -> None:
    rendered, _ = render_case("vllm-4gpu")
    unit = rendered.units[0]
    argv = list(unit.argv)
    assert argv[1:3] == ["serve", "/srv/models/Llama-3.1-70B-Instruct"]
    assert argv[argv.index("--max-model-len") + 1] == "32768"
    assert argv[argv.index("--max-num-seqs") + 1] == "256"
    assert argv[argv.index("--gpu-memory-utilization") + 1] == "0.90"
    assert argv[argv.index("--tensor-parallel-size") + 1] == "4"
    assert {k: unit.environment[k] for k in ("HF_HUB_OFFLINE", "VLLM_NO_USAGE_STATS", "DO_NOT_TRACK")} == {
        "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}  # fmt: skip
    assert unit.environment["CUDA_VISIBLE_DEVICES"] == ",".join(
        f"GPU-2f7b6c1e-5a0d-4c3e-9b1f-0a1b2c3d4e5{i}" for i in range(4)
    )
    one = argv_of("vllm-1gpu")
    assert "--tensor-parallel-size" not in one
    assert one[one.index("--enable-auto-tool-choice") + 1 : one.index("--enable-auto-tool-choice") + 3] == [
        "--tool-call-parser", "hermes"]  # fmt: skip
    assert one[one.index("--reasoning-parser") + 1] == "qwen3"
    assert one[2] == "/srv/models/sources/Qwen/Qwen3-8B/b968826d9c46dd6066d109eabc6255188de91218"


def test_amd_units_use_rocr_visible_devices_and_kfd() -> None:
    rendered, _ = render_case("llamacpp-amd")
    unit = rendered.units[0]
    assert unit.environment["ROCR_VISIBLE_DEVICES"] == "GPU-3a1f6c2d8e4b5970"
    assert "DeviceAllow=/dev/kfd rw" in unit.text and "PrivateDevices" not in unit.text


def test_gpu_units_never_use_private_devices_and_allow_their_gpus_only() -> None:
    rendered, _ = render_case("llamacpp-2gpu")
    text = rendered.units[0].text
    assert "PrivateDevices" not in text and "DevicePolicy=closed" in text
    assert "DeviceAllow=/dev/nvidia0 rw" in text and "DeviceAllow=/dev/nvidia1 rw" in text
    assert "/dev/nvidia2" not in text
    cpu = render_case("llamacpp-cpu")[0].units[0].text
    assert "PrivateDevices=yes" in cpu and "MemoryDenyWriteExecute=yes" in cpu
    assert "MemoryDenyWriteExecute" not in render_case("vllm-1gpu")[0].units[0].text  # vLLM JIT-compiles
    assert "MemoryDenyWriteExecute" not in text  # so do the CUDA and ROCm runtimes


def test_cpu_cores_are_a_weight_by_cores_never_a_quota() -> None:
    """Seed 000: a replica's cores are "its share when the machine is busy, not a ceiling": CPUWeight= by cores
    (100 per core, systemd's default weight for one unit), and no CPUQuota= (nor the cgroup v1 CPUShares=)."""
    from engine_ctl.core.render.units import cpu_weight

    for case in CASES:
        rendered, _ = render_case(case)
        unit = rendered.units[0]
        cores = rendered.fit.plan.cpu_cores
        assert f"\nCPUWeight={100 * cores}\n" in unit.text, (case, cores)
        assert not [line for line in unit.text.splitlines() if line.startswith(("CPUQuota", "CPUShares"))], case
    assert (cpu_weight(1), cpu_weight(4), cpu_weight(1024)) == (100, 400, 10_000)


def test_header_records_deployment_revision_and_content_hash() -> None:
    import hashlib

    unit = render_case("llamacpp-1gpu")[0].units[0]
    lines = unit.text.splitlines()
    assert lines[1].startswith("# deployment: llamacpp-1gpu  replica: 0  slot: a  revision: 1")
    body = unit.text.replace(unit.content_hash, "")
    assert lines[3] == f"# lineage: {GOLDEN_LINEAGE}"
    assert re.fullmatch(r"# id: [0-7][0-9A-HJKMNP-TV-Z]{25}", lines[4])  # the deployment's (import keeps it)
    assert lines[5] == f"# content-sha256: {unit.content_hash}"
    assert hashlib.sha256(body.encode()).hexdigest() == unit.content_hash
    assert unit.sha256 == hashlib.sha256(unit.text.encode()).hexdigest()


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_unit_passes_systemd_analyze_verify(case: str, tmp_path: Path) -> None:
    llama = str(llama_server_dir() / "bin" / "llama-server")
    engines = {"llama.cpp": llama, "vllm": "/usr/bin/python3", "sglang": "/usr/bin/python3"}
    unit = render_case(case, engines)[0].units[0]
    path = tmp_path / unit.name
    path.write_text(unit.text)
    proc = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(path)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr


def test_every_llamacpp_flag_engine_ctl_renders_is_in_the_real_llama_server_help() -> None:
    help_text = subprocess.run(
        [str(llama_server_dir() / "bin" / "llama-server"), "--help"], capture_output=True, text=True, check=True
    ).stdout
    known = set(re.findall(r"(--[a-z0-9][a-z0-9-]*)", help_text))
    rendered = set()
    for case in CASES:
        if case.startswith(("llamacpp", "embedding")):
            rendered |= {a for a in argv_of(case) if a.startswith("--")}
    from engine_ctl.providers.llamacpp import ALLOWED, SET_BY_DEPLOYMENT

    assert rendered <= known, rendered - known
    assert set(ALLOWED) <= known, set(ALLOWED) - known
    assert set(SET_BY_DEPLOYMENT) - {"--webui"} <= known


def test_systemd_analyze_is_installed() -> None:
    assert shutil.which("systemd-analyze"), "CI installs systemd; the verify tests need it"
