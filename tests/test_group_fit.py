"""The fit of a replica group (spec.nodes > 1, issue 30), pure: a model that fits only across machines is sized over
the group's machines and placed, not refused; what each machine needs is said where it waits or fails. GPU facts are
the recorded nvidia-smi output (tests/recordings/README.md), two H100s a machine. No hosts needed."""

from __future__ import annotations

import math

from engine_ctl.cli.views.plan import plan_text
from engine_ctl.core.documents.inventory import Host, Inventory
from engine_ctl.core.documents.loader import load_documents
from engine_ctl.core.documents.yamlsource import parse_text
from engine_ctl.core.fit.fitting import FitUnknown, fit
from engine_ctl.core.fit.hostfacts import HostFacts, parse_nvidia_smi
from engine_ctl.core.fit.modelfacts import ModelFacts
from engine_ctl.core.fit.runspec import FitPlan
from engine_ctl.core.model import Deployment, Model
from engine_ctl.core.plan.planner import Plan, make_plan
from engine_ctl.core.record.model import State
from engine_ctl.core.sizes import GIB
from tests.fleetfacts import cpu_host, gpu_host, recording

# Llama 3.1 405B's shape from its published config.json (126 layers, 128 heads, 8 KV heads, hidden 16384, head
# size 128), at about 4 bits a weight (an AWQ INT4 checkpoint of about 203 GB): more than the two H100s of one
# machine hold, less than the four of two machines.
LLAMA_405B_INT4 = ModelFacts(block_count=126, head_count=128, head_count_kv=8, embedding_length=16384,
                             key_length=128, value_length=128, context_length=131072,
                             weights_bytes=203_000_000_000)  # fmt: skip
BIG = Model(name="llama-405b", format="safetensors", path="/srv/models/llama-405b", context_length=131072)
H100_BYTES = 81559 * 1024**2  # what the recording says each H100 has (MiB)


def h100x2(name: str, i: int) -> HostFacts:
    """A machine with two H100s: the first two lines of the recorded `nvidia-smi --query-gpu` output, the UUIDs
    made the machine's own (as tests/test_plan_scale.py does)."""
    csv = "\n".join(recording("nvidia-smi-8xH100.csv").splitlines()[:2]) + "\n"
    return gpu_host(name, parse_nvidia_smi(csv.replace("GPU-2f7b6c1e", f"GPU-{i:08x}")), cores=64, memory_gib=512)


def _vllm(nodes: int, gpus: int | None = 2) -> Deployment:
    return Deployment(name="big", model=BIG.name, engine="vllm", context_length=8192, nodes=nodes, gpus=gpus)


# --- the fit ------------------------------------------------------------------------------------------------------


def test_a_model_bigger_than_one_machines_gpus_fails_on_one_machine_and_fits_over_two() -> None:
    hosts = [h100x2("g1", 1), h100x2("g2", 2)]
    one = fit(_vllm(1), BIG, LLAMA_405B_INT4, hosts)
    assert isinstance(one, str) and one.startswith("does not fit: llama-405b needs at least ")
    assert one.endswith(" on each of 2 GPUs (the largest GPU it may use has 85.5 GB)")  # the seed's words, as before
    two = fit(_vllm(2), BIG, LLAMA_405B_INT4, hosts)
    assert isinstance(two, FitPlan)
    # vLLM's rule over the group's 4 GPUs (tensor parallel 2 in a machine x pipeline parallel 2 across machines):
    # its share of the weights and of one whole-context sequence, + 1 GiB, within 0.90 of the GPU
    kv_one_sequence = 8192 * 126 * 8 * (128 + 128) * 2
    assert two.min_gpu_memory_bytes == math.ceil((math.ceil((203_000_000_000 + kv_one_sequence) / 4) + GIB) * 100 / 90)
    assert two.min_gpu_memory_bytes <= H100_BYTES and two.gpus == 2
    # host memory: seed 000's vLLM rule on each machine's half of the weights (+ 8 GiB, + 2 GiB for its 2nd GPU)
    assert two.memory_bytes == 101_500_000_000 + 8 * GIB + 2 * GIB
    assert two.weights_bytes == 203_000_000_000  # the replica's, in all


def test_gpus_left_out_is_the_fewest_per_machine_that_hold_the_group() -> None:
    hosts = [h100x2("g1", 1), h100x2("g2", 2)]
    assert isinstance(fit(_vllm(1, gpus=None), BIG, LLAMA_405B_INT4, hosts), str)
    chosen = fit(_vllm(2, gpus=None), BIG, LLAMA_405B_INT4, hosts)
    assert isinstance(chosen, FitPlan) and chosen.gpus == 2  # 1 GPU on each of 2 machines holds half: too little
    four = fit(_vllm(4, gpus=None), BIG, LLAMA_405B_INT4, [h100x2(f"g{i}", i) for i in range(1, 5)])
    assert isinstance(four, FitPlan) and four.gpus == 1


def test_a_group_that_still_does_not_fit_names_what_each_machine_needs() -> None:
    huge = LLAMA_405B_INT4.model_copy(update={"weights_bytes": 812_000_000_000})  # 405B in bf16
    why = fit(_vllm(2), BIG, huge, [h100x2("g1", 1), h100x2("g2", 2)])
    assert isinstance(why, str)
    assert why.startswith("does not fit: llama-405b needs 2 machines with 2 GPUs of at least ")
    assert why.endswith(" GB each (the largest GPU it may use has 85.5 GB)")
    # without the shape: the weights alone already need more than each GPU of the group has
    no_shape = ModelFacts(weights_bytes=812_000_000_000)
    alone = fit(_vllm(2), BIG, no_shape, [h100x2("g1", 1)])
    assert alone == (
        "does not fit: the weights of llama-405b alone (812 GB) need 2 machines with 2 GPUs of at least "
        "226.8 GB each (the largest GPU it may use has 85.5 GB)"
    )  # (812 / 4 + 1 GiB) / 0.90 each
    without_shape = fit(_vllm(2), BIG, LLAMA_405B_INT4.model_copy(update={"block_count": None}), [h100x2("g1", 1)])
    assert isinstance(without_shape, FitUnknown)  # 203 GB over 4 GPUs may fit: it waits for the shape


def test_sglang_tensor_parallel_spans_the_group_and_must_divide_the_heads() -> None:
    odd = LLAMA_405B_INT4.model_copy(update={"head_count": 96})  # 96 heads: 2 x 3 machines = 6 divides, 4 x 3 no
    d = Deployment(name="big", model=BIG.name, engine="sglang", context_length=8192, nodes=3, gpus=4)
    hosts = [h100x2(f"g{i}", i) for i in range(1, 4)]
    assert isinstance(fit(d.model_copy(update={"gpus": 2}), BIG, odd, hosts), FitPlan)
    odd64 = odd.model_copy(update={"head_count": 64})
    why = fit(d.model_copy(update={"gpus": 2}), BIG, odd64, hosts)  # tensor parallel 6 does not divide 64
    assert why == ("does not fit: no count of 1, 2, 4 or 8 GPUs on each of 3 machines gives a tensor parallel size "
                   "(6) that divides the 64 attention heads of llama-405b")  # fmt: skip
    # vLLM's tensor parallel is one machine's GPUs (the machines are pipeline stages): 2 divides 64
    vllm = d.model_copy(update={"engine": "vllm", "gpus": 2})
    assert isinstance(fit(vllm, BIG, odd64, hosts), FitPlan)


def test_llamacpp_on_cpus_spreads_the_layers_over_the_workers_and_keeps_the_rule_per_machine() -> None:
    gguf = Model(name="m", format="gguf", path="m/m.gguf", context_length=32768)
    facts = ModelFacts(block_count=80, head_count=64, head_count_kv=8, embedding_length=8192, context_length=32768,
                       weights_bytes=80_000_000_000)  # fmt: skip
    hosts = [cpu_host(f"c{i}") for i in range(1, 4)]
    plans = [fit(Deployment(name="x", model="m", accelerator="cpu", context_length=4096, nodes=n), gguf, facts, hosts)
             for n in (1, 2, 3)]  # fmt: skip
    one, two, three = (p for p in plans if isinstance(p, FitPlan))
    kv = 4096 * 2 * 80 * 8 * 256 * 2  # context x parallel 2 x layers x KV heads x (K + V dims) x f16
    assert one.memory_bytes == 80_000_000_000 + kv + 512 * 1024**2 + GIB  # the estimate + 1 GiB, as before
    assert two.memory_bytes == one.memory_bytes  # one worker holds every layer (the head's CPU keeps none)
    assert three.memory_bytes == 40_000_000_000 + kv // 2 + 512 * 1024**2 + GIB  # each of 2 workers, half
    tiny = facts.model_copy(update={"weights_bytes": 100_000_000, "block_count": 2})
    small = fit(Deployment(name="x", model="m", accelerator="cpu", context_length=256, nodes=3), gguf, tiny, hosts)
    # seed 000's "weights + 2 GiB" on each worker's half: the 2 GiB is each machine's, never split
    assert isinstance(small, FitPlan) and small.memory_bytes == 50_000_000 + 2 * GIB


# --- placement and the plan ---------------------------------------------------------------------------------------

MODEL_GGUF = "kind: Model\nmetadata: {name: m}\nspec: {format: gguf, path: m/m.gguf, context_length: 32768}\n"
MODEL_ST = "kind: Model\nmetadata: {name: m}\nspec: {format: safetensors, path: m/llama-405b, context_length: 131072}\n"


def _plan(model: str, spec: str, facts: ModelFacts, *hosts: HostFacts, engines: dict[str, str]) -> Plan:
    docs, _ = parse_text(model + "---\nmetadata: {name: big}\nspec: {model: m, " + spec + "}\n", "d.yaml")
    inv = Inventory(hosts=tuple(Host(name=h.host, address=f"10.0.0.{i}", models_dir="/srv/models", engines=engines)
                                for i, h in enumerate(hosts, start=1)))  # fmt: skip
    return make_plan(load_documents(docs).desired, State(), inv, {h.host: h for h in hosts}, {"m": facts})


def _vllm_plan(spec: str, *hosts: HostFacts) -> Plan:
    return _plan(MODEL_ST, f"engine: vllm, context_length: 8192, {spec}", LLAMA_405B_INT4, *hosts,
                 engines={"vllm": "/usr/local/bin/vllm"})  # fmt: skip


def test_the_group_is_placed_on_two_machines_each_with_its_share() -> None:
    hosts = (h100x2("g1", 1), h100x2("g2", 2))
    (refused,) = _vllm_plan("gpus: 2", *hosts).changes
    assert refused.failed_reason is not None and refused.failed_reason.startswith("does not fit: ")
    assert not refused.replicas
    plan = _vllm_plan("gpus: 2, nodes: 2", *hosts)
    (c,) = plan.changes
    assert c.failed_reason is None and c.pending_reason is None
    (r,) = c.replicas
    assert r.placement is not None and len(r.members) == 1
    (m,) = r.placement.members
    assert {r.host, m.host} == {"g1", "g2"} and len(r.placement.gpus) == 2 and len(m.gpus) == 2
    share = 101_500_000_000 + 10 * GIB
    assert r.placement.memory_bytes == share and m.memory_bytes == share  # each its half, not the whole replica's
    text = plan_text(plan)
    assert "each machine sets aside 104.5 GiB of host memory" in text
    assert "host memory     = 104.5 GiB " in text and ", on each of its 2 machines" in text
    argv = r.argv  # tensor parallel inside a machine, pipeline parallel across the two
    assert argv[argv.index("--tensor-parallel-size") + 1] == "2"
    assert argv[argv.index("--pipeline-parallel-size") + 1] == "2"


def test_a_cpu_model_bigger_than_one_host_is_placed_over_its_workers_and_waits_with_each_machines_need() -> None:
    facts = ModelFacts(block_count=80, head_count=64, head_count_kv=8, embedding_length=8192, context_length=32768,
                       weights_bytes=80_000_000_000)  # fmt: skip
    hosts = [cpu_host(f"c{i}") for i in range(1, 4)]  # 64 GiB each, 60 GiB available

    def planned(nodes: int) -> Plan:
        return _plan(MODEL_GGUF, f"accelerator: cpu, context_length: 4096, nodes: {nodes}", facts, *hosts,
                     engines={"llama.cpp": "/opt/llama/bin/llama-server"})  # fmt: skip

    (one,) = planned(1).changes
    assert not one.replicas and one.pending_reason is not None
    assert one.pending_reason.startswith("Waiting for a machine with ") and "of free memory" in one.pending_reason
    (two,) = planned(2).changes  # the one worker would hold every layer: still more than a host has
    assert not two.replicas and two.pending_reason is not None
    assert two.pending_reason.startswith("Waiting for 2 machines for one replica group, each with ")
    assert two.pending_reason.endswith(" GiB of free memory (60.0 GiB free here)")
    (three,) = planned(3).changes
    (r,) = three.replicas
    assert r.placement is not None and len(r.members) == 2
    assert r.placement.memory_bytes < 60 * GIB and all(m.memory_bytes == r.placement.memory_bytes
                                                       for m in r.placement.members)  # fmt: skip
