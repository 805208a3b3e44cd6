"""Which hosts may run a decisions deployment (seed 003, Decision models): those whose engine build serves
decision models, by the version the facts report (llama.cpp 0.7.0 or newer, SGLang 0.5.22 or newer) or by the
inventory's registration of the build (engines.<engine>.decisions: true). An older one is never chosen, and
naming it is refused with host_capability_missing:decisions. Pure."""

from __future__ import annotations

from collections.abc import Mapping

from engine_ctl.core.decisions import meets_floor, shown_version
from engine_ctl.core.documents.inventory import Host
from engine_ctl.core.fit.hostfacts import HostFacts
from engine_ctl.core.plan.engines import build_for, engine_at, host_platform
from engine_ctl.providers import Provider

HOST_CAPABILITY_MISSING = "host_capability_missing:decisions"


def decisions_refusal(provider: Provider, accelerator: str, facts: HostFacts, host: Host) -> str | None:
    """Why this host's build of the engine cannot serve decision models (None: it can, or there is no build to
    judge, which engine_refusals reports already)."""
    if host.engine_decisions.get(provider.name):
        return None
    path = build_for(provider, host, host_platform(provider, accelerator, facts))
    found = engine_at(facts, path) if path else None
    if path is None or provider.decisions_min_version is None:
        return None
    said = found.version if found else None
    if meets_floor(said, provider.decisions_min_version):
        return None
    return (f"{HOST_CAPABILITY_MISSING}: {provider.title} at {path} on {facts.host} is version {shown_version(said)}; "
            f"decision models need {provider.decisions_min_version} or newer (register a build that serves "
            f"POST /v1/systemone with engines.{provider.name}.decisions: true in the inventory)")  # fmt: skip


def decisions_refusals(
    provider: Provider, accelerator: str, hosts: list[HostFacts], inventory: Mapping[str, Host]
) -> dict[str, str]:
    """host -> why no replica of a decisions deployment is placed there."""
    out = {}
    for facts in hosts:
        why = decisions_refusal(provider, accelerator, facts, inventory[facts.host])
        if why:
            out[facts.host] = why
    return out
