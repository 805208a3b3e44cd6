"""The gateway's access log (render/gateway.py's ACCESS_LOG_FIELDS): one JSON object a line in the gateway unit's
journal. Parse a line, name the replica's host, show it, and add lines up per key or deployment (`engine-ctl
usage`). Pure."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime

NUMBERS = ("status", "bytes_in", "bytes_out", "queue_ms", "connect_ms", "ttfb_ms", "total_ms")
TOKENS = ("prompt_tokens", "completion_tokens")
"""Quoted numbers (HAProxy writes "-" for a variable it has not: a stream, an answer past its buffer)."""
UNQUOTED_REDISPATCH = re.compile(r'"retries":\+(\d{1,6})')
"""Gateways rendered before the retries were quoted wrote a redispatched request's `"retries":+1`, which is not
JSON: read as if quoted, so that none of their lines is dropped."""
TEXTS = ("id", "gateway", "key", "deployment", "replica", "server", "method", "path", "term")


@dataclass(frozen=True)
class RequestLine:
    """One request as the gateway logged it. A value the gateway had not (no key, no replica) is None; a time it
    never reached (no connection to a replica) is -1, as HAProxy writes it."""

    ts: float
    id: str | None = None
    gateway: str | None = None
    key: str | None = None
    deployment: str | None = None
    replica: str | None = None
    server: str | None = None
    host: str | None = None
    """The replica's host, by the server's address in the inventory (None when no host there has it)."""
    method: str | None = None
    path: str | None = None
    status: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    queue_ms: int = -1
    connect_ms: int = -1
    ttfb_ms: int = -1
    total_ms: int = -1
    term: str | None = None
    retries: int = 0
    """Connection retries to a replica (`retry-on conn-failure`: its connection was refused, an engine stopped
    since its last check); a request a replica took is never sent again."""
    redispatched: bool = False
    """The request was sent on to another replica after its first one failed (HAProxy's "+" before %rc)."""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    """The answer's own `usage` counts (the engine's), for a whole JSON answer; None for a stream."""

    def as_json(self) -> dict[str, object]:
        return asdict(self)


def parse_request(text: str, hosts_by_address: Mapping[str, str] | None = None) -> RequestLine | None:
    """A journal MESSAGE -> the request it logs; None for any other line (HAProxy's own notices, a line cut short)."""
    if not text.startswith('{"ts":'):
        return None
    try:
        raw = json.loads(text)
    except ValueError:
        try:  # only a line of a gateway rendered before the quoting pays for the rewrite
            raw = json.loads(UNQUOTED_REDISPATCH.sub(r'"retries":"+\1"', text, count=1))
        except ValueError:
            return None
    if not isinstance(raw, dict) or not isinstance(raw.get("ts"), int | float):
        return None
    values: dict[str, object] = {"ts": float(raw["ts"])}
    for name in TEXTS:
        value = raw.get(name)
        values[name] = None if value in (None, "-", "<NOSRV>", "-:-") else str(value)
    for name in NUMBERS:
        value = raw.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            values[name] = value
    retries = raw.get("retries")
    if isinstance(retries, int) and not isinstance(retries, bool):
        values["retries"] = retries
    elif isinstance(retries, str) and retries.lstrip("+").isdigit() and len(retries) <= 6:
        values["retries"], values["redispatched"] = int(retries.lstrip("+")), retries.startswith("+")
    for name in TOKENS:
        value = raw.get(name)
        if isinstance(value, str) and value.isdigit() and len(value) <= 12:
            values[name] = int(value)
    server = values.get("server")
    if isinstance(server, str) and hosts_by_address:
        address = server.rsplit(":", 1)[0].strip("[]")
        values["host"] = hosts_by_address.get(address)
    return RequestLine(**values)  # type: ignore[arg-type]


def when(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _ms(value: int) -> str:
    return "-" if value < 0 else str(value)


def format_request(r: RequestLine, gateway_width: int = 0) -> str:
    """One line for a person: when, which gateway, status, deployment, key, replica, sizes, times, ID."""
    replica = "-" if r.replica is None else r.replica + (f"@{r.host}" if r.host else f"@{r.server}")
    return (
        f"{when(r.ts)} {(r.gateway or '-').ljust(gateway_width)} {r.status} {r.deployment or '-'} "
        f"key={r.key or '-'} replica={replica} {r.method or '-'} {r.path or '-'} in={r.bytes_in}B "
        f"out={r.bytes_out}B queue={_ms(r.queue_ms)} connect={_ms(r.connect_ms)} ttfb={_ms(r.ttfb_ms)} "
        f"total={_ms(r.total_ms)}ms id={r.id or '-'}"
    )


@dataclass
class Usage:
    """Requests, errors, bytes and tokens of one key or deployment, added up from the access log."""

    requests: int = 0
    errors: int = 0
    """Answered 4xx or 5xx (by the replica or the gateway)."""
    bytes_in: int = 0
    bytes_out: int = 0
    ttfb_ms: list[int] = field(default_factory=list)
    prompt_tokens: int = 0
    generated_tokens: int = 0
    """Added up over the answers that carried the engine's `usage` counts (whole JSON answers)."""
    uncounted: int = 0
    """Answers a replica gave (2xx) without counts: streams, and answers bigger than the gateway's buffer."""

    def add(self, r: RequestLine) -> None:
        self.requests += 1
        self.errors += r.status >= 400
        self.bytes_in += r.bytes_in
        self.bytes_out += r.bytes_out
        if r.ttfb_ms >= 0:
            self.ttfb_ms.append(r.ttfb_ms)
        if r.prompt_tokens is not None or r.completion_tokens is not None:
            self.prompt_tokens += r.prompt_tokens or 0
            self.generated_tokens += r.completion_tokens or 0
        elif 200 <= r.status < 300 and r.replica is not None:
            self.uncounted += 1

    def p50_ttfb_ms(self) -> int | None:
        if not self.ttfb_ms:
            return None
        ordered = sorted(self.ttfb_ms)
        return ordered[(len(ordered) - 1) // 2]


def usage(lines: Iterable[RequestLine], by: str) -> dict[str, Usage]:
    """Per key name (by="key") or deployment (by="deployment"): the requests routed to a deployment (those the
    gateway refused before it knew one, a wrong key say, count under "-")."""
    out: dict[str, Usage] = {}
    for r in lines:
        name = (r.key if by == "key" else r.deployment) or "-"
        out.setdefault(name, Usage()).add(r)
    return dict(sorted(out.items()))


def counter_sum(text: str, name: str) -> float | None:
    """The sum of a Prometheus text exposition's samples of `name` (every label set); None when it has none."""
    total, seen = 0.0, False
    for line in text.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in (" ", "{"):
            try:
                total += float(line.rsplit(" ", 1)[-1])
                seen = True
            except ValueError:
                continue
    return total if seen else None


__all__ = ["RequestLine", "Usage", "counter_sum", "format_request", "parse_request", "usage", "when"]
