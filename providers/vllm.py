"""vLLM's OpenAI-compatible server (seed 000)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from engine_ctl.providers.base import (
    FETCHES,
    KEYS,
    OPENS,
    PAGED_AMD_WITHOUT_BUILD,
    READS_FILE,
    ROCM_GFX_PAGED,
    Group,
    HttpCall,
    PagedProvider,
    Run,
    SleepControls,
    cache_env,
    chat_template_argv,
    gpu_env,
)

GPU_MEMORY_UTILIZATION = 0.90

# The release the seed pins (vllm/vllm-openai:v0.30.0); every flag below is checked against its argument list,
# tests/engine_flags/vllm-0.30.0.txt (made by tests/tools/engine_flags.py from the release's own source).
RELEASE = "0.30.0"

ALLOWED = (
    "--dtype", "--quantization", "--kv-cache-dtype", "--enable-prefix-caching", "--no-enable-prefix-caching",
    "--enforce-eager", "--no-enforce-eager", "--max-num-batched-tokens", "--enable-chunked-prefill",
    "--no-enable-chunked-prefill", "--block-size", "--cpu-offload-gb", "--kv-cache-memory-bytes",
    "--gpu-memory-utilization", "--seed", "--generation-config", "--override-generation-config",
    "--max-logprobs", "--logprobs-mode", "--disable-log-stats", "--limit-mm-per-prompt", "--tokenizer-mode",
    "--hf-overrides", "--scheduling-policy", "--long-prefill-token-threshold", "--compilation-config",
    "--async-scheduling", "--no-async-scheduling", "--enable-auto-tool-choice", "--tool-call-parser",
    "--reasoning-parser", "--chat-template-content-format", "--default-chat-template-kwargs",
    "--response-role", "--enable-force-include-usage", "--enable-prompt-tokens-details",
    "--return-tokens-as-token-ids", "--max-log-len", "--disable-uvicorn-access-log", "--uvicorn-log-level",
    "--enable-server-load-tracking",
)  # fmt: skip

SET_BY_DEPLOYMENT = {
    "--model": "the deployment",
    "--host": "the deployment",
    "--port": "the deployment",
    "--served-model-name": "the deployment's name",
    "--max-model-len": "spec.context_length",
    "--max-num-seqs": "spec.parallel",
    "--tensor-parallel-size": "spec.gpus (a replica is one machine's GPUs)",
    "--pipeline-parallel-size": "spec.gpus (a replica is one machine's GPUs) and spec.nodes",
    "--nnodes": "spec.nodes",
    "--node-rank": "spec.nodes (each member's rank)",
    "--master-addr": "spec.nodes (the head's address)",
    "--master-port": "spec.nodes (a port from the inventory's range)",
    "--headless": "spec.nodes (the workers)",
    "--distributed-executor-backend": "spec.nodes",
    "--runner": "the model's capabilities",
    "--convert": "the model's capabilities",
    "--chat-template": "the model's chat_template",
}

REFUSED = {
    "--trust-remote-code": OPENS,
    "--api-key": OPENS,
    "--allowed-origins": OPENS,
    "--allow-credentials": OPENS,
    "--enable-request-id-headers": OPENS,
    "--ssl-keyfile": KEYS,
    "--ssl-certfile": KEYS,
    "--ssl-ca-certs": KEYS,
    "--enable-lora": READS_FILE,
    "--lora-modules": READS_FILE,
    "--speculative-config": READS_FILE,
    "--download-dir": READS_FILE,
    "--tokenizer": FETCHES,
    "--revision": FETCHES,
    "--code-revision": FETCHES,
    "--tokenizer-revision": FETCHES,
    "--allowed-local-media-path": READS_FILE,
    "--allowed-media-domains": FETCHES,
    "--load-format": READS_FILE,
}

SHORT = {
    "-tp": "--tensor-parallel-size",
    "-pp": "--pipeline-parallel-size",
    "-q": "--quantization",
    "-O": "--optimization-level",  # vLLM's parser rewrites -O<n> to --optimization-level <n> (argparse_utils.py)
    "-cc": "--compilation-config",
    "-dp": "--data-parallel-size",
    "-n": "--nnodes",
    "-r": "--node-rank",
}


@dataclass(frozen=True)
class Vllm(PagedProvider):
    """vLLM: takes 90% of each GPU (or the share engine_config.memory.request asks for) and pages its KV cache
    between requests; tensor parallel across GPUs."""

    def argv(self, run: Run) -> list[str]:
        return self._serve_argv(run, None, 0)

    def _serve_argv(self, run: Run, group: Group | None, rank: int) -> list[str]:
        """`vllm serve` for one machine (group None) or for member `rank` of a group: the workers (rank > 0) run
        headless, so they take no API flags (--host, --port, the chat template's file)."""
        plan = run.plan
        argv = [
            run.executable, "serve", run.model_path,
            "--served-model-name", run.deployment,
            "--max-model-len", str(plan.context_length),
            "--max-num-seqs", str(plan.parallel),
            "--gpu-memory-utilization", f"{self.memory_fraction(run):.2f}",
        ]  # fmt: skip
        if group is not None:
            argv += vllm_group_flags(plan.gpus, group, rank)
        elif plan.gpus > 1:
            argv += ["--tensor-parallel-size", str(plan.gpus)]
        if plan.kind == "embedding":
            argv += ["--runner", "pooling", "--convert", "embed"]
        if "tools" in run.model.capabilities and run.model.tool_call_parser:
            argv += ["--enable-auto-tool-choice", self.parser_flags["tool_call_parser"], run.model.tool_call_parser]
        if run.model.reasoning_parser:
            argv += [self.parser_flags["reasoning_parser"], run.model.reasoning_parser]
        if rank == 0:
            argv += chat_template_argv(run, "--chat-template", "--chat-template")
            argv += ["--host", run.bind_address, "--port", str(run.port)]
        return argv + self.sleep_launch(run)[0] + self.engine_args_argv(run.engine_args)

    # --- a replica over several machines: vLLM's multi-node serving with multiprocessing ----------------
    multi_node: ClassVar[bool] = True
    # A --headless worker opens no port engine-ctl names: it dials the head's --master-port (torch.distributed's
    # TCPStore client) and its engine processes take ports the OS gives them (ZeroMQ, NCCL).
    worker_listens_before_head: ClassVar[bool] = False

    def group_head_argv(self, run: Run, group: Group) -> list[str]:
        return self._serve_argv(run, group, 0)

    def group_worker_argv(self, run: Run, group: Group, rank: int) -> list[str]:
        group.check_rank(rank)
        return self._serve_argv(run, group, rank)

    def group_environment(self, run: Run, group: Group, rank: int) -> dict[str, str]:
        # VLLM_HOST_IP: the address this member's processes give the others (vllm/utils/network_utils.py get_ip;
        # the head's message queue to the workers binds on it, v1/executor/multiproc_executor.py); without it vLLM
        # guesses from the default route. The socket interfaces: docs/serving/parallelism_scaling.md ("Optimizing
        # network communication" and its troubleshooting: GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME).
        group.check_rank(rank, head=True)
        env = {**self.environment(run), "VLLM_HOST_IP": group.addresses[rank]}
        if group.interface:
            env |= {"NCCL_SOCKET_IFNAME": group.interface, "GLOO_SOCKET_IFNAME": group.interface}
        return env

    # vLLM requires `Authorization: Bearer <VLLM_API_KEY>` on /v1 and leaves /health open (vllm/entrypoints/openai/
    # api_server.py, "if token := args.api_key or envs.VLLM_API_KEY"); one key only from the environment.
    internal_key_env: ClassVar[str | None] = "VLLM_API_KEY"

    def environment(self, run: Run) -> dict[str, str]:
        env = {"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", **gpu_env(run)}
        return {**env, **cache_env(run, "VLLM_CACHE_ROOT"), **self.sleep_launch(run)[1]}

    def version_probe(self) -> dict[str, object]:
        """How the facts probe reads the installed version without starting the engine."""
        return {"kind": "python_dist", "dist": "vllm"}


def vllm_group_flags(gpus_per_node: int, group: Group, rank: int) -> list[str]:
    """The flags of member `rank` of a group, as vLLM 0.30.0's docs/serving/parallelism_scaling.md ("Running vLLM
    with MultiProcessing", https://docs.vllm.ai/en/v0.30.0/serving/parallelism_scaling.html) gives them: every node
    runs the same `vllm serve` with --nnodes, its --node-rank and the head's --master-addr (the workers add
    --headless). Sizes per that page's rule for multi-node: tensor parallel = the GPUs of one node (NVLink inside a
    machine), pipeline parallel = the nodes (only activations cross the network); vLLM requires that --nnodes
    divide tp x pp (engine/arg_utils.py create_engine_config), which this keeps. --master-port is the group's
    rendezvous port (vLLM's default, 29501, is not checked free). --distributed-executor-backend mp: vLLM picks mp
    for nnodes > 1 by itself on CUDA only (config/parallel.py); on ROCm it would refuse the world size."""
    flags = ["--tensor-parallel-size", str(max(gpus_per_node, 1)), "--pipeline-parallel-size", str(group.nodes)]
    flags += ["--distributed-executor-backend", "mp", "--nnodes", str(group.nodes), "--node-rank", str(rank)]
    flags += ["--master-addr", group.head, "--master-port", str(group.ports[0])]
    return flags + (["--headless"] if rank > 0 else [])


def _vllm_wake(level: int) -> tuple[HttpCall, ...]:
    """Level 1 wakes with one call. Level 2 dropped the weights: wake the weights' memory, reload them from the
    checkpoint, then the KV cache (vLLM's sleep-mode docs, "Level 2 sleep" with tags)."""
    if level == 1:
        return (HttpCall("POST", "/wake_up"),)
    reload = HttpCall("POST", "/collective_rpc", '{"method": "reload_weights"}')
    return HttpCall("POST", "/wake_up?tags=weights"), reload, HttpCall("POST", "/wake_up?tags=kv_cache")


VLLM_SLEEP = SleepControls(
    # vLLM's sleep mode (docs.vllm.ai, features/sleep_mode): launched with --enable-sleep-mode, and the HTTP
    # endpoints exist with VLLM_SERVER_DEV_MODE=1: POST /sleep?level=N, POST /wake_up, GET /is_sleeping.
    sleep=lambda level: (HttpCall("POST", f"/sleep?level={level}"),),
    wake=_vllm_wake,
    asleep=HttpCall("GET", "/is_sleeping"),
    asleep_key="is_sleeping",
    launch_argv=("--enable-sleep-mode",),
    launch_env={"VLLM_SERVER_DEV_MODE": "1"},
)


VLLM = Vllm(
    name="vllm",
    title="vLLM",
    formats=frozenset({"safetensors"}),
    auto_for_format="safetensors",
    platforms=frozenset({"nvidia", "amd"}),
    allowed_flags=ALLOWED,
    deployment_flags=SET_BY_DEPLOYMENT,
    refused_flags=REFUSED,
    short_flags=SHORT,
    in_flight_metric="vllm:num_requests_running",
    token_metrics=("vllm:prompt_tokens_total", "vllm:generation_tokens_total"),
    parser_flags={"tool_call_parser": "--tool-call-parser", "reasoning_parser": "--reasoning-parser"},
    tool_choice_flags=("--enable-auto-tool-choice",),
    # vLLM's HTTP server starts once its engine has loaded the model; a 503 from /health then means the engine
    # died, not that it is loading: no loading answer.
    loading_statuses=frozenset(),
    default_context_cap=32768,
    serves_decisions=False,
    release=RELEASE,  # seed 001: "vLLM v0.30.0"
    default_executable="/usr/local/bin/vllm",
    jit_compiles=True,
    tp_must_divide_heads=True,
    startup_budget_s=1200,
    cache_type_flags=("--kv-cache-dtype", "--kv-cache-dtype"),
    gpu_memory_fraction=GPU_MEMORY_UTILIZATION,
    amd_without_build=PAGED_AMD_WITHOUT_BUILD,
    rocm_gfx=ROCM_GFX_PAGED,
    sleep_controls=VLLM_SLEEP,
)
