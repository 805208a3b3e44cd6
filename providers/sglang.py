"""SGLang's server (`python -m sglang.launch_server`), with an allow-list in the seed's spirit."""

from __future__ import annotations

from dataclasses import dataclass

from engine_ctl.providers.base import (
    FETCHES,
    KEYS,
    OPENS,
    PAGED_AMD_WITHOUT_BUILD,
    READS_FILE,
    ROCM_GFX_PAGED,
    EngineOption,
    PagedProvider,
    chat_template_argv,
    gpu_env,
)

from engine_ctl.core.fit.runspec import ReplicaRun

MEM_FRACTION_STATIC = 0.88

ALLOWED = (
    "--dtype", "--quantization", "--kv-cache-dtype", "--chunked-prefill-size", "--max-prefill-tokens",
    "--schedule-policy", "--schedule-conservativeness", "--disable-radix-cache", "--disable-cuda-graph",
    "--cuda-graph-max-bs", "--enable-torch-compile", "--torch-compile-max-bs", "--attention-backend",
    "--sampling-backend", "--random-seed", "--tool-call-parser", "--reasoning-parser", "--max-total-tokens",
    "--stream-interval", "--log-level", "--enable-mixed-chunk", "--enable-dp-attention",
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
    "--mem-fraction-static": "engine_config.memory.request",
    "--enable-metrics": "the deployment",
    "--is-embedding": "the model's capabilities",
    "--chat-template": "the model's chat_template",
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

SHORT = {"-tp": "--tp-size"}

CUDA_GRAPHS = EngineOption(
    key="cuda_graphs",
    annotation=bool | None,
    description="SGLang: CUDA graphs (on by default).",
    recorded_when_unset=True,
)


@dataclass(frozen=True)
class SgLang(PagedProvider):
    """SGLang: `python -m sglang.launch_server`; a static memory fraction of each GPU for weights and KV."""

    def argv(self, run: ReplicaRun) -> list[str]:
        plan = run.plan
        argv = [
            run.executable, "-m", "sglang.launch_server",
            "--model-path", run.model_path,
            "--served-model-name", run.deployment,
            "--context-length", str(plan.context_length),
            "--max-running-requests", str(plan.parallel),
            "--mem-fraction-static", f"{self.memory_fraction(run):.2f}",
        ]  # fmt: skip
        if plan.gpus > 1:
            argv += ["--tp-size", str(plan.gpus)]
        if plan.kind == "embedding":
            argv += ["--is-embedding"]
        if "tools" in run.model.capabilities and run.model.tool_call_parser:
            argv += [self.parser_flags["tool_call_parser"], run.model.tool_call_parser]
        if run.model.reasoning_parser:
            argv += [self.parser_flags["reasoning_parser"], run.model.reasoning_parser]
        if run.engine_options.get(CUDA_GRAPHS.key) is False:
            argv += ["--disable-cuda-graph"]
        argv += chat_template_argv(run, "--chat-template", "--chat-template")
        argv += ["--enable-metrics", "--host", run.bind_address, "--port", str(run.port)]
        return argv + self.engine_args_argv(run.engine_args)

    def environment(self, run: ReplicaRun) -> dict[str, str]:
        return {"HF_HUB_OFFLINE": "1", "SGLANG_DISABLE_USAGE_STATS": "1", "DO_NOT_TRACK": "1", **gpu_env(run)}

    def version_probe(self) -> dict[str, object]:
        """How the facts probe reads the installed version without starting the engine."""
        return {"kind": "python_dist", "dist": "sglang"}


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
)
