"""What one replica runs: the fit's plan object, its placement, and the run the provider turns into argv."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from engine_ctl.facts import Gpu
from engine_ctl.model import Model

MemoryBasis = Literal["estimate", "arch", "catalog", "weights"]


class FitPlan(BaseModel):
    """Seed 000's `plan` object: what each replica runs and takes."""

    model_config = ConfigDict(frozen=True)

    engine: str
    gpu_vendor: str
    accelerator: Literal["gpu", "cpu"]
    kind: Literal["chat", "embedding"]
    gpus: int
    min_gpu_memory_gb: int
    memory_basis: MemoryBasis
    cpu_cores: int
    threads: int | None
    memory_bytes: int
    context_length: int
    parallel: int
    weights_bytes: int
    kv_cache_bytes: int
    port: int | None = None
    capabilities: tuple[str, ...] = ()


class Placement(BaseModel):
    model_config = ConfigDict(frozen=True)

    index: int
    host: str
    gpus: tuple[Gpu, ...] = ()
    port: int
    threads: int | None = None


class ReplicaRun(BaseModel):
    """Everything a provider needs to build one replica's argv and environment."""

    model_config = ConfigDict(frozen=True)

    deployment: str
    revision: int = 1
    index: int = 0
    slot: str = "a"
    model: Model
    model_path: str
    """Absolute on the host: the .gguf file, or the checkpoint directory."""
    mmproj_path: str | None = None
    executable: str
    bind_address: str = "0.0.0.0"
    port: int
    gpus: tuple[Gpu, ...] = ()
    plan: FitPlan
    threads: int | None = None
    engine_args: tuple[str, ...] = ()
    gpu_memory_bytes: int | None = None
    cuda_graphs: bool | None = None
