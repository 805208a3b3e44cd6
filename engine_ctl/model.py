"""The internal model every document form loads into. Values only; no I/O."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

EngineChoice = Literal["auto", "llama.cpp", "vllm", "sglang"]
Format = Literal["gguf", "safetensors"]


class Value(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class HfRef(Value):
    repo: str
    commit: str | None = None

    def __str__(self) -> str:
        return f"{self.repo}@{self.commit}" if self.commit else self.repo


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

    @property
    def is_embedding(self) -> bool:
        return "embeddings" in self.capabilities


class Deployment(Value):
    """A deployment as engine-ctl understands it, whichever form it was written in."""

    name: str
    labels: dict[str, str] = {}
    model: str
    engine: EngineChoice = "auto"
    replicas_min: int = 1
    replicas_max: int = 1
    idle_minutes: int | None = None
    accelerator: Literal["gpu", "cpu"] = "gpu"
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
    cuda_graphs: bool | None = None


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


class DesiredState(Value):
    """Everything the documents ask for."""

    models: tuple[LoadedModel, ...] = ()
    deployments: tuple[LoadedDeployment, ...] = ()

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
