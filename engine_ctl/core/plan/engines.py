"""Engine builds, pinned: which build of an engine each host runs (one per platform, chosen by the seed's
GPU-vendors table), hosts left out when they have none or it is not the pinned one, what each replica runs
(version and sha256 of the binary, from the facts) and an engine changed under a deployment as drift. Pure."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING

from engine_ctl.core.decisions import shown_version
from engine_ctl.core.documents.inventory import Host
from engine_ctl.core.fit.hostfacts import EngineInstall, HostFacts
from engine_ctl.core.record.model import MemberRecord, ReplicaRecord
from engine_ctl.providers import Provider

if TYPE_CHECKING:
    from engine_ctl.core.plan.changes import Plan


def host_platform(provider: Provider, accelerator: str, facts: HostFacts) -> str | None:
    """The platform whose build runs a replica on this host: cpu, or its GPUs' build (None: none runs there)."""
    if accelerator == "cpu" or not facts.gpus:
        return provider.build_platform(None)
    return provider.build_platform(facts.gpus[0])


def build_for(provider: Provider, host: Host, platform: str | None) -> str | None:
    """The executable the inventory names for this platform; None when it names builds but not this one."""
    builds = host.engine_builds.get(provider.name)
    if builds:
        return builds.get(platform or "")
    return host.engines.get(provider.name) or provider.default_executable


def engine_at(facts: HostFacts, path: str) -> EngineInstall | None:
    """What the facts found at an executable path (a build, the engine found on its own, or a binary a group's
    worker runs beside a build)."""
    found = [*facts.engines.values(), *(b for builds in facts.engine_builds.values() for b in builds.values()),
             *facts.worker_engines.values()]  # fmt: skip
    return next((e for e in found if e.path == path), None)


def engine_refusals(
    provider: Provider, accelerator: str, hosts: list[HostFacts], inventory: Mapping[str, Host]
) -> dict[str, str]:
    """host -> why no replica of this engine is placed there: no build for its GPUs, or not the pinned one."""
    out: dict[str, str] = {}
    for facts in hosts:
        host = inventory[facts.host]
        platform = host_platform(provider, accelerator, facts)
        if platform is None:  # B29: no build of this engine runs here at all (never "add engines.<engine>.None")
            why = provider.gpu_refusal(facts.gpus[0]) if facts.gpus else f"{provider.title} needs a GPU"
            out[facts.host] = f"no {provider.title} build runs on {facts.host}: {why or 'no build for its GPUs'}"
            continue
        path = build_for(provider, host, platform)
        if path is None:
            named = ", ".join(sorted(host.engine_builds.get(provider.name, {}))) or "none"
            out[facts.host] = (f"no {provider.title} build for {platform} on {facts.host} (the inventory names: "
                               f"{named}); add engines.{provider.name}.{platform}")  # fmt: skip
            continue
        why = pin_refusal(provider, host, facts, path)
        if why:
            out[facts.host] = why
    return out


def pin_refusal(provider: Provider, host: Host, facts: HostFacts, path: str) -> str | None:
    pins = host.engine_pins.get(provider.name) or {}
    if not pins.get("version"):
        why = release_refusal(provider, facts, path)
        if why or not pins:
            return why
    found = engine_at(facts, path)
    if found is None:
        return f"the pinned {provider.title} build {path} is not on {facts.host}"
    version, digest = pins.get("version"), pins.get("sha256")
    if version and not re.search(rf"(?<![\w.]){re.escape(version)}(?![\w.])", found.version or ""):
        said = found.version or "unknown"
        return f"{provider.title} at {path} on {facts.host} is version {said}, not the pinned {version}"
    if digest and found.sha256 != digest:
        return (f"{provider.title} at {path} on {facts.host} has sha256 {(found.sha256 or 'unknown')[:12]}…, not the "
                f"pinned {digest[:12]}…")  # fmt: skip
    return None


def release_refusal(provider: Provider, facts: HostFacts, path: str) -> str | None:
    """Seed 001: the engines run the seed's releases (the provider's `release`); a build that reports another
    version runs only where the inventory pins that version. A build whose version is not known is not refused."""
    found = engine_at(facts, path)
    said = shown_version(found.version if found else None)
    if provider.release is None or said == "unknown" or said.removeprefix("v") == provider.release:
        return None
    return (f"{provider.title} at {path} on {facts.host} is version {said}, not the release engine-ctl runs by "
            f"default ({provider.release}): pin it in the inventory to run it (engines.{provider.name}.version: "
            f"{said})")  # fmt: skip


def engine_drift_detail(record: ReplicaRecord, facts: HostFacts) -> str | None:
    """Why the engine under a recorded replica is not the one it was applied with (None: the same one)."""
    return _changed(record.argv, record.engine_sha256, record.engine_version, f"on {record.host}", facts,
                    "the replica restarts onto it")  # fmt: skip


def member_engine_drift_detail(name: str, record: ReplicaRecord, member: MemberRecord, facts: HostFacts) -> str | None:
    """Why the binary a group's worker runs is not the one it was applied with (None: the same one, or a member
    recorded before members recorded it): drift of the whole replica, which restarts onto it."""
    where = f"on {member.host} (worker {member.rank} of {name} replica {record.index})"
    then = "the group restarts onto it"
    return _changed(member.argv, member.engine_sha256, member.engine_version, where, facts, then)


def _changed(argv: list[str], sha: str, version: str | None, where: str, facts: HostFacts, then: str) -> str | None:
    """'the engine at PATH WHERE changed: version … → …; THEN' when the build at argv[0] is not the recorded one
    (None: the same, or nothing recorded to compare): another binary (its sha256), or another version where the
    binary is a launcher whose bytes do not change (a Python engine's console script or interpreter: a `pip
    install` of another release into the same environment)."""
    if not sha or not argv:
        return None
    now = engine_at(facts, argv[0])
    if now is None:
        return None
    other_binary = now.sha256 is not None and now.sha256 != sha
    was, said = shown_version(version), shown_version(now.version)  # x.y[.z] or "unknown": never a partial output
    other_version = "unknown" not in (was, said) and was.removeprefix("v") != said.removeprefix("v")
    if not (other_binary or other_version):
        return None
    return (f"the engine at {argv[0]} {where} changed: version {version or 'unknown'} (sha256 {sha[:12]}…) → "
            f"{now.version or 'unknown'} (sha256 {(now.sha256 or 'unknown')[:12]}…); {then}")  # fmt: skip


def recorded_version(said: str | None) -> str | None:
    """What a replica records of its engine's --version output: the version itself, else its first line."""
    if not said or not said.strip():
        return None
    shown = shown_version(said)
    return shown if shown != "unknown" else said.strip().splitlines()[0][:200]


def with_engines(plan: Plan, facts: Mapping[str, HostFacts]) -> Plan:
    """Each replica the plan starts or restarts, with the version and sha256 of the build it runs (argv[0]), and
    each of its group's workers with those of the binary it runs."""
    for change in plan.changes:
        for step in change.replicas:
            if step.action == ["delete"] or not step.argv or step.host not in facts:
                continue
            found = engine_at(facts[step.host], step.argv[0])
            if found is not None:
                # B38: the version itself, not the whole multi-line --version output
                version = recorded_version(found.version)
                step.engine_version, step.engine_sha256 = version, found.sha256 or ""
            for m in step.members:  # a group's workers: the binary each runs on its own host
                worker = engine_at(facts[m.host], m.argv[0]) if m.argv and m.host in facts else None
                if worker is not None:
                    m.engine_version, m.engine_sha256 = recorded_version(worker.version), worker.sha256 or ""
    return plan
