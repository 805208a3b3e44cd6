"""What one replica runs: the fit's plan object, its placement, and the run the provider turns into argv."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, SerializerFunctionWrapHandler, model_serializer

from engine_ctl.core.fit.hostfacts import Gpu
from engine_ctl.core.model import Model, OptionValue

MemoryBasis = Literal["estimate", "arch", "catalog", "weights"]


class FitPlan(BaseModel):
    """Seed 000's `plan` object: what each replica runs and takes. For a replica group (spec.nodes > 1) gpus,
    cpu_cores, threads and memory_bytes are what each of its machines takes, min_gpu_memory_bytes what each of
    its GPUs must have, weights_bytes and kv_cache_bytes the whole replica's (fitting's docstring)."""

    model_config = ConfigDict(frozen=True)

    engine: str
    gpu_vendor: str
    accelerator: Literal["gpu", "cpu"]
    kind: Literal["chat", "embedding"]
    gpus: int
    min_gpu_memory_gb: int
    """The seed's figure, for people: min_gpu_memory_bytes in GB, rounded up. Placement never compares it."""
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
    min_gpu_memory_bytes: int = 0
    """What each GPU of a replica must have, in bytes: the one figure the fit and placement compare."""
    devices: tuple[str, ...] = ()
    """The GPUs the deployment pins (gpu0, gpu1, … or UUIDs); empty: any free ones."""


def without_empty_group(data: dict[str, Any]) -> dict[str, Any]:
    """A replica on one machine is written as before groups existed (older plans and states read the same): no
    `members`, no `group_port`."""
    if not data.get("members"):
        data.pop("members", None)
        data.pop("group_port", None)
    return data


class Member(BaseModel):
    """A worker of a replica group (spec.nodes > 1): the machine it runs on, what it takes there and the port its
    engine's distributed runtime listens on (rank 1.. in order; the head is the Placement itself)."""

    model_config = ConfigDict(frozen=True)

    host: str
    gpus: tuple[Gpu, ...] = ()
    port: int
    threads: int | None = None
    cpu_cores: int = 0
    memory_bytes: int = 0


class Placement(BaseModel):
    model_config = ConfigDict(frozen=True)

    index: int
    host: str
    gpus: tuple[Gpu, ...] = ()
    port: int
    threads: int | None = None
    cpu_cores: int = 0
    """Cores and host memory this replica takes on its host (what later placements count as taken)."""
    memory_bytes: int = 0
    group_port: int | None = None
    """A replica group's head: its runtime port (the rendezvous port, where its runtime has one), beside `port`."""
    members: tuple[Member, ...] = ()
    """A replica group's workers (spec.nodes > 1), rank 1 first; empty for a replica on one machine."""

    @property
    def hosts(self) -> tuple[str, ...]:
        """Every machine the replica runs on, the head's first."""
        return (self.host, *(m.host for m in self.members))

    @model_serializer(mode="wrap")
    def _without_group(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return without_empty_group(handler(self))


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
    allow_from: tuple[str, ...] = ()
    """The gateway hosts' addresses: with any, the unit accepts only them and loopback (IPAddressAllow=)."""
    api_key_file: str | None = None
    """Where the unit provides the gateway's internal key (a credential), when the inventory has a gateway."""
    api_key_env_file: str | None = None
    """The root-only EnvironmentFile= that sets the engine's key variable (an engine with no key-file flag)."""
    port: int
    gpus: tuple[Gpu, ...] = ()
    plan: FitPlan
    threads: int | None = None
    engine_args: tuple[str, ...] = ()
    gpu_memory_bytes: int | None = None
    engine_options: dict[str, OptionValue] = {}
    """engine_config keys only this engine reads (the deployment's engine_options)."""
    chat_template_file: str | None = None
    """Where the unit provides the model's Jinja chat template as a file (a systemd credential), if it has one."""
    cache_dir: str | None = None
    """The replica's engine cache directory on the host (the inventory's cache_dir / the deployment)."""
    lineage: str | None = None
    """The lineage of the state the unit belongs to, written into its header; None renders a unit as engine-ctl
    wrote it before it recorded lineages."""
    deployment_id: str | None = None
    """The deployment's stable ID, written into its header (`engine-ctl import` keeps it from there); None renders
    a unit as engine-ctl wrote it before it recorded IDs there."""
    startup_budget_s: int | None = None
    """The deployment's own start-up budget (the flat form's timeouts.startup); None: the engine's."""
    residency: str = "restart_only"
    """How a park treats it (the deployment's residency): an engine with sleep controls is launched with them on."""
    guard_address: str | None = None
    """With sleep controls on: the host's address its guard listens on (the engine then listens on loopback only;
    engine_ctl.core.render.guard). None: no guard, the engine listens on bind_address itself."""
