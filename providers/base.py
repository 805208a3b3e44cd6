"""The provider interface: every question engine-ctl asks of an engine."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

GIB = 1024**3

# Why a class of flags is refused by design (seed 000, "Not allowed, by design").
READS_FILE = "reads a file on the host (adapters, grammars, templates, draft models are not allowed, by design)"
FETCHES = "fetches from the network (not allowed, by design)"
KEYS = "keys and certificates are not passed as engine arguments (not allowed, by design)"
OPENS = "opens the server further (not allowed, by design)"

# Engines whose builds run on no AMD GPU outside the seed's ROCm rows for vLLM (GPU vendors table).
PAGED_AMD_WITHOUT_BUILD = frozenset({"instinct-mi100", "radeon-rocm-llamacpp", "radeon-other"})

# Bytes per element of KV cache types (ggml block sizes: q8_0 is 34 bytes per 32 values, …).
CACHE_TYPE_BYTES = {
    "f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q5_1": 24 / 32, "q5_0": 22 / 32,
    "q4_1": 20 / 32, "q4_0": 18 / 32, "iq4_nl": 18 / 32, "fp8": 1.0, "fp8_e4m3": 1.0, "fp8_e5m2": 1.0, "auto": 2.0,
}  # fmt: skip


LOADER_ENV_PREFIXES = ("LD_",)
"""What the dynamic loader reads in any program (LD_PRELOAD, LD_LIBRARY_PATH, LD_AUDIT): code loaded into it."""


# AMD GPU families as seed 001's "GPU vendors" table groups them, matched on the name the GPU tools print
# (amd-smi's market_name, rocm-smi's card series). First match wins; a name that matches none is not refused.
AMD_FAMILIES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("instinct-mi350", re.compile(r"\bmi35[05]")),
    ("instinct-mi100", re.compile(r"\bmi100\b")),
    ("instinct", re.compile(r"\bmi(300|325|250|210)")),
    ("radeon-rocm", re.compile(r"rx\s*(7900|7800|7700|9070|9060)|pro\s*w7[89]00|ryzen\s*ai|gfx115[01]")),
    ("radeon-rocm-llamacpp", re.compile(r"rx\s*(7600|6800|6900|6950)")),
    ("radeon-other", re.compile(r"radeon")),
)


PLATFORMS = ("cuda", "rocm", "vulkan", "metal", "cpu")
"""The builds of an engine the inventory may name, one per platform (seed 001, GPU vendors)."""

# The seed's GPU-vendors table by LLVM target (what amd-smi reports as target_graphics_version): MI300X/A and
# MI325X gfx942, MI210/MI250 gfx90a, MI100 gfx908, MI350/MI355 gfx950; RX 7900 XTX/XT/GRE and PRO W7900/W7800
# gfx1100, RX 7800/7700 gfx1101, RX 7600 gfx1102; RX 9070 gfx1201, RX 9060 gfx1200; Ryzen AI gfx1150/gfx1151;
# RX 6800/6900 gfx1030. Any other AMD GPU (RX 6700 gfx1031, 6600 gfx1032, RX 5000 gfx101x…) has no ROCm build.
ROCM_GFX_LLAMACPP = frozenset(
    {"gfx942", "gfx90a", "gfx908", "gfx1100", "gfx1101", "gfx1102", "gfx1200", "gfx1201", "gfx1150", "gfx1151",
     "gfx1030"}
)  # fmt: skip
ROCM_GFX_PAGED = frozenset(
    {"gfx942", "gfx90a", "gfx950", "gfx1100", "gfx1101", "gfx1200", "gfx1201", "gfx1150", "gfx1151"}
)  # fmt: skip
INSTINCT_GFX = frozenset({"gfx908", "gfx90a", "gfx942", "gfx950"})
"""Instinct accelerators: the Vulkan build is for Radeon cards only."""


# --- what a provider reads of a run ---------------------------------------------------------------------------
# Read-only views, so that providers need nothing of the core: engine_ctl.core.fit.runspec.ReplicaRun (with its
# FitPlan, Model and hostfacts.Gpu) answers them, and mypy checks that it does wherever a run is passed.
class RunGpu(Protocol):
    """One GPU of a replica (the core's hostfacts.Gpu)."""

    @property
    def uuid(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def vendor(self) -> str: ...
    @property
    def memory_total_bytes(self) -> int | None: ...
    @property
    def gfx_target(self) -> str | None: ...


class RunModel(Protocol):
    """The model a replica serves (the core's model.Model)."""

    @property
    def name(self) -> str: ...
    @property
    def capabilities(self) -> Sequence[str]: ...
    @property
    def chat_template(self) -> str | None: ...
    @property
    def pooling(self) -> str | None: ...
    @property
    def tool_call_parser(self) -> str | None: ...
    @property
    def reasoning_parser(self) -> str | None: ...


class RunPlan(Protocol):
    """What the fit decided for a replica (the core's runspec.FitPlan)."""

    @property
    def accelerator(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def gpus(self) -> int: ...
    @property
    def context_length(self) -> int: ...
    @property
    def parallel(self) -> int: ...


class Run(Protocol):
    """One replica, as a provider reads it to build its argv and environment (the core's runspec.ReplicaRun)."""

    @property
    def deployment(self) -> str: ...
    @property
    def model(self) -> RunModel: ...
    @property
    def model_path(self) -> str: ...
    @property
    def mmproj_path(self) -> str | None: ...
    @property
    def executable(self) -> str: ...
    @property
    def bind_address(self) -> str: ...
    @property
    def port(self) -> int: ...
    @property
    def api_key_file(self) -> str | None: ...
    @property
    def gpus(self) -> Sequence[RunGpu]: ...
    @property
    def plan(self) -> RunPlan: ...
    @property
    def threads(self) -> int | None: ...
    @property
    def engine_args(self) -> Sequence[str]: ...
    @property
    def gpu_memory_bytes(self) -> int | None: ...
    @property
    def engine_options(self) -> Mapping[str, object]: ...
    @property
    def chat_template_file(self) -> str | None: ...
    @property
    def cache_dir(self) -> str | None: ...
    @property
    def residency(self) -> str: ...


# --- the syntax of engine flags (the provider contract's: allow-lists and argv speak it) ---------------------
def is_flag(token: str) -> bool:
    if not token.startswith("-") or token in ("-", "--"):
        return False
    # Negative numbers are values: --seed -1, --rope-freq-scale -0.5
    body = token[1:]
    return not (body[:1].isdigit() or (body[:1] == "." and body[1:2].isdigit()))


def flag_name(token: str) -> str:
    return token.split("=", 1)[0]


def split_flags(args: Sequence[str]) -> list[tuple[str, str | None]]:
    """[('--temp', '0.7'), ('--jinja', None)] from a checked argument list."""
    out: list[tuple[str, str | None]] = []
    for token in args:
        if is_flag(token):
            name, eq, value = token.partition("=")
            out.append((name, value if eq else None))
        elif out and out[-1][1] is None:
            out[-1] = (out[-1][0], token)
    return out


FAMILY_GFX = {
    "instinct-mi350": "gfx950", "instinct-mi100": "gfx908", "instinct": "gfx942", "radeon-rocm": "gfx1100",
    "radeon-rocm-llamacpp": "gfx1030",
}  # fmt: skip
"""When the tools give no target: a GPU's family (by its name) stands for a target of its row."""


def amd_family(name: str) -> str | None:
    """The seed's GPU-vendors row an AMD GPU's name falls in, or None when it names none of them."""
    lowered = name.lower()
    return next((family for family, pattern in AMD_FAMILIES if pattern.search(lowered)), None)


# --- parking: an engine's sleep controls (engine-ctl park) -----------------------------------------------------
PARKING_RESIDENCIES = frozenset({"parked", "deep", "host_backed"})
"""Residencies that park an engine asleep (restart_only stops it instead)."""


@dataclass(frozen=True)
class HttpCall:
    """One request to the engine's own port, made from its host (never through the gateway)."""

    method: str
    path: str
    body: str | None = None


@dataclass(frozen=True)
class SleepControls:
    """How an engine parks without a restart, and wakes: the HTTP calls on the replica's port, in order, and
    what it must be launched with for them to exist."""

    sleep: Callable[[int], tuple[HttpCall, ...]]
    """level (1 keeps the weights in host RAM, 2 drops them) -> the calls that put it to sleep."""
    wake: Callable[[int], tuple[HttpCall, ...]]
    """the level it slept at -> the calls that wake it, serving again."""
    asleep: HttpCall | None = None
    """A GET answering JSON {asleep_key: true|false}, to confirm a sleep and a wake; None when there is none."""
    asleep_key: str = ""
    launch_argv: tuple[str, ...] = ()
    launch_env: Mapping[str, str] = field(default_factory=dict)

    @staticmethod
    def level(residency: str) -> int:
        """Seed 003: parked (and host_backed) sleep at level 1, keeping the weights in host RAM; deep at 2."""
        return 2 if residency == "deep" else 1


@dataclass(frozen=True)
class EngineOption:
    """A key of the flat form's engine_config that one engine alone reads (seed 003: `cuda_graphs` on SGLang,
    `llamacpp: {gguf_file}` on llama.cpp). The documents' model gains it as an optional field; the loader puts
    its value in the deployment's engine_options (what the engine's argv reads), or, when it names the model's
    file, in the model."""

    key: str
    annotation: Any
    """The value's type as pydantic checks it; always optional (None: not written)."""
    description: str | None = None
    model_file: Callable[[Any], str] | None = None
    """When the option names the model's file rather than setting the engine: the file, read from its value."""
    model_format: str | None = None
    """The format of that file (it decides the model's format)."""
    recorded_when_unset: bool = False
    """Records (state, plans) written before options moved into providers carry this key as null in every
    deployment; keeping it there keeps their spec digest, so an upgrade starts no new revision."""


@dataclass(frozen=True)
class Group:
    """One replica spread over several machines (`spec.nodes` > 1), on the engine's own distributed runtime:
    where its members are and the ports that runtime uses. Member 0 is the head (it serves the API; the gateway
    sees only it); members 1.. are the workers, in rank order."""

    addresses: tuple[str, ...]
    """Each member's address as the other members reach it, the head first."""
    ports: tuple[int, ...]
    """One runtime port per member, from the inventory's port range and checked free: the head's is the
    rendezvous port (vLLM's --master-port, SGLang's --dist-init-addr port); a llama.cpp worker's is its
    rpc-server port (the head's is then unused)."""
    interface: str | None = None
    """The network interface the collective library uses (NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME), when the
    inventory names one."""

    @property
    def nodes(self) -> int:
        return len(self.addresses)

    @property
    def head(self) -> str:
        return self.addresses[0]

    def check_rank(self, rank: int, head: bool = False) -> None:
        """A worker's rank is 1..nodes-1 (0 too, the head, where `head`); ports are one per member."""
        if len(self.ports) != self.nodes:
            raise ValueError(f"a group of {self.nodes} members needs {self.nodes} ports, got {len(self.ports)}")
        if not (0 if head else 1) <= rank < self.nodes:
            raise ValueError(f"rank {rank} is not a {'member' if head else 'worker'} of a group of {self.nodes}")


@dataclass(frozen=True)
class Provider:
    """An engine: formats, platforms, flags, argv, health, memory rule, defaults."""

    name: str
    title: str
    formats: frozenset[str]
    auto_for_format: str | None
    """The model format for which `engine: auto` picks this engine (one engine per format)."""
    platforms: frozenset[str]
    """Where it runs: nvidia, amd, apple (Metal), cpu."""
    allowed_flags: tuple[str, ...]
    deployment_flags: Mapping[str, str]
    """Flags the deployment sets -> where to set them instead."""
    refused_flags: Mapping[str, str]
    """Flags refused by design -> why."""
    short_flags: Mapping[str, str] = field(default_factory=dict)
    health_path: str = "/health"
    metrics_path: str = "/metrics"
    in_flight_metric: str = ""
    token_metrics: tuple[str, str] = ("", "")
    """Its /metrics counters of prompt tokens and generated tokens since it started (`engine-ctl usage`)."""
    default_context_cap: int = 8192
    serves_decisions: bool = False
    lacks: frozenset[str] = frozenset()
    """Model capabilities this engine does not serve (seed 001: llama.cpp has no speech to text and no video); a
    deployment of a model that has one is refused (capability_missing)."""
    decisions_min_version: str | None = None
    """The oldest release that serves decision models (seed 003): a build reporting an older version serves
    them only where the inventory says so (engines.<engine>.decisions: true)."""
    release: str | None = None
    """The seed's release engine-ctl runs by default (seed 001: llama.cpp v0.5.0, vLLM v0.30.0): a build reporting
    another version runs only where the inventory pins that version (engines.<engine>.version)."""
    default_executable: str = ""
    jit_compiles: bool = False
    """JIT compilers need writable+executable memory: MemoryDenyWriteExecute stays off."""
    tp_must_divide_heads: bool = False
    startup_budget_s: int = 600
    cache_type_flags: tuple[str, str] = ("", "")
    aliases: tuple[str, ...] = ()
    """Other names the documents accept for this engine (the flat form's `llamacpp`)."""
    auto_for_cpu: bool = False
    """Whether `engine: auto` with `accelerator: cpu` picks this engine."""
    options: tuple[EngineOption, ...] = ()
    """engine_config keys only this engine reads."""
    vision_needs_mmproj: bool = False
    """Whether the engine serves images only with the model's multimodal projector beside it (a `--mmproj`)."""
    tool_choice_flags: tuple[str, ...] = ()
    """Flags that, with the tool-call parser's, turn on tool calls (the engine's auto tool choice)."""
    parser_flags: Mapping[str, str] = field(default_factory=dict)
    """The model's parser fields (tool_call_parser, reasoning_parser) -> the flag that sets each; a decisions
    deployment has no parser, so these flags are refused in its extra_args."""
    loading_statuses: frozenset[str] = frozenset()
    """HTTP statuses the health endpoint answers while the engine is still loading its model (starting, not
    failing)."""
    log_prefix: str = ""
    """A regular expression for what the engine writes before each log line (a timestamp, a level): dropped
    from the engine's words when a replica fails to start."""
    keeps_argv: bool = False
    """Its main process's command line (/proc/PID/cmdline) stays the argv it was started with (it sets no process
    title): arguments there that its unit does not give (a wrapper at its executable's path) are drift."""
    env_prefixes: tuple[str, ...] = ()
    """Environment variables it reads as settings (each one a flag, a key, where it fetches from), and those any
    program's loader reads (LOADER_ENV_PREFIXES): one in its process that its unit does not set came from elsewhere
    (systemd's manager environment, `systemctl set-environment`) and changes how it serves, or whom it answers."""
    head_dials_members: bool = False
    """A replica group's head connects to each worker's port (llama.cpp's RPC backend): the facts probe opens that
    connection from the head's host, and a worker it cannot reach puts the group out of service in `status` (its
    /health answers without its workers, while its requests wait on them)."""
    takes_flag_equals_value: bool = True
    """Whether the engine reads `--flag=value` as one word (argparse does: vLLM, SGLang). When not (llama.cpp's
    llama-server refuses `--seed=42`), the user's engine_args are passed as `--flag value`."""

    amd_without_build: frozenset[str] = frozenset()
    """AMD families (see AMD_FAMILIES) that no build of this engine runs on (seed 001, GPU vendors)."""
    rocm_gfx: frozenset[str] = frozenset()
    """AMD targets this engine's ROCm build runs on (seed 001, GPU vendors)."""
    vulkan_for_other_amd: bool = False
    """Whether a Vulkan build serves the AMD GPUs the ROCm build has no kernels for (llama.cpp)."""
    sleep_controls: SleepControls | None = None
    """How it parks asleep (vLLM's sleep mode, SGLang's memory release); None: a park restarts it (llama.cpp)."""

    def parks_asleep(self, residency: str) -> bool:
        return self.sleep_controls is not None and residency in PARKING_RESIDENCIES

    def sleep_launch(self, run: Run) -> tuple[list[str], dict[str, str]]:
        """The flags and environment that enable its sleep controls, when its residency parks it asleep."""
        if self.sleep_controls is None or not self.parks_asleep(run.residency):
            return [], {}
        return list(self.sleep_controls.launch_argv), dict(self.sleep_controls.launch_env)

    def build_platform(self, gpu: RunGpu | None) -> str | None:
        """Which build of this engine runs a replica on `gpu` (None: on CPUs), by the seed's GPU-vendors table;
        None when no build of it runs there."""
        if gpu is None:
            return "cpu" if self.runs_on("cpu") else None
        if not self.runs_on(gpu.vendor):
            return None
        if gpu.vendor == "nvidia":
            return "cuda"
        if gpu.vendor == "apple":
            return "metal"
        family = amd_family(gpu.name)
        target = gpu.gfx_target or FAMILY_GFX.get(family or "")
        if target is None and family is None:  # an AMD GPU named by none of the rows: not refused
            return "rocm"
        if target in self.rocm_gfx:
            return "rocm"
        instinct = target in INSTINCT_GFX or (family or "").startswith("instinct")
        return "vulkan" if self.vulkan_for_other_amd and not instinct else None

    def api_key_argv(self, key_file: str) -> list[str]:
        """Flags that make the engine answer only requests with the key in `key_file` (the gateway's internal
        key, a credential of the unit written as internal_key_text gives it); [] for an engine that takes it
        otherwise (internal_key_env) or not at all (then only IPAddressAllow= guards it)."""
        return []

    # The gateway's internal key: how this engine is given it, never in its argv or its unit's text.
    internal_key_credential: ClassVar[str | None] = None
    """The unit credential's name when the engine reads the key from a file a flag names (api_key_argv)."""
    internal_key_env: ClassVar[str | None] = None
    """The environment variable the engine reads the key from (set by a root-only EnvironmentFile=)."""
    internal_key_several: ClassVar[bool] = False
    """Whether the engine accepts several keys at once (the old and the new while the key is rotated)."""

    @property
    def takes_internal_key(self) -> bool:
        return bool(self.internal_key_credential or self.internal_key_env)

    def internal_key_text(self, keys: Sequence[str]) -> str:
        """The host file that gives this engine the key: keys[0] is the one the gateway sends; the others are
        accepted too, where the engine can take several (during a rotation)."""
        if self.internal_key_env:
            return f"{self.internal_key_env}={keys[0]}\n"
        return "".join(k + "\n" for k in keys)

    def engine_args_argv(self, args: Sequence[str]) -> list[str]:
        """The deployment's engine_args (already checked) in the form this engine accepts."""
        if self.takes_flag_equals_value:
            return list(args)
        out: list[str] = []
        for token in args:
            name, eq, value = token.partition("=")
            out += [name, value] if eq and name.startswith("--") else [token]
        return out

    def runs_on(self, platform: str) -> bool:
        return platform in self.platforms

    def gpu_refusal(self, gpu: RunGpu) -> str | None:
        """Why this engine cannot run on `gpu`, or None when one of its builds does (seed 001, GPU vendors)."""
        if not self.runs_on(gpu.vendor):
            return f"{self.title} does not run on {gpu.vendor} GPUs"
        if self.build_platform(gpu) is None or (gpu.vendor == "amd" and amd_family(gpu.name) in self.amd_without_build):
            return f"no {self.title} build runs on the {gpu.name} (GPU vendors table)"
        return None

    # --- fit -------------------------------------------------------------------------------------------
    def cache_type_bytes(self, cache_type: str) -> float:
        return CACHE_TYPE_BYTES.get(cache_type.lower(), 2.0)

    def kv_cache_types(self, engine_args: Sequence[str]) -> tuple[str, str]:
        """K and V cache types as the user's engine_args set them (f16 by default)."""
        k_flag, v_flag = self.cache_type_flags
        k = v = "f16"
        for flag, value in split_flags(engine_args):
            if flag == k_flag and value:
                k = value
                if k_flag == v_flag:
                    v = value
            elif flag == v_flag and value:
                v = value
        return k, v

    def cache_tokens(self, context: int, parallel: int) -> int:
        """Tokens of KV cache allocated at start."""
        return context * parallel

    def context_note(self, context: int, parallel: int) -> str | None:
        """What context_length means beside this engine's own flags, where they differ (shown in plans)."""
        return None

    def compute_bytes(self, weights: int, gpus: int) -> int:
        return 512 * 1024**2

    def gpu_bytes_per_gpu(self, weights: int, kv: int, gpus: int, kv_one_sequence: int) -> int:
        raise NotImplementedError

    def host_memory_bytes(self, weights: int, estimate: int, gpus: int, accelerator: str) -> int:
        raise NotImplementedError

    def parallel_candidates(self, accelerator: str) -> tuple[int, ...]:
        raise NotImplementedError

    # --- what a replica runs ----------------------------------------------------------------------------
    def argv(self, run: Run) -> list[str]:
        raise NotImplementedError

    # --- a replica bigger than one machine (issue 30) ----------------------------------------------------
    multi_node: ClassVar[bool] = False
    """Whether the engine has its own distributed runtime that spreads one replica over several machines."""

    worker_listens_before_head: ClassVar[bool] = True
    """Whether a group worker's runtime listens on the member port engine-ctl gives it on its own, before its head
    starts (llama.cpp's rpc-server does at once): apply starts the workers first, so a worker's unit is gated on
    that port only then. False where a worker first joins its head's rendezvous: a vLLM --headless worker listens
    on no port named in advance; an SGLang worker of a non-zero rank serves its health check only once its
    schedulers are ready, which takes the head. Such a unit is started once its process runs, and the head's
    health gate, which waits for every worker, decides."""

    def group_head_argv(self, run: Run, group: Group) -> list[str]:
        """The head's argv: the single-machine argv plus the runtime's flags (it serves the API)."""
        raise NotImplementedError(f"{self.name} does not spread a replica over machines")

    def group_worker_argv(self, run: Run, group: Group, rank: int) -> list[str]:
        """Worker `rank`'s (1..nodes-1) whole argv, executable first (llama.cpp: rpc-server; vLLM: a headless
        `vllm serve`; SGLang: `python -m sglang.launch_server` with its node rank)."""
        raise NotImplementedError(f"{self.name} does not spread a replica over machines")

    def group_environment(self, run: Run, group: Group, rank: int) -> dict[str, str]:
        """Member `rank`'s environment (0 is the head): the single-machine one plus the runtime's."""
        return self.environment(run)

    def layer_machines(self, nodes: int, accelerator: str) -> int:
        """How many machines of a group of `nodes` hold the model's layers and their KV cache (the fit spreads
        them over these machines' GPUs, or their host memory): every machine, unless the runtime says otherwise."""
        return nodes

    def tensor_parallel_size(self, gpus: int, nodes: int) -> int:
        """The tensor-parallel size of a replica of `nodes` machines of `gpus` GPUs each (where
        tp_must_divide_heads, the model's attention heads must divide by it): the GPUs of one machine; the
        machines are pipeline stages."""
        return gpus

    def worker_executables(self, executable: str) -> dict[str, dict[str, object]]:
        """The binaries a group's workers run, other than the engine's own `executable` (llama.cpp: the
        rpc-server beside llama-server), each with how the facts probe reads its version ({}: it has no version
        flag; only its sha256 is read). The facts report each one's sha256, so that a worker's binary changed under
        a running group is drift of the replica, as the head's is (drift.replica_drift)."""
        return {}

    def environment(self, run: Run) -> dict[str, str]:
        return {}

    def version_probe(self) -> dict[str, object]:
        return {"kind": "argv", "args": ["--version"]}

    def executable_candidates(self, configured: str | None) -> list[str]:
        """Where the facts probe looks for the engine: the inventory's path, else the usual places."""
        if configured:
            return [configured]
        base = self.default_executable.rsplit("/", 1)[-1]
        return [self.default_executable, base, f"/opt/{self.name}/bin/{base}"]


@dataclass(frozen=True)
class PagedProvider(Provider):
    """Engines with a paged KV cache in a fixed fraction of each GPU (vLLM, SGLang): a replica needs its share
    of the weights and room for one whole-context sequence within that fraction; host memory is the seed's
    vLLM rule, weights + 8 GiB + 2 GiB per GPU beyond the first; 256 requests at once."""

    gpu_memory_fraction: float = 0.90

    def memory_fraction(self, run: Run) -> float:
        """The share of each GPU the engine takes: the deployment's memory request (engine_config.memory.request,
        split over the replica's GPUs) against the smallest of them, rounded down to 0.01; else the default."""
        total = min((g.memory_total_bytes or 0) for g in run.gpus) if run.gpus else 0
        if not run.gpu_memory_bytes or not total:
            return self.gpu_memory_fraction
        share = run.gpu_memory_bytes / max(len(run.gpus), 1) / total
        return min(0.95, max(0.05, math.floor(share * 100) / 100))

    def gpu_bytes_per_gpu(self, weights: int, kv: int, gpus: int, kv_one_sequence: int) -> int:
        need = ceil_div(weights + kv_one_sequence, gpus) + GIB
        return ceil_div(need * 100, int(self.gpu_memory_fraction * 100))

    def cache_tokens(self, context: int, parallel: int) -> int:
        return context  # paged: the minimum is one whole-context sequence

    def host_memory_bytes(self, weights: int, estimate: int, gpus: int, accelerator: str) -> int:
        return at_least_2gib(weights + 8 * GIB + 2 * GIB * max(gpus - 1, 0))

    def parallel_candidates(self, accelerator: str) -> tuple[int, ...]:
        return (256,)


def at_least_2gib(n: int) -> int:
    return max(n, 2 * GIB)


def gpu_env(run: Run) -> dict[str, str]:
    """Visible devices by UUID: CUDA_VISIBLE_DEVICES on NVIDIA, ROCR_VISIBLE_DEVICES on AMD."""
    if not run.gpus:
        return {}
    uuids = ",".join(g.uuid for g in run.gpus)
    if run.gpus[0].vendor == "apple":  # Metal has one GPU and no visible-devices variable
        return {}
    if run.gpus[0].vendor == "amd":
        return {"ROCR_VISIBLE_DEVICES": uuids}
    return {"CUDA_VISIBLE_DEVICES": uuids, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


TEMPLATE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def is_template_name(template: str) -> bool:
    """A built-in template's name (chatml, llama3, …) rather than Jinja text."""
    return bool(TEMPLATE_NAME.fullmatch(template))


def chat_template_argv(run: Run, name_flag: str, file_flag: str) -> list[str]:
    """The model's chat_template: a name as it is, Jinja text as the file the unit provides."""
    template = run.model.chat_template
    if not template:
        return []
    if is_template_name(template):
        return [name_flag, template]
    if run.chat_template_file is None:
        raise ValueError(f"model {run.model.name}: its Jinja chat template needs the unit's file (chat_template_file)")
    return [file_flag, run.chat_template_file]


def cache_env(run: Run, *names: str) -> dict[str, str]:
    """The engine's own cache variables, pointed at the replica's cache directory."""
    return {name: run.cache_dir for name in names} if run.cache_dir else {}


def ceil_div(a: int, b: int) -> int:
    return math.ceil(a / b)
