"""The provider interface: the questions engine-ctl asks of an engine."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

# Why a class of flags is refused by design (seed 000, "Not allowed, by design").
READS_FILE = "reads a file on the host (adapters, grammars, templates, draft models are not allowed, by design)"
FETCHES = "fetches from the network (not allowed, by design)"
KEYS = "keys and certificates are not passed as engine arguments (not allowed, by design)"
OPENS = "opens the server further (not allowed, by design)"


@dataclass(frozen=True)
class Provider:
    """An engine: its formats, platforms, flags and rules. Subclasses add argv and environment."""

    name: str
    formats: frozenset[str]
    auto_for_format: str | None
    platforms: frozenset[str]
    """Where it runs: nvidia, amd, cpu."""
    allowed_flags: tuple[str, ...]
    deployment_flags: Mapping[str, str]
    """Flags the deployment sets -> where to set them instead."""
    refused_flags: Mapping[str, str]
    """Flags refused by design -> why."""
    short_flags: Mapping[str, str] = field(default_factory=dict)
    """Short forms -> long forms, to name the long form in a refusal."""
    health_path: str = "/health"
    metrics_path: str = "/metrics"
    in_flight_metric: str = ""
    default_context_cap: int = 8192
    serves_decisions: bool = False

    def runs_on(self, platform: str) -> bool:
        return platform in self.platforms
