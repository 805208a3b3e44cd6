"""Engine providers: everything engine-specific lives here, one module per engine.

The registry answers the questions the rest of engine-ctl asks about engines as a whole: which names the
documents accept, which engine `auto` picks, which engines serve decisions, which engine_config keys exist.
Adding an engine is one module under providers/ and its line in `PROVIDERS` (or `register` before the documents'
models are built: they take the engine names and engine-only options from here when first imported).
"""

from __future__ import annotations

from collections.abc import Iterable

from engine_ctl.providers.base import EngineOption, Provider
from engine_ctl.providers.llamacpp import LLAMACPP
from engine_ctl.providers.sglang import SGLANG
from engine_ctl.providers.vllm import VLLM

PROVIDERS: dict[str, Provider] = {p.name: p for p in (LLAMACPP, VLLM, SGLANG)}
AUTO = "auto"
NON_ENGINE_EXECUTABLES = ("haproxy",)
"""Executables an inventory's `engines:` may name that are no engine (the gateway's)."""

_sealed: list[str] = []


def register(p: Provider) -> None:
    """Add an engine. Only before the documents' models are built (they list the engines then)."""
    if _sealed:
        raise RuntimeError(f"provider {p.name!r} registered after {_sealed[0]} was built from the registry")
    taken = set(engine_choices())
    if {p.name, *p.aliases} & taken:
        raise ValueError(f"engine name {p.name!r} or one of its aliases {p.aliases} is taken: {sorted(taken)}")
    PROVIDERS[p.name] = p


def seal(by: str) -> None:
    """Called by what is built from the registry once (the documents' models): later registrations fail loudly."""
    _sealed.append(by)


def canonical_engine(name: str) -> str:
    """An alias ('llamacpp') -> the engine's name ('llama.cpp'); any other name, 'auto' too, stays."""
    return next((p.name for p in PROVIDERS.values() if name in p.aliases), name)


def provider(name: str) -> Provider:
    return PROVIDERS[canonical_engine(name)]


def engine_choices() -> tuple[str, ...]:
    """What a document's `engine:` accepts: auto, then each engine's name and its aliases."""
    return (AUTO, *engine_keys())


def engine_keys() -> tuple[str, ...]:
    """Each engine's name followed by its aliases, in registry order."""
    return tuple(n for p in PROVIDERS.values() for n in (p.name, *p.aliases))


def provider_for_format(fmt: str) -> Provider:
    """The engine `auto` picks for a model format: GGUF -> llama.cpp, safetensors -> vLLM."""
    for p in PROVIDERS.values():
        if p.auto_for_format == fmt:
            return p
    raise KeyError(fmt)


def cpu_provider() -> Provider:
    """The engine `auto` picks for a CPU-only deployment."""
    return next(p for p in PROVIDERS.values() if p.auto_for_cpu)


def formats() -> tuple[str, ...]:
    """Every model format some engine serves, in registry order."""
    return tuple(dict.fromkeys(f for p in PROVIDERS.values() for f in sorted(p.formats)))


def serving(fmt: str) -> list[Provider]:
    return [p for p in PROVIDERS.values() if fmt in p.formats]


def decision_providers() -> list[Provider]:
    return [p for p in PROVIDERS.values() if p.serves_decisions]


def engine_options() -> list[EngineOption]:
    """Every engine-only engine_config key, sorted by key (one key, one engine)."""
    return sorted((o for p in PROVIDERS.values() for o in p.options), key=lambda o: o.key)


def deployment_option_keys() -> frozenset[str]:
    """The engine-only keys a deployment carries (not those that name the model's file)."""
    return frozenset(o.key for o in engine_options() if o.model_file is None)


def recorded_unset_keys() -> tuple[str, ...]:
    return tuple(o.key for o in engine_options() if o.model_file is None and o.recorded_when_unset)


def titles(providers: Iterable[Provider], sep: str = ", ") -> str:
    return sep.join(p.title for p in providers)


__all__ = [
    "AUTO",
    "PROVIDERS",
    "EngineOption",
    "Provider",
    "canonical_engine",
    "cpu_provider",
    "decision_providers",
    "deployment_option_keys",
    "engine_choices",
    "engine_keys",
    "engine_options",
    "formats",
    "provider",
    "provider_for_format",
    "recorded_unset_keys",
    "register",
    "seal",
    "serving",
    "titles",
]
