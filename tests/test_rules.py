"""One test per rule of seed 000's Rules table, each asserting the seed's exact message."""

from __future__ import annotations

import pytest

from tests.helpers import MODEL_GGUF, MODEL_ST, deployment, load, messages


def only_error(spec: str, model: str = MODEL_GGUF, name: str = "chat") -> str:
    _, diags = deployment(spec, name=name, model=model)
    errs = messages(diags)
    assert len(errs) == 1, errs
    return errs[0]


def test_valid_minimal_document_has_no_errors() -> None:
    _, diags = deployment("model: llama-3-2-3b")
    assert messages(diags) == []


def test_model_must_exist() -> None:
    assert only_error("model: x") == 'spec.model "x": a model of the deployment\'s own workspace'


@pytest.mark.parametrize("value", [0, 65, -1])
def test_replicas_max_between_1_and_64(value: int) -> None:
    errs = messages(deployment(f"model: llama-3-2-3b\nreplicas: {{min: 0, max: {value}}}")[1])
    assert "spec.replicas.max: between 1 and 64" in errs


def test_replicas_max_64_is_allowed() -> None:
    assert messages(deployment("model: llama-3-2-3b\nreplicas: {min: 1, max: 64}")[1]) == []


def test_replicas_min_at_most_max() -> None:
    assert (
        only_error("model: llama-3-2-3b\nreplicas: {min: 3, max: 2}") == "spec.replicas.min: at most spec.replicas.max"
    )


@pytest.mark.parametrize("value", [0, 1441])
def test_idle_minutes_between_1_and_1440(value: int) -> None:
    err = only_error(f"model: llama-3-2-3b\nreplicas: {{min: 0, max: 1, idle_minutes: {value}}}")
    assert err == "spec.replicas.idle_minutes: between 1 and 1440"


def test_idle_minutes_cleared_with_a_warning_when_min_above_zero() -> None:
    result, diags = deployment("model: llama-3-2-3b\nreplicas: {min: 1, max: 2, idle_minutes: 30}")
    assert messages(diags) == []
    assert "spec.replicas.idle_minutes: ignored (cleared) because spec.replicas.min is above 0" in messages(
        diags, "warning"
    )
    assert result.desired.deployments[0].deployment.idle_minutes is None


def test_idle_minutes_defaults_to_15_with_min_zero() -> None:
    result, _ = deployment("model: llama-3-2-3b\nreplicas: {min: 0, max: 1}")
    assert result.desired.deployments[0].deployment.idle_minutes == 15


def test_context_length_at_least_256() -> None:
    assert only_error("model: llama-3-2-3b\ncontext_length: 255") == "spec.context_length: at least 256 tokens"


def test_context_length_at_most_the_models() -> None:
    err = only_error("model: llama-3-2-3b\ncontext_length: 200000")
    assert err == "spec.context_length 200000: model llama-3-2-3b takes at most 131072 tokens"


@pytest.mark.parametrize("value", [0, 1025])
def test_parallel_between_1_and_1024(value: int) -> None:
    assert only_error(f"model: llama-3-2-3b\nparallel: {value}") == "spec.parallel: between 1 and 1024"


@pytest.mark.parametrize("value", [0, 1025])
def test_cpu_cores_between_1_and_1024(value: int) -> None:
    assert only_error(f"model: llama-3-2-3b\ncpu_cores: {value}") == "spec.cpu_cores: between 1 and 1024"


@pytest.mark.parametrize("value", [0, 3, 5, 16])
def test_gpus_1_2_4_8(value: int) -> None:
    assert (
        only_error(f"model: llama-3-2-3b\ngpus: {value}") == "spec.gpus: 1, 2, 4 or 8 GPUs of one machine per replica"
    )


@pytest.mark.parametrize("value", [1, 2, 4, 8])
def test_gpus_allowed_values(value: int) -> None:
    assert messages(deployment(f"model: llama-3-2-3b\ngpus: {value}")[1]) == []


def test_no_gpus_on_a_cpu_deployment() -> None:
    err = only_error("model: llama-3-2-3b\naccelerator: cpu\ngpus: 1")
    assert err == "spec.gpus: a CPU-only deployment has none"


def test_vllm_needs_a_gpu() -> None:
    err = only_error("model: qwen\nengine: vllm\naccelerator: cpu", model=MODEL_ST)
    assert err == "spec.accelerator: cpu is served by llama.cpp; vLLM needs a GPU"


def test_llamacpp_refuses_safetensors() -> None:
    err = only_error("model: qwen\nengine: llama.cpp", model=MODEL_ST)
    assert err == "llama.cpp serves GGUF; model qwen is a safetensors checkpoint: serve it with vllm"


def test_vllm_refuses_gguf() -> None:
    err = only_error("model: llama-3-2-3b\nengine: vllm")
    assert err == "model llama-3-2-3b is GGUF: serve it with llama.cpp (vLLM serves safetensors checkpoints here)"


@pytest.mark.parametrize("name", ["Chat", "-chat", "chat-", "a" * 41, "chat_1", "chät"])
def test_name_rule(name: str) -> None:
    err = only_error("model: llama-3-2-3b", name=f'"{name}"')
    assert err == (
        f"metadata.name {name!r}: lowercase letters, digits and -, not starting or ending with -, at most 40 characters"
    )


@pytest.mark.parametrize("name", ["a", "chat-2", "a" * 40, "7b"])
def test_good_names(name: str) -> None:
    assert messages(deployment("model: llama-3-2-3b", name=name)[1]) == []


def test_auto_engine_follows_the_format() -> None:
    from engine_ctl.core.documents.rules import resolve_engine

    result, _ = load(
        MODEL_GGUF,
        MODEL_ST,
        "metadata: {name: a}\nspec: {model: llama-3-2-3b}",
        "metadata: {name: b}\nspec: {model: qwen}",
    )
    engines = {
        d.deployment.name: resolve_engine(d.deployment, result.desired.model(d.deployment.model)).name  # type: ignore[union-attr]
        for d in result.desired.deployments
    }
    assert engines == {"a": "llama.cpp", "b": "vllm"}


def test_unknown_field_did_you_mean() -> None:
    _, diags = deployment("model: llama-3-2-3b\ncontxt_length: 4096")
    (d,) = [x for x in diags if x.severity == "error"]
    assert d.message == "unknown field 'contxt_length'"
    assert d.hint == "did you mean 'context_length'?"
    assert (d.location.line, d.location.column) == (4, 3)
    assert d.field == "spec.contxt_length"


def test_duplicate_deployment_names_across_files() -> None:
    _, diags = load(
        MODEL_GGUF,
        "metadata: {name: chat}\nspec: {model: llama-3-2-3b}",
        "metadata: {name: chat}\nspec: {model: llama-3-2-3b}",
    )
    (d,) = [x for x in diags if x.severity == "error"]
    assert d.message.startswith("duplicate deployment name 'chat' (first defined at 1-d.yaml:1:")
    assert d.location.file == "2-d.yaml"


def test_hf_reference_without_commit_is_refused_offline() -> None:
    model = "kind: Model\nmetadata: {name: q}\nspec: {format: safetensors, hf: Qwen/Qwen3-4B}"
    _, diags = load(model)
    (d,) = [x for x in diags if x.severity == "error"]
    assert "validate works offline, so it refuses an hf: reference without a commit" in d.message
    assert d.hint == "pin it: Qwen/Qwen3-4B@<commit>"
