"""Where the running gateway differs from the configuration it loaded, in what a command on its admin socket
changes beyond its maps, weights and server states: a server added (`add server`: it gets requests, and the
internal key with them), an ACL's entries (`add acl #N`, `del acl`, `clear acl`: the internal endpoint's allowed
sources, the odd-path guard), the connection limits (`set maxconn global|frontend|server`) and where a server's
health check goes (`set server ... check-port|check-addr`). A reload drops each, so each is drift that apply removes
with one (`unloaded`). Pure: the configuration's text and the facts probe's reading (facts_probe.gateway_runtime)."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from engine_ctl.core.fit.hostfacts import HostFacts
from engine_ctl.core.render.gateway import server_lines

INT_OPERATORS = {"eq", "ge", "gt", "le", "lt"}
"""HAProxy's integer operators: `gt 200` is one entry, shown as the range `201:`."""
PREDEFINED = {"METH_GET": ("method", ["GET", "HEAD"]), "METH_POST": ("method", ["POST"]),
              "METH_HEAD": ("method", ["HEAD"]), "LOCALHOST": ("src", ["127.0.0.1/8", "::1"])}  # fmt: skip
"""HAProxy's predefined ACLs that a configuration may name (instantiated where first named): their fetch and
entries."""
ADDRESS_FETCHES = {"src", "dst"}
FLAGS_WITH_VALUE = {"-m", "-f", "-u"}


def haproxy_words(line: str) -> list[str]:
    """A configuration line's words as HAProxy reads them: quotes ('…' literal, "…" with backslash escapes), a
    backslash escaping the next character, and a comment from an unquoted #."""
    words: list[str] = []
    word: list[str] | None = None
    quote, i = "", 0
    while i < len(line):
        c = line[i]
        if (quote == "'" and c != "'") or (quote == '"' and c not in '"\\'):
            word = (word or []) + [c]
        elif c == "\\" and i + 1 < len(line) and quote != "'":
            word, i = (word or []) + [line[i + 1]], i + 1
        elif c in "'\"":
            quote, word = ("" if quote == c else c), word or []
        elif c == "#" and not quote:
            break
        elif c.isspace():
            if word is not None:
                words.append("".join(word))
            word = None
        else:
            word = (word or []) + [c]
        i += 1
    if word is not None:
        words.append("".join(word))
    return words


def _expression(words: Sequence[str]) -> tuple[str, list[str]]:
    """(fetch, patterns) of one ACL expression: its fetch's name (before any argument or converter), its flags
    skipped, and its patterns as HAProxy shows them (an integer comparison as its range)."""
    fetch = words[0].split("(", 1)[0].split(",", 1)[0]
    rest = list(words[1:])
    while rest and rest[0].startswith("-"):
        flag = rest.pop(0)
        if flag in FLAGS_WITH_VALUE and rest:
            rest.pop(0)
        if flag == "--":
            break
    patterns, operator = [], ""
    for word in rest:
        if word in INT_OPERATORS:
            operator = word
            continue
        patterns.append(_integer(operator, word) if operator else word)
    return fetch, patterns


def _integer(operator: str, word: str) -> str:
    """An integer comparison as `show acl` shows it: a range."""
    if not word.lstrip("-").isdigit():
        return word
    n = int(word)
    return {"eq": str(n), "ge": f"{n}:", "gt": f"{n + 1}:", "le": f":{n}", "lt": f":{n - 1}"}[operator]


def declared_acls(config: str) -> dict[int, list[tuple[str, list[str]]]]:
    """line number -> the ACLs that line declares, in order (as HAProxy numbers them): an `acl` line's, each
    `{ … }`, and a predefined ACL where first named."""
    out: dict[int, list[tuple[str, list[str]]]] = {}
    named: set[str] = set()
    for number, line in enumerate(config.splitlines(), start=1):
        words = haproxy_words(line)
        found: list[tuple[str, list[str]]] = []
        if len(words) > 2 and words[0] == "acl":
            found.append(_expression(words[2:]))
            words = []
        i = 0
        while i < len(words):
            if words[i] in ("{", "!{") and "}" in words[i + 1 :]:
                end = words.index("}", i + 1)
                if end > i + 1:
                    found.append(_expression(words[i + 1 : end]))
                i = end
            elif words[i].lstrip("!") in PREDEFINED and words[i].lstrip("!") not in named:
                named.add(words[i].lstrip("!"))
                found.append(PREDEFINED[words[i].lstrip("!")])
            i += 1
        if found:
            out[number] = found
    return out


def _normal(fetch: str, entry: str) -> str:
    """An entry as compared: an address as its network (HAProxy shows 10.0.0.1 as it was given, 10.0.0.1/32 too)."""
    if fetch in ADDRESS_FETCHES:
        try:
            return str(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            return entry
    return entry


def _entry_changes(fetch: str, live: Sequence[str], wanted: Sequence[str]) -> tuple[list[str], list[str]]:
    """(entries the running ACL has beyond its configuration's, those it lacks), each as HAProxy shows it."""
    now, should = [_normal(fetch, e) for e in live], [_normal(fetch, e) for e in wanted]
    extra = [e for e, n in zip(live, now, strict=True) if now.count(n) > should.count(n)]
    missing = [e for e, n in zip(wanted, should, strict=True) if should.count(n) > now.count(n)]
    return extra, missing


def _shown(entries: Sequence[str]) -> str:
    said = ", ".join(repr(e if len(e) <= 40 else e[:40] + "…") for e in entries[:4])
    return said + (f" and {len(entries) - 4} more" if len(entries) > 4 else "")


def acl_differences(config: str, running: Sequence[Sequence[Any]] | None) -> list[str]:
    """The ACLs whose entries in the running gateway are not its configuration's. A line whose ACLs (their number
    and fetches) are not what the configuration declares there is another configuration's: left to the file
    checks."""
    if not running:
        return []
    declared = declared_acls(config)
    by_line: dict[int, list[tuple[str, list[str]]]] = {}
    for line, fetch, entries in running:
        by_line.setdefault(int(line), []).append((str(fetch), [str(e) for e in entries]))
    out = []
    for line, live in sorted(by_line.items()):
        wanted = declared.get(line, [])
        if [f for f, _ in live] != [f for f, _ in wanted]:
            continue
        for (fetch, now), (_, should) in zip(live, wanted, strict=True):
            extra, missing = _entry_changes(fetch, now, should)
            said = [f"against {_shown(extra)} too" if extra else "", f"no more against {_shown(missing)}" if missing
                    else ""]  # fmt: skip
            if extra or missing:
                out.append(f"matches {fetch} on line {line} of haproxy.cfg {' and '.join(x for x in said if x)}, "
                           "which its configuration does not say (an admin command: `add acl`, `del acl`, "
                           "`clear acl`)")  # fmt: skip
    return out


def _maxconn(words: Sequence[str]) -> str | None:
    return words[words.index("maxconn") + 1] if "maxconn" in words[:-1] else None


def configured_limits(config: str) -> tuple[str | None, dict[str, str]]:
    """(global maxconn, {frontend or "backend/server": its connection limit}) as the configuration gives them: a
    frontend without its own maxconn takes the global one; a server without one has none ("")."""
    global_max, section, name = None, "", ""
    frontends: dict[str, str | None] = {}
    limits: dict[str, str] = {}
    for line in config.splitlines():
        words = haproxy_words(line)
        if not words:
            continue
        if not line[:1].isspace():
            section, name = words[0], words[1] if len(words) > 1 else ""
            if section == "frontend":
                frontends[name] = None
        elif section == "global" and words[0] == "maxconn":
            global_max = words[1] if len(words) > 1 else None
        elif section == "frontend" and words[0] == "maxconn":
            frontends[name] = words[1] if len(words) > 1 else None
        elif section == "backend" and words[0] == "server" and len(words) > 1:
            limits[f"{name}/{words[1]}"] = _maxconn(words) or ""
    for frontend, limit in frontends.items():
        if limit or global_max:
            limits[frontend] = limit or global_max or ""
    return global_max, limits


def limit_differences(config: str, runtime: Mapping[str, Any]) -> list[str]:
    global_max, limits = configured_limits(config)
    out = []
    live_max = runtime.get("maxconn")
    if live_max and global_max and live_max != global_max:
        out.append(f"takes at most {live_max} connections in all, not its configuration's {global_max} (an admin "
                   "command: `set maxconn global`)")  # fmt: skip
    for where, live in sorted((runtime.get("slim") or {}).items()):
        wanted = limits.get(where)
        if wanted is not None and live != wanted:
            kind = "server" if "/" in where else "frontend"
            out.append(f"limits {kind} {where} to {live or 'no limit'} connections, not its configuration's "
                       f"{wanted or 'none'} (an admin command: `set maxconn {kind}`)")  # fmt: skip
    return out


def check_differences(config: str, checks: Mapping[str, str] | None) -> list[str]:
    """Servers whose health check goes elsewhere than the server itself (the configuration never sets a check
    port or address)."""
    configured = {f"{backend}/{server}" for backend, server, _, _ in server_lines(config)}
    return [
        f"checks server {server}'s health at {' '.join(p for p in target.split() if p not in ('0', '-'))}, not at "
        "the server itself (an admin command: `set server … check-port`, `check-addr`): its state there says "
        "nothing of the replica"
        for server, target in sorted((checks or {}).items())
        if server in configured and target != "0 -"
    ]


def added_servers(config: str, running: Iterable[str]) -> list[str]:
    configured = {f"{backend}/{server}" for backend, server, _, _ in server_lines(config)}
    return [f"has server {s}, which its configuration does not (an admin command: `add server`): it takes requests, "
            "and the replicas' internal key with them" for s in sorted(set(running) - configured)]  # fmt: skip


def added_frontends(config: str, running: Iterable[str]) -> list[str]:
    """Frontends the running gateway has that `config` does not declare: a configuration loaded beside it (a
    wrapper's `-f`), which answers on ports of its own, past every key check (a probe, session 17)."""
    declared = {m.group(1) for m in re.finditer(r"^(?:frontend|listen)\s+(\S+)", config, re.MULTILINE)}
    return [f"has frontend {f}, which its configuration does not (another configuration loaded beside it): it "
            "answers on a port of its own, past every key check" for f in sorted(set(running) - declared)]  # fmt: skip


def tampered_drift(host: str, config: str, hf: HostFacts | None) -> list[dict[str, str]]:
    """Each way the running gateway on `host` differs from `config` (what it loaded) in what an admin command
    changes, beyond its maps, weights and states: drift that apply removes with a reload."""
    if hf is None or not hf.gateway_runtime or not config:
        return []
    runtime = hf.gateway_runtime
    found = added_servers(config, hf.gateway_servers)
    found += added_frontends(config, hf.gateway_frontends)
    found += acl_differences(config, runtime.get("acls"))
    found += limit_differences(config, runtime)
    found += check_differences(config, runtime.get("checks"))
    return [{"host": host, "kind": "unloaded", "detail": f"the running gateway on {host} {d}: apply reloads it"}
            for d in found]  # fmt: skip
