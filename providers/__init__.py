"""Engine providers: everything engine-specific lives here, one module per engine."""

from __future__ import annotations

from engine_ctl.providers.base import Provider
from engine_ctl.providers.llamacpp import LLAMACPP
from engine_ctl.providers.sglang import SGLANG
from engine_ctl.providers.vllm import VLLM

PROVIDERS: dict[str, Provider] = {p.name: p for p in (LLAMACPP, VLLM, SGLANG)}
ALIASES: dict[str, str] = {"llamacpp": "llama.cpp", "llama-cpp": "llama.cpp", "llama_cpp": "llama.cpp"}


def canonical_engine(name: str) -> str:
    """'llamacpp' -> 'llama.cpp'; 'auto' stays 'auto'."""
    return ALIASES.get(name, name)


def provider(name: str) -> Provider:
    return PROVIDERS[canonical_engine(name)]


def provider_for_format(fmt: str) -> Provider:
    """The engine `auto` picks for a model format: GGUF -> llama.cpp, safetensors -> vLLM."""
    for p in PROVIDERS.values():
        if p.auto_for_format == fmt:
            return p
    raise KeyError(fmt)


__all__ = ["ALIASES", "PROVIDERS", "Provider", "canonical_engine", "provider", "provider_for_format"]
