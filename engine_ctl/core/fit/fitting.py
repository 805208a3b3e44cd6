"""Fit and placement: what one replica needs and where replicas can run. Pure functions over values.

The rules are seed 000's ("Memory per replica", defaults of gpus, cpu_cores, context_length and parallel)
and seed 001's ("GPUs per replica", "GPU vendors"). Engine-specific arithmetic is asked of the provider.

One unit throughout: every comparison is in bytes. GB figures exist only in messages (and in the seed's
min_gpu_memory_gb field, for people), formatted so that a need and a size never read as equal when one
does not fit the other.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict

from engine_ctl.core.documents.rules import resolve_engine
from engine_ctl.core.fit.hostfacts import BUSY_BYTES, Gpu, HostFacts
from engine_ctl.core.fit.modelfacts import ModelFacts, estimate_weights_bytes
from engine_ctl.core.fit.runspec import FitPlan, MemoryBasis, Placement
from engine_ctl.core.model import Deployment, Model
from engine_ctl.core.sizes import GIB
from engine_ctl.providers import Provider

GPU_CHOICES = (1, 2, 4, 8)
BASE_PORT = 8000
GB = 1000**3


class FitResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    plan: FitPlan | None = None
    placements: tuple[Placement, ...] = ()
    waiting: dict[str, str] = {}
    """host -> why a replica cannot be placed there (seed's words)."""
    pending_reason: str | None = None
    failed_reason: str | None = None


class FitUnknown(BaseModel):
    """The fit cannot be computed yet (the weights are on no host and nothing else gives their shape): the
    deployment is Pending for this reason. Never a guess that could under-estimate."""

    model_config = ConfigDict(frozen=True)

    reason: str


@dataclass
class Taken:
    """What is already given away on each host, as placement counts it: replicas recorded in the state (which
    run, or will run again) and replicas placed earlier in the same plan. `ours` are the GPUs engine-ctl's own
    replicas hold, whose memory in use is not another process's."""

    gpus: set[str] = field(default_factory=set)
    ours: set[str] = field(default_factory=set)
    ports: dict[str, set[int]] = field(default_factory=dict)
    cores: dict[str, int] = field(default_factory=dict)
    memory: dict[str, int] = field(default_factory=dict)
    """Host memory (bytes) given to every replica counted here, against the host's total."""
    placed_memory: dict[str, int] = field(default_factory=dict)
    """Host memory (bytes) given to replicas placed by this plan: not yet gone from the host's available memory."""

    def hold(
        self, host: str, *, port: int | None = None, gpus: Iterable[str] = (), cores: int = 0, memory: int = 0,
        placed: bool = False,
    ) -> None:  # fmt: skip
        if port is not None:
            self.ports.setdefault(host, set()).add(port)
        self.gpus.update(gpus)
        self.cores[host] = self.cores.get(host, 0) + cores
        self.memory[host] = self.memory.get(host, 0) + memory
        if placed:
            self.placed_memory[host] = self.placed_memory.get(host, 0) + memory

    def free(
        self, host: str, *, port: int | None = None, gpus: Iterable[str] = (), cores: int = 0, memory: int = 0
    ) -> None:
        """Give back what a replica that goes away held (its memory counts as available only once it stopped)."""
        if port is not None:
            self.ports.get(host, set()).discard(port)
        self.gpus.difference_update(gpus)
        self.cores[host] = max(self.cores.get(host, 0) - cores, 0)
        self.memory[host] = max(self.memory.get(host, 0) - memory, 0)

    def take(self, p: Placement) -> None:
        self.hold(p.host, port=p.port, gpus=[g.uuid for g in p.gpus], cores=p.cpu_cores, memory=p.memory_bytes,
                  placed=True)  # fmt: skip

    def copy(self) -> Taken:
        return Taken(
            gpus=set(self.gpus), ours=set(self.ours), ports={h: set(p) for h, p in self.ports.items()},
            cores=dict(self.cores), memory=dict(self.memory), placed_memory=dict(self.placed_memory),
        )  # fmt: skip

    def free_cores(self, host: HostFacts) -> int:
        return host.cpu.cores - self.cores.get(host.host, 0)

    def free_memory(self, host: HostFacts) -> int:
        """Memory really free for one more replica: the host's total less what every counted replica takes, and
        its available memory now less what this plan has placed there."""
        by_total = host.memory.total_bytes - self.memory.get(host.host, 0)
        by_available = host.memory.available_bytes - self.placed_memory.get(host.host, 0)
        return min(by_total, by_available)


# --- formatting (messages only) ---------------------------------------------------------------------------


def gb_up(n_bytes: int) -> str:
    """A need, in GB rounded up to 0.1: never shows less than is needed."""
    return f"{math.ceil(n_bytes / GB * 10) / 10:g} GB"


def gb_down(n_bytes: int) -> str:
    """A size, in GB rounded down to 0.1: never shows more than there is."""
    return f"{math.floor(n_bytes / GB * 10) / 10:g} GB"


def gib_up(n_bytes: int) -> str:
    return f"{math.ceil(n_bytes / GIB * 10) / 10:.1f} GiB"


def gib_down(n_bytes: int) -> str:
    return f"{math.floor(max(n_bytes, 0) / GIB * 10) / 10:.1f} GiB"


# --- what the model is ------------------------------------------------------------------------------------


def kv_bytes_per_token(facts: ModelFacts, type_k: str, type_v: str, provider: Provider) -> int:
    """K and V bytes for one token across all layers: KV heads × head dims × bytes per element."""
    if not facts.has_shape:
        return 0
    k_dim, v_dim = facts.head_dims or (0, 0)
    kv_heads = facts.head_count_kv or 0
    layers = facts.block_count or 0
    per_layer = kv_heads * (k_dim * provider.cache_type_bytes(type_k) + v_dim * provider.cache_type_bytes(type_v))
    return math.ceil(layers * per_layer)


def model_shape(model: Model, facts: ModelFacts | None) -> ModelFacts | None:
    """The shape the KV cache is sized from: the weights' own metadata once a host has them, else the Model
    document's spec.architecture; None when neither gives it (the fit is not known yet)."""
    if facts is not None and facts.has_shape:
        return facts
    return declared_shape(model)


def declared_shape(model: Model) -> ModelFacts | None:
    """spec.architecture as the shape the files would give (block_count, head counts, head sizes)."""
    arch = model.architecture
    if arch is None or arch.head_size is None:
        return None
    return ModelFacts(
        block_count=arch.layers, head_count=arch.heads, head_count_kv=arch.kv_heads,
        embedding_length=arch.embedding_length, key_length=arch.head_size, value_length=arch.head_size,
        context_length=model.context_length, parameters=model.parameters, weights_bytes=model.weights_bytes,
    )  # fmt: skip


def shape_disagreement(model: Model, facts: ModelFacts | None) -> str | None:
    """A warning when the weights' metadata and spec.architecture give different shapes (the weights win)."""
    declared = declared_shape(model)
    if declared is None or facts is None or not facts.has_shape:
        return None
    files = (facts.block_count, facts.head_count_kv, facts.head_dims)
    stated = (declared.block_count, declared.head_count_kv, declared.head_dims)
    if files == stated:
        return None

    def shape(layers: int | None, kv: int | None, dims: tuple[int, int] | None) -> str:
        k, v = dims or (0, 0)
        return f"{layers} layers, {kv} KV heads, head size {k if k == v else f'{k}/{v}'}"

    return (
        f"model {model.name}: its weights give {shape(*files)}, spec.architecture says {shape(*stated)}; "
        "the KV cache is sized from the weights"
    )


def weights_and_basis(model: Model, facts: ModelFacts | None) -> tuple[int, MemoryBasis]:
    if facts is not None and facts.weights_bytes:
        return facts.weights_bytes, ("arch" if facts.has_shape else "weights")
    if declared_shape(model) is not None:  # the KV cache is sized from spec.architecture
        weights, _ = _weights_without_files(model, facts)
        return weights, "arch"
    return _weights_without_files(model, facts)


def _weights_without_files(model: Model, facts: ModelFacts | None) -> tuple[int, MemoryBasis]:
    if model.weights_bytes:
        return model.weights_bytes, "catalog"
    params = model.parameters or (facts.parameters if facts else None)
    if params:
        quant = facts.file_type if facts else None
        return estimate_weights_bytes(params, model.format, quant, facts.dtype if facts else None), "estimate"
    return 0, "estimate"


def context_maximum(model: Model, facts: ModelFacts | None) -> int | None:
    """The model's longest context: the Model document's, the weights' own metadata's, the lower of both."""
    known = [n for n in (model.context_length, facts.context_length if facts else None) if n]
    return min(known) if known else None


def default_context(d: Deployment, model: Model, facts: ModelFacts | None, provider: Provider) -> int:
    if d.context_length is not None:
        return d.context_length
    own = context_maximum(model, facts) or provider.default_context_cap
    return min(own, provider.default_context_cap)


def context_refusal(
    d: Deployment, model: Model, facts: ModelFacts | None, field_name: str = "spec.context_length"
) -> str | None:
    """Seed 000's rule "context_length ≤ the model's", wherever the model's maximum comes from."""
    most = context_maximum(model, facts)
    if d.context_length is not None and most is not None and d.context_length > most:
        return f"{field_name} {d.context_length}: model {model.name} takes at most {most} tokens"
    return None


def unknown_reason(model: Model, facts: ModelFacts | None, what: str, names: Callable[[str], str] | None) -> FitUnknown:
    if facts is None:
        where = f"the weights of {model.name} are on no reachable host yet"
    else:
        where = f"the files of {model.name} do not give them"
    todo = "put the weights on a host"
    stated = [names(f) for f in ("gpu_memory_bytes", "ram_bytes")] if names else []
    if stated and not any(f.startswith("spec.") for f in stated):  # a form that can state memory (flat)
        todo += f", or state the memory a replica takes ({' and '.join(stated)})"
    return FitUnknown(reason=f"the fit is not known yet: {where}, so its {what} cannot be sized ({todo})")


def cpu_cores_by_size(parameters: int | None, largest_cores: int) -> int:
    """CPU only: 2 up to 2B parameters, 4 up to 9B, 6 above, at most the largest machine's cores."""
    p = parameters or 0
    cores = 2 if p <= 2_000_000_000 else 4 if p <= 9_000_000_000 else 6
    return max(1, min(cores, largest_cores)) if largest_cores else cores


# --- which GPUs a deployment may use ----------------------------------------------------------------------


def pins(gpu: Gpu, devices: Sequence[str]) -> bool:
    """Whether `gpu` is one of the pinned devices: gpuN (its index) or its UUID."""
    return any(d == gpu.uuid or d == f"gpu{gpu.index}" for d in devices)


def compatible_gpus(host: HostFacts, provider: Provider, vendor: str, devices: Sequence[str] = ()) -> list[Gpu]:
    """The GPUs of `host` a replica may take: its engine has a build for them, the vendor and the pins allow."""
    return [
        g for g in host.gpus
        if provider.gpu_refusal(g) is None and vendor in ("any", g.vendor) and (not devices or pins(g, devices))
    ]  # fmt: skip


def sizing_hosts(d: Deployment, hosts: Sequence[HostFacts]) -> list[HostFacts]:
    """The machines the deployment may use: spec.host (flat host:) narrows them to one."""
    return [h for h in hosts if d.host in (None, h.host)]


def largest_gpu_host(
    hosts: Sequence[HostFacts], provider: Provider, vendor: str, devices: Sequence[str] = ()
) -> HostFacts | None:
    best: tuple[int, int] | None = None
    chosen = None
    for h in hosts:
        gpus = compatible_gpus(h, provider, vendor, devices)
        if not gpus:
            continue
        sizes = [g.memory_total_bytes or 0 for g in gpus]
        key = (min(sizes) if devices else max(sizes), len(gpus))  # pinned: the smallest of them must hold it
        if best is None or key > best:
            best, chosen = key, h
    return chosen


def devices_refusal(d: Deployment) -> str | None:
    """devices: [{id: gpu1}] pins GPUs of one machine: as many as a replica takes, each once."""
    if not d.devices:
        return None
    if d.accelerator == "cpu":
        return "devices: a CPU-only deployment has no GPUs to pin"
    twice = sorted({x for x in d.devices if d.devices.count(x) > 1})
    if twice:
        return f"devices: {', '.join(twice)} listed more than once"
    n = len(d.devices)
    if d.gpus is not None and d.gpus != n:
        return f"devices: {n} GPU{'s' if n > 1 else ''} pinned, but gpus is {d.gpus}; pin as many as a replica takes"
    if n not in GPU_CHOICES:
        return f"devices: {n} GPUs pinned; a replica takes 1, 2, 4 or 8 GPUs of one machine"
    return None


# --- the fit ----------------------------------------------------------------------------------------------


def fit(
    d: Deployment,
    model: Model,
    facts: ModelFacts | None,
    hosts: Sequence[HostFacts],
    names: Callable[[str], str] | None = None,
) -> FitPlan | FitUnknown | str:
    """The plan object for one replica; FitUnknown when it cannot be sized yet (Pending); or why the
    specification cannot be served as asked (Failed). Memory the deployment states itself (flat form:
    resources.ram, resources.gpu or engine_config.memory.request) replaces the estimate. `names` gives a field's
    name in the deployment's own document form (rules.field_name), for the messages."""
    context_field = names("context_length") if names else "spec.context_length"
    refusal = context_refusal(d, model, facts, context_field) or devices_refusal(d)
    if refusal:
        return refusal
    provider = resolve_engine(d, model)
    assert provider is not None
    weights, basis = weights_and_basis(model, facts)
    if not weights and not (d.ram_bytes and (d.accelerator == "cpu" or d.gpu_memory_bytes)):
        return unknown_reason(model, facts, "weights", names)
    shape = model_shape(model, facts)
    stated = d.ram_bytes if d.accelerator == "cpu" else d.gpu_memory_bytes
    if shape is None and not stated:
        return unknown_reason(model, facts, "KV cache (layers, KV heads and head size)", names)
    usable = sizing_hosts(d, hosts)
    result: FitPlan | FitUnknown | str
    if d.accelerator == "cpu":
        result = _fit_cpu(d, model, facts, shape, usable, provider, weights, basis)
    else:
        result = _fit_gpu(d, model, facts, shape, usable, provider, weights, basis)
    if not isinstance(result, FitPlan):
        return result
    if d.ram_bytes:
        result = result.model_copy(update={"memory_bytes": d.ram_bytes})
    if d.ram_bytes or d.gpu_memory_bytes:
        result = result.model_copy(
            update={"memory_basis": "catalog" if result.memory_basis == "estimate" else result.memory_basis}
        )
    return result


def _kv_per_token(d: Deployment, shape: ModelFacts | None, provider: Provider) -> int | None:
    if shape is None:
        return None
    type_k, type_v = provider.kv_cache_types(d.engine_args)
    return kv_bytes_per_token(shape, type_k, type_v, provider)


def _fit_cpu(
    d: Deployment, model: Model, facts: ModelFacts | None, shape: ModelFacts | None, hosts: Sequence[HostFacts],
    provider: Provider, weights: int, basis: MemoryBasis,
) -> FitPlan:  # fmt: skip
    context = default_context(d, model, facts, provider)
    parallel = d.parallel or provider.parallel_candidates("cpu")[0]
    per_token = _kv_per_token(d, shape, provider)
    if per_token is None:  # the stated memory (resources.ram) holds it: what is left after the weights
        kv = max((d.ram_bytes or 0) - weights, 0)
    else:
        kv = per_token * provider.cache_tokens(context, parallel)
    estimate = weights + kv + provider.compute_bytes(weights, 0)
    largest_cores = max((h.cpu.cores for h in hosts), default=0)
    cores = d.cpu_cores or cpu_cores_by_size(model.parameters or (facts.parameters if facts else None), largest_cores)
    threads = min(2 * cores, largest_cores) if largest_cores else 2 * cores
    return FitPlan(
        engine=provider.name, gpu_vendor="any", accelerator="cpu", kind=_kind(model), gpus=0, min_gpu_memory_gb=0,
        memory_basis=basis, cpu_cores=cores, threads=threads,
        memory_bytes=provider.host_memory_bytes(weights, estimate, 0, "cpu"), context_length=context,
        parallel=parallel, weights_bytes=weights, kv_cache_bytes=kv, capabilities=model.capabilities,
    )  # fmt: skip


def _kind(model: Model) -> Literal["chat", "embedding"]:
    return "embedding" if model.is_embedding else "chat"


def _fit_gpu(
    d: Deployment, model: Model, facts: ModelFacts | None, shape: ModelFacts | None, hosts: Sequence[HostFacts],
    provider: Provider, weights: int, basis: MemoryBasis,
) -> FitPlan | FitUnknown | str:  # fmt: skip
    context = default_context(d, model, facts, provider)
    per_token = _kv_per_token(d, shape, provider)
    biggest = largest_gpu_host(hosts, provider, d.gpu_vendor, d.devices)
    gpus_there = compatible_gpus(biggest, provider, d.gpu_vendor, d.devices) if biggest else []
    sizes = [g.memory_total_bytes or 0 for g in gpus_there]
    biggest_gpu = (min(sizes) if d.devices else max(sizes)) if sizes else 0
    fixed = d.gpus or (len(d.devices) if d.devices else None)
    if fixed is None and biggest is None:
        where = f"host {d.host} (not in the inventory or unreachable)" if d.host else "a machine"
        return FitUnknown(reason=f"Waiting for {where} with GPUs {provider.title} runs on, to choose gpus there")
    gpu_options = (fixed,) if fixed else tuple(n for n in GPU_CHOICES if n <= max(len(gpus_there), 1))
    parallel_options = (d.parallel,) if d.parallel else provider.parallel_candidates("gpu")
    heads = shape.head_count if shape else (facts.head_count if facts else None)
    chosen: tuple[int, int, int, int] | None = None
    smallest_need: tuple[int, int, int, int] | None = None
    for n in gpu_options:
        if provider.tp_must_divide_heads and heads and n > 1 and heads % n:
            continue
        for p in parallel_options:
            candidate = _candidate(d, provider, weights, per_token, context, n, p)
            if smallest_need is None or candidate[2] < smallest_need[2]:
                smallest_need = candidate
            if biggest is None or candidate[2] <= biggest_gpu:
                chosen = candidate
                break
        if chosen:
            break
    if chosen is None:
        if smallest_need is None:
            return f"does not fit: no count of 1, 2, 4 or 8 GPUs divides the {heads} attention heads of {model.name}"
        return (
            f"does not fit: {model.name} needs at least {gb_up(smallest_need[2])} on each of {smallest_need[0]} "
            f"GPU{'s' if smallest_need[0] > 1 else ''} (the largest GPU it may use has {gb_down(biggest_gpu)})"
        )
    n, p, per_gpu, kv = chosen
    estimate = weights + kv + provider.compute_bytes(weights, n)
    return FitPlan(
        engine=provider.name, gpu_vendor=d.gpu_vendor, accelerator="gpu", kind=_kind(model), gpus=n,
        min_gpu_memory_gb=math.ceil(per_gpu / GB), min_gpu_memory_bytes=per_gpu, memory_basis=basis,
        cpu_cores=d.cpu_cores or 4 * n, threads=None,
        memory_bytes=provider.host_memory_bytes(weights, estimate, n, "gpu"), context_length=context,
        parallel=p, weights_bytes=weights, kv_cache_bytes=kv, capabilities=model.capabilities, devices=d.devices,
    )  # fmt: skip


def _candidate(
    d: Deployment, provider: Provider, weights: int, per_token: int | None, context: int, n: int, p: int
) -> tuple[int, int, int, int]:
    """(gpus, parallel, bytes each GPU needs, KV cache bytes) for one choice. A stated memory request (split
    over the GPUs) is what each GPU needs; else the engine's rule from the weights and the KV cache."""
    if per_token is None:  # the stated request holds the KV cache: what is left after the weights
        assert d.gpu_memory_bytes
        return n, p, math.ceil(d.gpu_memory_bytes / n), max(d.gpu_memory_bytes - weights, 0)
    kv = per_token * provider.cache_tokens(context, p)
    if d.gpu_memory_bytes:
        return n, p, math.ceil(d.gpu_memory_bytes / n), kv
    return n, p, provider.gpu_bytes_per_gpu(weights, kv, n, per_token * context), kv


# --- placement --------------------------------------------------------------------------------------------


def free_port(used: set[int], start: int = BASE_PORT) -> int:
    port = start
    while port in used:
        port += 1
    return port


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' if n != 1 else ''}"


def cpu_verdict(host: HostFacts, plan: FitPlan, taken: Taken) -> str | None:
    """Why one more replica's cores or host memory are not free on `host` (seed's kind of reason), or None."""
    cores = taken.free_cores(host)
    if cores < plan.cpu_cores:
        return (
            f"Waiting for a machine with {_plural(plan.cpu_cores, 'free CPU core')} "
            f"({max(cores, 0)} of {host.cpu.cores} free here)"
        )
    memory = taken.free_memory(host)
    if memory < plan.memory_bytes:
        what = "free memory" if plan.accelerator == "cpu" else "free host memory"
        return f"Waiting for a machine with {gib_up(plan.memory_bytes)} of {what} ({gib_down(memory)} free here)"
    return None


def gpu_verdict(host: HostFacts, plan: FitPlan, provider: Provider, taken: Taken) -> tuple[list[Gpu] | None, str]:
    """The free GPUs of `host` a replica may take (all of them, in index order), or why there are none."""
    if not host.gpus:
        return None, "Waiting for a machine with a GPU (this one has none)"
    if plan.gpu_vendor != "any" and not any(g.vendor == plan.gpu_vendor for g in host.gpus):
        return None, f"Waiting for a machine with {plan.gpu_vendor} GPUs (this one has {host.gpus[0].vendor})"
    usable = compatible_gpus(host, provider, plan.gpu_vendor)
    if not usable:
        refusal = provider.gpu_refusal(host.gpus[0]) or f"{provider.name} does not run on these GPUs"
        return None, f"Waiting for a machine with GPUs {provider.title} runs on ({refusal})"
    if plan.devices:
        usable = [g for g in usable if pins(g, plan.devices)]
        if len(usable) < len(plan.devices):
            have = ", ".join(f"gpu{g.index}" for g in host.gpus)
            return None, f"Waiting for a machine with the pinned GPUs {', '.join(plan.devices)} (this one has {have})"
    need = plan.min_gpu_memory_bytes
    big_enough = [g for g in usable if (g.memory_total_bytes or 0) >= need]
    if not big_enough:
        largest = max((g.memory_total_bytes or 0) for g in usable)
        return None, (
            f"Waiting for a machine with a GPU with at least {gb_up(need)} (the largest here has {gb_down(largest)})"
        )
    free = [
        g for g in big_enough
        if g.uuid not in taken.gpus and ((g.memory_used_bytes or 0) <= BUSY_BYTES or g.uuid in taken.ours)
    ]  # fmt: skip
    if len(free) < plan.gpus:
        return None, (
            f"Waiting for a machine with {_plural(plan.gpus, 'free GPU')} with at least {gb_up(need)} "
            f"({len(free)} free here)"
        )
    return sorted(free, key=lambda g: g.index)[: plan.gpus], ""


def host_verdict(
    host: HostFacts, plan: FitPlan, provider: Provider, taken: Taken
) -> tuple[list[Gpu] | None, str | None]:
    """Which GPUs of `host` a replica would take, or why it cannot run there (seed's words)."""
    if plan.accelerator == "cpu":
        if not provider.runs_on("cpu"):
            return None, f"{provider.name} does not run on CPUs"
        reason = cpu_verdict(host, plan, taken)
        return (None, reason) if reason else ([], None)
    gpus, why = gpu_verdict(host, plan, provider, taken)
    if gpus is None:
        return None, why
    reason = cpu_verdict(host, plan, taken)
    return (None, reason) if reason else (gpus, None)


def place(
    d: Deployment,
    plan: FitPlan,
    provider: Provider,
    hosts: Sequence[HostFacts],
    count: int,
    taken: Taken | None = None,
    already: dict[str, int] | None = None,
    prefer: str | None = None,
    no_weights: Mapping[str, str] | None = None,
) -> FitResult:
    """Spread `count` replicas over hosts, GPUs whole, by UUID. `taken` (not changed) is what other replicas
    already hold; each replica placed here is counted too. `no_weights` maps a host to why the model's weights are
    not usable there (missing, not a valid file): no replica is placed there, and it waits for them.

    The order is deterministic (the same documents, state and facts give the same placement): see host_order."""
    held = taken.copy() if taken is not None else Taken()
    per_host: dict[str, int] = {h.host: (already or {}).get(h.host, 0) for h in hosts}
    candidates = [h for h in hosts if d.host in (None, h.host)]
    placements: list[Placement] = []
    waiting: dict[str, str] = {}
    if d.host is not None and not candidates:
        return FitResult(plan=plan, pending_reason=f"Waiting for host {d.host} (not in the inventory or unreachable)")
    for index in range(count):
        best: tuple[HostFacts, list[Gpu]] | None = None
        for h in host_order(candidates, per_host, held, prefer):
            if no_weights and h.host in no_weights:
                waiting[h.host] = no_weights[h.host]
                continue
            gpus, reason = host_verdict(h, plan, provider, held)
            if gpus is None:
                waiting[h.host] = reason or "cannot run here"
            elif best is None:
                best = (h, gpus)
        if best is None:
            reason = _furthest(waiting) if waiting else "Waiting for a machine (no host in the inventory)"
            return FitResult(plan=plan, placements=tuple(placements), waiting=waiting, pending_reason=reason)
        h, gpus = best
        waiting.pop(h.host, None)
        port = free_port(set(h.ports_in_use) | held.ports.get(h.host, set()))
        placement = Placement(
            index=index, host=h.host, gpus=tuple(gpus), port=port, threads=replica_threads(plan, h),
            cpu_cores=plan.cpu_cores, memory_bytes=plan.memory_bytes,
        )  # fmt: skip
        held.take(placement)
        per_host[h.host] += 1
        placements.append(placement)
    return FitResult(plan=plan, placements=tuple(placements), waiting=waiting)


def free_room(host: HostFacts, taken: Taken) -> tuple[int, int, int]:
    """A host's room as placement ranks it, from stable facts only: GPUs not given to a replica, CPU cores and host
    memory (of its total) not given to a replica. Never the memory available now or a GPU's memory in use, which
    change from one gathering of facts to the next (and so would move a placement between two plans)."""
    gpus = sum(1 for g in host.gpus if g.uuid not in taken.gpus)
    memory = host.memory.total_bytes - taken.memory.get(host.host, 0)
    return gpus, taken.free_cores(host), memory


def host_order(
    hosts: Sequence[HostFacts], per_host: Mapping[str, int], taken: Taken, prefer: str | None = None
) -> list[HostFacts]:
    """The order hosts are tried for one replica: fewest replicas of this deployment first; then `prefer` (the
    host of the replica a surge replaces); then the most free room (free_room: GPUs, then cores, then memory);
    then inventory order. The first host where the replica fits is chosen."""
    position = {h.host: i for i, h in enumerate(hosts)}

    def key(h: HostFacts) -> tuple[int, bool, tuple[int, int, int], int]:
        gpus, cores, memory = free_room(h, taken)
        return per_host.get(h.host, 0), h.host != prefer, (-gpus, -cores, -memory), position[h.host]

    return sorted(hosts, key=key)


def replica_threads(plan: FitPlan, host: HostFacts) -> int | None:
    """A CPU replica's threads (its provider passes them to the engine): twice its cores, at most the machine's."""
    return min(2 * plan.cpu_cores, host.cpu.cores) if plan.accelerator == "cpu" else None


def _furthest(waiting: dict[str, str]) -> str:
    """The reason to show for the deployment: the one most hosts share."""
    counts: dict[str, int] = {}
    for reason in waiting.values():
        counts[reason] = counts.get(reason, 0) + 1
    return max(counts, key=lambda r: counts[r])
