"""The documents' descriptions that name engines, built from the provider registry's answers (so that the
schema an editor shows lists every registered engine, and only those). Pure."""

from __future__ import annotations

from engine_ctl import providers as registry
from engine_ctl.core.model import FORMAT_TITLES


def _or(words: list[str]) -> str:
    """'a', 'a or b', 'a, b or c'."""
    return " or ".join([", ".join(words[:-1]), words[-1]] if len(words) > 2 else words)


def engine_description() -> str:
    """auto (the model's: <format> → <the engine auto picks>, …), then every engine's name."""
    picks = [f"{FORMAT_TITLES[p.auto_for_format]} → {p.name}" for p in registry.PROVIDERS.values() if p.auto_for_format]
    return f"auto (the model's: {', '.join(picks)}), {_or(list(registry.PROVIDERS))}."


def flat_engine_description() -> str:
    """Every engine as the flat form writes it (its first alias, or its name), then auto."""
    names = [f"{p.aliases[0]} (or {p.name})" if p.aliases else p.name for p in registry.PROVIDERS.values()]
    return _or([*names, registry.AUTO]) + "."


def cpu_description() -> str:
    cpu = registry.cpu_provider()
    return f"{cpu.title} and {' and '.join(FORMAT_TITLES[f] for f in sorted(cpu.formats))} only."


def _grouped(texts: list[tuple[str, str]]) -> str:
    """[(engine title, its default)] -> 'A x; B and C y', engines with one default named together."""
    by_text: dict[str, list[str]] = {}
    for title, text in texts:
        by_text.setdefault(text, []).append(title)
    return "; ".join(f"{' and '.join(titles)} {text}" for text, titles in by_text.items())


def context_defaults() -> str:
    caps = [(p.title, f"the model's, at most {p.default_context_cap}") for p in registry.PROVIDERS.values()]
    return f"Default: {_grouped(caps)}."


def _parallel_text(candidates: tuple[int, ...]) -> str:
    first, *lower = candidates
    if not lower:
        return str(first)
    return f"{first}, lowered to {_or([str(n) for n in lower])} when that is what fits"


def parallel_defaults() -> str:
    texts: list[tuple[str, str]] = []
    for p in registry.PROVIDERS.values():
        gpu = _parallel_text(p.parallel_candidates("gpu"))
        cpu = _parallel_text(p.parallel_candidates("cpu")) if p.runs_on("cpu") else gpu
        texts += [(p.title, gpu)] if cpu == gpu else [(p.title, f"on a GPU {gpu}"), (p.title, f"on a CPU {cpu}")]
    return f"Default: {_grouped(texts)}."


def format_description() -> str:
    """Each format with the engines that serve it."""
    return _or([f"{f} ({registry.titles(registry.serving(f))})" for f in registry.formats()]) + "."


def parser_description(field: str, what: str) -> str:
    """The engines that take the model's parser (a flag for it), then what it is."""
    engines = [p for p in registry.PROVIDERS.values() if field in p.parser_flags]
    return f"{registry.titles(engines, '/')}: the {what} parser."
