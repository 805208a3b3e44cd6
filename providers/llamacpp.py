"""llama.cpp's llama-server (seed 000: "What each replica runs", engine arguments)."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import ClassVar

from engine_ctl.providers.base import (
    FETCHES,
    GIB,
    KEYS,
    LOADER_ENV_PREFIXES,
    OPENS,
    READS_FILE,
    ROCM_GFX_LLAMACPP,
    EngineOption,
    Group,
    Provider,
    Run,
    at_least_2gib,
    cache_env,
    ceil_div,
    chat_template_argv,
    gpu_env,
)
from pydantic import BaseModel, ConfigDict, Field

ALLOWED = (
    "--threads", "--threads-batch", "--batch-size", "--ubatch-size", "--n-predict", "--keep", "--swa-full",
    "--flash-attn", "--cache-type-k", "--cache-type-v", "--kv-offload", "--no-kv-offload", "--defrag-thold",
    "--rope-scaling", "--rope-scale", "--rope-freq-base", "--rope-freq-scale", "--yarn-orig-ctx",
    "--yarn-ext-factor", "--yarn-attn-factor", "--yarn-beta-slow", "--yarn-beta-fast", "--override-kv",
    "--cpu-moe", "--n-cpu-moe", "--seed", "--samplers", "--temp", "--top-k", "--top-p", "--min-p",
    "--typical-p", "--repeat-last-n", "--repeat-penalty", "--presence-penalty", "--frequency-penalty",
    "--ignore-eos", "--kv-unified", "--no-kv-unified", "--ctx-checkpoints", "--cache-ram", "--context-shift",
    "--no-context-shift", "--cache-prompt", "--no-cache-prompt", "--cache-reuse", "--cont-batching",
    "--no-cont-batching", "--warmup", "--no-warmup", "--pooling", "--embeddings", "--split-mode",
    "--tensor-split", "--main-gpu", "--reranking", "--jinja", "--no-jinja", "--reasoning-format",
    "--reasoning-effort", "--reasoning-budget", "--chat-template-kwargs", "--timeout", "--threads-http",
    "--sse-ping-interval", "--slots", "--no-slots", "--fit", "--fit-target", "--fit-ctx",
)  # fmt: skip

SET_BY_DEPLOYMENT = {
    "--model": "the deployment",
    "--host": "the deployment",
    "--port": "the deployment",
    "--ctx-size": "spec.context_length",
    "--parallel": "spec.parallel",
    "--n-gpu-layers": "spec.accelerator",
    "--gpu-layers": "spec.accelerator",
    "--alias": "the deployment's name",
    "--metrics": "the deployment",
    "--webui": "the deployment",
    "--no-webui": "the deployment",
    "--chat-template": "the model's chat_template",
    "--chat-template-file": "the model's chat_template",
    "--mmproj": "the model's mmproj",
}

REFUSED = {
    "--lora": READS_FILE,
    "--lora-scaled": READS_FILE,
    "--lora-init-without-apply": READS_FILE,
    "--control-vector": READS_FILE,
    "--control-vector-scaled": READS_FILE,
    "--grammar-file": READS_FILE,
    "--json-schema-file": READS_FILE,
    "--model-draft": READS_FILE,
    "--system-prompt-file": READS_FILE,
    "--slot-save-path": READS_FILE,
    "--log-file": READS_FILE,
    "--path": READS_FILE,
    "--prompt-cache": READS_FILE,
    "--mmproj-url": FETCHES,
    "--model-url": FETCHES,
    "--hf-repo": FETCHES,
    "--hf-file": FETCHES,
    "--hf-token": KEYS,
    "--hf-repo-draft": FETCHES,
    "--docker-repo": FETCHES,
    "--rpc": FETCHES,
    "--api-key": OPENS,
    "--api-key-file": KEYS,
    "--ssl-key-file": KEYS,
    "--ssl-cert-file": KEYS,
    "--props": OPENS,
    "--slot-save": OPENS,
    "--tools": OPENS,
}

SHORT = {
    "-fa": "--flash-attn", "-t": "--threads", "-tb": "--threads-batch", "-b": "--batch-size",
    "-ub": "--ubatch-size", "-n": "--n-predict", "-c": "--ctx-size", "-np": "--parallel",
    "-ngl": "--n-gpu-layers", "-m": "--model", "-a": "--alias", "-sm": "--split-mode", "-ts": "--tensor-split",
    "-mg": "--main-gpu", "-s": "--seed", "-ctk": "--cache-type-k", "-ctv": "--cache-type-v",
    "-nkvo": "--no-kv-offload", "-dt": "--defrag-thold", "-kvu": "--kv-unified", "-cmoe": "--cpu-moe",
    "-ncmoe": "--n-cpu-moe", "-to": "--timeout", "-cb": "--cont-batching", "-nocb": "--no-cont-batching",
    "-fit": "--fit", "-md": "--model-draft", "-hf": "--hf-repo", "-hfr": "--hf-repo", "-hff": "--hf-file",
    "-mu": "--model-url", "-sp": "--special", "-cram": "--cache-ram",
}  # fmt: skip


# The flat form's engine_config.llamacpp (seed 003): which GGUF file of the model directory to serve.
class FlatLlamaCpp(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    gguf_file: str = Field(description="The GGUF file in the model directory to serve.")


GGUF_FILE = EngineOption(
    key="llamacpp",
    annotation=FlatLlamaCpp | None,
    model_file=lambda value: value.gguf_file,
    model_format="gguf",
)


RPC_SERVER = "ggml-rpc-server"
"""llama.cpp's RPC worker (tools/rpc; named rpc-server before), built beside llama-server with -DGGML_RPC=ON."""


def rpc_server_beside(executable: str) -> str:
    """The rpc-server of the build whose llama-server is `executable` (the same build: its directory)."""
    return posixpath.join(posixpath.dirname(executable), RPC_SERVER)


def _url_host(address: str) -> str:
    return f"[{address}]" if ":" in address else address


@dataclass(frozen=True)
class LlamaCpp(Provider):
    """llama-server: --ctx-size is the whole cache, split between its --parallel slots."""

    def gpu_bytes_per_gpu(self, weights: int, kv: int, gpus: int, kv_one_sequence: int) -> int:
        # Layers (weights and their KV) split across the GPUs, plus each GPU's compute buffer and CUDA context.
        return ceil_div(weights + kv, gpus) + self.compute_bytes(weights, gpus) + 256 * 1024**2

    def host_memory_bytes(self, weights: int, estimate: int, gpus: int, accelerator: str) -> int:
        if accelerator == "cpu":
            return at_least_2gib(max(weights + 2 * GIB, estimate + GIB))
        return at_least_2gib(weights + 2 * GIB)

    def parallel_candidates(self, accelerator: str) -> tuple[int, ...]:
        return (2,) if accelerator == "cpu" else (4, 2, 1)

    def context_note(self, context: int, parallel: int) -> str | None:
        return (
            f"tokens per request; --ctx-size {context * parallel} is context_length × parallel, "
            "split between the parallel slots"
        )

    def argv(self, run: Run) -> list[str]:
        plan = run.plan
        argv = [
            run.executable,
            "--model", run.model_path,
            "--alias", run.deployment,
            "--ctx-size", str(plan.context_length * plan.parallel),
            "--parallel", str(plan.parallel),
        ]  # fmt: skip
        if plan.accelerator == "gpu":
            argv += ["--n-gpu-layers", "all"]
            if plan.gpus > 1:
                argv += ["--split-mode", "layer"]
        argv += ["--metrics", "--jinja", "--no-webui"]
        if plan.kind == "embedding":
            argv += ["--embeddings"]
            if run.model.pooling:
                argv += ["--pooling", run.model.pooling]
        if run.mmproj_path:
            argv += ["--mmproj", run.mmproj_path]
        argv += chat_template_argv(run, "--chat-template", "--chat-template-file")
        argv += ["--host", run.bind_address, "--port", str(run.port)]
        if run.api_key_file:
            argv += self.api_key_argv(run.api_key_file)
        if plan.accelerator == "cpu" and run.threads:
            argv += ["--threads", str(run.threads)]
        return argv + self.engine_args_argv(run.engine_args)

    # --- a replica over several machines: llama.cpp's RPC backend (tools/rpc/README.md) -------------------
    multi_node: ClassVar[bool] = True

    def group_head_argv(self, run: Run, group: Group) -> list[str]:
        """llama-server with every worker's rpc-server as a device (`--rpc host:port,…`): the layers go to the
        group's devices (`--n-gpu-layers all`): the workers' rpc-servers, and the head's own GPUs where it has
        them (llama.cpp splits them by each device's free memory). On a CPU head its own CPU keeps the token
        embeddings and runs the server; the layers are the workers'."""
        argv = self.argv(run)
        servers = ",".join(f"{_url_host(a)}:{p}" for a, p in zip(group.addresses[1:], group.ports[1:], strict=True))
        offload = [] if "--n-gpu-layers" in argv else ["--n-gpu-layers", "all"]
        at = argv.index("--metrics")  # before the deployment's and the user's flags, after the model's
        return [*argv[:at], *offload, "--rpc", servers, *argv[at:]]

    def group_worker_argv(self, run: Run, group: Group, rank: int) -> list[str]:
        """rpc-server beside the head's llama-server (the same build: its directory), listening on the member's
        own address and runtime port only (the unit's IPAddressAllow= admits the group's hosts)."""
        argv = [rpc_server_beside(run.executable), "--host", group.addresses[rank], "--port", str(group.ports[rank])]
        if run.threads:
            argv += ["--threads", str(run.threads)]
        return argv

    def layer_machines(self, nodes: int, accelerator: str) -> int:
        """On GPUs the layers go to every member's GPUs (the head's own and the workers' rpc-servers'). On CPUs
        the head's CPU is no offload device: it keeps the token embeddings and serves, and the layers (with their
        KV cache) are split over the nodes - 1 workers' rpc-servers (group_head_argv)."""
        return nodes - 1 if accelerator == "cpu" and nodes > 1 else nodes

    def worker_executables(self, executable: str) -> dict[str, dict[str, object]]:
        # ggml-rpc-server has no version flag: `--version` is "error: unknown argument" (build 11434): sha256 only
        return {rpc_server_beside(executable): {}}

    def api_key_argv(self, key_file: str) -> list[str]:
        # llama-server answers /health without the key and refuses everything else (401) without it; its key file
        # holds one key a line, each accepted (llama.cpp's common/arg.cpp, --api-key-file)
        return ["--api-key-file", key_file]

    internal_key_credential: ClassVar[str | None] = "replica-key"
    internal_key_several: ClassVar[bool] = True

    def environment(self, run: Run) -> dict[str, str]:
        return {**gpu_env(run), **cache_env(run, "LLAMA_CACHE")}

    def version_probe(self) -> dict[str, object]:
        """How the facts probe reads the installed version without starting the engine."""
        return {"kind": "argv", "args": ["--version"]}


LLAMACPP = LlamaCpp(
    name="llama.cpp",
    title="llama.cpp",
    aliases=("llamacpp",),
    formats=frozenset({"gguf"}),
    auto_for_format="gguf",
    auto_for_cpu=True,
    lacks=frozenset({"transcription", "video"}),  # seed 001: "Speech to text, video — | Whisper; videos …"
    options=(GGUF_FILE,),
    loading_statuses=frozenset({"503"}),  # llama-server answers 503 "Loading model" until its model is loaded
    log_prefix=r"^[\d.:]+\s+[A-Z]\s+",  # llama-server's `0.00.014.738 E ` (time, level)
    keeps_argv=True,  # llama-server sets no process title
    head_dials_members=True,  # llama-server dials each worker's rpc-server (--rpc host:port)
    # tools/server/README.md: each flag's LLAMA_ARG_* variable (a flag wins over it), LLAMA_API_KEY (--api-key: a
    # key it answers beside its key file's), LLAMA_CACHE and HF_* (where -hf fetches), GGML_* (the backends' own)
    env_prefixes=("LLAMA_", "HF_", "GGML_", "CUDA_", *LOADER_ENV_PREFIXES),
    platforms=frozenset({"nvidia", "amd", "apple", "cpu"}),
    allowed_flags=ALLOWED,
    deployment_flags=SET_BY_DEPLOYMENT,
    refused_flags=REFUSED,
    short_flags=SHORT,
    in_flight_metric="llamacpp:requests_processing",
    token_metrics=("llamacpp:prompt_tokens_total", "llamacpp:tokens_predicted_total"),
    default_context_cap=8192,
    serves_decisions=True,
    decisions_min_version="0.7.0",
    release="0.5.0",  # seed 001: "llama.cpp release v0.5.0"
    default_executable="/usr/local/bin/llama-server",
    vision_needs_mmproj=True,
    jit_compiles=False,
    startup_budget_s=600,
    cache_type_flags=("--cache-type-k", "--cache-type-v"),
    takes_flag_equals_value=False,
    amd_without_build=frozenset({"instinct-mi350"}),
    rocm_gfx=ROCM_GFX_LLAMACPP,
    vulkan_for_other_amd=True,
)
