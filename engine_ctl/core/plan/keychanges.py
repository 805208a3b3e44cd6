"""What a plan changes in the gateway's keys, by name, for a reviewer: a key added, removed (refused from then on),
rotated (its old value refused), its deployments, limit or expiry changed. Pure: the running gateway's key maps
(what requests are checked against now) and the maps the documents give. Only the maps the documents changed are
said here; a running map that differs from unchanged documents is drift (core.plan.gateway.runtime_drift)."""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping

INTERNAL_PREFIX = "@"
"""Key names the documents cannot give (the internal endpoint's caller): never said."""


def _by_name(keys: Mapping[str, str]) -> dict[str, str]:
    """keys.map (hash -> name) -> name -> hash."""
    return {name: digest for digest, name in keys.items()}


def _scopes(scopes: Mapping[str, str]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for entry in scopes:
        name, _, deployment = entry.partition("/")
        out.setdefault(name, set()).add(deployment)
    return out


def _when(epoch: str | None) -> str:
    if epoch is None or not epoch.lstrip("-").isdigit():
        return "never"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(int(epoch)))


def _listed(names: Collection[str]) -> str:
    return ", ".join(repr(n) for n in sorted(names))


def key_changes(
    running: Mapping[str, Mapping[str, str]] | None, wanted: Mapping[str, Mapping[str, str]], rewritten: Collection[str]
) -> list[str]:
    """Each key the plan adds, removes or changes, in words (no hash, no key). `running`: the gateway's maps in
    memory (None: not read, nothing said); `rewritten`: the map files the documents changed."""
    if running is None or not {"keys.map", "scopes.map", "limits.map", "expires.map"} & set(rewritten):
        return []
    before, after = _by_name(running.get("keys.map") or {}), _by_name(wanted.get("keys.map") or {})
    out = [f"key {n!r} added" for n in sorted(set(after) - set(before))]
    out += [f"key {n!r} removed: requests with it are refused (401)" for n in sorted(set(before) - set(after))]
    kept = sorted(n for n in set(before) & set(after) if not n.startswith(INTERNAL_PREFIX))
    out += [f"key {n!r} rotated: its old value is refused, its new one accepted" for n in kept if before[n] != after[n]]
    was, now = _scopes(running.get("scopes.map") or {}), _scopes(wanted.get("scopes.map") or {})
    for n in kept:
        gained, lost = now.get(n, set()) - was.get(n, set()), was.get(n, set()) - now.get(n, set())
        if gained:
            out.append(f"key {n!r} may now call {_listed(gained)}")
        if lost:
            out.append(f"key {n!r} may no longer call {_listed(lost)} (404 model_not_found)")
    for map_name, said in (("limits.map", "limit"), ("expires.map", "expiry")):
        old, new = running.get(map_name) or {}, wanted.get(map_name) or {}
        for n in kept:
            if old.get(n) == new.get(n):
                continue
            if map_name == "limits.map":
                out.append(f"key {n!r} {said}: {old.get(n) or 'none'} → {new.get(n) or 'none'} requests a minute")
            else:
                out.append(f"key {n!r} {said}: {_when(old.get(n))} → {_when(new.get(n))}")
    return out
