"""Model facts from a real GGUF file, and the KV estimate against the size the real llama-server reports."""

from __future__ import annotations

import re
import socket
import subprocess
import time
from pathlib import Path

from engine_ctl.providers import provider

from engine_ctl.core.fit.fitting import kv_bytes_per_token
from tests.gguf_reader import read_gguf
from tests.llama import llama_server_dir, tiny_model


def test_gguf_metadata_of_the_tiny_real_model() -> None:
    facts = read_gguf(tiny_model())
    assert facts.architecture == "llama"
    assert (facts.block_count, facts.head_count, facts.head_count_kv, facts.embedding_length) == (2, 4, 2, 64)
    assert facts.context_length == 2048 and facts.file_type == "F32"
    assert facts.head_dims == (16, 16)
    size = tiny_model().stat().st_size
    assert facts.weights_bytes is not None and 0.9 * size < facts.weights_bytes <= size
    assert facts.parameters is not None and facts.parameters > 4_000_000


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _reported_kv_bytes(context: int, parallel: int, cache_type: str) -> int:
    port = _free_port()
    argv = [
        str(llama_server_dir() / "bin" / "llama-server"), "--model", str(tiny_model()),
        "--ctx-size", str(context * parallel), "--parallel", str(parallel), "--host", "127.0.0.1",
        "--port", str(port), "--threads", "2", "--no-webui", "--log-verbosity", "4",
        "--cache-type-k", cache_type, "--cache-type-v", cache_type,
    ]  # fmt: skip
    if cache_type != "f16":
        argv += ["--flash-attn", "on"]  # quantized V cache needs flash attention
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 60
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            match = re.search(r"llama_kv_cache: size =\s+([\d.]+) MiB", line)
            if match:
                return int(float(match.group(1)) * 1024 * 1024)
            if time.monotonic() > deadline:
                break
    finally:
        proc.kill()
        proc.wait()
    raise AssertionError("llama-server did not report its KV cache size:\n" + "".join(lines[-30:]))


def test_kv_estimate_within_10_percent_of_what_llama_server_reports() -> None:
    facts = read_gguf(tiny_model())
    llama = provider("llama.cpp")
    for context, parallel, cache in ((1024, 2, "f16"), (2048, 4, "f16"), (2048, 2, "f32")):
        estimate = kv_bytes_per_token(facts, cache, cache, llama) * llama.cache_tokens(context, parallel)
        reported = _reported_kv_bytes(context, parallel, cache)
        assert abs(estimate - reported) <= 0.10 * reported, (context, parallel, cache, estimate, reported)


def test_llama_server_version_runs() -> None:
    out = subprocess.run(
        [str(llama_server_dir() / "bin" / "llama-server"), "--version"], capture_output=True, text=True, check=False
    )
    assert "version:" in (out.stdout + out.stderr)


def test_tiny_model_is_cached_outside_the_repo() -> None:
    assert not str(tiny_model()).startswith(str(Path(__file__).resolve().parents[1]))
