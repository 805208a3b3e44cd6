"""vLLM's OpenAI-compatible server (seed 000)."""

from __future__ import annotations

from engine_ctl.providers.base import FETCHES, KEYS, OPENS, READS_FILE, Provider

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
    "--pipeline-parallel-size": "spec.gpus (a replica is one machine's GPUs)",
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
    "-O": "--compilation-config",
    "-dp": "--data-parallel-size",
}

VLLM = Provider(
    name="vllm",
    formats=frozenset({"safetensors"}),
    auto_for_format="safetensors",
    platforms=frozenset({"nvidia", "amd"}),
    allowed_flags=ALLOWED,
    deployment_flags=SET_BY_DEPLOYMENT,
    refused_flags=REFUSED,
    short_flags=SHORT,
    in_flight_metric="vllm:num_requests_running",
    default_context_cap=32768,
    serves_decisions=False,
)
