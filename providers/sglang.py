"""SGLang's server (`python -m sglang.launch_server`), with an allow-list in the seed's spirit."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from engine_ctl.providers.base import (
    FETCHES,
    KEYS,
    OPENS,
    PAGED_AMD_WITHOUT_BUILD,
    READS_FILE,
    ROCM_GFX_PAGED,
    EngineOption,
    Group,
    HttpCall,
    PagedProvider,
    Run,
    SleepControls,
    chat_template_argv,
    gpu_env,
)

MEM_FRACTION_STATIC = 0.88

# The release the flags are checked against: the seed's floor for decision models (SGLang 0.5.22); its argument
# list is tests/engine_flags/sglang-0.5.22.txt (made by tests/tools/engine_flags.py from the release's own source).
RELEASE = "0.5.22"

ALLOWED = (
    "--dtype", "--quantization", "--kv-cache-dtype", "--chunked-prefill-size", "--max-prefill-tokens",
    "--schedule-policy", "--schedule-conservativeness", "--disable-radix-cache",
    "--cuda-graph-max-bs-decode", "--cuda-graph-max-bs-prefill",
    "--enable-torch-compile", "--torch-compile-max-bs", "--attention-backend",
    "--sampling-backend", "--random-seed", "--tool-call-parser", "--reasoning-parser", "--max-total-tokens",
    "--stream-interval", "--log-level", "--enable-mixed-chunk",
    "--num-continuous-decode-steps",
    "--disable-overlap-schedule", "--page-size", "--preferred-sampling-params",
)  # fmt: skip

SET_BY_DEPLOYMENT = {
    "--model-path": "the deployment",
    "--model": "the deployment",
    "--host": "the deployment",
    "--port": "the deployment",
    "--served-model-name": "the deployment's name",
    "--context-length": "spec.context_length",
    "--max-running-requests": "spec.parallel",
    "--tp-size": "spec.gpus (a replica is one machine's GPUs)",
    "--tensor-parallel-size": "spec.gpus (a replica is one machine's GPUs)",
    "--dp-size": "spec.replicas",
    "--pp-size": "spec.gpus and spec.nodes",
    "--pipeline-parallel-size": "spec.gpus and spec.nodes",
    "--nnodes": "spec.nodes",
    "--node-rank": "spec.nodes (each member's rank)",
    "--dist-init-addr": "spec.nodes (the head's address and a port from the inventory's range)",
    "--nccl-init-addr": "spec.nodes (the head's address and a port from the inventory's range)",
    "--mem-fraction-static": "engine_config.memory.request",
    "--enable-metrics": "the deployment",
    "--is-embedding": "the model's capabilities",
    "--chat-template": "the model's chat_template",
    "--cuda-graph-backend-decode": "engine_config.cuda_graphs",
    "--cuda-graph-backend-prefill": "engine_config.cuda_graphs",
    "--disable-cuda-graph": "engine_config.cuda_graphs",
}

REFUSED = {
    "--trust-remote-code": OPENS,
    "--api-key": OPENS,
    "--enable-lora": READS_FILE,
    "--lora-paths": READS_FILE,
    "--speculative-draft-model-path": READS_FILE,
    "--tokenizer-path": READS_FILE,
    "--download-dir": READS_FILE,
    "--revision": FETCHES,
    "--ssl-keyfile": KEYS,
    "--ssl-certfile": KEYS,
}

SHORT: dict[str, str] = {}  # SGLang 0.5.22 has no short flags but -h

CUDA_GRAPHS = EngineOption(
    key="cuda_graphs",
    annotation=bool | None,
    description="SGLang: CUDA graphs (on by default).",
    recorded_when_unset=True,
)


SGLANG_SLEEP = SleepControls(
    # SGLang's memory saver (its server arguments and http_server.py): launched with --enable-memory-saver, and
    # --enable-weights-cpu-backup so that the weights are copied to host RAM before their GPU memory is released
    # (output after resume is right); POST /release_memory_occupation and /resume_memory_occupation, body {}.
    sleep=lambda level: (HttpCall("POST", "/release_memory_occupation", "{}"),),
    wake=lambda level: (HttpCall("POST", "/resume_memory_occupation", "{}"),),
    launch_argv=("--enable-memory-saver", "--enable-weights-cpu-backup"),
)


@dataclass(frozen=True)
class SgLang(PagedProvider):
    """SGLang: `python -m sglang.launch_server`; a static memory fraction of each GPU for weights and KV."""

    def argv(self, run: Run) -> list[str]:
        return self._launch_argv(run, None, 0)

    def _launch_argv(self, run: Run, group: Group | None, rank: int) -> list[str]:
        """`python -m sglang.launch_server` for one machine (group None) or member `rank` of a group. A worker
        (rank > 0) keeps --host and --port: SGLang runs a health server there on non-zero ranks
        (entrypoints/engine.py, launch_dummy_health_check_server); the chat template is the head's alone (its
        tokenizer manager reads it)."""
        plan = run.plan
        argv = [
            run.executable, "-m", "sglang.launch_server",
            "--model-path", run.model_path,
            "--served-model-name", run.deployment,
            "--context-length", str(plan.context_length),
            "--max-running-requests", str(plan.parallel),
            "--mem-fraction-static", f"{self.memory_fraction(run):.2f}",
        ]  # fmt: skip
        if group is not None:
            argv += sglang_group_flags(plan.gpus, group, rank)
        elif plan.gpus > 1:
            argv += ["--tp-size", str(plan.gpus)]
        if plan.kind == "embedding":
            argv += ["--is-embedding"]
        if "tools" in run.model.capabilities and run.model.tool_call_parser:
            argv += [self.parser_flags["tool_call_parser"], run.model.tool_call_parser]
        if run.model.reasoning_parser:
            argv += [self.parser_flags["reasoning_parser"], run.model.reasoning_parser]
        if run.engine_options.get(CUDA_GRAPHS.key) is False:  # --disable-cuda-graph is deprecated in 0.5.22
            argv += ["--cuda-graph-backend-decode", "disabled", "--cuda-graph-backend-prefill", "disabled"]
        if rank == 0:
            argv += chat_template_argv(run, "--chat-template", "--chat-template")
        argv += ["--enable-metrics", "--host", run.bind_address, "--port", str(run.port)]
        if run.api_key_file:
            argv += self.api_key_argv(run.api_key_file)
        return argv + self.sleep_launch(run)[0] + self.engine_args_argv(run.engine_args)

    # --- a replica over several machines: SGLang's multi-node tensor parallel ------------------------------
    multi_node: ClassVar[bool] = True
    # A worker (node rank > 0) starts its health server only after its schedulers are ready, and they join the
    # head's --dist-init-addr first (srt/entrypoints/engine.py: wait_for_ready, then launch_dummy_health_check_server).
    worker_listens_before_head: ClassVar[bool] = False

    def tensor_parallel_size(self, gpus: int, nodes: int) -> int:
        """Tensor parallel spans the group (sglang_group_flags: --tp-size = GPUs per node x nodes)."""
        return gpus * nodes

    def group_head_argv(self, run: Run, group: Group) -> list[str]:
        return self._launch_argv(run, group, 0)

    def group_worker_argv(self, run: Run, group: Group, rank: int) -> list[str]:
        group.check_rank(rank)
        return self._launch_argv(run, group, rank)

    def group_environment(self, run: Run, group: Group, rank: int) -> dict[str, str]:
        # SGLANG_HOST_IP: the address this member gives the others (sglang/srt/utils/network.py,
        # get_local_ip_auto); the interfaces: SGLang's multi-node deployment page (NCCL_SOCKET_IFNAME and
        # GLOO_SOCKET_IFNAME when the nodes have several networks).
        group.check_rank(rank, head=True)
        env = {**self.environment(run), "SGLANG_HOST_IP": group.addresses[rank]}
        if group.interface:
            env |= {"NCCL_SOCKET_IFNAME": group.interface, "GLOO_SOCKET_IFNAME": group.interface}
        return env

    def api_key_argv(self, key_file: str) -> list[str]:
        # SGLang takes its key from --api-key only (in argv, which every local user may read); a YAML file named by
        # --config gives it the same way (sglang/srt/server_args_config_parser.py: keys are the flags' names), and
        # its middleware leaves /health and /metrics open (sglang/srt/utils.py, add_api_key_middleware).
        return ["--config", key_file]

    internal_key_credential: ClassVar[str | None] = "replica-key.yaml"

    def internal_key_text(self, keys: Sequence[str]) -> str:
        return f"api-key: {keys[0]}\n"

    def environment(self, run: Run) -> dict[str, str]:
        return {"HF_HUB_OFFLINE": "1", "SGLANG_DISABLE_USAGE_STATS": "1", "DO_NOT_TRACK": "1", **gpu_env(run)}

    def version_probe(self) -> dict[str, object]:
        """How the facts probe reads the installed version without starting the engine."""
        return {"kind": "python_dist", "dist": "sglang"}


def sglang_group_flags(gpus_per_node: int, group: Group, rank: int) -> list[str]:
    """The flags of member `rank` of a group, as SGLang's multi-node deployment page gives them
    (https://docs.sglang.io/references/multi_node_deployment/multi_node.html, "Run 405B (fp16) on Two Nodes": the
    same command on every node with --tp 16 over two nodes of 8 GPUs, --dist-init-addr of the first node,
    --nnodes and each node's --node-rank). So tensor parallel spans the group: --tp-size = GPUs per node x nodes
    (SGLang requires nnodes to divide tp x pp, arg_groups/validation_hook.py); --dist-init-addr is the head's
    address and the group's rendezvous port (an IPv6 address in brackets)."""
    head = f"[{group.head}]" if ":" in group.head else group.head
    return [
        "--tp-size", str(max(gpus_per_node, 1) * group.nodes),
        "--nnodes", str(group.nodes), "--node-rank", str(rank), "--dist-init-addr", f"{head}:{group.ports[0]}",
    ]  # fmt: skip


SGLANG = SgLang(
    name="sglang",
    title="SGLang",
    formats=frozenset({"safetensors"}),
    auto_for_format=None,
    platforms=frozenset({"nvidia", "amd"}),
    allowed_flags=ALLOWED,
    deployment_flags=SET_BY_DEPLOYMENT,
    refused_flags=REFUSED,
    short_flags=SHORT,
    in_flight_metric="sglang:num_running_reqs",
    token_metrics=("sglang:prompt_tokens_total", "sglang:generation_tokens_total"),
    parser_flags={"tool_call_parser": "--tool-call-parser", "reasoning_parser": "--reasoning-parser"},
    options=(CUDA_GRAPHS,),
    # SGLang's /health answers 503 while the server is still starting (ServerStatus.Starting in its http_server)
    loading_statuses=frozenset({"503"}),
    default_context_cap=32768,
    serves_decisions=True,
    decisions_min_version="0.5.22",
    default_executable="/usr/bin/python3",
    jit_compiles=True,
    tp_must_divide_heads=True,
    startup_budget_s=1200,
    cache_type_flags=("--kv-cache-dtype", "--kv-cache-dtype"),
    gpu_memory_fraction=MEM_FRACTION_STATIC,
    amd_without_build=PAGED_AMD_WITHOUT_BUILD,
    rocm_gfx=ROCM_GFX_PAGED,
    sleep_controls=SGLANG_SLEEP,
)
