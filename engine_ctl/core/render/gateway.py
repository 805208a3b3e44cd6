"""Render a gateway host's HAProxy configuration, its Lua, its maps and its systemd unit from templates/. Pure.

The gateway is the deployments' one endpoint (seed 001, "Reaching a deployment": http://<machine>:8800/v1):
OpenAI requests are routed on the JSON body's `model` to that deployment's backend, keys are checked as SHA-256
against keys.map, and a deployment with no serving replica holds requests (hold.lua).

What needs a reload (the configuration, the Lua, the unit) is kept apart from what changes at run time over the
stats socket with no reload (the key maps): `reload_sha256` covers only the former."""

from __future__ import annotations

import hashlib
import ipaddress
import json
import posixpath
import re
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict

from engine_ctl.core.documents.inventory import (
    DEFAULT_GATEWAY_THREADS,
    DEFAULT_HOLD_CAP,
    DEFAULT_HOLD_S,
    GATEWAY_ROLE,
    Host,
)
from engine_ctl.core.model import ApiKey
from engine_ctl.core.render.templates import load_template

if TYPE_CHECKING:
    from engine_ctl.providers import Provider

GATEWAY_UNIT = "engine-ctl-gateway.service"
GATEWAY_DIR = "/etc/engine-ctl/gateway"
RUN_DIR_NAME = "engine-ctl-gateway"
RUN_DIR = f"/run/{RUN_DIR_NAME}"
PRIVATE_RUN_DIR = f"/run/private/{RUN_DIR_NAME}"
"""Where systemd keeps a DynamicUser unit's RuntimeDirectory; RUN_DIR is its link to it."""
ADMIN_SOCKET = f"{RUN_DIR}/admin.sock"
MASTER_SOCKET = f"{RUN_DIR}/master.sock"
"""HAProxy's master CLI (the unit's -S): it reaches every worker, those a reload left finishing too."""
SERVER_STATE = f"{RUN_DIR}/server-state"
HOLD_503 = (
    '{"error":{"message":"No replica of this deployment is serving yet; retry in 5 s","type":"server_error",'
    '"param":null,"code":"unavailable"}}'
)
"""The answer at the end of a hold (with Retry-After: 5), or to a request held once already."""
INTERNAL_ENV = f"{GATEWAY_DIR}/internal.env"
"""Where engine-ctl before the key rotation kept the internal key on a gateway host (read, never written)."""
GATEWAY_KEY = f"{GATEWAY_DIR}/internal.key"
"""On a gateway host (root-only): the internal key as a map, `gateway <hex>` (the key the gateway adds to every
request to a replica) and, while a rotation is under way, `next <hex>` (the key the replicas learn first). The unit
loads it as a credential and copies it to INTERNAL_MAP; apply changes both and the running map when it rotates."""
INTERNAL_MAP_FILE = "internal.map"
"""In the run directory, owned by the gateway's user: the map the configuration reads the key from."""
REPLICA_KEY = "/etc/engine-ctl/replica-key"
"""On every engine host: the same internal key, which a replica's engine requires (root-only, 0600); each engine
has its own form of it beside (replica_key_files)."""
HAPROXY = "/usr/sbin/haproxy"
BACKEND_PREFIX = "d_"
BUFSIZE = 262144
BODY_LIMIT = 245760
"""240 KiB: the largest request body routed. It must fit in one buffer with the request's headers (bufsize less
HAProxy's reserve for rewrites), since the route is read from the body's `model`, which OpenAI clients write
after `messages`."""
ALLOCATOR_ENV = {"MALLOC_MMAP_THRESHOLD_": str(4 * BUFSIZE), "MALLOC_TRIM_THRESHOLD_": str(128 * BUFSIZE)}
"""The gateway's environment for glibc's malloc (mallopt(3)). Each request takes buffers of BUFSIZE bytes; by
default glibc gives their memory back to the kernel as soon as they are freed (brk down, then up again: two system
calls a request, a fifth of HAProxy's CPU per request as measured by bench/gateway.py). These keep them in the
heap: buffers come from the heap, not mmap, and up to 128 freed buffers (32 MiB) stay there for the next request."""
JSON_DEPTH_LIMIT = 64
"""The deepest JSON a request body may nest (hold.lua's check; deeper is answered 400 json_too_deep)."""
DEPTH_PRECHECK = rf"^(?:[^{{[]*+[{{[]){{{JSON_DEPTH_LIMIT + 1}}}"
"""Whether hold.lua's depth check runs at all: a body nested deeper than the limit has at least limit + 1 opening
brackets, which this regex counts (PCRE2, JIT-compiled; possessive, so linear in the body). Most requests have far
fewer and skip the Lua call, about a tenth of HAProxy's CPU per request (bench/gateway.py); the rest are scanned
as before, brackets inside strings not counted."""
STREAM_SET = r'"stream"\s*+:\s*+(?!false)'
"""A request body that may ask for a stream: a `"stream"` key whose value is anything but `false`, wherever it is
(nested too). Read as raw bytes, not parsed: inside a JSON string every quote is escaped, so a key named stream
(written without escapes) with a true value always shows as `"stream"`, a colon and `true`, spaces between. It
counts more bodies as streams than an engine does (a nested key, a value an engine refuses); a false match costs
only a new connection to the replica. A regex (PCRE2, JIT-compiled) and not HAProxy's json_query: the JSON reader
takes tens of instructions a byte of the body and reads all of it when `stream` is absent, as in most requests
(docs/benchmarks.md)."""
USAGE_COUNTS = (
    r'^(?:(?s:.*?)"usage"\s*+:\s*+\{'
    r'(?:(?=(?:[^{}]|\{[^{}]*+\})*?"prompt_tokens"\s*+:\s*+([0-9]{1,12})[^0-9]))?'
    r'(?:(?=(?:[^{}]|\{[^{}]*+\})*?"completion_tokens"\s*+:\s*+([0-9]{1,12})[^0-9]))?)?(?s:.*)'
)
"""A whole JSON answer's `usage` counts, as `<prompt>/<completion>` (regsub's `\\1/\\2`; a count not given is
empty, and an answer without `usage` gives "/"; the log writes "-" for either). It always matches the whole answer,
so nothing of the answer but the two numbers is ever kept; the rule after it drops any value other than digits, a
slash and digits. The first `"usage"` key written without escapes is the answer's (inside a JSON string every quote
is escaped, so a text that spells `"usage": {...}` never matches); its counts are read in either order, beside one
level of nested objects (`prompt_tokens_details`). One regex, in one pass: HAProxy's JSON reader (json_query) read
the answer from its start once for each count, a tenth of HAProxy's CPU a request (bench/gateway.py)."""
STREAM_AMBIGUOUS = r'^(?:[^"]++|"(?:[^"\\]++|\\[^u])*+"|"(?:[^"\\]++|\\.)*+"(?!\s*:))*+"(?:[^"\\]++|\\.)*+"\s*+:'
"""A request body whose `stream` an engine's JSON parser may read otherwise than STREAM_SET does, which the
gateway then treats as a stream too: one with a key written with a \\u escape (STREAM_SET reads keys as written, an
engine decodes them first: `"\\u0073tream"` is `stream`). A key given twice needs nothing more: STREAM_SET finds
either that is not false, and an engine keeping either reads false when both are. A false match costs only a new
connection. Linear in the body, whatever it holds: it reads the body from its start, a string at a time
(possessive: never back), and stops at the first key with a \\u escape (a string with one that a colon follows)."""
MAXCONN = 1000
"""Connections at once per gateway: each may hold two buffers, so about 512 MiB at the most."""
HOLD_S = DEFAULT_HOLD_S
"""Seed 001: held up to 2 minutes, then 503 Retry-After: 5 (the inventory's gateway.hold_s sets it)."""
HOLD_CAP = DEFAULT_HOLD_CAP
"""Requests held at once per deployment (the inventory's gateway.hold_cap sets it)."""
WAKE_PORT = 8809
INTERNAL_PORT = 8801
"""The internal endpoint's port on each gateway host (seed 000's deploy-<name>.<namespace>…:8000, where runs on
the cluster's machines call a deployment without a key): only the inventory's hosts connect. Not 8000: replicas
take ports from 8000 up on every host, the gateway hosts included."""
INTERNAL_CALLER = "@internal"
"""The key name an internal caller's requests carry (the access log, the usage table): no ApiKey is named so."""
"""The scaler hears the Lua on WAKE_PORT (`wake <deployment>` for a held request; see render/scaler.py): on
127.0.0.1 on its own host, on that host's inventory address from the other gateway hosts (wake_address)."""
LOOPBACK = "127.0.0.1"
DRAIN_TIMEOUT_S = 120
"""How long a replica being replaced may finish its requests in flight (streams included) before it stops."""
CONFIG_FILE = "haproxy.cfg"
LUA_FILE = "hold.lua"
START_STATE_FILE = "start.state"
"""Every server DOWN, in HAProxy's server-state format: what a freshly started gateway loads (its unit copies it
to the state file before HAProxy starts), so no request goes to a replica before its first check passes."""
ERRORS = {
    400: ("Bad Request", "Bad request: the gateway could not parse it", "invalid_request_error", "bad_request"),
    408: ("Request Timeout", "The request did not arrive in time", "invalid_request_error", "request_timeout"),
    422: ("Unprocessable Content", "The request could not be processed", "invalid_request_error", "unprocessable"),
    429: ("Too Many Requests", "Too many requests; retry later", "rate_limit_error", "rate_limit_exceeded"),
    500: ("Internal Server Error", "The gateway failed to handle the request", "server_error", "internal_error"),
    502: ("Bad Gateway", "The replica gave no valid answer", "server_error", "bad_gateway"),
    503: ("Service Unavailable", "No server is available to handle this request", "server_error", "unavailable"),
    504: ("Gateway Timeout", "The replica did not answer in time", "server_error", "gateway_timeout"),
}
"""HAProxy's own errors (a request it cannot parse, a timeout, no server): answered in the OpenAI error shape, from
error-<status>.http beside the configuration (its `errorfile` lines), not as HAProxy's HTML."""


def error_files() -> dict[str, str]:
    """error-<status>.http: the raw HTTP answers HAProxy sends for its own errors (ERRORS)."""
    out = {}
    for status, (reason, message, kind, code) in ERRORS.items():
        body = json.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}})
        head = [f"HTTP/1.1 {status} {reason}", "Content-Type: application/json", "Cache-Control: no-cache"]
        head += ["Connection: close", f"Content-Length: {len(body)}", *(["Retry-After: 5"] if status == 503 else [])]
        out[f"error-{status}.http"] = "\r\n".join(head) + "\r\n\r\n" + body
    return out


ACCESS_LOG_FIELDS = (
    ("ts", "%Ts.%ms", False),
    ("id", "%[var(txn.rid)]", True),
    ("gateway", "{host}", True),
    ("key", "%[var(txn.key)]", True),
    ("deployment", "%[var(txn.deployment)]", True),
    ("replica", "%s", True),
    ("server", "%si:%sp", True),
    ("method", "%HM", True),
    ("path", "%[var(txn.path),json(utf8s)]", True),
    ("status", "%ST", False),
    ("bytes_in", "%U", False),
    ("bytes_out", "%B", False),
    ("queue_ms", "%Tw", False),
    ("connect_ms", "%Tc", False),
    ("ttfb_ms", "%Tr", False),
    ("total_ms", "%Ta", False),
    ("term", "%ts", True),
    ("retries", "%rc", True),
    ("prompt_tokens", "%[var(txn.tokens),field(1,/)]", True),
    ("completion_tokens", "%[var(txn.tokens),field(2,/)]", True),
)
"""The gateway's access log, one JSON object a line (HAProxy 2.6 has no JSON log encoding: strings are quoted here, and
the path, the only value a client writes as it likes, is escaped by the json converter; the ID, the key's name and
the deployment are checked against a pattern with nothing to escape before they are set). ts: the request's arrival,
epoch seconds; key: the key's name (keys.map's value, never the key or its hash); replica: the server
(r<index><slot>) and its address; status, bytes in and out (headers included); queue_ms, connect_ms, ttfb_ms (the
replica's response headers), total_ms (HAProxy's %Ta, to the last byte); -1 for a step never reached; retries, the
connection retries, quoted since HAProxy writes "+1" when it sent the request on to another replica (a redispatch);
prompt_tokens and completion_tokens, the `usage` of a whole JSON answer (a number, quoted; "-" for a stream, an
answer past the buffer or a count the answer does not give: USAGE_COUNTS). An absent value is "-". Read by
engine_ctl.core.accesslog."""


def access_log_format(host: str) -> str:
    """The log-format line for this gateway host (a host's name is letters, digits and . _ -: nothing to escape)."""
    parts = []
    for name, value, quoted in ACCESS_LOG_FIELDS:
        value = value.replace("{host}", host)
        parts.append(f'"{name}":' + (f'"{value}"' if quoted else value))
    return "{" + ",".join(parts) + "}"


DECISIONS_MAP_FILE = "decisions.map"
"""The scaler's decisions so far, "<deployment>/<action>" -> count: empty as rendered, filled at run time by the
scaler on this host over the stats socket (never by apply), exported by the metrics port."""
DECISION_ACTIONS = ("up", "down", "zero", "wake", "woken", "preempt", "hold", "failed", "reset", "gateway", "lead",
                    "follow")  # fmt: skip
"""The scaler's actions (core.plan.scaler.Decision), each a label value of engine_ctl_scaler_decisions_total."""

MAP_FILES = ("keys.map", "expires.map", "scopes.map", "limits.map", "models.map", "stopped.map")
API_FRONTEND = "api"
"""The frontend of the endpoint (and the internal endpoint) in templates/haproxy.cfg.j2."""
RUNTIME_MAPS = ("keys.map", "expires.map", "scopes.map", "limits.map", "stopped.map")
"""Maps changed over the stats socket, with no reload (models.map changes only with the backends)."""


class GatewayServer(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    """r<index><slot>: one per replica unit."""
    address: str
    port: int
    maxconn: int
    disabled: bool = False
    """Starts in maintenance: a replica an apply is about to start enters only when apply lets it in."""


class GatewayBackend(BaseModel):
    model_config = ConfigDict(frozen=True)

    deployment: str
    health_path: str = "/health"
    servers: tuple[GatewayServer, ...] = ()
    api: str = "chat"
    """decisions: the backend answers POST /v1/systemone only, and its servers' health check is the readiness
    decision (seed 003); chat: everything under /v1 but /v1/systemone."""
    created: int = 0
    """When the deployment was created (epoch seconds, from its ID): `created` of its model object in /v1/models
    (0 until its first apply gives it an ID)."""

    @property
    def backend(self) -> str:
        return backend_name(self.deployment)


class RenderedGateway(BaseModel):
    model_config = ConfigDict(frozen=True)

    host: str
    listen: str
    endpoint: str
    files: dict[str, str]
    """File name (in GATEWAY_DIR) -> content: the configuration, the Lua and the maps."""
    unit_text: str
    maps: dict[str, dict[str, str]]
    """The maps as key -> value, for run-time updates."""

    @property
    def file_sha256(self) -> dict[str, str]:
        return {name: sha256(text) for name, text in sorted(self.files.items())}

    @property
    def unit_sha256(self) -> str:
        return sha256(self.unit_text)

    @property
    def reload_sha256(self) -> str:
        """What a reload is for: the configuration, the Lua, models.map and the unit (not the key maps)."""
        parts = [self.files[CONFIG_FILE], self.files[LUA_FILE], self.files["models.map"], self.unit_text]
        return sha256("\0".join(parts))


def unix_sockets(config: str) -> tuple[str, ...]:
    """The UNIX sockets a gateway configuration listens on (`bind unix@PATH`: the hold frontends' held-<name>.sock),
    in order. A running gateway whose socket file was deleted keeps listening on an inode nothing reaches; only a
    restart makes the file again (a reload takes the old listener over as it is)."""
    return tuple(m.group(1) for m in re.finditer(r"^\s*bind\s+unix@(\S+)", config, re.MULTILINE))


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def created_of(deployment_id: str) -> int:
    """The creation time (epoch seconds) a deployment's ID records: a ULID's first 10 characters are its
    milliseconds since the epoch, in Crockford's base 32. 0 for no ID (a state written before IDs)."""
    if len(deployment_id) != 26 or any(c not in CROCKFORD for c in deployment_id[:10]):
        return 0
    ms = 0
    for c in deployment_id[:10]:
        ms = ms * 32 + CROCKFORD.index(c)
    return ms // 1000


def backend_name(deployment: str) -> str:
    return BACKEND_PREFIX + deployment


def server_name(index: int, slot: str) -> str:
    return f"r{index}{slot}"


@lru_cache(maxsize=4096)
def is_ip(address: str) -> bool:
    """Whether `address` is an IP address, not a name (asked for every replica's host: remembered per address)."""
    try:
        ipaddress.ip_address(address)
    except ValueError:
        return False
    return True


def endpoint_of(host: Host) -> str:
    """host:port of a gateway: what clients call (http://<endpoint>/v1)."""
    address = f"[{host.address}]" if ":" in host.address else host.address
    return f"{address}:{host.gateway_port}"


def internal_endpoint(endpoint: str) -> str:
    """host:port of a gateway's internal endpoint, from its endpoint (host:port): the same address, INTERNAL_PORT."""
    return f"{endpoint.rsplit(':', 1)[0]}:{INTERNAL_PORT}"


def internal_sources(hosts: Iterable[Host]) -> list[str]:
    """Who may call the internal endpoint: the inventory's hosts, by their IP addresses (HAProxy compares a
    connection's source with them; a host the inventory reaches by a DNS name is not among them)."""
    return list(dict.fromkeys(h.address for h in hosts if is_ip(h.address)))


def internal_frontend(host: Host, allow: Sequence[str], port: int = INTERNAL_PORT) -> dict[str, object] | None:
    """The internal listener's settings (None: no inventory host to allow, as in a gateway rendered alone)."""
    if not allow:
        return None
    listen = f"{'[::]' if ':' in host.address else '*'}:{port}"
    return {"listen": listen, "port": port, "allow": list(allow), "caller": INTERNAL_CALLER}


def _with_hash(name: str, values: Mapping[str, object]) -> str:
    """Render twice: the header records the sha256 of the text rendered without it (as units do)."""
    body = load_template(name).render(**values, content_hash="")
    return load_template(name).render(**values, content_hash=sha256(body))


def key_maps(
    keys: Iterable[ApiKey], deployments: Iterable[str], requests_per_minute: int | None = None
) -> dict[str, dict[str, str]]:
    """keys.map (hash -> key name), expires.map (key name -> epoch), scopes.map ("<key>/<deployment>" -> 1,
    for every deployment a key may use; a key with no scope may use all of them) and limits.map (key name ->
    requests a minute: its document's, else `requests_per_minute`, the inventory's; none: no limit)."""
    names = sorted(set(deployments))
    keys_map: dict[str, str] = {}
    expires: dict[str, str] = {}
    scopes: dict[str, str] = {}
    limits: dict[str, str] = {}
    for k in sorted(keys, key=lambda k: k.name):
        keys_map[k.sha256] = k.name
        if k.expires is not None:
            expires[k.name] = str(k.expires)
        for d in names if k.deployments is None else sorted(set(k.deployments)):
            scopes[f"{k.name}/{d}"] = "1"
        rate = k.requests_per_minute if k.requests_per_minute is not None else requests_per_minute
        if rate is not None:
            limits[k.name] = str(rate)
    return {"keys.map": keys_map, "expires.map": expires, "scopes.map": scopes, "limits.map": limits}


def map_text(entries: Mapping[str, str]) -> str:
    return "".join(f"{k} {v}\n" for k, v in sorted(entries.items()))


def stopped_answer() -> dict[str, str]:
    """The code of the gateway's answer for a deployment an operator stopped (engine-ctl stop): HTTP 409 with
    `{"code": "deployment_stopped", "message": …}` (no command exits with it; CODES and the README list it)."""
    code = "deployment_stopped"
    return {"stopped_code": code, **engine_error_answer()}


def engine_error_answer() -> dict[str, str]:
    """The code of the gateway's answer when a decision model's engine cannot read the input (longer than its
    batch or context) or fails it: HTTP 502 with the engine's own message (seed 003)."""
    code = "engine_error"
    return {"engine_error_code": code}


def _hold_lua(hold_s: int, hold_cap: int, wakes: list[str], ordered: list[GatewayBackend]) -> str:
    """hold.lua: the hold, the wake, the rate limits per key and the scaler's decision counts."""
    return _with_hash("hold.lua", {"hold_s": hold_s, "hold_cap": hold_cap, "backend_prefix": BACKEND_PREFIX,
                                   "wake_port": WAKE_PORT, "wake_addresses": wakes, "backends": ordered,
                                   "decisions_map": DECISIONS_MAP_FILE, "actions": DECISION_ACTIONS,
                                   "json_depth_limit": JSON_DEPTH_LIMIT})  # fmt: skip


def metrics_frontend(host: Host, port: int | None, allow: Sequence[str]) -> dict[str, object] | None:
    """The metrics frontend's settings (None: the inventory sets no monitoring.port)."""
    if port is None:
        return None
    listen = f"{'[::]' if ':' in host.address else '*'}:{port}"
    return {"listen": listen, "allow": list(allow), "engine_path": "/metrics"}


def _haproxy_cfg(
    host: Host, common: dict[str, object], ordered: list[GatewayBackend], run_dir: str,
    sizes: tuple[int, int, int], metrics: tuple[int | None, Sequence[str]],
    internal: tuple[Sequence[str], int] = ((), INTERNAL_PORT),
) -> str:  # fmt: skip
    """haproxy.cfg: `sizes` are the hold (seconds), the hold's cap and HAProxy's threads; `metrics` the
    monitoring port and who may reach it."""
    hold_s, hold_cap, threads = sizes
    return _with_hash(
        "haproxy.cfg.j2",
        {
            **common,
            "endpoint": endpoint_of(host),
            "bufsize": BUFSIZE,
            "body_limit": BODY_LIMIT,
            "json_depth_limit": JSON_DEPTH_LIMIT,
            "depth_precheck": DEPTH_PRECHECK,
            "stream_set": STREAM_SET,
            "stream_ambiguous": STREAM_AMBIGUOUS,
            "usage_counts": _haproxy_double_quoted(USAGE_COUNTS),
            "maxconn": MAXCONN,
            "run_dir": run_dir,
            "hold_503": HOLD_503,
            "admin_socket": f"{run_dir}/admin.sock",
            "server_state": f"{run_dir}/server-state",
            "internal_map": f"{run_dir}/{INTERNAL_MAP_FILE}",
            "hold_s": hold_s,
            "hold_cap": hold_cap,
            "threads": threads,
            "backends": ordered,
            **decisions_context(ordered, bool(common["internal_key"])),
            **stopped_answer(),
            "errors": sorted(ERRORS),
            "access_log_format": access_log_format(host.name),
            "metrics": metrics_frontend(host, *metrics),
            "internal": internal_frontend(host, *internal),
        },
    )


def render_gateway(
    host: Host,
    backends: Iterable[GatewayBackend],
    keys: Iterable[ApiKey],
    *,
    internal_key: bool = True,
    hold_s: int = HOLD_S,
    hold_cap: int = HOLD_CAP,
    threads: int = DEFAULT_GATEWAY_THREADS,
    haproxy: str = HAPROXY,
    run_dir: str = RUN_DIR,
    stopped: Mapping[str, str] | None = None,
    wake_address: str = LOOPBACK,
    wake_addresses: Sequence[str] = (),
    scope_names: Iterable[str] = (),
    requests_per_minute: int | None = None,
    metrics_port: int | None = None,
    metrics_allow: Sequence[str] = (),
    internal_allow: Sequence[str] = (),
    internal_port: int = INTERNAL_PORT,
    lineage: str = "",
) -> RenderedGateway:
    """Everything one gateway host runs, rendered from templates/ (haproxy.cfg.j2, hold.lua, gateway.service.j2).
    `stopped`: deployment -> ID of those an operator stopped (stopped.map: answered deployment_stopped).
    `wake_address`: where its Lua pokes the scaler (wake_address_for) when none listens on this host's loopback;
    `wake_addresses`: every place it tries, in order (wake_addresses_for: with PostgreSQL state a scaler runs on
    every gateway host, and the first that listens passes the wake to the one that acts).
    `scope_names`: deployments a key with no scope may also name though none is routed (one an operator deleted:
    its name answers 404 all the same, and its scopes stay as they were, so the delete changes no key map);
    `requests_per_minute`: the inventory's limit for keys whose document sets none (None: no limit);
    `metrics_port`: the inventory's monitoring.port (None: no metrics frontend); `metrics_allow`: the monitoring
    hosts' addresses and networks, which may connect to it besides loopback; `internal_allow`: the inventory's
    hosts' addresses (internal_sources), which may call the internal endpoint (`internal_port`) without a key
    (none: no internal endpoint); `lineage`: the state's, in haproxy.cfg's header (whose gateway this is: another
    state's plan never takes it over)."""
    ordered = sorted(backends, key=lambda b: b.deployment)
    listen = f"{'[::]' if ':' in host.address else '*'}:{host.gateway_port}"
    common = {"host": host.name, "listen": listen, "internal_key": internal_key, "lineage": lineage}
    config = _haproxy_cfg(host, common, ordered, run_dir, (hold_s, hold_cap, threads), (metrics_port, metrics_allow),
                          (internal_allow, internal_port))  # fmt: skip
    wakes = list(wake_addresses) or list(dict.fromkeys([LOOPBACK, wake_address]))
    lua = _hold_lua(hold_s, hold_cap, wakes, ordered)
    scoped = [*(b.deployment for b in ordered), *scope_names]
    maps = key_maps(keys, scoped, requests_per_minute)
    if internal_allow:  # an internal caller may call every deployment: the scope of a key with none
        maps["scopes.map"].update({f"{INTERNAL_CALLER}/{d}": "1" for d in sorted(set(scoped))})
    maps.update({"models.map": {b.deployment: b.backend for b in ordered}, "stopped.map": dict(stopped or {})})
    files = {CONFIG_FILE: config, LUA_FILE: lua, **{name: map_text(maps[name]) for name in MAP_FILES}}
    files.update({START_STATE_FILE: start_state(ordered), DECISIONS_MAP_FILE: "", **error_files()})
    unit = _gateway_unit(common, haproxy, run_dir, internal_key)
    return RenderedGateway(
        host=host.name, listen=listen, endpoint=endpoint_of(host), files=files, unit_text=unit, maps=maps
    )


def gateway_argv(haproxy: str = HAPROXY, run_dir: str = RUN_DIR) -> tuple[str, ...]:
    """The command line the gateway's master runs with, as its unit's ExecStart gives it (${CONFIG} expanded;
    tests/test_gateway_core.py checks the two agree). HAProxy's master keeps it across its reloads (re-executed
    with the same words)."""
    return (haproxy, "-Ws", "-f", f"{GATEWAY_DIR}/{CONFIG_FILE}", "-p", f"{run_dir}/haproxy.pid", "-S",
            f"{run_dir}/master.sock")  # fmt: skip


def _gateway_unit(common: Mapping[str, object], haproxy: str, run_dir: str, internal_key: bool) -> str:
    """The gateway's systemd unit (templates/gateway.service.j2)."""
    return _with_hash(
        "gateway.service.j2",
        {
            **common,
            "config": f"{GATEWAY_DIR}/{CONFIG_FILE}",
            "haproxy": haproxy,
            "run_dir": run_dir,
            "run_dir_name": RUN_DIR_NAME,
            "start_state": f"{GATEWAY_DIR}/{START_STATE_FILE}",
            "internal_key": GATEWAY_KEY if internal_key else None,
            "internal_map": f"{run_dir}/{INTERNAL_MAP_FILE}",
            "allocator_env": ALLOCATOR_ENV,
        },
    )


# --- the one scaler's host ---------------------------------------------------------------------------------------
def first_gateway(hosts: Iterable[Host]) -> Host | None:
    """The gateway host that runs the one scaler: the first by name (None without a gateway host)."""
    gateways = sorted((h for h in hosts if GATEWAY_ROLE in h.roles), key=lambda h: h.name)
    return gateways[0] if gateways else None


def wake_address_for(host: Host, hosts: Iterable[Host]) -> str:
    """Where a gateway's Lua pokes the scaler: 127.0.0.1 on the scaler's own host, that host's inventory address
    from every other gateway host (the scaler listens there too, for the gateway hosts only)."""
    scaler = first_gateway(hosts)
    return LOOPBACK if scaler is None or scaler.name == host.name else scaler.address


def wake_addresses_for(host: Host, hosts: Iterable[Host]) -> list[str]:
    """Where a gateway's Lua pokes the scalers, the first that listens hearing it: this host's own (127.0.0.1),
    then the first gateway host by name (the one scaler without the PostgreSQL lock), then the other gateway
    hosts (with the lock, a scaler on each: when this host's is down, another passes the wake on)."""
    gateways = sorted((h for h in hosts if GATEWAY_ROLE in h.roles), key=lambda h: h.name)
    return [LOOPBACK] + [g.address for g in gateways if g.name != host.name and g.address != LOOPBACK]


# --- servers DOWN at start --------------------------------------------------------------------------------------
STATE_COLUMNS = (
    "be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state srv_uweight srv_iweight "
    "srv_time_since_last_change srv_check_status srv_check_result srv_check_health srv_check_state srv_agent_state "
    "bk_f_forced_id srv_f_forced_id srv_fqdn srv_port srvrecord srv_use_ssl srv_check_port srv_check_addr "
    "srv_agent_addr srv_agent_port"
)
"""HAProxy 2.6's server-state file, version 1 (what `show servers state` prints)."""
ADMIN_MAINT_FROM_CONFIG = 5
"""srv_admin_state of a server `disabled` in the configuration and never set ready since: SRV_ADMF_FMAINT (1) |
SRV_ADMF_CMAINT (4), what `show servers state` prints for it."""


def start_state(backends: Iterable[GatewayBackend]) -> str:
    """The server-state file a fresh gateway starts from: every server DOWN (operational state 0, health 0, its
    last check a failed connection), so it enters only once its health check passes (rise 1, every second while
    down) and a request meanwhile is held, never sent to an engine that is not serving. Without it HAProxy starts
    every server UP until its first check fails. A `disabled` server keeps its maintenance: admin state 5, forced
    (1) and from the configuration (4), as HAProxy itself dumps one. With 4 alone HAProxy reads "set ready at run
    time" and takes it out of maintenance at start, UP before any check ("UP 1/3"): a sleeping on-demand slot then
    got requests, and the client HAProxy's 503 after its retries (issue 24). Proxies and servers are matched by
    name (no forced ids)."""
    lines = ["1", "# " + STATE_COLUMNS]
    for be_id, b in enumerate(backends, start=1):
        for srv_id, s in enumerate(b.servers, start=1):
            admin = ADMIN_MAINT_FROM_CONFIG if s.disabled else 0
            lines.append(f"{be_id} {b.backend} {srv_id} {s.name} {s.address} 0 {admin} 1 1 0 8 2 0 6 0 0 0 - "
                         f"{s.port} - 0 0 - - 0")  # fmt: skip
    return "\n".join(lines) + "\n"


def state_across_reload(dumped: str, start: str) -> str:
    """The server-state file a reloaded gateway loads: the running worker's `show servers state` (`dumped`) for each
    server the new configuration keeps at the same address and port, and the DOWN line of `start` (start_state of
    the new configuration) for every other one. HAProxy 2.6 takes a server's port from the state file over the
    configuration's (the address too, where it resolves one): a slot named again at another port or host would
    otherwise go on sending its requests to the old one, where another deployment's replica may listen (issue 24:
    sb's requests were answered by sa's engine until sa was parked). A server gone from the configuration is
    dropped; one new or moved enters once its health check passes, as at a fresh start."""
    addr, port = STATE_COLUMNS.split().index("srv_addr"), STATE_COLUMNS.split().index("srv_port")
    kept: dict[tuple[str, str], list[str]] = {}
    for line in dumped.splitlines():
        fields = line.split()
        if len(fields) > port and not line.startswith("#"):
            kept[(fields[1], fields[3])] = fields
    out = []
    for line in start.splitlines():
        fields = line.split()
        if len(fields) <= port or line.startswith("#"):
            out.append(line)
            continue
        old = kept.get((fields[1], fields[3]))
        same = old is not None and (old[addr], old[port]) == (fields[addr], fields[port])
        if same and old is not None:
            # where its checks go is the configuration's, never a runtime `set server … check-port|check-addr`
            # (or agent-*) carried over: a reload is what apply does to undo those
            names = STATE_COLUMNS.split()
            old = [fields[i] if i < len(names) and names[i] in CONFIGURED_COLUMNS and i < len(fields) else value
                   for i, value in enumerate(old)]  # fmt: skip
        out.append(" ".join(old) if same and old is not None else line)
    return "\n".join(out) + "\n"


CONFIGURED_COLUMNS = frozenset({"srv_check_port", "srv_check_addr", "srv_agent_addr", "srv_agent_port"})
"""Columns of `show servers state` a reload takes from the configuration (the start state), not from the running
worker."""


def server_lines(config: str) -> list[tuple[str, str, str, bool]]:
    """(backend, server, address, disabled) of each server line of a haproxy.cfg (address "" where it has none)."""
    out, backend = [], ""
    for line in config.splitlines():
        words = line.split()
        if words[:1] == ["backend"] and len(words) > 1:
            backend = words[1]
        elif words[:1] == ["server"] and len(words) > 1:
            out.append((backend, words[1], words[2] if len(words) > 2 else "", words[-1] == "disabled"))
    return out


def server_addresses(config: str) -> dict[str, str]:
    """ "backend/server" -> "address:port" of each server line of a haproxy.cfg that names one (not a unix socket)."""
    return {
        f"{backend}/{server}": address
        for backend, server, address, _ in server_lines(config)
        if ":" in address and not address.startswith("unix@")
    }


def misrouted(config: str, running: Mapping[str, str]) -> dict[str, tuple[str, str]]:
    """ "backend/server" -> (where the running gateway sends its requests, where `config` says) for each server whose
    live address is not its configuration's: HAProxy keeps a state file's address over the configuration's, so a
    file can be right while the process is not. `running`: `show stat`'s addr column."""
    out = {}
    for server, wanted in server_addresses(config).items():
        live = running.get(server)
        if live and not _same_endpoint(live, wanted):
            out[server] = (live, wanted)
    return out


def _same_endpoint(live: str, configured: str) -> bool:
    """A configured host name is compared by its port alone (HAProxy shows the address it resolved)."""
    live_host, _, live_port = live.rpartition(":")
    host, _, port = configured.rpartition(":")
    if live_port != port:
        return False
    try:
        wanted = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return True
    try:
        return ipaddress.ip_address(live_host.strip("[]")) == wanted
    except ValueError:
        return False


# --- the internal key on engine hosts -----------------------------------------------------------------------------
def internal_key_path(provider: Provider) -> str | None:
    """Where an engine host keeps this engine's form of the internal key (root-only): the file its unit loads as a
    credential, or the EnvironmentFile= that sets its variable; None for an engine that takes no key."""
    folder = posixpath.dirname(REPLICA_KEY)
    if provider.internal_key_credential:
        return f"{folder}/{provider.internal_key_credential}"
    if provider.internal_key_env:
        return f"{folder}/replica-key.{provider.name}.env"
    return None


def replica_key_files(keys: Sequence[str]) -> dict[str, str]:
    """Every engine's form of the internal key on an engine host: path -> content. keys[0] is the key the gateways
    send; the others (an old key during a rotation) are accepted too by the engines that take several."""
    from engine_ctl.providers import PROVIDERS

    out: dict[str, str] = {}
    for provider in PROVIDERS.values():
        path = internal_key_path(provider)
        if path is not None:
            out[path] = provider.internal_key_text(keys)
    return out


def gateway_key_text(key: str, following: str | None = None) -> str:
    """The gateway's key map: the key it sends, and the one a rotation has given the replicas to accept next."""
    return f"gateway {key}\n" + (f"next {following}\n" if following else "")


def parse_gateway_key(text: str) -> tuple[str | None, str | None]:
    """(the key sent, the next one) from a gateway's key map, or from the files engine-ctl wrote before it (the
    environment file ENGINE_CTL_GATEWAY_KEY=<hex>, a replica's key file): a 64-digit hex key each, else None."""
    sent: str | None = None
    following: str | None = None
    for line in text.splitlines():
        name, _, value = line.strip().replace("=", " ", 1).partition(" ")
        value = value.strip() if value else name
        if len(value) != 64 or any(c not in "0123456789abcdef" for c in value):
            continue
        if name == "next":
            following = value
        elif sent is None:
            sent = value
    return sent, following


# --- decision models (seed 003): routed to POST /v1/systemone only, checked with the readiness decision ---------
def decisions_context(backends: list[GatewayBackend], internal_key: bool) -> dict[str, object]:
    """The template's values for decisions backends: their names (one ACL), and each one's health check body:
    the readiness request with its own served model name, as HAProxy's `http-check send ... body` takes it."""
    from engine_ctl.core.decisions import READINESS_PATH, readiness_body

    decisions = [b for b in backends if b.api == "decisions"]
    return {
        "decisions_backends": " ".join(b.backend for b in decisions),
        "decisions_path": READINESS_PATH,
        "decisions_checks": {b.backend: _haproxy_quoted(readiness_body(b.deployment)) for b in decisions},
        "decisions_auth": internal_key,
    }


def _haproxy_double_quoted(text: str) -> str:
    """A converter's argument inside a double-quoted word (`"fetch,conv('<text>')"`): HAProxy reads \\\\ and \\" there
    (and nothing else is escaped); the argument's own single quotes take the text as it is. A text with a single
    quote or a `$` (HAProxy expands variables inside double quotes) cannot be written so."""
    if "'" in text or "$" in text:
        raise ValueError(f"cannot be written in HAProxy's double quotes: {text!r}")
    return text.replace("\\", "\\\\").replace('"', '\\"')


def _haproxy_quoted(text: str) -> str:
    """A string in HAProxy's single quotes (no escapes inside; a ' ends it and is written '\\'')."""
    return "'" + text.replace("'", "'\\''") + "'"
