"""The real llama-server built by tests/tools/build_llama_server.sh (cached outside the repo)."""

from __future__ import annotations

import os
import subprocess
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@cache
def llama_server_dir() -> Path:
    """The cache directory with bin/llama-server and models/; builds it once per machine if missing."""
    env_dir = os.environ.get("ENGINE_CTL_LLAMA_SERVER_DIR")
    if env_dir and (Path(env_dir) / "bin" / "llama-server").exists():
        return Path(env_dir)
    out = subprocess.run(
        ["bash", str(ROOT / "tests/tools/build_llama_server.sh")], capture_output=True, text=True, check=True
    )
    return Path(out.stdout.strip().splitlines()[-1])


@cache
def tiny_model() -> Path:
    """The tiny real GGUF model (made once per machine next to the llama-server cache)."""
    from tests.tools.make_tiny_model import make

    base = llama_server_dir()
    out = base / "models" / "tiny-llama-f32.gguf"
    if not out.exists():
        tmp = out.with_suffix(".tmp")
        make(base / "models" / "ggml-vocab-llama-spm.gguf", tmp)
        tmp.rename(out)
    return out
