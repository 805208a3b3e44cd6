"""`engine-ctl engine list` and `engine add` (seed 003, "Add an engine"): the engines the inventory registers, with
their builds, versions and which hosts have them; and the inventory entry `engine add` writes, with the version
the hosts report recorded as the pin. Pure: the facts are gathered, and the file written, by the CLI."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict

from engine_ctl.core.decisions import shown_version
from engine_ctl.core.documents.inventory import BUILD_PLATFORMS, Host
from engine_ctl.core.fit.hostfacts import HostFacts
from engine_ctl.core.plan.engines import engine_at, host_platform
from engine_ctl.providers import Provider

PLAIN = "any"
"""The build column of an engine registered as one executable for every platform (`engines: {<engine>: /opt/…}`)."""


class EngineRow(BaseModel):
    """One registered build: an engine, its platform (or `any`), its executable, and per version and digest found
    the hosts that have it; the hosts that register it and lack it, and those not asked."""

    model_config = ConfigDict(frozen=True)

    engine: str
    build: str
    path: str
    version: str | None = None
    """What its `--version` says, cut to the version (None: not on any host asked)."""
    sha256: str | None = None
    hosts: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()
    """Hosts that register this build and do not have it at its path."""
    unknown: tuple[str, ...] = ()
    """Hosts that register it and were not asked (unreachable, or left out)."""
    pinned: dict[str, str] = {}
    decisions: bool | None = None


def registered(host: Host) -> list[tuple[str, str, str]]:
    """(engine, build, path) of every engine the host's inventory entry registers."""
    out = [(engine, PLAIN, path) for engine, path in sorted(host.engines.items())]
    for engine, builds in sorted(host.engine_builds.items()):
        out += [(engine, platform, path) for platform, path in builds.items()]
    return out


def engine_rows(hosts: Sequence[Host], facts: Mapping[str, HostFacts]) -> list[EngineRow]:
    """Every registered build, one row per version and digest the hosts report (a build with two versions across the
    hosts is two rows), in engine, build, path order."""
    found: dict[tuple[str, str, str], dict[tuple[str | None, str | None], list[str]]] = {}
    missing: dict[tuple[str, str, str], list[str]] = {}
    unknown: dict[tuple[str, str, str], list[str]] = {}
    pins: dict[tuple[str, str, str], tuple[dict[str, str], bool | None]] = {}
    for host in hosts:
        for key in registered(host):
            pins.setdefault(key, (dict(host.engine_pins.get(key[0], {})), host.engine_decisions.get(key[0])))
            hf = facts.get(host.name)
            if hf is None:
                unknown.setdefault(key, []).append(host.name)
                continue
            e = engine_at(hf, key[2])
            if e is None:
                missing.setdefault(key, []).append(host.name)
                continue
            version = shown_version(e.version) if e.version else None
            found.setdefault(key, {}).setdefault((version, e.sha256), []).append(host.name)
    rows = []
    for key in sorted(pins):
        pinned, decisions = pins[key]
        common = {"engine": key[0], "build": key[1], "path": key[2], "pinned": pinned, "decisions": decisions,
                  "missing": tuple(missing.get(key, ())), "unknown": tuple(unknown.get(key, ()))}  # fmt: skip
        by_version = found.get(key, {})
        if not by_version:
            rows.append(EngineRow(**common))
        for (version, sha), on in sorted(by_version.items(), key=lambda kv: (kv[0][0] or "", kv[0][1] or "")):
            rows.append(EngineRow(**common, version=version, sha256=sha, hosts=tuple(on)))
    return rows


# --- engine add ------------------------------------------------------------------------------------------------
class Registration(BaseModel):
    """What `engine add` writes into one engines block (defaults or a host's): the engine's builds by platform with
    the new path, and the version pin when every build it names reports that one version."""

    model_config = ConfigDict(frozen=True)

    engine: str
    entry: dict[str, Any]
    version: str | None
    """The version the hosts report for the new build (None: they report none)."""
    platforms: tuple[str, ...]


def platforms_for(provider: Provider, hosts: Sequence[HostFacts], build: str | None) -> list[str]:
    """The platforms the new build serves: the one asked for, or each host's own (its GPUs' build, or cpu)."""
    if build is not None:
        return [build]
    found: list[str] = []
    for hf in hosts:
        platform = host_platform(provider, "gpu" if hf.gpus else "cpu", hf) or provider.build_platform(None)
        if platform and platform not in found:
            found.append(platform)
    return found


def registration(
    provider: Provider,
    path: str,
    existing: object,
    platforms: Sequence[str],
    versions: Sequence[str | None],
    other_versions: Sequence[str | None] = (),
    digests: Sequence[str | None] = (),
) -> Registration | str:
    """The engines entry with `path` as the build for `platforms`, from the one the block has now (`existing`: None,
    a path, or a mapping of builds), or why it cannot be written. `versions`: what the new build reports on each
    host; `other_versions`: what the entry's other builds report. The version is pinned only when all of them say
    the same one (a pin on an engine holds for each of its builds); a sha256 pin the new build's `digests` do not
    match is dropped."""
    if isinstance(existing, str) and existing != path:
        return (f"engines.{provider.name} is {existing}, one executable for every platform; remove it, or write "
                "its builds per platform, before adding another")  # fmt: skip
    entry: dict[str, Any] = dict(existing) if isinstance(existing, Mapping) else {}
    for platform in platforms:
        if platform not in BUILD_PLATFORMS:
            return f"--build {platform}: one of {', '.join(BUILD_PLATFORMS)}"
        entry[platform] = path
    said = {shown_version(v) for v in versions if v}
    version = next(iter(said)) if len(said) == 1 else None
    others = {shown_version(v) for v in other_versions if v}
    entry.pop("version", None)
    if entry.get("sha256") and any(d != entry["sha256"] for d in digests):  # the old pin would leave the new build out
        entry.pop("sha256")
    if version is not None and version != "unknown" and others <= {version}:
        entry["version"] = version
    return Registration(engine=provider.name, entry=entry, version=version, platforms=tuple(platforms))
