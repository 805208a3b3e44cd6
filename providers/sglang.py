"""SGLang's server (`python -m sglang.launch_server`), with an allow-list in the seed's spirit."""

from __future__ import annotations

from engine_ctl.providers.base import FETCHES, KEYS, OPENS, READS_FILE, Provider

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

SGLANG = Provider(
    name="sglang",
    formats=frozenset({"safetensors"}),
    auto_for_format=None,
    platforms=frozenset({"nvidia", "amd"}),
    allowed_flags=ALLOWED,
    deployment_flags=SET_BY_DEPLOYMENT,
    refused_flags=REFUSED,
    short_flags=SHORT,
    in_flight_metric="sglang:num_running_reqs",
    default_context_cap=32768,
    serves_decisions=True,
)
