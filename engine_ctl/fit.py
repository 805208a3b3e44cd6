"""Fit and placement: what one replica needs and where replicas can run. Pure functions over values.

The rules are seed 000's ("Memory per replica", defaults of gpus, cpu_cores, context_length and parallel)
and seed 001's ("GPUs per replica", "GPU vendors"). Engine-specific arithmetic is asked of the provider.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict

from engine_ctl.facts import BUSY_BYTES, Gpu, HostFacts
from engine_ctl.model import Deployment, Model
from engine_ctl.modelfacts import ModelFacts, estimate_weights_bytes
from engine_ctl.providers import Provider
from engine_ctl.rules import resolve_engine
from engine_ctl.runspec import FitPlan, MemoryBasis, Placement
from engine_ctl.units import GIB

GPU_CHOICES = (1, 2, 4, 8)
BASE_PORT = 8000


class FitResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    plan: FitPlan | None = None
    placements: tuple[Placement, ...] = ()
    waiting: dict[str, str] = {}
    """host -> why a replica cannot be placed there (seed's words)."""
    pending_reason: str | None = None
    failed_reason: str | None = None


def kv_bytes_per_token(facts: ModelFacts, type_k: str, type_v: str, provider: Provider) -> int:
    """K and V bytes for one token across all layers: KV heads × head dims × bytes per element."""
    if not facts.has_shape:
        return 0
    k_dim, v_dim = facts.head_dims or (0, 0)
    kv_heads = facts.head_count_kv or 0
    layers = facts.block_count or 0
    per_layer = kv_heads * (k_dim * provider.cache_type_bytes(type_k) + v_dim * provider.cache_type_bytes(type_v))
    return math.ceil(layers * per_layer)


def weights_and_basis(model: Model, facts: ModelFacts | None) -> tuple[int, MemoryBasis]:
    if facts is not None and facts.weights_bytes:
        return facts.weights_bytes, ("arch" if facts.has_shape else "weights")
    if model.weights_bytes:
        return model.weights_bytes, "catalog"
    params = model.parameters or (facts.parameters if facts else None)
    if params:
        quant = facts.file_type if facts else None
        return estimate_weights_bytes(params, model.format, quant, facts.dtype if facts else None), "estimate"
    return 0, "estimate"


def default_context(d: Deployment, model: Model, facts: ModelFacts | None, provider: Provider) -> int:
    if d.context_length is not None:
        return d.context_length
    own = model.context_length or (facts.context_length if facts else None) or provider.default_context_cap
    return min(own, provider.default_context_cap)


def cpu_cores_by_size(parameters: int | None, largest_cores: int) -> int:
    """CPU only: 2 up to 2B parameters, 4 up to 9B, 6 above, at most the largest machine's cores."""
    p = parameters or 0
    cores = 2 if p <= 2_000_000_000 else 4 if p <= 9_000_000_000 else 6
    return max(1, min(cores, largest_cores)) if largest_cores else cores


def compatible_gpus(host: HostFacts, provider: Provider, vendor: str) -> list[Gpu]:
    return [g for g in host.gpus if provider.runs_on(g.vendor) and vendor in ("any", g.vendor)]


def largest_gpu_host(hosts: Sequence[HostFacts], provider: Provider, vendor: str) -> HostFacts | None:
    best: tuple[int, int] | None = None
    chosen = None
    for h in hosts:
        gpus = compatible_gpus(h, provider, vendor)
        if not gpus:
            continue
        key = (max(g.memory_total_bytes or 0 for g in gpus), len(gpus))
        if best is None or key > best:
            best, chosen = key, h
    return chosen


def fit(
    d: Deployment,
    model: Model,
    facts: ModelFacts | None,
    hosts: Sequence[HostFacts],
) -> FitPlan | str:
    """The plan object for one replica, or why the specification does not fit (Failed). Memory the deployment
    states itself (flat form: resources.ram, resources.gpu or engine_config.memory.request) replaces the
    estimate."""
    result = _fit(d, model, facts, hosts)
    if isinstance(result, str):
        return result
    update: dict[str, object] = {}
    if d.ram_bytes:
        update["memory_bytes"] = d.ram_bytes
    if d.gpu_memory_bytes and result.gpus:
        update["min_gpu_memory_gb"] = math.ceil(d.gpu_memory_bytes / result.gpus / 1000**3)
    if update:
        update["memory_basis"] = "catalog" if result.memory_basis == "estimate" else result.memory_basis
    return result.model_copy(update=update) if update else result


def _fit(
    d: Deployment,
    model: Model,
    facts: ModelFacts | None,
    hosts: Sequence[HostFacts],
) -> FitPlan | str:
    provider = resolve_engine(d, model)
    assert provider is not None
    weights, basis = weights_and_basis(model, facts)
    context = default_context(d, model, facts, provider)
    type_k, type_v = provider.kv_cache_types(d.engine_args)
    per_token = kv_bytes_per_token(facts, type_k, type_v, provider) if facts else 0
    kind: Literal["chat", "embedding"] = "embedding" if model.is_embedding else "chat"
    largest_cores = max((h.cpu.cores for h in hosts), default=0)
    if d.accelerator == "cpu":
        parallel = d.parallel or provider.parallel_candidates("cpu")[0]
        kv = per_token * provider.cache_tokens(context, parallel)
        estimate = weights + kv + provider.compute_bytes(weights, 0)
        cores = d.cpu_cores or cpu_cores_by_size(
            model.parameters or (facts.parameters if facts else None), largest_cores
        )
        threads = min(2 * cores, largest_cores) if largest_cores else 2 * cores
        return FitPlan(
            engine=provider.name, gpu_vendor="any", accelerator="cpu", kind=kind, gpus=0, min_gpu_memory_gb=0,
            memory_basis=basis, cpu_cores=cores, threads=threads,
            memory_bytes=provider.host_memory_bytes(weights, estimate, 0, "cpu"), context_length=context,
            parallel=parallel, weights_bytes=weights, kv_cache_bytes=kv, capabilities=model.capabilities,
        )  # fmt: skip
    biggest = largest_gpu_host(hosts, provider, d.gpu_vendor)
    biggest_gpu = (
        max((g.memory_total_bytes or 0 for g in compatible_gpus(biggest, provider, d.gpu_vendor)), default=0)
        if biggest
        else 0
    )
    max_gpus = len(compatible_gpus(biggest, provider, d.gpu_vendor)) if biggest else 8
    gpu_options = (d.gpus,) if d.gpus else tuple(n for n in GPU_CHOICES if n <= max(max_gpus, 1))
    parallel_options = (d.parallel,) if d.parallel else provider.parallel_candidates("gpu")
    heads = facts.head_count if facts else None
    chosen: tuple[int, int, int, int] | None = None
    smallest_need: tuple[int, int, int, int] | None = None
    for n in gpu_options:
        if provider.tp_must_divide_heads and heads and n > 1 and heads % n:
            continue
        for p in parallel_options:
            kv = per_token * provider.cache_tokens(context, p)
            per_gpu = provider.gpu_bytes_per_gpu(weights, kv, n, per_token * context)
            candidate = (n, p, per_gpu, kv)
            if smallest_need is None or per_gpu < smallest_need[2]:
                smallest_need = candidate
            if biggest is None or per_gpu <= biggest_gpu:
                chosen = candidate
                break
        if chosen:
            break
    if chosen is None:
        assert smallest_need is not None
        need_gb = math.ceil(smallest_need[2] / 1000**3)
        return (
            f"does not fit: {model.name} needs at least {need_gb} GB on each of {smallest_need[0]} GPUs "
            f"(the largest GPU in the inventory has {biggest_gpu / 1000**3:.0f} GB)"
        )
    n, p, per_gpu, kv = chosen
    estimate = weights + kv + provider.compute_bytes(weights, n)
    return FitPlan(
        engine=provider.name, gpu_vendor=d.gpu_vendor, accelerator="gpu", kind=kind, gpus=n,
        min_gpu_memory_gb=math.ceil(per_gpu / 1000**3), memory_basis=basis, cpu_cores=d.cpu_cores or 4 * n,
        threads=None, memory_bytes=provider.host_memory_bytes(weights, estimate, n, "gpu"), context_length=context,
        parallel=p, weights_bytes=weights, kv_cache_bytes=kv, capabilities=model.capabilities,
    )  # fmt: skip


def free_port(used: set[int], start: int = BASE_PORT) -> int:
    port = start
    while port in used:
        port += 1
    return port


def host_verdict(
    host: HostFacts,
    plan: FitPlan,
    provider: Provider,
    taken_gpus: set[str],
    committed_memory: int,
    held_by_us: set[str] | None = None,
) -> tuple[list[Gpu] | None, str | None]:
    """Which GPUs of `host` a replica would take, or why it cannot run there (seed's words)."""
    if plan.accelerator == "cpu":
        if not provider.runs_on("cpu"):
            return None, f"{provider.name} does not run on CPUs"
        free_bytes = host.memory.available_bytes - committed_memory
        if free_bytes < plan.memory_bytes:
            return None, (
                f"Waiting for a machine with {plan.memory_bytes / GIB:.1f} GiB of free memory "
                f"({max(free_bytes, 0) / GIB:.1f} GiB free)"
            )
        return [], None
    if not host.gpus:
        return None, "Waiting for a machine with a GPU (this one has none)"
    usable = compatible_gpus(host, provider, plan.gpu_vendor)
    if not usable:
        vendor = host.gpus[0].vendor
        if plan.gpu_vendor not in ("any", vendor):
            return None, f"Waiting for a machine with {plan.gpu_vendor} GPUs (this one has {vendor})"
        return None, f"{provider.name} does not run on {vendor} GPUs here"
    need = plan.min_gpu_memory_gb * 1000**3
    big_enough = [g for g in usable if (g.memory_total_bytes or 0) >= need]
    if not big_enough:
        return None, f"Waiting for a machine with a GPU with at least {plan.min_gpu_memory_gb} GB"
    free = [
        g for g in big_enough
        if g.uuid not in taken_gpus and ((g.memory_used_bytes or 0) <= BUSY_BYTES or g.uuid in (held_by_us or ()))
    ]  # fmt: skip
    if len(free) < plan.gpus:
        return None, (
            f"Waiting for a machine with {plan.gpus} free GPU{'s' if plan.gpus > 1 else ''} with at least "
            f"{plan.min_gpu_memory_gb} GB ({len(free)} free here)"
        )
    if host.memory.available_bytes - committed_memory < plan.memory_bytes:
        return None, f"Waiting for a machine with {plan.memory_bytes / GIB:.1f} GiB of free host memory"
    return sorted(free, key=lambda g: g.index)[: plan.gpus], None


def place(
    d: Deployment,
    plan: FitPlan,
    provider: Provider,
    hosts: Sequence[HostFacts],
    count: int,
    reserved_ports: dict[str, set[int]] | None = None,
    taken_gpus: set[str] | None = None,
    ours: set[str] | None = None,
    already: dict[str, int] | None = None,
    prefer: str | None = None,
) -> FitResult:
    """Spread `count` replicas over hosts: fewest replicas of this deployment first, GPUs whole, by UUID."""
    taken = set(taken_gpus or ())
    ports = {h.host: set(h.ports_in_use) | set((reserved_ports or {}).get(h.host, ())) for h in hosts}
    memory: dict[str, int] = {h.host: 0 for h in hosts}
    per_host: dict[str, int] = {h.host: (already or {}).get(h.host, 0) for h in hosts}
    candidates = [h for h in hosts if d.host in (None, h.host)]
    placements: list[Placement] = []
    waiting: dict[str, str] = {}
    if d.host is not None and not candidates:
        return FitResult(plan=plan, pending_reason=f"Waiting for host {d.host} (not in the inventory or unreachable)")
    for index in range(count):
        best: tuple[HostFacts, list[Gpu]] | None = None
        for h in sorted(candidates, key=lambda x: (per_host[x.host], x.host != prefer, -x.memory.available_bytes)):
            gpus, reason = host_verdict(h, plan, provider, taken, memory[h.host], held_by_us=ours or set())
            if gpus is None:
                waiting[h.host] = reason or "cannot run here"
            elif best is None:
                best = (h, gpus)
        if best is None:
            reason = _furthest(waiting) if waiting else "Waiting for a machine (no host in the inventory)"
            return FitResult(plan=plan, placements=tuple(placements), waiting=waiting, pending_reason=reason)
        h, gpus = best
        port = free_port(ports[h.host])
        ports[h.host].add(port)
        memory[h.host] += plan.memory_bytes
        per_host[h.host] += 1
        taken.update(g.uuid for g in gpus)
        threads = replica_threads(plan, h)
        placements.append(Placement(index=index, host=h.host, gpus=tuple(gpus), port=port, threads=threads))
    return FitResult(plan=plan, placements=tuple(placements), waiting=waiting)


def replica_threads(plan: FitPlan, host: HostFacts) -> int | None:
    """llama.cpp on a CPU: --threads at twice the replica's cores, at most the machine's."""
    return min(2 * plan.cpu_cores, host.cpu.cores) if plan.accelerator == "cpu" else None


def _furthest(waiting: dict[str, str]) -> str:
    """The reason to show for the deployment: the one most hosts share."""
    counts: dict[str, int] = {}
    for reason in waiting.values():
        counts[reason] = counts.get(reason, 0) + 1
    return max(counts, key=lambda r: counts[r])
