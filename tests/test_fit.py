"""Fit: the seeds' figures, hand-computed KV sizes for real model shapes, the parallel descent, the gpus choice."""

from __future__ import annotations

import math

import pytest
from engine_ctl.providers import provider

from engine_ctl.core.fit.fitting import fit, kv_bytes_per_token
from engine_ctl.core.fit.hostfacts import Cpu, HostFacts, Memory, parse_nvidia_smi
from engine_ctl.core.fit.modelfacts import ModelFacts, estimate_weights_bytes
from engine_ctl.core.fit.placement import place
from engine_ctl.core.model import Deployment, Model
from engine_ctl.core.sizes import GIB
from tests.fleetfacts import a100x4, cpu_host, gpu_host, h100x8, mi300x2
from tests.helpers import deployment as load_deployment
from tests.helpers import messages

# Real shapes from the models' published config.json files.
LLAMA_31_8B = ModelFacts(block_count=32, head_count=32, head_count_kv=8, embedding_length=4096, context_length=131072)
LLAMA_31_70B = ModelFacts(block_count=80, head_count=64, head_count_kv=8, embedding_length=8192, context_length=131072)
LLAMA_32_3B = ModelFacts(block_count=28, head_count=24, head_count_kv=8, embedding_length=3072, key_length=128,
                         value_length=128, context_length=131072)  # fmt: skip
LLAMA = provider("llama.cpp")


def test_seed_figure_70b_q4_k_m_is_42_5_gb_against_about_140_gb_bf16() -> None:
    params = 70_550_000_000
    assert estimate_weights_bytes(params, "gguf", "Q4_K_M") / 1e9 == pytest.approx(42.5, rel=0.01)
    assert estimate_weights_bytes(params, "safetensors", dtype="bfloat16") / 1e9 == pytest.approx(141, rel=0.01)


def test_seed_figure_llama_3_2_3b_takes_at_most_131072_tokens() -> None:
    _, diags = load_deployment("model: llama-3-2-3b\ncontext_length: 131073")
    assert messages(diags) == ["spec.context_length 131073: model llama-3-2-3b takes at most 131072 tokens"]


@pytest.mark.parametrize(
    ("shape", "cache", "expected"),
    [
        # 32 layers × 8 KV heads × (128 + 128) dims × 2 bytes = 131072 bytes (128 KiB) per token
        (LLAMA_31_8B, "f16", 32 * 8 * 256 * 2),
        (LLAMA_31_70B, "f16", 80 * 8 * 256 * 2),  # 320 KiB per token
        (LLAMA_32_3B, "f16", 28 * 8 * 256 * 2),  # 112 KiB per token
        (LLAMA_31_8B, "q8_0", 32 * 8 * 256 * 34 // 32),  # q8_0: 34 bytes per block of 32
        (LLAMA_31_8B, "q4_0", 32 * 8 * 256 * 18 // 32),
    ],
)
def test_kv_bytes_per_token_for_real_shapes(shape: ModelFacts, cache: str, expected: int) -> None:
    assert kv_bytes_per_token(shape, cache, cache, LLAMA) == expected


def test_kv_cache_for_context_times_parallel() -> None:
    model = Model(name="llama-8b", format="gguf", path="x.gguf", context_length=131072)
    facts = LLAMA_31_8B.model_copy(update={"weights_bytes": 4_920_000_000})
    d = Deployment(name="c", model="llama-8b", context_length=8192, parallel=4)
    plan = fit(d, model, facts, [h100x8()])
    assert not isinstance(plan, str)
    assert plan.kv_cache_bytes == 8192 * 4 * 131072 == 4 * GIB
    assert plan.memory_basis == "arch" and plan.gpus == 1 and plan.parallel == 4
    assert plan.memory_bytes == 4_920_000_000 + 2 * GIB  # llama.cpp on GPUs: weights + 2 GiB


def test_parallel_descends_4_2_1_to_what_fits() -> None:
    model = Model(name="llama-70b", format="gguf", path="x.gguf", context_length=131072)
    facts = LLAMA_31_70B.model_copy(update={"weights_bytes": 42_500_000_000})
    l40s = gpu_host("l40s", parse_nvidia_smi("0, GPU-aaaa, NVIDIA L40S, 46068, 0, 550.54.15\n"))
    plan = fit(Deployment(name="c", model="llama-70b", gpus=1), model, facts, [l40s])
    assert not isinstance(plan, str)
    assert plan.parallel == 1  # 4 needs ~54 GB, 2 needs ~48.7 GB, the L40S has 48.3 GB
    roomy = fit(Deployment(name="c", model="llama-70b", gpus=1), model, facts, [h100x8()])
    assert not isinstance(roomy, str) and roomy.parallel == 4


def test_gpus_fewest_that_hold_the_model_on_the_largest_gpu_host_of_a_mixed_inventory() -> None:
    model = Model(name="llama-70b-bf16", format="safetensors", path="/m", context_length=131072)
    facts = LLAMA_31_70B.model_copy(update={"weights_bytes": 141_100_000_000})
    d = Deployment(name="big", model="llama-70b-bf16", engine="vllm", context_length=8192)
    hosts = [a100x4(), h100x8()]
    plan = fit(d, model, facts, hosts)
    assert not isinstance(plan, str)
    assert plan.gpus == 2 and plan.parallel == 256
    assert plan.memory_bytes == 141_100_000_000 + 8 * GIB + 2 * GIB  # vLLM: + 8 GiB, + 2 GiB per extra GPU
    result = place(d, plan, provider("vllm"), hosts, 1)
    assert result.placements[0].host == "gpu-h100"
    need = math.ceil(plan.min_gpu_memory_bytes / 1e8) / 10
    assert result.waiting["gpu-a100"] == (f"Waiting for a machine with a GPU with at least {need:g} GB")


def test_vllm_tensor_parallel_must_divide_the_heads() -> None:
    model = Model(name="odd", format="safetensors", path="/m")
    facts = ModelFacts(
        block_count=40, head_count=6, head_count_kv=6, embedding_length=6144, weights_bytes=200_000_000_000
    )
    plan = fit(Deployment(name="o", model="odd", engine="vllm", context_length=4096), model, facts, [h100x8()])
    assert isinstance(plan, str) and plan.startswith("does not fit")


def test_cpu_cores_by_size_and_threads() -> None:
    small = Model(name="s", format="gguf", path="s.gguf", parameters=1_000_000_000, weights_bytes=700_000_000)
    mid = Model(name="m", format="gguf", path="m.gguf", parameters=8_000_000_000, weights_bytes=5_000_000_000)
    big = Model(name="b", format="gguf", path="b.gguf", parameters=14_000_000_000, weights_bytes=9_000_000_000)
    hosts = [cpu_host(cores=16)]
    cores = [
        fit(Deployment(name="x", model=m.name, accelerator="cpu"), m, LLAMA_32_3B, hosts) for m in (small, mid, big)
    ]
    assert [c.cpu_cores for c in cores if not isinstance(c, str)] == [2, 4, 6]
    tiny_host = [cpu_host(cores=3)]
    capped = fit(Deployment(name="x", model="b", accelerator="cpu"), big, LLAMA_32_3B, tiny_host)
    assert not isinstance(capped, str) and capped.cpu_cores == 3 and capped.threads == 3
    assert not isinstance(cores[0], str) and cores[0].threads == 4 and cores[0].parallel == 2


def test_cpu_memory_is_the_larger_of_weights_plus_2_gib_and_estimate_plus_1_gib() -> None:
    m = Model(name="s", format="gguf", path="s.gguf", parameters=8_000_000_000)
    facts = LLAMA_31_8B.model_copy(update={"weights_bytes": 5 * GIB})
    plan = fit(
        Deployment(name="x", model="s", accelerator="cpu", context_length=32768, parallel=2), m, facts, [cpu_host()]
    )
    assert not isinstance(plan, str)
    kv = 32768 * 2 * 131072  # 8 GiB
    assert plan.kv_cache_bytes == kv
    assert plan.memory_bytes == 5 * GIB + kv + 512 * 1024**2 + GIB  # the estimate + 1 GiB is larger here


def test_placement_uses_whole_free_gpus_by_uuid_never_the_busy_one() -> None:
    m = Model(name="m", format="gguf", path="m.gguf", weights_bytes=20_000_000_000)
    facts = LLAMA_31_8B.model_copy(update={"weights_bytes": 20_000_000_000})
    d = Deployment(name="x", model="m", gpus=1, replicas_min=4, replicas_max=4)
    plan = fit(d, m, facts, [a100x4()])
    assert not isinstance(plan, str)
    result = place(d, plan, LLAMA, [a100x4()], 4)
    used = [g.uuid for p in result.placements for g in p.gpus]
    assert used == [f"GPU-9a1e3d55-7c21-4f0b-8e6d-1c2b3a4d5e6{i}" for i in (1, 2, 3)]
    assert len(set(p.port for p in result.placements)) == 3
    assert result.pending_reason is not None and "free GPU" in result.pending_reason


def test_gpu_vendor_and_engine_platform() -> None:
    m = Model(name="m", format="safetensors", path="/m")
    facts = LLAMA_31_8B.model_copy(update={"weights_bytes": 16_000_000_000})
    d = Deployment(name="x", model="m", engine="vllm", gpu_vendor="amd")
    hosts = [h100x8(), mi300x2()]
    plan = fit(d, m, facts, hosts)
    assert not isinstance(plan, str)
    result = place(d, plan, provider("vllm"), hosts, 1)
    assert result.placements[0].host == "gpu-mi300"
    assert result.placements[0].gpus[0].uuid == "GPU-3a1f6c2d8e4b5970"
    assert result.waiting == {"gpu-h100": "Waiting for a machine with amd GPUs (this one has nvidia)"}


def test_no_gpu_host_reason() -> None:
    m = Model(name="m", format="gguf", path="m.gguf", weights_bytes=10_000_000_000)
    d = Deployment(name="x", model="m")
    plan = fit(d, m, LLAMA_31_8B, [h100x8()])
    assert not isinstance(plan, str)
    result = place(d, plan, LLAMA, [cpu_host()], 1)
    assert result.pending_reason == "Waiting for a machine with a GPU (this one has none)"
    assert math.isfinite(plan.min_gpu_memory_gb)


def test_cpu_host_without_enough_memory() -> None:
    m = Model(name="m", format="gguf", path="m.gguf", weights_bytes=100 * GIB)
    d = Deployment(name="x", model="m", accelerator="cpu")
    small = HostFacts(host="small", cpu=Cpu(cores=8), memory=Memory(total_bytes=64 * GIB, available_bytes=60 * GIB))
    plan = fit(d, m, LLAMA_31_8B, [small])
    assert not isinstance(plan, str)
    result = place(d, plan, LLAMA, [small], 1)
    assert result.pending_reason is not None and result.pending_reason.startswith("Waiting for a machine with 10")


def test_memory_the_deployment_states_replaces_the_estimate() -> None:
    m = Model(name="m", format="gguf", path="m.gguf", weights_bytes=8_000_000_000)
    d = Deployment(name="x", model="m", gpus=1, ram_bytes=2 * GIB, gpu_memory_bytes=16 * GIB)
    plan = fit(d, m, None, [h100x8()])
    assert not isinstance(plan, str)
    assert plan.memory_bytes == 2 * GIB and plan.min_gpu_memory_gb == math.ceil(16 * GIB / 1e9)


def test_the_pending_reason_is_the_furthest_replicas_not_the_most_common() -> None:
    """Seed 000, States: "The reason is the furthest replica's." Two hosts without a GPU and one whose GPUs are too
    small: the deployment waits for a bigger GPU, not for a GPU at all; a host that lacks only the weights is
    further still, and one that lacks the weights and has no GPU says it has no GPU (the recorded A100 host)."""
    m = Model(name="m", format="gguf", path="m.gguf", weights_bytes=60_000_000_000)
    d = Deployment(name="x", model="m", gpus=1)
    plan = fit(d, m, LLAMA_31_8B, [h100x8()])
    assert not isinstance(plan, str)
    need = math.ceil(plan.min_gpu_memory_bytes / 1e8) / 10
    hosts = [cpu_host("cpu-01"), cpu_host("cpu-02"), a100x4()]
    result = place(d, plan, LLAMA, hosts, 1)
    assert result.pending_reason == (f"Waiting for a machine with a GPU with at least {need:g} GB"), result.waiting
    weights = "Waiting for the weights of m at /srv/models/m.gguf (not found)"
    missing = {"cpu-01": weights, "gpu-h100": weights}
    found = place(d, plan, LLAMA, [*hosts, h100x8()], 1, no_weights=missing)
    assert found.pending_reason == weights
    assert found.waiting["cpu-01"] == "Waiting for a machine with a GPU (this one has none)"
