"""The documents users write, as pydantic models: their shape and types, with the seeds' descriptions.

Range rules (with the seeds' exact messages) live in `rules.py`; these models check shape only,
so that every refusal can name its field and its place in the file.

What depends on the engines (the names `engine:` accepts, the engine-only engine_config keys, the descriptions
that name engines) is asked of the provider registry when this module is first imported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, cast

from pydantic import BaseModel, ConfigDict, Field, create_model, model_validator

from engine_ctl import providers as registry
from engine_ctl.core.documents.engine_text import (
    context_defaults,
    cpu_description,
    engine_description,
    flat_engine_description,
    format_description,
    parallel_defaults,
    parser_description,
)

if TYPE_CHECKING:
    EngineName = str
else:
    EngineName = Literal[registry.engine_choices()]


Capability = Literal[
    "chat",
    "embeddings",
    "vision",
    "audio",
    "video",
    "transcription",
    "tools",
    "reasoning",
    "structured_output",
    "logprobs",
]


class Doc(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, defer_build=True)


class Metadata(Doc):
    name: str = Field(
        description="Lowercase letters, digits and -, not starting or ending with -, at most 40 characters. "
        "It is also what clients put in a request's model."
    )
    labels: dict[str, str] = Field(default_factory=dict, description="Your labels.")


class Replicas(Doc):
    min: int = Field(
        1,
        description="Fewest replicas. 0 scales to zero when idle; the next request starts one. At most max.",
    )
    max: int = Field(1, description="Most replicas, 1 to 64. Between min and max the deployment scales with load.")
    idle_minutes: int | None = Field(
        None,
        description="With min: 0, minutes without a request before the last replica stops, 1 to 1440 "
        "(default 15). Ignored (cleared) when min is above 0.",
    )


class DeploymentSpec(Doc):
    model: str = Field(
        description="A Model document (kind: Model) loaded with this one. It must exist; its weights need "
        "not be on any host yet."
    )
    engine: EngineName = Field("auto", description=engine_description())
    replicas: Replicas = Field(default_factory=Replicas, description="How many replicas run.")
    accelerator: Literal["gpu", "cpu"] = Field(
        "gpu",
        description="gpu: whole GPUs of one host per replica. cpu: CPU only, " + cpu_description(),
    )
    gpus: int | None = Field(
        None,
        description="GPUs per replica, all of one host: 1, 2, 4 or 8. When omitted, the fewest that hold the "
        "model on the largest-GPU host of the inventory. Not allowed with cpu.",
    )
    gpu_vendor: Literal["any", "nvidia", "amd"] = Field(
        "any",
        description="nvidia or amd to restrict replicas to that vendor's GPUs. any: any GPU the engine runs on.",
    )
    cpu_cores: int | None = Field(
        None,
        description="CPU cores per replica, 1 to 1024. Default with GPUs: 4 per GPU. CPU only: 2 up to 2B "
        "parameters, 4 up to 9B, 6 above, at most the cores of the largest host.",
    )
    context_length: int | None = Field(
        None,
        description="The longest context of one request, in tokens; at least 256 and never above the model's. "
        + context_defaults(),
    )
    parallel: int | None = Field(
        None,
        description="Requests one replica serves at once, 1 to 1024. " + parallel_defaults(),
    )
    engine_args: list[str] = Field(
        default_factory=list,
        description="Extra engine flags from a fixed allow-list, after the ones the deployment sets.",
    )
    priority: int = Field(0, description="Replicas of a higher-priority deployment are placed first.")
    host: str | None = Field(None, description="Restrict replicas to this inventory host.")
    prevent_destroy: bool = Field(
        False,
        description="true: any plan that would destroy this deployment is refused (Terraform's lifecycle "
        "prevent_destroy), also when its document is left out. Changing it changes nothing on the hosts.",
    )
    api: Literal["chat", "decisions"] = Field("chat", description="chat, or decisions (POST /v1/systemone).")
    nodes: int = Field(
        1,
        description="Machines one replica spans, 1 to 16: a replica group on the engine's own distributed runtime. "
        "Each machine gives `gpus` GPUs, or `cpu_cores` cores; the head serves the API, the "
        "gateway sees only it. Only engines that spread a replica over machines, always-on replicas.",
    )


class DeploymentDocument(Doc):
    """A deployment in the metadata/spec form."""

    kind: Literal["Deployment"] = "Deployment"
    metadata: Metadata
    spec: DeploymentSpec


class HfSource(Doc):
    hf: str = Field(description="A Hugging Face repository, org/repo, or org/repo@<commit> to pin it.")
    commit: str | None = Field(None, description="The commit to pin (or write org/repo@<commit>).")


class FlatMemory(Doc):
    request: str | int | None = Field(
        None, description="GPU memory the engine may use: weights, KV cache and a margin, e.g. 16GiB."
    )
    startup: str | int | None = Field(
        None,
        description="The memory set aside to start the model, e.g. 28GiB, in place of the estimate until a first "
        "start has measured its peak.",
    )


class FlatTimeouts(Doc):
    startup: int | str | None = Field(
        None,
        description="How long the engine may take to load the model and answer its health check: seconds, or "
        "600s, 10m (default: the engine's start-up budget).",
    )


class EngineConfigFields(Doc):
    """engine_config's keys every engine reads; FlatEngineConfig adds each provider's own (engine_options)."""

    memory: FlatMemory | None = None
    context_length: int | None = Field(None, description="As spec.context_length.")
    accept_extra_args: bool = Field(False, description="Must be true for extra_args to be passed.")
    extra_args: list[str] = Field(default_factory=list, description="As spec.engine_args.")


def _flat_engine_config() -> type[EngineConfigFields]:
    """The flat form's engine_config: the common keys, with the engine-only ones (sorted) after context_length."""
    common = {name: (info.annotation, info) for name, info in EngineConfigFields.model_fields.items()}
    own: dict[str, Any] = {
        o.key: (o.annotation, Field(None, description=o.description)) for o in registry.engine_options()
    }
    clash = own.keys() & common.keys()
    if clash:
        raise ValueError(f"engine options {sorted(clash)} are engine_config keys every engine reads")
    head = ("memory", "context_length")
    fields = {k: common[k] for k in head} | own | {k: v for k, v in common.items() if k not in head}
    return cast("type[EngineConfigFields]", create_model("FlatEngineConfig", __base__=Doc, **fields))


if TYPE_CHECKING:
    FlatEngineConfig = EngineConfigFields
else:
    FlatEngineConfig = _flat_engine_config()


class FlatDevice(Doc):
    id: str = Field(description="A GPU of the host: gpu0, gpu1, … or its UUID.")


class FlatResources(Doc):
    gpu: str | int | None = Field(None, description="GPU memory per replica, e.g. 16GiB.")
    ram: str | int | None = Field(None, description="Host memory per replica, e.g. 2GiB.")


class FlatDeploymentDocument(Doc):
    """A deployment in the flat form: name, engine, model."""

    name: str = Field(description="The name clients send as model in their requests.")
    engine: EngineName = Field("auto", description=flat_engine_description())
    model: str | HfSource = Field(
        description="A directory under the host's models directory, an absolute path, org/repo@<commit>, "
        "or {hf: org/repo}."
    )
    api: Literal["chat", "decisions"] = Field("chat", description="chat, or decisions (POST /v1/systemone).")
    residency: Literal["restart_only", "parked", "deep", "host_backed"] = Field(
        "parked",
        description="How the model parks. parked (the default): off the GPU without stopping it; restart_only to "
        "stop the model instead of parking it, or deep to drop its weights when parked. A decisions deployment "
        "restarts instead of parking (restart_only, its default).",
    )
    devices: list[FlatDevice] = Field(default_factory=list, description="Pin GPUs on a host with several.")
    host: str | None = Field(None, description="The inventory host to run on.")
    prevent_destroy: bool = Field(
        False,
        description="true: any plan that would destroy this deployment is refused (Terraform's lifecycle "
        "prevent_destroy), also when its document is left out. Changing it changes nothing on the hosts.",
    )
    resources: FlatResources | None = None
    engine_config: FlatEngineConfig = Field(default_factory=FlatEngineConfig)
    replicas: int = Field(1, description="How many replicas (min = max).")
    timeouts: FlatTimeouts | None = None

    @model_validator(mode="before")
    @classmethod
    def _decisions_restart(cls, data: Any) -> Any:
        """A decisions deployment restarts instead of parking: restart_only is its default (seed 003)."""
        if isinstance(data, dict) and data.get("api") == "decisions" and "residency" not in data:
            return {**data, "residency": "restart_only"}
        return data


class ModelMetadata(Doc):
    name: str = Field(description="The name deployments give as spec.model.")
    labels: dict[str, str] = Field(default_factory=dict)


class ArchitectureDoc(Doc):
    layers: int = Field(description="Layers (config.json num_hidden_layers; GGUF <arch>.block_count).")
    kv_heads: int = Field(
        description="KV heads per layer (config.json num_key_value_heads; GGUF <arch>.attention.head_count_kv)."
    )
    heads: int | None = Field(
        None, description="Attention heads (config.json num_attention_heads; GGUF <arch>.attention.head_count)."
    )
    head_dim: int | None = Field(
        None,
        description="Size of one head (config.json head_dim; GGUF <arch>.attention.key_length). "
        "When omitted: embedding_length / heads.",
    )
    embedding_length: int | None = Field(
        None, description="Embedding size (config.json hidden_size; GGUF <arch>.embedding_length)."
    )


class ModelSpecDoc(Doc):
    format: Literal["gguf", "safetensors"] = Field(description=format_description())
    path: str | None = Field(
        None,
        description="Where the weights are on each host: a .gguf file or a checkpoint directory; relative "
        "paths are under the host's models_dir.",
    )
    hf: str | HfSource | None = Field(None, description="org/repo@<commit>, or {hf: org/repo, commit: …}.")
    file: str | None = Field(None, description="GGUF: the file in the directory or repository.")
    context_length: int | None = Field(None, description="The model's maximum context, in tokens.")
    parameters: int | None = Field(None, description="Parameter count, e.g. 3210000000.")
    weights_bytes: int | None = Field(None, description="Size of the weights; read from the files when omitted.")
    chat_template: str | None = Field(None, description="A chat template name or Jinja text.")
    mmproj: str | None = Field(None, description="GGUF: the multimodal projector file.")
    capabilities: list[Capability] = Field(default_factory=lambda: list[Capability](["chat"]))
    pooling: Literal["none", "mean", "cls", "last", "rank"] | None = Field(
        None, description="Embedding models: the pooling."
    )
    tool_call_parser: str | None = Field(None, description=parser_description("tool_call_parser", "tool-call"))
    reasoning_parser: str | None = Field(None, description=parser_description("reasoning_parser", "reasoning"))
    architecture: ArchitectureDoc | None = Field(
        None,
        description="The model's shape, to size the KV cache before any host has the weights: layers, kv_heads "
        "and head_dim (or embedding_length and heads). The weights' own metadata wins once a host has them.",
    )


class ModelDocument(Doc):
    kind: Literal["Model"]
    metadata: ModelMetadata
    spec: ModelSpecDoc


registry.seal(__name__)
