"""The fit and placement follow the seeds exactly (issue 8 §2) and count what is taken (issue 9 §3).

Pure unit tests on synthetic facts built with the real types: GPUs come from recorded nvidia-smi, amd-smi and
rocm-smi output (tests/recordings/README.md); a card the recordings lack is the MI210 recording with its card
series renamed, in rocm-smi's real format.
"""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest
from engine_ctl.providers import provider

from engine_ctl.core.documents.inventory import Host, Inventory, inventory_from
from engine_ctl.core.documents.loader import load_documents
from engine_ctl.core.documents.yamlsource import parse_text
from engine_ctl.core.fit.fitting import FitUnknown, fit
from engine_ctl.core.fit.hostfacts import Cpu, HostFacts, Memory, parse_nvidia_smi, parse_rocm_smi
from engine_ctl.core.fit.modelfacts import ModelFacts
from engine_ctl.core.fit.placement import Taken, place
from engine_ctl.core.fit.runspec import FitPlan
from engine_ctl.core.model import Deployment, DesiredState, Model
from engine_ctl.core.plan.pipeline import render_deployment
from engine_ctl.core.plan.planner import Plan, make_plan
from engine_ctl.core.record.model import DeploymentRecord, ReplicaRecord, State
from engine_ctl.core.sizes import GIB, gb_down, gb_up, gib_down, gib_up
from tests.fleetfacts import a100x4, cpu_host, gpu_host, h100x8, mi210x2, mi300x2, recording
from tests.helpers import load, messages
from tests.llama import llama_server_dir

LLAMA = provider("llama.cpp")
LLAMA_SERVER = str(llama_server_dir() / "bin" / "llama-server")
VLLM = provider("vllm")
# Llama 3.1 8B's shape (its config.json); 128 KiB of f16 KV cache per token.
SHAPE_8B = ModelFacts(block_count=32, head_count=32, head_count_kv=8, embedding_length=4096, context_length=131072)
H100_BYTES = 81559 * 1024**2  # what nvidia-smi reports for an H100 80GB HBM3: 85.52 GB


def desired(*texts: str) -> DesiredState:
    docs = []
    for i, text in enumerate(texts):
        found, problems = parse_text(text, f"{i}.yaml")
        assert not problems
        docs.extend(found)
    result = load_documents(docs)
    assert not [d for d in result.diagnostics if d.severity == "error"], result.diagnostics
    return result.desired


def world(*facts: HostFacts, **host: object) -> tuple[Inventory, dict[str, HostFacts]]:
    hosts = tuple(Host(name=f.host, address=f.host, models_dir="/srv/models", **host) for f in facts)  # type: ignore[arg-type]
    return Inventory(hosts=hosts), {f.host: f for f in facts}


def amd_host(name: str, card: str) -> HostFacts:
    """Two AMD GPUs in rocm-smi's real format: the MI210 recording, its card series renamed to `card`."""
    text = recording("rocm-smi-2xMI210.json").replace("AMD Instinct MI210", card)
    return gpu_host(name, parse_rocm_smi(text), cores=32, memory_gib=256)


def planned(p: Plan, name: str):  # type: ignore[no-untyped-def]
    return next(c for c in p.changes if c.name == name)


# --- the automatic GPU count honours spec.host and gpu_vendor ----------------------------------------------


def test_automatic_gpus_are_sized_for_the_pinned_host_not_the_largest_elsewhere() -> None:
    model = Model(name="big", format="gguf", path="big.gguf", context_length=131072)
    facts = SHAPE_8B.model_copy(update={"weights_bytes": 50_000_000_000})
    hosts = [h100x8(), a100x4()]
    anywhere = fit(Deployment(name="x", model="big"), model, facts, hosts)
    assert isinstance(anywhere, FitPlan) and anywhere.gpus == 1  # one H100 holds it
    pinned = Deployment(name="x", model="big", host="gpu-a100")
    plan = fit(pinned, model, facts, hosts)
    assert isinstance(plan, FitPlan) and plan.gpus == 2  # an A100-40GB does not: two of them
    result = place(pinned, plan, LLAMA, hosts, 1)
    assert result.pending_reason is None and result.placements[0].host == "gpu-a100"
    assert len(result.placements[0].gpus) == 2
    # and gpu_vendor: sized for the vendor's largest GPU, not the other vendor's
    amd = fit(Deployment(name="x", model="big", gpu_vendor="nvidia"), model, facts, [mi300x2(), a100x4()])
    assert isinstance(amd, FitPlan) and amd.gpus == 2


def test_a_pinned_host_that_is_not_reachable_is_waited_for_not_sized_elsewhere() -> None:
    model = Model(name="big", format="gguf", path="big.gguf")
    facts = SHAPE_8B.model_copy(update={"weights_bytes": 50_000_000_000})
    result = fit(Deployment(name="x", model="big", host="gpu-a100"), model, facts, [h100x8()])
    assert isinstance(result, FitUnknown)
    assert result.reason == "Waiting for host gpu-a100 (not in the inventory or unreachable) with GPUs llama.cpp " \
        "runs on, to choose gpus there"  # fmt: skip


def test_flat_host_pins_the_plan_to_that_host() -> None:
    d = desired("name: chat\nengine: llamacpp\nmodel: big/big.gguf\nhost: gpu-a100\n")
    inv, facts = world(h100x8(), a100x4())
    shape = SHAPE_8B.model_copy(update={"weights_bytes": 50_000_000_000})
    change = planned(make_plan(d, State(), inv, facts, {"big.gguf": shape}), "chat")
    assert change.pending_reason is None and change.fit is not None and change.fit.gpus == 2
    assert [r.host for r in change.replicas] == ["gpu-a100"]


# --- one unit throughout: bytes -----------------------------------------------------------------------------


def test_a_model_that_fits_an_h100_is_placed_on_it() -> None:
    """85.4 GB on each GPU fits an H100's 85.52 GB: the fit says so and placement agrees (not '86 GB')."""
    model = Model(name="m", format="gguf", path="m.gguf", weights_bytes=60_000_000_000)
    d = Deployment(name="x", model="m", gpus=1, gpu_memory_bytes=85_400_000_000, ram_bytes=70 * GIB)
    plan = fit(d, model, SHAPE_8B, [h100x8()])
    assert isinstance(plan, FitPlan) and plan.min_gpu_memory_bytes == 85_400_000_000
    result = place(d, plan, LLAMA, [h100x8()], 1)
    assert result.pending_reason is None and len(result.placements) == 1


def test_need_and_size_are_never_printed_as_equal_when_it_does_not_fit() -> None:
    model = Model(name="m", format="gguf", path="m.gguf", weights_bytes=60_000_000_000)
    d = Deployment(name="x", model="m", gpus=1, gpu_memory_bytes=H100_BYTES + 1, ram_bytes=70 * GIB)
    refused = fit(d, model, SHAPE_8B, [h100x8()])
    assert refused == "does not fit: m needs at least 85.6 GB on each of 1 GPU (the largest GPU it may use has 85.5 GB)"
    ok = d.model_copy(update={"gpu_memory_bytes": 85_400_000_000})
    plan = fit(ok, model, SHAPE_8B, [h100x8()])
    assert isinstance(plan, FitPlan)
    waiting = place(ok, plan, LLAMA, [a100x4()], 1)
    assert waiting.pending_reason == "Waiting for a machine with a GPU with at least 85.4 GB"


@pytest.mark.parametrize("need", [H100_BYTES + 1, 42_900_000_001, 10**9 + 1, 15 * 10**9])
def test_a_need_above_a_size_never_formats_at_or_below_it(need: int) -> None:
    have = need - 1
    assert float(gb_up(need).split()[0]) > float(gb_down(have).split()[0])
    assert gb_up(15 * 10**9) == "15 GB"  # the seed's "a GPU with at least 15 GB"


# --- context_length above the model's maximum --------------------------------------------------------------

SEED_MESSAGE = "spec.context_length 200000: model llama-3-2-3b takes at most 131072 tokens"
GGUF_NO_MAX = """
kind: Model
metadata: {name: llama-3-2-3b}
spec: {format: gguf, path: llama/Llama-3.2-3B-Q4_K_M.gguf}
"""
GGUF_OWN = ModelFacts(block_count=28, head_count=24, head_count_kv=8, embedding_length=3072, key_length=128,
                      value_length=128, context_length=131072, weights_bytes=2_019_377_696)  # fmt: skip


def test_context_above_the_ggufs_own_maximum_is_failed_with_the_seeds_message_spec_form() -> None:
    d = desired(GGUF_NO_MAX, "metadata: {name: chat}\nspec: {model: llama-3-2-3b, context_length: 200000}\n")
    inv, facts = world(h100x8())
    change = planned(make_plan(d, State(), inv, facts, {"llama-3-2-3b": GGUF_OWN}), "chat")
    assert change.failed_reason == SEED_MESSAGE and change.replicas == []
    rendered = render_deployment(d, "chat", inv, facts, GGUF_OWN)
    assert rendered.fit.failed_reason == SEED_MESSAGE and rendered.units == ()


def test_flat_form_ctx_size_500000_never_renders() -> None:
    d = desired("name: chat\nengine: llamacpp\nmodel: llama/L.gguf\nengine_config: {context_length: 500000}\n")
    inv, facts = world(h100x8())
    rendered = render_deployment(d, "chat", inv, facts, GGUF_OWN)
    assert rendered.units == ()
    message = "engine_config.context_length 500000: model L.gguf takes at most 131072 tokens"  # the flat form's name
    assert rendered.fit.failed_reason == message
    change = planned(make_plan(d, State(), inv, facts, {"L.gguf": GGUF_OWN}), "chat")
    assert change.failed_reason == message and change.replicas == []


def test_the_lower_of_the_documents_and_the_files_maximum_holds() -> None:
    model = Model(name="llama-3-2-3b", format="gguf", path="x.gguf", context_length=262144)
    assert fit(Deployment(name="c", model=model.name, context_length=200000), model, GGUF_OWN, [h100x8()]) == (
        SEED_MESSAGE
    )


def test_offline_validate_checks_the_model_documents_maximum() -> None:
    _, diags = load(
        GGUF_NO_MAX.replace("path:", "context_length: 131072, path:"),
        "metadata: {name: chat}\nspec: {model: llama-3-2-3b, context_length: 200000}\n",
    )
    assert messages(diags) == [SEED_MESSAGE]


# --- the KV cache is never counted as zero -----------------------------------------------------------------


def test_without_the_weights_on_a_host_the_fit_is_not_known_yet_never_parallel_4_by_a_zero_kv() -> None:
    model = Model(name="llama-70b", format="gguf", path="x.gguf", context_length=131072, weights_bytes=42_500_000_000)
    l40s = gpu_host("l40s", parse_nvidia_smi("0, GPU-aaaa, NVIDIA L40S, 46068, 0, 550.54.15\n"))  # nvidia-smi's format
    d = Deployment(name="c", model="llama-70b", gpus=1)
    unknown = fit(d, model, None, [l40s])
    assert isinstance(unknown, FitUnknown)
    assert unknown.reason == (
        "the fit is not known yet: the weights of llama-70b are on no reachable host yet, so its KV cache (layers, KV "
        "heads and head size) cannot be sized (put the weights on a host)"
    )
    known = fit(d, model, ModelFacts(block_count=80, head_count=64, head_count_kv=8, embedding_length=8192), [l40s])
    assert isinstance(known, FitPlan) and known.parallel == 1 and known.kv_cache_bytes == 8192 * 80 * 8 * 256 * 2


def test_the_plan_says_the_fit_is_not_known_yet_and_places_nothing() -> None:
    d = desired(GGUF_NO_MAX, "metadata: {name: chat}\nspec: {model: llama-3-2-3b, gpus: 1}\n")
    inv, facts = world(h100x8())
    change = planned(make_plan(d, State(), inv, facts, {"llama-3-2-3b": None}), "chat")
    assert change.replicas == [] and change.action == ["create"]
    assert change.pending_reason is not None and change.pending_reason.startswith("the fit is not known yet")


def test_files_without_a_shape_are_not_counted_as_no_kv_cache() -> None:
    model = Model(name="m", format="gguf", path="m.gguf")
    unknown = fit(Deployment(name="c", model="m", gpus=1), model, ModelFacts(weights_bytes=4 * GIB), [h100x8()])
    assert isinstance(unknown, FitUnknown) and "the files of m do not give them, so its KV cache" in unknown.reason


def test_the_flat_form_is_told_it_may_state_the_memory_instead() -> None:
    d = desired("name: chat\nengine: llamacpp\nmodel: m/m.gguf\n")
    inv, facts = world(h100x8())
    change = planned(make_plan(d, State(), inv, facts, {"m.gguf": None}), "chat")
    assert change.pending_reason is not None and change.pending_reason.endswith(
        "(put the weights on a host, or state the memory a replica takes (engine_config.memory.request and "
        "resources.ram))"
    )
    stated = desired("name: chat\nengine: llamacpp\nmodel: m/m.gguf\nresources: {gpu: 8GiB, ram: 4GiB}\n")
    known = planned(make_plan(stated, State(), inv, facts, {"m.gguf": None}), "chat")
    assert known.pending_reason is None and [r.action for r in known.replicas] == [["create"]]


# --- devices pin GPUs -----------------------------------------------------------------------------------------

SMALL = ModelFacts(block_count=28, head_count=24, head_count_kv=8, embedding_length=3072, weights_bytes=2 * 10**9)


def test_flat_devices_pin_that_gpu() -> None:
    d = desired("name: chat\nengine: llamacpp\nmodel: m/m.gguf\ndevices: [{id: gpu1}]\n")
    inv, facts = world(h100x8())
    change = planned(make_plan(d, State(), inv, facts, {"m.gguf": SMALL}), "chat")
    (replica,) = change.replicas
    assert replica.gpu_indexes == [1] and replica.gpus == ["GPU-2f7b6c1e-5a0d-4c3e-9b1f-0a1b2c3d4e51"]


def test_a_pinned_gpu_held_by_another_process_waits_and_says_which() -> None:
    # The A100 recording's GPU 0 is busy (another process holds 38 GiB of it).
    model = Model(name="m", format="gguf", path="m.gguf")
    d = Deployment(name="x", model="m", devices=("gpu0",))
    plan = fit(d, model, SMALL, [a100x4()])
    assert isinstance(plan, FitPlan) and plan.gpus == 1
    result = place(d, plan, LLAMA, [a100x4()], 1)
    assert result.placements == () and result.pending_reason is not None
    assert result.pending_reason.startswith("Waiting for a machine with 1 free GPU")
    other = place(d, plan, LLAMA, [cpu_host()], 1)
    assert other.pending_reason == "Waiting for a machine with a GPU (this one has none)"
    missing = place(d.model_copy(update={"devices": ("gpu7",)}), plan.model_copy(update={"devices": ("gpu7",)}),
                    LLAMA, [a100x4()], 1)  # fmt: skip
    assert missing.pending_reason == (
        "Waiting for a machine with the pinned GPUs gpu7 (this one has gpu0, gpu1, gpu2, gpu3)"
    )


@pytest.mark.parametrize(
    ("devices", "gpus", "message"),
    [
        (("gpu1", "gpu1"), None, "devices: gpu1 listed more than once"),
        (("gpu0", "gpu1", "gpu2"), None, "devices: 3 GPUs pinned; a replica takes 1, 2, 4 or 8 GPUs of one machine"),
        (("gpu0",), 2, "devices: 1 GPU pinned, but gpus is 2; pin as many as a replica takes"),
    ],
)
def test_devices_that_cannot_be_pinned_are_refused_clearly(
    devices: tuple[str, ...], gpus: int | None, message: str
) -> None:
    model = Model(name="m", format="gguf", path="m.gguf")
    assert fit(Deployment(name="x", model="m", devices=devices, gpus=gpus), model, SMALL, [h100x8()]) == message


# --- the chat template reaches the engine ------------------------------------------------------------------

JINJA = "{% for m in messages %}<|{{ m.role }}|> {{ m.content }}\n{% endfor %}100% <|assistant|>\n"


def template_model(engine: str, template: str) -> str:
    fmt = "gguf" if engine == "llama.cpp" else "safetensors"
    path = "t/t.gguf" if fmt == "gguf" else "/srv/models/t"
    return (
        f"kind: Model\nmetadata: {{name: t}}\nspec: {{format: {fmt}, path: {path}, context_length: 4096, "
        f"chat_template: {json.dumps(template)}}}\n---\n"
        f"metadata: {{name: chat}}\nspec: {{model: t, engine: {engine}, gpus: 1}}\n"
    )


def rendered_unit(text: str, shape: ModelFacts = SMALL, **host: object):  # type: ignore[no-untyped-def]
    d = desired(text)
    inv, facts = world(h100x8(), **host)
    result = render_deployment(d, "chat", inv, facts, shape)
    assert result.fit.failed_reason is None and result.fit.pending_reason is None, result.fit
    (unit,) = result.units
    return unit


def test_llamacpp_gets_a_template_name_as_chat_template() -> None:
    argv = list(rendered_unit(template_model("llama.cpp", "chatml")).argv)
    assert argv[argv.index("--chat-template") + 1] == "chatml" and "--chat-template-file" not in argv


def test_llamacpp_gets_jinja_text_as_a_file_the_unit_provides(tmp_path: Path) -> None:
    unit = rendered_unit(template_model("llama.cpp", JINJA), engines={"llama.cpp": LLAMA_SERVER})
    argv = list(unit.argv)
    path = argv[argv.index("--chat-template-file") + 1]
    assert path == f"/run/credentials/{unit.name}/chat-template"
    (line,) = [x for x in unit.text.splitlines() if x.startswith("SetCredential=")]
    assert line.startswith("SetCredential=chat-template:{\\x25 for m in messages \\x25}")
    assert "\\n" in line and "\n" not in line.removeprefix("SetCredential=")
    file = tmp_path / unit.name
    file.write_text(unit.text)
    proc = subprocess.run(["systemd-analyze", "verify", "--man=no", str(file)], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr


def test_vllm_gets_the_template_with_chat_template() -> None:
    argv = list(rendered_unit(template_model("vllm", JINJA)).argv)
    assert argv[argv.index("--chat-template") + 1].startswith("/run/credentials/")


# --- vLLM honours engine_config.memory.request -------------------------------------------------------------


def test_vllm_gpu_memory_utilization_comes_from_the_memory_request() -> None:
    text = (
        "name: chat\nengine: vllm\nmodel: /srv/models/qwen\nengine_config: {memory: {request: 16GiB}}\n"
        "residency: restart_only\n"
    )
    shape = SHAPE_8B.model_copy(update={"weights_bytes": 8 * 10**9})
    argv = list(rendered_unit(text, shape).argv)
    # 16 GiB of an H100's 79.6 GiB is 0.20 of it: not the 0.90 default (72 GB of an 80 GB card)
    assert argv[argv.index("--gpu-memory-utilization") + 1] == "0.20"
    default = list(rendered_unit("name: chat\nengine: vllm\nmodel: /srv/models/qwen\nresidency: restart_only\n",
                                 shape).argv)  # fmt: skip
    assert default[default.index("--gpu-memory-utilization") + 1] == "0.90"


def test_a_request_is_split_over_a_replicas_gpus() -> None:
    model = Model(name="q", format="safetensors", path="/q")
    d = Deployment(name="x", model="q", engine="vllm", gpus=2, gpu_memory_bytes=32 * GIB)
    plan = fit(d, model, SHAPE_8B.model_copy(update={"weights_bytes": 8 * 10**9}), [h100x8()])
    assert isinstance(plan, FitPlan) and plan.min_gpu_memory_bytes == 16 * GIB
    result = place(d, plan, VLLM, [h100x8()], 1)
    from engine_ctl.core.fit.runspec import ReplicaRun

    run = ReplicaRun(deployment="x", model=model, model_path="/q", executable="/usr/bin/vllm", port=8000,
                     gpus=result.placements[0].gpus, plan=plan, gpu_memory_bytes=32 * GIB)  # fmt: skip
    assert VLLM.memory_fraction(run) == 0.2


# --- the inventory's cache_dir is the unit's engine cache --------------------------------------------------


@pytest.mark.parametrize(
    ("cache_dir", "directive"),
    [("/var/cache/llm", "CacheDirectory=llm/chat"), ("/data/engine-cache", "ReadWritePaths=/data/engine-cache/chat")],
)
def test_the_engine_cache_lives_in_the_inventorys_cache_dir(cache_dir: str, directive: str, tmp_path: Path) -> None:
    unit = rendered_unit(
        template_model("llama.cpp", "chatml"), cache_dir=cache_dir, engines={"llama.cpp": LLAMA_SERVER}
    )
    cache = f"{cache_dir}/chat"
    for key in ("HOME", "XDG_CACHE_HOME", "LLAMA_CACHE"):
        assert unit.environment[key] == cache
    assert unit.environment["HF_HOME"] == f"{cache}/huggingface"
    lines = unit.text.splitlines()
    assert directive in lines and f"WorkingDirectory={cache}" in lines
    assert ("CacheDirectory=engine-ctl/chat" in lines) is False
    file = tmp_path / unit.name
    file.write_text(unit.text)
    proc = subprocess.run(["systemd-analyze", "verify", "--man=no", str(file)], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr


# --- vLLM only on GPUs its builds run on (seed 001, GPU vendors) --------------------------------------------


@pytest.mark.parametrize(
    ("card", "vllm", "llamacpp"),
    [
        ("AMD Instinct MI210", True, True),
        ("AMD Instinct MI100", False, True),
        ("AMD Radeon RX 7600", False, True),
        ("AMD Radeon RX 6900 XT", False, True),
        ("AMD Radeon RX 6700 XT", False, True),
        ("AMD Radeon RX 7900 XTX", True, True),
        ("AMD Radeon PRO W7800", True, True),
        ("AMD Instinct MI355X", True, False),
    ],
)
def test_gpu_vendors_table(card: str, vllm: bool, llamacpp: bool) -> None:
    gpu = amd_host("h", card).gpus[0]
    assert (VLLM.gpu_refusal(gpu) is None) is vllm
    assert (LLAMA.gpu_refusal(gpu) is None) is llamacpp


def test_vllm_is_placed_only_where_its_builds_run_and_the_others_say_why() -> None:
    model = Model(name="q", format="safetensors", path="/q")
    facts = SHAPE_8B.model_copy(update={"weights_bytes": 16 * 10**9})
    hosts = [amd_host("mi100", "AMD Instinct MI100"), amd_host("rx7600", "AMD Radeon RX 7600"), mi210x2()]
    d = Deployment(name="x", model="q", engine="vllm", replicas_min=2, replicas_max=2)
    plan = fit(d, model, facts, hosts)
    assert isinstance(plan, FitPlan)
    result = place(d, plan, VLLM, hosts, 2)
    assert [p.host for p in result.placements] == ["gpu-mi210", "gpu-mi210"]
    assert result.waiting["mi100"] == (
        "Waiting for a machine with GPUs vLLM runs on "
        "(no vLLM build runs on the AMD Instinct MI100 (GPU vendors table))"
    )
    assert "AMD Radeon RX 7600" in result.waiting["rx7600"]
    gguf = Model(name="g", format="gguf", path="g.gguf")
    on_mi100 = place(Deployment(name="y", model="g"), fit(Deployment(name="y", model="g"), gguf, SMALL, hosts[:1]),  # type: ignore[arg-type]
                     LLAMA, hosts[:1], 1)  # fmt: skip
    assert on_mi100.placements and on_mi100.placements[0].host == "mi100"


def test_vllm_alone_on_unsupported_gpus_is_not_sized_on_them() -> None:
    model = Model(name="q", format="safetensors", path="/q")
    facts = SHAPE_8B.model_copy(update={"weights_bytes": 16 * 10**9})
    result = fit(
        Deployment(name="x", model="q", engine="vllm"), model, facts, [amd_host("mi100", "AMD Instinct MI100")]
    )
    assert isinstance(result, FitUnknown) and "GPUs vLLM runs on" in result.reason


# --- placement counts what is taken (issue 9 §3) -----------------------------------------------------------

TINY = "kind: Model\nmetadata: {name: tiny}\nspec: {format: gguf, path: tiny/tiny.gguf, parameters: 4170048}\n"
TINY_SHAPE = ModelFacts(block_count=2, head_count=4, head_count_kv=4, embedding_length=64, weights_bytes=17_000_000)


def small_host(cores: int = 2, total_gib: float = 23.5, available_gib: float = 22.0) -> HostFacts:
    return HostFacts(
        host="box", cpu=Cpu(cores=cores),
        memory=Memory(total_bytes=int(total_gib * GIB), available_bytes=int(available_gib * GIB)),
    )  # fmt: skip


def cpu_deployments(n: int, spec: str = "accelerator: cpu, cpu_cores: 2, context_length: 1024") -> DesiredState:
    docs = [TINY] + [f"metadata: {{name: d{i:03}}}\nspec: {{model: tiny, {spec}}}\n" for i in range(n)]
    return desired("---\n".join(docs))


def test_200_cpu_deployments_are_not_all_placed_on_one_2_core_host() -> None:
    inv, facts = world(small_host())
    p = make_plan(cpu_deployments(200), State(), inv, facts, {"tiny": TINY_SHAPE})
    placed = [c for c in p.changes if c.replicas]
    pending = [c for c in p.changes if c.pending_reason]
    assert len(placed) == 1 and len(pending) == 199
    assert {c.pending_reason for c in pending} == {"Waiting for a machine with 2 free CPU cores (0 of 2 free here)"}


def test_memory_given_to_earlier_replicas_of_the_same_plan_is_taken() -> None:
    inv, facts = world(small_host(cores=64, total_gib=8, available_gib=5.0))
    p = make_plan(cpu_deployments(3), State(), inv, facts, {"tiny": TINY_SHAPE})
    assert [bool(c.replicas) for c in p.changes] == [True, True, False]
    fitted = p.changes[0].fit
    assert fitted is not None
    each = fitted.memory_bytes
    left = 5 * GIB - 2 * each
    assert p.changes[2].pending_reason == (
        f"Waiting for a machine with {gib_up(each)} of free memory ({gib_down(left)} free here)"
    )


def _running(name: str, host: str, cores: int, memory: int, port: int = 8000) -> DeploymentRecord:
    plan = FitPlan(
        engine="llama.cpp", gpu_vendor="any", accelerator="cpu", kind="chat", gpus=0, min_gpu_memory_gb=0,
        memory_basis="estimate", cpu_cores=cores, threads=2 * cores, memory_bytes=memory, context_length=1024,
        parallel=1, weights_bytes=memory // 2, kv_cache_bytes=memory // 4,
    )  # fmt: skip
    replica = ReplicaRecord(index=0, host=host, unit=f"engine-ctl-{name}-0a.service", port=port, unit_sha256="a" * 64,
                            revision=1, status="serving")  # fmt: skip
    return DeploymentRecord(name=name, revision=1, spec_hash="old", plan=plan, replicas=[replica], state="Ready")


def test_replicas_already_running_hold_their_cores() -> None:
    inv, facts = world(small_host(cores=4))
    state = State(deployments={"other": _running("other", "box", cores=4, memory=2 * GIB)})
    d = cpu_deployments(1)
    p = make_plan(DesiredState(models=d.models, deployments=d.deployments), state, inv, facts, {"tiny": TINY_SHAPE})
    change = planned(p, "d000")
    assert change.replicas == [] and change.pending_reason == (
        "Waiting for a machine with 2 free CPU cores (0 of 4 free here)"
    )


def test_a_surge_has_room_only_when_it_is_really_free() -> None:
    def roll(cores: int) -> str | None:
        inv, facts = world(small_host(cores=cores))
        state = State(deployments={"d000": _running("d000", "box", cores=2, memory=2 * GIB)})
        p = make_plan(cpu_deployments(1), state, inv, facts, {"tiny": TINY_SHAPE})
        return planned(p, "d000").strategy

    assert roll(4) == "surge"
    assert roll(2) == "stop-then-start"  # the old replica's 2 cores are not free while it serves


def test_taken_is_not_changed_by_place() -> None:
    taken = Taken()
    plan = fit(Deployment(name="x", model="tiny", accelerator="cpu", cpu_cores=1), Model(
        name="tiny", format="gguf", path="t.gguf"), TINY_SHAPE, [small_host()])  # fmt: skip
    assert isinstance(plan, FitPlan)
    result = place(Deployment(name="x", model="tiny", accelerator="cpu"), plan, LLAMA, [small_host()], 2, taken=taken)
    assert len(result.placements) == 2 and taken.cores == {}
    assert len({p.port for p in result.placements}) == 2


def test_two_inventory_hosts_with_the_same_address_are_refused() -> None:
    (doc,), _ = parse_text("hosts:\n  - {name: a, address: 10.0.0.5}\n  - {name: b, address: 10.0.0.5}\n", "h.yaml")
    _, problems = inventory_from(doc)
    (problem,) = problems
    assert problem.field == "hosts[1].address" and "10.0.0.5" in problem.message and "hosts[0]" in problem.message


# --- issue 25 point 9: seed 003's memory margin for the flat form --------------------------------------------


def test_the_memory_margin_is_the_seeds_rule() -> None:
    """Seed 003: "On a unified-memory machine such as a GB10 the margin is 8 GiB, or the weights x 0.15 plus 4 GiB
    for checkpoints above 26.7 GiB; on a discrete GPU it is the weights x 0.10." """
    from engine_ctl.core.fit.fitting import memory_margin_bytes

    assert memory_margin_bytes(10 * GIB, unified=False) == GIB
    assert memory_margin_bytes(16 * GIB, unified=True) == 8 * GIB
    assert memory_margin_bytes(int(26.7 * GIB), unified=True) == 8 * GIB
    assert memory_margin_bytes(40 * GIB, unified=True) == 6 * GIB + 4 * GIB


def spark(name: str = "spark") -> HostFacts:
    """A DGX Spark: one NVIDIA GB10 sharing the machine's 128 GB (nvidia-smi's name for it: `NVIDIA GB10`)."""
    from engine_ctl.core.fit.hostfacts import Gpu

    gb10 = Gpu(index=0, uuid="GPU-6d1c2a3b-0000-4000-8000-00000000gb10", name="NVIDIA GB10", vendor="nvidia",
               memory_total_bytes=119 * GIB, memory_used_bytes=0)  # fmt: skip
    return gpu_host(name, [gb10], cores=20, memory_gib=128)


@pytest.mark.parametrize(("host", "unified"), [(h100x8, False), (spark, True)])
def test_the_flat_form_sizes_the_memory_the_engine_may_use_with_the_seeds_margin(host, unified) -> None:  # type: ignore[no-untyped-def]
    """The flat form fills in the GPU memory the engine may use: the weights, the KV cache and the margin (x 0.10 on
    an H100, 8 GiB on a GB10); the spec form (seed 000) keeps the engine's own rule."""
    facts = SHAPE_8B.model_copy(update={"weights_bytes": 16 * GIB})
    flat = "name: chat\nengine: llamacpp\nmodel: m/m.gguf\n"
    spec = ("kind: Model\nmetadata: {name: m}\nspec: {format: gguf, path: m/m.gguf}\n---\n"
            "metadata: {name: chat}\nspec: {model: m}\n")  # fmt: skip
    inv, hosts = world(host())
    fitted = planned(make_plan(desired(flat), State(), inv, hosts, {"m.gguf": facts}), "chat").fit
    margin = 8 * GIB if unified else math.ceil(16 * GIB * 0.10)
    assert fitted.gpus == 1 and fitted.min_gpu_memory_bytes == 16 * GIB + fitted.kv_cache_bytes + margin
    engines_own = planned(make_plan(desired(spec), State(), inv, hosts, {"m": facts}), "chat").fit
    assert engines_own.min_gpu_memory_bytes != fitted.min_gpu_memory_bytes


def test_a_gb10_that_reports_no_memory_figure_is_placed_with_the_machines_memory() -> None:
    """A GB10's memory is the machine's: nvidia-smi answers memory.total with [N/A] on a DGX Spark (the line below,
    in --query-gpu=index,uuid,name,memory.total,memory.used,driver_version's form). Its GPU is sized and placed by
    the machine's memory with the seed's unified-memory margin, not left waiting for a GPU with enough memory."""
    line = "0, GPU-6d1c2a3b-0000-4000-8000-00000000gb10, NVIDIA GB10, [N/A], [N/A], 580.95.05\n"
    (gb10,) = parse_nvidia_smi(line)
    assert gb10.memory_total_bytes is None
    spark_na = gpu_host("spark", [gb10], cores=20, memory_gib=128)
    assert spark_na.gpus[0].memory_total_bytes == 128 * GIB  # the machine's memory
    facts = SHAPE_8B.model_copy(update={"weights_bytes": 16 * GIB})
    inv, hosts = world(spark_na)
    plan = make_plan(desired("name: chat\nengine: llamacpp\nmodel: m/m.gguf\n"), State(), inv, hosts, {"m.gguf": facts})
    change = planned(plan, "chat")
    assert change.fit.gpus == 1 and [r.host for r in change.replicas] == ["spark"], change.reasons
    assert change.fit.min_gpu_memory_bytes == 16 * GIB + change.fit.kv_cache_bytes + 8 * GIB  # the GB10's margin
