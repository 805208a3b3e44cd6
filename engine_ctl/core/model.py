"""The internal model every document form loads into. Values only; no I/O."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from engine_ctl.providers import AUTO, PROVIDERS, deployment_option_keys, recorded_unset_keys

Format = Literal["gguf", "safetensors"]
FORMAT_TITLES = {"gguf": "GGUF", "safetensors": "safetensors"}
"""How a format is written in prose."""
OptionValue = bool | int | float | str


class Value(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)


class HfRef(Value):
    repo: str
    commit: str | None = None

    def __str__(self) -> str:
        return f"{self.repo}@{self.commit}" if self.commit else self.repo


class Architecture(Value):
    """The model's shape as its Model document states it, to size the KV cache before any host has the weights:
    layers × KV heads × head size (head_dim, or embedding_length / heads)."""

    layers: int
    kv_heads: int
    heads: int | None = None
    head_dim: int | None = None
    embedding_length: int | None = None

    @property
    def head_size(self) -> int | None:
        if self.head_dim:
            return self.head_dim
        if self.embedding_length and self.heads:
            return self.embedding_length // self.heads
        return None

    def problems(self) -> list[tuple[str, str, str]]:
        """(field, message, hint) for each rule the values break; empty when the shape is whole and consistent."""
        out: list[tuple[str, str, str]] = []
        for name in ("layers", "kv_heads", "heads", "head_dim", "embedding_length"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                out.append((name, f"{value}: a positive count", f"write the model's {_ARCH_SOURCES[name]}"))
        if out:
            return out
        if self.head_dim is None and not (self.embedding_length and self.heads):
            out.append(("head_dim", "missing: give head_dim, or embedding_length and heads",
                        "head_dim is config.json's head_dim, or its hidden_size / num_attention_heads"))  # fmt: skip
        if self.heads is not None and (self.kv_heads > self.heads or self.heads % self.kv_heads):
            out.append(("kv_heads", f"{self.kv_heads}: the KV heads divide the {self.heads} attention heads",
                        "kv_heads is config.json's num_key_value_heads (GGUF: attention.head_count_kv)"))  # fmt: skip
        if self.head_dim is None and self.embedding_length and self.heads and self.embedding_length % self.heads:
            out.append(("embedding_length", f"{self.embedding_length}: not a multiple of the {self.heads} heads",
                        "give head_dim (config.json's head_dim) when the heads do not divide it"))  # fmt: skip
        return out


_ARCH_SOURCES = {
    "layers": "number of layers (config.json num_hidden_layers, GGUF block_count)",
    "kv_heads": "KV heads (config.json num_key_value_heads, GGUF attention.head_count_kv)",
    "heads": "attention heads (config.json num_attention_heads, GGUF attention.head_count)",
    "head_dim": "head size (config.json head_dim, GGUF attention.key_length)",
    "embedding_length": "embedding size (config.json hidden_size, GGUF embedding_length)",
}


class Model(Value):
    """A model: where its weights are and what it is."""

    name: str
    format: Format
    path: str | None = None
    hf: HfRef | None = None
    file: str | None = None
    context_length: int | None = None
    parameters: int | None = None
    weights_bytes: int | None = None
    chat_template: str | None = None
    mmproj: str | None = None
    capabilities: tuple[str, ...] = ("chat",)
    pooling: str | None = None
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    architecture: Architecture | None = None

    @property
    def is_embedding(self) -> bool:
        return "embeddings" in self.capabilities


UNSET_UNRECORDED = ("startup_bytes", "startup_timeout_s", "nodes")


class Deployment(Value):
    """A deployment as engine-ctl understands it, whichever form it was written in."""

    name: str
    labels: dict[str, str] = {}
    model: str
    engine: str = "auto"
    """`auto` or a provider's name (the documents accept only those; aliases are resolved on loading)."""
    replicas_min: int = 1
    replicas_max: int = 1
    idle_minutes: int | None = None
    accelerator: Literal["gpu", "cpu", "host"] = "gpu"
    """host: the host decides (the flat form, which has no accelerator field): its GPUs where it has some the
    engine runs on, else its CPU where the engine runs on CPUs (fitting.host_decides, once per revision)."""
    gpus: int | None = None
    gpu_vendor: Literal["any", "nvidia", "amd"] = "any"
    cpu_cores: int | None = None
    context_length: int | None = None
    parallel: int | None = None
    engine_args: tuple[str, ...] = ()
    priority: int = 0
    host: str | None = None
    api: Literal["chat", "decisions"] = "chat"
    residency: Literal["restart_only", "parked", "deep", "host_backed"] = "restart_only"
    devices: tuple[str, ...] = ()
    gpu_memory_bytes: int | None = None
    ram_bytes: int | None = None
    engine_options: dict[str, OptionValue] = {}
    """engine_config keys only one engine reads (its provider's `options`), as written. Recorded flat, each key
    beside the other fields as before they moved into providers, so that records and digests stay as they were."""
    prevent_destroy: bool = False
    """Any plan that would destroy the deployment is refused (recorded in the state, never a new revision)."""
    startup_bytes: int | None = None
    """The flat form's engine_config.memory.startup: memory set aside to start it until a start measures it."""
    startup_timeout_s: int | None = None
    """The flat form's timeouts.startup: the start-up budget in place of the engine's."""
    nodes: int | None = None
    """spec.nodes: the machines one replica spans (a replica group, on the engine's own distributed runtime);
    None is 1 (and is not recorded, so deployments written before it keep their digest)."""

    @property
    def node_count(self) -> int:
        return self.nodes or 1

    @field_validator("engine")
    @classmethod
    def _known_engine(cls, engine: str) -> str:
        if engine != AUTO and engine not in PROVIDERS:
            raise ValueError(f"engine {engine!r}: {AUTO} or one of {', '.join(PROVIDERS)}")
        return engine

    @model_validator(mode="before")
    @classmethod
    def _gather_options(cls, data: Any) -> Any:
        """A recorded spec (a saved plan's) names engine options as fields of their own: gather them again."""
        if not isinstance(data, dict):
            return data
        keys = deployment_option_keys() & data.keys()
        if not keys:
            return data
        options = {**data.get("engine_options", {}), **{k: data[k] for k in keys if data[k] is not None}}
        return {**{k: v for k, v in data.items() if k not in keys}, "engine_options": options}

    @model_serializer(mode="wrap")
    def _flat_options(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """engine_options written flat in their place: {…, "cuda_graphs": null, "prevent_destroy": …}. The keys
        records always carried (recorded_when_unset) are there when not set too; any other only when set."""
        data: dict[str, Any] = handler(self)
        for key in UNSET_UNRECORDED:  # written only when set: the digests of deployments without them stay
            if data.get(key, 0) is None:
                del data[key]
        if "engine_options" not in data:
            return data
        options = {**dict.fromkeys(recorded_unset_keys()), **data["engine_options"]}
        out: dict[str, Any] = {}
        for key, value in data.items():
            out.update(options if key == "engine_options" else {key: value})
        return out


class Origin(Value):
    """Where a document came from: its file, its form, and where each internal field was written."""

    file: str
    form: Literal["spec", "flat", "model"]
    line: int
    column: int
    fields: dict[str, tuple[str, int, int]] = {}
    """internal field name -> (document path as written, line, column)."""


class Loaded(Value):
    """A value with its origin."""

    origin: Origin


class LoadedDeployment(Loaded):
    deployment: Deployment


class LoadedModel(Loaded):
    model: Model


class ApiKey(Value):
    """An API key as the gateway checks it (kind: ApiKey): its name, its SHA-256 (never the key), its scope
    (None: every deployment), its expiry (epoch seconds) and its rate limit (requests per minute; None: the
    inventory's gateway.requests_per_minute, else none)."""

    name: str
    sha256: str
    deployments: tuple[str, ...] | None = None
    expires: int | None = None
    requests_per_minute: int | None = None
    file: str = ""


class DesiredState(Value):
    """Everything the documents ask for."""

    models: tuple[LoadedModel, ...] = ()
    deployments: tuple[LoadedDeployment, ...] = ()
    api_keys: tuple[ApiKey, ...] = ()

    def model(self, name: str) -> Model | None:
        for loaded in self.models:
            if loaded.model.name == name:
                return loaded.model
        return None

    def deployment(self, name: str) -> LoadedDeployment | None:
        for loaded in self.deployments:
            if loaded.deployment.name == name:
                return loaded
        return None


def distinct_flat_models(
    models: list[LoadedModel], deployments: list[LoadedDeployment]
) -> tuple[list[LoadedModel], list[LoadedDeployment]]:
    """Seed 003 (B11): two flat checkpoints with the same directory name (/a/qwen, /b/qwen), or two commits of one
    repository, are two models, not a duplicate. A flat model whose name another flat model has with other weights
    is named by where it is (its path as written, or org/repo@commit), and its deployment with it."""
    flat = [m for m in models if m.origin.form == "flat"]
    by_name: dict[str, set[Model]] = {}
    for m in flat:
        by_name.setdefault(m.model.name, set()).add(m.model)
    clashing = {name for name, found in by_name.items() if len(found) > 1}
    if not clashing:
        return models, deployments
    renamed: dict[tuple[str, int, int], str] = {}
    out_models = []
    for m in models:
        if m.origin.form == "flat" and m.model.name in clashing:
            name = m.model.path.rstrip("/") if m.model.path else str(m.model.hf)
            renamed[(m.origin.file, m.origin.line, m.origin.column)] = name
            m = m.model_copy(update={"model": m.model.model_copy(update={"name": name})})
        out_models.append(m)
    out_deployments = []
    for d in deployments:
        new = renamed.get((d.origin.file, d.origin.line, d.origin.column)) if d.origin.form == "flat" else None
        out_deployments.append(d.model_copy(update={"deployment": d.deployment.model_copy(update={"model": new})})
                               if new else d)  # fmt: skip
    return out_models, out_deployments
