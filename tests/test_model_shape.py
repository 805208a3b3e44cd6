"""The Model document's spec.architecture sizes the KV cache before any host has the weights (issue 8 §2:
"The KV cache is never counted as zero"). The weights' own metadata wins once a host has them.

Real parts: the loader and rules on documents as text, the fit on recorded-format host facts, the CLI as a
subprocess on examples/quickstart (whose weights are on no host of this machine).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from engine_ctl.core.documents.inventory import Host, Inventory
from engine_ctl.core.fit.fitting import FitUnknown, fit, model_shape, shape_disagreement
from engine_ctl.core.fit.hostfacts import parse_nvidia_smi
from engine_ctl.core.fit.modelfacts import ModelFacts
from engine_ctl.core.fit.runspec import FitPlan
from engine_ctl.core.model import Architecture, Deployment, Model
from engine_ctl.core.plan.planner import make_plan
from engine_ctl.core.record.model import State
from tests.fleetfacts import cpu_host, gpu_host, h100x8
from tests.helpers import load, messages, run

ROOT = Path(__file__).resolve().parents[1]
TINY = """
kind: Model
metadata: {name: tiny}
spec:
  format: gguf
  path: tiny/tiny.gguf
  context_length: 2048
  weights_bytes: 16680192
  architecture:
    layers: 2
    heads: 4
    kv_heads: 2
    embedding_length: 64
"""
# Llama 3.1 70B's config.json: 80 layers, 64 heads, 8 KV heads, head_dim 128.
ARCH_70B = Architecture(layers=80, heads=64, kv_heads=8, head_dim=128)
L40S = "0, GPU-aaaa, NVIDIA L40S, 46068, 0, 550.54.15\n"  # nvidia-smi's csv format


ARCH_MEMORY = "host memory     = 2.0 GiB (estimated from the model's shape: layers, KV heads and head size)"
"""The quickstart's host memory as plans say it: sized from the model's shape (memory_basis arch)."""


def errors(text: str) -> list[tuple[str, str, int | None, int | None, str | None]]:
    _, diags = load(text)
    return [(d.field, d.message, d.location.line, d.location.column, d.hint) for d in diags if d.severity == "error"]


# --- the document --------------------------------------------------------------------------------------------


def test_architecture_loads_into_the_model() -> None:
    result, diags = load(TINY)
    assert messages(diags) == []
    assert result.desired.models[0].model.architecture == Architecture(
        layers=2, heads=4, kv_heads=2, embedding_length=64
    )
    assert result.desired.models[0].model.architecture.head_size == 16  # type: ignore[union-attr]


def test_a_count_that_is_not_positive_is_refused_at_its_place() -> None:
    found = errors(TINY.replace("layers: 2", "layers: 0"))
    assert len(found) == 1
    path, message, line, column, hint = found[0]
    assert (path, message, line, column) == (
        "spec.architecture.layers",
        "spec.architecture.layers 0: a positive count",
        10,
        13,
    )
    assert hint is not None and "num_hidden_layers" in hint


def test_a_shape_without_a_head_size_is_refused() -> None:
    found = errors(TINY.replace("    embedding_length: 64\n", ""))
    assert [(p, m, line) for p, m, line, _, _ in found] == [
        (
            "spec.architecture.head_dim",
            "spec.architecture.head_dim missing: give head_dim, or embedding_length and heads",
            9,
        )
    ]


def test_kv_heads_must_divide_the_heads() -> None:
    found = errors(TINY.replace("kv_heads: 2", "kv_heads: 3"))
    assert [(p, m, line) for p, m, line, _, _ in found] == [
        ("spec.architecture.kv_heads", "spec.architecture.kv_heads 3: the KV heads divide the 4 attention heads", 12)
    ]


def test_a_string_and_a_misspelled_field_are_located_shape_errors() -> None:
    found = errors(TINY.replace("layers: 2", 'layers: "2"'))
    assert [(p, line) for p, _, line, _, _ in found] == [("spec.architecture.layers", 10)]
    assert "should be a valid integer" in found[0][1]
    found = errors(TINY.replace("kv_heads: 2", "kv_heads: 2\n    head_dims: 16"))
    assert [(p, m, h) for p, m, _, _, h in found] == [
        ("spec.architecture.head_dims", "unknown field 'head_dims'", "did you mean 'head_dim'?")
    ]


def test_the_layers_and_kv_heads_are_required() -> None:
    found = errors(TINY.replace("    kv_heads: 2\n", ""))
    assert [(p, m) for p, m, _, _, _ in found] == [("spec.architecture.kv_heads", "required field is missing")]


def test_the_schema_describes_the_architecture() -> None:
    schema = json.loads(run("schema").stdout)
    props = schema["$defs"]["ArchitectureDoc"]["properties"]
    assert set(props) == {"layers", "kv_heads", "heads", "head_dim", "embedding_length"}
    assert sorted(schema["$defs"]["ArchitectureDoc"]["required"]) == ["kv_heads", "layers"]


# --- the fit -------------------------------------------------------------------------------------------------


def test_the_fit_is_known_from_the_architecture_alone_and_says_arch() -> None:
    result, _ = load(TINY)
    model = result.desired.models[0].model
    d = Deployment(name="c", model="tiny", accelerator="cpu", context_length=1024)
    plan = fit(d, model, None, [cpu_host()])
    assert isinstance(plan, FitPlan)
    # 2 layers × 2 KV heads × 16 per head × 2 bytes (f16) × K and V, for 1024 tokens × parallel 2
    assert plan.kv_cache_bytes == 2 * 2 * 16 * 2 * 2 * 1024 * 2
    assert plan.memory_basis == "arch" and plan.weights_bytes == 16680192
    # the same figures as once the file's own metadata is read
    files = ModelFacts(block_count=2, head_count=4, head_count_kv=2, embedding_length=64, context_length=2048,
                       weights_bytes=16680192)  # fmt: skip
    from_files = fit(d, model.model_copy(update={"architecture": None}), files, [cpu_host()])
    assert isinstance(from_files, FitPlan) and from_files.kv_cache_bytes == plan.kv_cache_bytes


def test_without_the_architecture_it_stays_not_known() -> None:
    result, _ = load(
        TINY.replace("  architecture:\n    layers: 2\n    heads: 4\n    kv_heads: 2\n    embedding_length: 64\n", "")
    )
    model = result.desired.models[0].model
    assert model.architecture is None
    unknown = fit(Deployment(name="c", model="tiny", accelerator="cpu"), model, None, [cpu_host()])
    assert isinstance(unknown, FitUnknown) and unknown.reason.startswith("the fit is not known yet")


def test_never_parallel_4_where_1_fits_the_70b_on_an_l40s() -> None:
    model = Model(name="llama-70b", format="gguf", path="x.gguf", context_length=131072,
                  weights_bytes=42_500_000_000, architecture=ARCH_70B)  # fmt: skip
    l40s = gpu_host("l40s", parse_nvidia_smi(L40S))
    plan = fit(Deployment(name="c", model="llama-70b", gpus=1), model, None, [l40s])
    assert isinstance(plan, FitPlan) and plan.parallel == 1
    assert plan.kv_cache_bytes == 8192 * 80 * 8 * 128 * 2 * 2 and plan.memory_basis == "arch"


def test_the_weights_metadata_wins_over_the_architecture_and_the_difference_is_said() -> None:
    model = Model(name="m", format="gguf", path="m.gguf", architecture=Architecture(layers=2, kv_heads=2, head_dim=16))
    files = ModelFacts(block_count=4, head_count=4, head_count_kv=4, embedding_length=64, weights_bytes=10**7)
    assert model_shape(model, files) is files
    d = Deployment(name="c", model="m", accelerator="cpu", context_length=1024, parallel=1)
    plan = fit(d, model, files, [cpu_host()])
    assert isinstance(plan, FitPlan) and plan.kv_cache_bytes == 4 * 4 * 16 * 2 * 2 * 1024
    assert shape_disagreement(model, files) == (
        "model m: its weights give 4 layers, 4 KV heads, head size 16, spec.architecture says 2 layers, 2 KV heads, "
        "head size 16; the KV cache is sized from the weights"
    )
    same = ModelFacts(block_count=2, head_count_kv=2, key_length=16, value_length=16, weights_bytes=10**7)
    assert shape_disagreement(model, same) is None


def test_files_without_a_shape_leave_the_architecture_to_size_it() -> None:
    model = Model(name="m", format="gguf", path="m.gguf", architecture=Architecture(layers=2, kv_heads=2, head_dim=16))
    files = ModelFacts(weights_bytes=10**7)  # a file whose metadata lacks the head counts
    plan = fit(Deployment(name="c", model="m", accelerator="cpu", context_length=1024, parallel=1), model, files,
               [cpu_host()])  # fmt: skip
    assert isinstance(plan, FitPlan) and plan.kv_cache_bytes == 2 * 2 * 16 * 2 * 2 * 1024
    assert plan.weights_bytes == 10**7 and plan.memory_basis == "weights"


def test_the_seed_example_is_sized_from_its_architecture_before_its_weights_are_anywhere() -> None:
    from engine_ctl.core.documents.loader import load_paths

    result = load_paths([ROOT / "examples/seed"])
    assert not [d for d in result.diagnostics if d.severity == "error"]
    h100 = h100x8()
    inventory = Inventory(hosts=(Host(name=h100.host, address=h100.host, models_dir="/srv/models"),))
    p = make_plan(result.desired, State(), inventory, {h100.host: h100}, {"llama-3-2-3b": None})
    (change,) = p.changes
    assert change.pending_reason is None and change.fit is not None
    assert change.fit.memory_basis == "arch" and change.fit.gpus == 1
    # 28 layers × 8 KV heads × 128 × 2 bytes × K and V, 8192 tokens × parallel 4
    assert change.fit.kv_cache_bytes == 28 * 8 * 128 * 2 * 2 * 8192 * 4
    assert len(change.replicas) == 1


# --- the README's main job -----------------------------------------------------------------------------------


def plan_quickstart(quickstart: Path, tmp_path: Path) -> tuple[int, str]:
    proc = subprocess.run(
        [sys.executable, "-m", "engine_ctl", "plan", str(quickstart), "--state", str(tmp_path / "state.json")],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    return proc.returncode, proc.stdout + proc.stderr


def test_the_quickstart_plan_knows_the_fit_before_the_weights_are_on_the_machine(tmp_path: Path) -> None:
    gguf = "/var/lib/engine-ctl/models/tiny-llama/tiny-llama-f32.gguf"
    assert not Path(gguf).exists(), "this test is about a machine without the quickstart's weights"
    rc, out = plan_quickstart(ROOT / "examples/quickstart", tmp_path)
    assert rc == 1, out  # Pending until the weights are there: the document is not served (the promise of a plan)
    assert "the fit is not known yet" not in out and "No changes" not in out
    assert "+ context_length  = 1024" in out and ARCH_MEMORY in out
    assert "the weights of tiny-llama" in out and f"at {gguf} (not found)" in out  # what this machine lacks
    assert "Plan: 1 to add, 0 to change, 0 to destroy." in out


def test_the_quickstart_plan_prints_the_argv_once_the_weights_are_there(tmp_path: Path) -> None:
    from tests.llama import LLAMA_VERSION, llama_server_dir, tiny_model

    quickstart = tmp_path / "quickstart"
    shutil.copytree(ROOT / "examples/quickstart", quickstart)
    models = tmp_path / "models"
    (models / "tiny-llama").mkdir(parents=True)
    shutil.copy(tiny_model(), models / "tiny-llama" / "tiny-llama-f32.gguf")
    server = llama_server_dir() / "bin" / "llama-server"
    hosts = (quickstart / "hosts.yaml").read_text()
    engines = f"{{llama.cpp: {{path: {server}, version: {LLAMA_VERSION}}}}}"
    hosts = hosts.replace("models_dir: /var/lib/engine-ctl/models", f"models_dir: {models}\n  engines: {engines}")
    (quickstart / "hosts.yaml").write_text(hosts)
    rc, out = plan_quickstart(quickstart, tmp_path)
    assert rc == 0, out
    assert f"argv: {server} --model {models}/tiny-llama/tiny-llama-f32.gguf --alias tiny-chat --ctx-size 2048 " in out
    assert "Warning" not in out and "Pending" not in out
    assert ARCH_MEMORY in out  # the file's own shape now
