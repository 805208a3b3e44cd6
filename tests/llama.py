"""The real llama-server built by tests/tools/build_llama_server.sh (cached outside the repo)."""

from __future__ import annotations

import os
import struct
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


LLAMA_VERSION = "0.6.0-dev"
"""What the built llama-server's --version says (`version: 0.6.0-dev (build 0, commit unknown)`): not the seed's
release (0.5.0), so an inventory that runs it pins this version (engines.llama.cpp.version)."""


def llama_engine() -> dict[str, str]:
    """The inventory's engines.llama.cpp entry for the built llama-server: its path, with its version pinned."""
    return {"path": str(llama_server_dir() / "bin" / "llama-server"), "version": LLAMA_VERSION}


@cache
def llama_rpc_dir() -> Path:
    """The cache directory with an RPC-enabled bin/llama-server and bin/ggml-rpc-server (llama.cpp's RPC backend, built
    with -DGGML_RPC=ON under its own cache key); builds it once per machine if missing."""
    env_dir = os.environ.get("ENGINE_CTL_LLAMA_RPC_DIR")
    if env_dir and (Path(env_dir) / "bin" / "ggml-rpc-server").exists():
        return Path(env_dir)
    out = subprocess.run(
        ["bash", str(ROOT / "tests/tools/build_llama_server.sh"), "--rpc"], capture_output=True, text=True, check=True
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


def wrong_shape_model() -> Path:
    """The tiny model with one tensor's two dimensions swapped: whole, every tensor within the file (the facts
    probe finds nothing wrong with it), and refused by llama-server at load ("tensor 'token_embd.weight' has wrong
    shape"): a replica that cannot start, for the tests of a failed start."""
    src = tiny_model()
    out = src.with_name("tiny-llama-wrong-shape.gguf")
    if out.exists():
        return out
    data = bytearray(src.read_bytes())
    at = 4 + 4  # magic, version
    n_tensors, n_kv = struct.unpack_from("<QQ", data, at)
    at += 16

    def string(pos: int) -> int:
        (n,) = struct.unpack_from("<Q", data, pos)
        return pos + 8 + n

    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

    def value(pos: int, kind: int) -> int:
        if kind == 8:
            return string(pos)
        if kind == 9:
            item, n = struct.unpack_from("<IQ", data, pos)
            pos += 12
            for _ in range(n):
                pos = value(pos, item)
            return pos
        return pos + sizes[kind]

    for _ in range(n_kv):
        at = string(at)
        (kind,) = struct.unpack_from("<I", data, at)
        at = value(at + 4, kind)
    for _ in range(n_tensors):
        (n,) = struct.unpack_from("<Q", data, at)
        name = bytes(data[at + 8 : at + 8 + n]).decode()
        at += 8 + n
        (n_dims,) = struct.unpack_from("<I", data, at)
        dims = list(struct.unpack_from(f"<{n_dims}Q", data, at + 4))
        if name == "token_embd.weight" and n_dims == 2 and dims[0] != dims[1]:
            struct.pack_into("<2Q", data, at + 4, dims[1], dims[0])
            tmp = out.with_suffix(".tmp")
            tmp.write_bytes(bytes(data))
            tmp.rename(out)
            return out
        at += 4 + 8 * n_dims + 4 + 8
    raise AssertionError(f"{src} has no 2-D token_embd.weight to reshape")
