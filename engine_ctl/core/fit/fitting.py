"""Fit and placement: what one replica needs and where replicas can run. Pure functions over values.

The rules are seed 000's ("Memory per replica", defaults of gpus, cpu_cores, context_length and parallel)
and seed 001's ("GPUs per replica", "GPU vendors"). Engine-specific arithmetic is asked of the provider.

A replica group (spec.nodes: N > 1, issue 30) is one replica whose layers (and their KV cache) are spread by the
engine's own runtime over the machines that hold layers: how many is the provider's (provider.layer_machines:
every machine, or the workers alone where the head's CPU is no offload device), and so is the tensor-parallel
size the attention heads must divide by (provider.tensor_parallel_size: one machine's GPUs, or the whole group's).

- GPUs: `gpus` is each machine's count (1, 2, 4 or 8, the fewest that hold it, as for one machine), and the
  per-GPU need is the engine's own rule (provider.gpu_bytes_per_gpu) over all the group's GPUs, gpus x the
  machines holding layers. That rule's fixed part (CUDA context, compute buffer, the engine's 1 GiB and its
  memory fraction) is a per-GPU cost, so it is counted whole on every GPU, never divided.
- Host memory: seed 000's "Memory per replica" rule (provider.host_memory_bytes) is applied per machine, to
  that machine's share of the weights (and, on CPUs, of the memory estimate): a machine runs its own engine
  process, so each keeps the rule's fixed part (each engine's, for that machine's GPUs) and seed 000's floor of
  2 GiB. The head takes the same share as a worker (placement gives every member one plan): more than a CPU
  head needs, never less.
- The flat form's margin (seed 003) would be split like the weights; the flat form refuses nodes anyway.

FitPlan then says what each machine takes (gpus, cpu_cores, memory_bytes; min_gpu_memory_bytes for each GPU)
and what the replica holds in all (weights_bytes, kv_cache_bytes). A replica on one machine (N = 1) is sized
exactly as before groups existed.

One unit throughout: every comparison is in bytes. GB figures exist only in messages (and in the seed's
min_gpu_memory_gb field, for people), formatted so that a need and a size never read as equal when one
does not fit the other.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict

from engine_ctl.core.documents.rules import resolve_engine
from engine_ctl.core.fit.hostfacts import Gpu, HostFacts, unified_memory
from engine_ctl.core.fit.modelfacts import ModelFacts, estimate_weights_bytes
from engine_ctl.core.fit.runspec import FitPlan, MemoryBasis, Placement
from engine_ctl.core.model import Deployment, Model
from engine_ctl.core.sizes import GB, GIB, gb_down, gb_up
from engine_ctl.providers import Provider

GPU_CHOICES = (1, 2, 4, 8)


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


def sizing_hosts(d: Deployment, hosts: Sequence[HostFacts]) -> Sequence[HostFacts]:
    """The machines the deployment may use: spec.host (flat host:) narrows them to one (else `hosts` itself, not
    a copy: a plan's memo knows them by identity)."""
    return hosts if d.host is None else [h for h in hosts if h.host == d.host]


class Fleet(Protocol):
    """What the fit asks of all the hosts at once. A plan answers from a memo (it plans many deployments over the
    same hosts): each answer is the same as these functions give."""

    def largest_gpu_host(
        self, hosts: Sequence[HostFacts], provider: Provider, vendor: str, devices: Sequence[str] = ()
    ) -> HostFacts | None: ...

    def largest_cores(self, hosts: Sequence[HostFacts]) -> int: ...


class AskEachHost:
    """The Fleet that asks each host every time (one deployment alone)."""

    @staticmethod
    def largest_gpu_host(
        hosts: Sequence[HostFacts], provider: Provider, vendor: str, devices: Sequence[str] = ()
    ) -> HostFacts | None:
        return largest_gpu_host(hosts, provider, vendor, devices)

    @staticmethod
    def largest_cores(hosts: Sequence[HostFacts]) -> int:
        return largest_cores(hosts)


def largest_cores(hosts: Sequence[HostFacts]) -> int:
    return max((h.cpu.cores for h in hosts), default=0)


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


def host_decides(d: Deployment, model: Model, hosts: Sequence[HostFacts], fleet: Fleet | None = None) -> Deployment:
    """The flat form's accelerator, "the host decides" (seed 003): GPUs where a host it may use has GPUs its engine
    runs on (or it pins devices), else the CPU where its engine runs on CPUs and serves the model's format, as the
    spec form's accelerator: cpu. A deployment that states its accelerator is returned as it is."""
    if d.accelerator != "host":
        return d
    provider = resolve_engine(d, model)
    assert provider is not None
    on_gpus = (
        bool(d.devices or d.gpus)
        or (fleet or AskEachHost()).largest_gpu_host(sizing_hosts(d, hosts), provider, d.gpu_vendor) is not None
    )
    on_cpu = provider.runs_on("cpu") and model.format in provider.formats
    return d.model_copy(update={"accelerator": "cpu" if on_cpu and not on_gpus else "gpu"})


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


# --- seed 003's margin: the memory a flat-form engine may use is the weights, the KV cache and this -----------
UNIFIED_MARGIN_BYTES = 8 * GIB
UNIFIED_LARGE_BYTES = int(26.7 * GIB)
"""Above this checkpoint size the unified-memory margin is the weights x 0.15 plus 4 GiB (8 GiB at 26.7 GiB)."""


def memory_margin_bytes(weights: int, unified: bool) -> int:
    """Seed 003: "On a unified-memory machine such as a GB10 the margin is 8 GiB, or the weights x 0.15 plus 4 GiB
    for checkpoints above 26.7 GiB; on a discrete GPU it is the weights x 0.10." """
    if not unified:
        return math.ceil(weights * 0.10)
    return math.ceil(weights * 0.15) + 4 * GIB if weights > UNIFIED_LARGE_BYTES else UNIFIED_MARGIN_BYTES


def fit(
    d: Deployment,
    model: Model,
    facts: ModelFacts | None,
    hosts: Sequence[HostFacts],
    names: Callable[[str], str] | None = None,
    fleet: Fleet | None = None,
    flat: bool = False,
) -> FitPlan | FitUnknown | str:
    """The plan object for one replica; FitUnknown when it cannot be sized yet (Pending); or why the
    specification cannot be served as asked (Failed). Memory the deployment states itself (flat form:
    resources.ram, resources.gpu or engine_config.memory.request) replaces the estimate. `names` gives a field's
    name in the deployment's own document form (rules.field_name), for the messages. `flat`: a flat-form document
    (seed 003) whose GPU memory request engine-ctl fills in: the weights, the KV cache and seed 003's margin."""
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
    usable = sizing_hosts(d, hosts)
    if shape is None and not stated:
        too_big = weights_refusal(d, model, provider, weights, usable, fleet or AskEachHost())
        return too_big or unknown_reason(model, facts, "KV cache (layers, KV heads and head size)", names)
    result: FitPlan | FitUnknown | str
    if d.accelerator == "cpu":
        result = _fit_cpu(d, model, facts, shape, usable, provider, weights, basis, fleet or AskEachHost())
    else:
        result = _fit_gpu(d, model, facts, shape, usable, provider, weights, basis, fleet or AskEachHost(), flat)
    if not isinstance(result, FitPlan):
        return result
    if d.ram_bytes or d.startup_bytes:  # a declared start-up memory is what its start sets aside
        result = result.model_copy(update={"memory_bytes": d.startup_bytes or d.ram_bytes})
    if d.ram_bytes or d.gpu_memory_bytes or d.startup_bytes:
        result = result.model_copy(
            update={"memory_basis": "catalog" if result.memory_basis == "estimate" else result.memory_basis}
        )
    return result


def weights_refusal(
    d: Deployment, model: Model, provider: Provider, weights: int, hosts: Sequence[HostFacts], fleet: Fleet
) -> str | None:
    """Failed before the KV cache is known: the weights alone (a lower bound of what each GPU holds, known without
    the model's shape) fit on no GPU count it may use of the largest GPUs reached. None when they may fit, or when
    there is nothing to compare with (CPU, unknown weights, no GPU host reached)."""
    if d.accelerator == "cpu" or not weights:
        return None
    biggest = fleet.largest_gpu_host(hosts, provider, d.gpu_vendor, d.devices)
    if biggest is None:
        return None
    sizes = [g.memory_total_bytes or 0 for g in compatible_gpus(biggest, provider, d.gpu_vendor, d.devices)]
    biggest_gpu = (min(sizes) if d.devices else max(sizes)) if sizes else 0
    fixed = d.gpus or (len(d.devices) if d.devices else None)
    options = (fixed,) if fixed else tuple(n for n in GPU_CHOICES if n <= max(len(sizes), 1))
    spread = provider.layer_machines(d.node_count, "gpu")
    needs = [(provider.gpu_bytes_per_gpu(weights, 0, n * spread, 0), n) for n in options]
    if any(need <= biggest_gpu for need, _ in needs):
        return None
    need, n = min(needs)
    return (
        f"does not fit: the weights of {model.name} alone ({gb_up(weights)}) need {each_gpu(need, n, d.node_count)} "
        f"(the largest GPU it may use has {gb_down(biggest_gpu)})"
    )


def each_gpu(need: int, gpus: int, nodes: int) -> str:
    """'at least 81 GB on each of 2 GPUs' (seed 000's words for one machine); for a replica group, what each of
    its machines must have: '2 machines with 2 GPUs of at least 81 GB each'."""
    if nodes <= 1:
        return f"at least {gb_up(need)} on each of {gpus} GPU{'s' if gpus > 1 else ''}"
    return f"{nodes} machines with {gpus} GPU{'s' if gpus > 1 else ''} of at least {gb_up(need)} each"


def _kv_per_token(d: Deployment, shape: ModelFacts | None, provider: Provider) -> int | None:
    if shape is None:
        return None
    type_k, type_v = provider.kv_cache_types(d.engine_args)
    return kv_bytes_per_token(shape, type_k, type_v, provider)


def _fit_cpu(
    d: Deployment, model: Model, facts: ModelFacts | None, shape: ModelFacts | None, hosts: Sequence[HostFacts],
    provider: Provider, weights: int, basis: MemoryBasis, fleet: Fleet,
) -> FitPlan:  # fmt: skip
    context = default_context(d, model, facts, provider)
    parallel = d.parallel or provider.parallel_candidates("cpu")[0]
    per_token = _kv_per_token(d, shape, provider)
    if per_token is None:  # the stated memory (resources.ram) holds it: what is left after the weights
        kv = max((d.ram_bytes or 0) - weights, 0)
    else:
        kv = per_token * provider.cache_tokens(context, parallel)
    spread = provider.layer_machines(d.node_count, "cpu")  # each machine's share (the module's docstring)
    weights_share, kv_share = -(-weights // spread), -(-kv // spread)
    estimate = weights_share + kv_share + provider.compute_bytes(weights, 0)
    most = fleet.largest_cores(hosts)
    cores = d.cpu_cores or cpu_cores_by_size(model.parameters or (facts.parameters if facts else None), most)
    threads = min(2 * cores, most) if most else 2 * cores
    return FitPlan(
        engine=provider.name, gpu_vendor="any", accelerator="cpu", kind=_kind(model), gpus=0, min_gpu_memory_gb=0,
        memory_basis=basis, cpu_cores=cores, threads=threads,
        memory_bytes=provider.host_memory_bytes(weights_share, estimate, 0, "cpu"), context_length=context,
        parallel=parallel, weights_bytes=weights, kv_cache_bytes=kv, capabilities=model.capabilities,
    )  # fmt: skip


def _kind(model: Model) -> Literal["chat", "embedding"]:
    return "embedding" if model.is_embedding else "chat"


def _fit_gpu(
    d: Deployment, model: Model, facts: ModelFacts | None, shape: ModelFacts | None, hosts: Sequence[HostFacts],
    provider: Provider, weights: int, basis: MemoryBasis, fleet: Fleet, flat: bool = False,
) -> FitPlan | FitUnknown | str:  # fmt: skip
    context = default_context(d, model, facts, provider)
    per_token = _kv_per_token(d, shape, provider)
    biggest = fleet.largest_gpu_host(hosts, provider, d.gpu_vendor, d.devices)
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
    margin = memory_margin_bytes(weights, any(unified_memory(g) for g in gpus_there)) if flat else None
    nodes = d.node_count
    spread = provider.layer_machines(nodes, "gpu")  # the machines whose GPUs hold the layers (the module's docstring)
    chosen: tuple[int, int, int, int] | None = None
    smallest_need: tuple[int, int, int, int] | None = None
    for n in gpu_options:
        tp = provider.tensor_parallel_size(n, nodes)
        if provider.tp_must_divide_heads and heads and tp > 1 and heads % tp:
            continue
        for p in parallel_options:
            candidate = _candidate(d, provider, weights, per_token, context, n, p, margin, spread)
            if smallest_need is None or candidate[2] < smallest_need[2]:
                smallest_need = candidate
            if biggest is None or candidate[2] <= biggest_gpu:
                chosen = candidate
                break
        if chosen:
            break
    if chosen is None:
        if smallest_need is None:
            if nodes > 1:
                tps = ", ".join(str(provider.tensor_parallel_size(n, nodes)) for n in gpu_options)
                return (
                    f"does not fit: no count of 1, 2, 4 or 8 GPUs on each of {nodes} machines gives a tensor "
                    f"parallel size ({tps}) that divides the {heads} attention heads of {model.name}"
                )
            return f"does not fit: no count of 1, 2, 4 or 8 GPUs divides the {heads} attention heads of {model.name}"
        return (
            f"does not fit: {model.name} needs {each_gpu(smallest_need[2], smallest_need[0], nodes)} "
            f"(the largest GPU it may use has {gb_down(biggest_gpu)})"
        )
    n, p, per_gpu, kv = chosen
    weights_share = -(-weights // spread)  # each machine's share of the layers (the module's docstring)
    estimate = weights_share + -(-kv // spread) + provider.compute_bytes(weights, n)
    return FitPlan(
        engine=provider.name, gpu_vendor=d.gpu_vendor, accelerator="gpu", kind=_kind(model), gpus=n,
        min_gpu_memory_gb=math.ceil(per_gpu / GB), min_gpu_memory_bytes=per_gpu, memory_basis=basis,
        cpu_cores=d.cpu_cores or 4 * n, threads=None,
        memory_bytes=provider.host_memory_bytes(weights_share, estimate, n, "gpu"), context_length=context,
        parallel=p, weights_bytes=weights, kv_cache_bytes=kv, capabilities=model.capabilities, devices=d.devices,
    )  # fmt: skip


def _candidate(
    d: Deployment, provider: Provider, weights: int, per_token: int | None, context: int, n: int, p: int,
    margin: int | None = None, spread: int = 1,
) -> tuple[int, int, int, int]:  # fmt: skip
    """(gpus, parallel, bytes each GPU needs, KV cache bytes) for one choice of `n` GPUs on each of the `spread`
    machines that hold the layers (1: a replica on one machine). A stated memory request (split over the GPUs)
    is what each GPU needs; else, with `margin` (the flat form's), the weights, the KV cache and the margin split
    over the GPUs; else the engine's rule from the weights and the KV cache over all the GPUs."""
    total = n * spread
    if per_token is None:  # the stated request holds the KV cache: what is left after the weights
        assert d.gpu_memory_bytes
        return n, p, math.ceil(d.gpu_memory_bytes / total), max(d.gpu_memory_bytes - weights, 0)
    kv = per_token * provider.cache_tokens(context, p)
    if d.gpu_memory_bytes:
        return n, p, math.ceil(d.gpu_memory_bytes / total), kv
    if margin is not None:
        return n, p, math.ceil((weights + kv + margin) / total), kv
    return n, p, provider.gpu_bytes_per_gpu(weights, kv, total, per_token * context), kv
