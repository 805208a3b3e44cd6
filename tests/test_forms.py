"""Both document forms load into one internal model and mean the same where they overlap."""

from __future__ import annotations

from tests.helpers import load, messages

COMMIT = "b968826d9c46dd6066d109eabc6255188de91218"


def test_same_meaning_in_both_forms_gives_the_same_internal_model() -> None:
    spec_form = """
    kind: Model
    metadata: {name: Clef-Flash-GGUF}
    spec: {format: gguf, path: Clef-Flash-GGUF, file: Clef-Flash-Q8_0.gguf}
    ---
    metadata: {name: decider}
    spec:
      model: Clef-Flash-GGUF
      engine: llama.cpp
      context_length: 16384
      engine_args: [--batch-size, "16384", --ubatch-size, "16384"]
    """
    flat_form = """
    name: decider
    engine: llamacpp
    model: Clef-Flash-GGUF
    engine_config:
      context_length: 16384
      llamacpp: {gguf_file: Clef-Flash-Q8_0.gguf}
      accept_extra_args: true
      extra_args: [--batch-size, "16384", --ubatch-size, "16384"]
    """
    a, da = load(spec_form)
    b, db = load(flat_form)
    assert messages(da) == messages(db) == []
    spec_d, flat_d = a.desired.deployments[0].deployment, b.desired.deployments[0].deployment
    # where the forms differ by the seeds: the flat form lets the host decide the accelerator, and parks
    assert (spec_d.accelerator, spec_d.residency) == ("gpu", "restart_only")
    assert (flat_d.accelerator, flat_d.residency) == ("host", "parked")
    assert spec_d == flat_d.model_copy(update={"accelerator": "gpu", "residency": "restart_only"})
    assert a.desired.models[0].model == b.desired.models[0].model
    assert a.desired.deployments[0].origin.form == "spec"
    assert b.desired.deployments[0].origin.form == "flat"


def test_flat_form_hf_reference_with_commit() -> None:
    result, diags = load(f"name: q\nengine: vllm\nmodel: Qwen/Qwen3-4B@{COMMIT}")
    assert messages(diags) == []
    model = result.desired.models[0].model
    assert model.hf is not None and (model.hf.repo, model.hf.commit) == ("Qwen/Qwen3-4B", COMMIT)
    assert model.format == "safetensors"


def test_flat_form_hf_mapping_without_commit_refused() -> None:
    _, diags = load("name: q\nengine: vllm\nmodel: {hf: Qwen/Qwen3-4B-Instruct-2507}")
    (msg,) = messages(diags)
    assert "refuses an hf: reference without a commit" in msg


def test_decisions_on_vllm_refused() -> None:
    _, diags = load(f"name: d\nengine: vllm\nmodel: Qwen/Q@{COMMIT}\napi: decisions")
    assert any(m.startswith("capability_missing:decisions") for m in messages(diags))


def test_json_documents_load() -> None:
    result, diags = load(
        '{"kind": "Model", "metadata": {"name": "m"}, "spec": {"format": "gguf", "path": "m.gguf"}}',
        '{"metadata": {"name": "chat"}, "spec": {"model": "m", "accelerator": "cpu"}}',
    )
    assert messages(diags) == []
    assert result.desired.deployments[0].deployment.accelerator == "cpu"


def test_architecture_means_the_same_in_yaml_and_json() -> None:
    yaml_doc = """
    kind: Model
    metadata: {name: m}
    spec:
      format: gguf
      path: m.gguf
      architecture: {layers: 28, heads: 24, kv_heads: 8, head_dim: 128}
    """
    json_doc = (
        '{"kind": "Model", "metadata": {"name": "m"}, "spec": {"format": "gguf", "path": "m.gguf", '
        '"architecture": {"layers": 28, "heads": 24, "kv_heads": 8, "head_dim": 128}}}'
    )
    a, da = load(yaml_doc)
    b, db = load(json_doc)
    assert messages(da) == messages(db) == []
    arch = a.desired.models[0].model.architecture
    assert arch is not None and (arch.layers, arch.kv_heads, arch.head_size) == (28, 8, 128)
    assert a.desired.models[0].model == b.desired.models[0].model
