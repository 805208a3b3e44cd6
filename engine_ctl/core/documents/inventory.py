"""The host inventory (hosts.yaml): where engine-ctl reaches each host and what it may use there."""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from engine_ctl.core.diagnostics import Diagnostic, InputError, format_path
from engine_ctl.core.documents.shape import diagnostics_from
from engine_ctl.core.documents.yamlsource import SourceDocument, read_path, text_problems
from engine_ctl.core.sizes import parse_size
from engine_ctl.providers import NON_ENGINE_EXECUTABLES, PROVIDERS, canonical_engine, engine_keys, seal

DEFAULT_MODELS_DIR = "/var/lib/engine-ctl/models"
INTERFACE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,15}")
"""A Linux network interface's name (IFNAMSIZ is 16 with the NUL): what NCCL_SOCKET_IFNAME may safely name."""
DEFAULT_CACHE_DIR = "/var/cache/engine-ctl"
GATEWAY_ROLE = "gateway"
DEFAULT_GATEWAY_PORT = 8800
DEFAULT_DOWNLOAD_CAP = 500 * 1024**3
DEFAULT_HOLD_S = 120
"""Seed 001: a request to a deployment with no serving replica is held up to 2 minutes, then 503 Retry-After: 5."""
DEFAULT_HOLD_CAP = 100
"""Requests held at once per deployment; more are answered 503 with Retry-After: 5 at once."""
HOLD_S_RANGE = (1, 3600)
HOLD_CAP_RANGE = (0, 10000)
DEFAULT_GATEWAY_THREADS = 1
"""HAProxy's threads on a gateway host. One thread proxies thousands of requests a second, far more than engines
answer, and leaves the other cores to the engines that share the host (bench/gateway.py: two threads on two
cores took about a sixth more CPU per request)."""
GATEWAY_THREADS_RANGE = (1, 64)
KEY_RATE_RANGE = (1, 1_000_000)
"""Requests a minute per API key (the ApiKey documents' spec.requests_per_minute has the same range)."""
"""All hf: downloads together on a host are capped at 500 GiB (seed 003), unless downloads.cap says otherwise."""
HOST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
EXECUTABLE = re.compile(r"/[A-Za-z0-9/._+:=,@-]*")
"""An engine's executable: systemd runs it as ExecStart's first word, where `$` cannot be escaped (`$$` stays
two characters there and the unit fails with 203/EXEC), so only characters that need no escaping at all."""
EXECUTABLE_MESSAGE = "an absolute path of letters, digits and / . _ + : = , @ - (no spaces, $, % or quotes)"


class _Doc(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, defer_build=True)


if TYPE_CHECKING:
    EngineKey = str
else:
    EngineKey = Literal[(*engine_keys(), *NON_ENGINE_EXECUTABLES)]
"""An engine's name or alias (the providers'), or the gateway's executable."""


def _install_example() -> str:
    """Where an engine may be installed, for hints: the first engine's third place to look."""
    first = next(iter(PROVIDERS.values()))
    return first.executable_candidates(None)[-1]


seal(__name__)


BUILD_PLATFORMS = ("cuda", "rocm", "vulkan", "metal", "cpu")
SHA256_HEX = re.compile(r"[0-9a-f]{64}")


class EngineBuilds(_Doc):
    """One build of an engine per platform (seed 001, GPU vendors), or one for every platform (path), and
    optionally what it must be: a build whose version is not the seed's release needs its version pinned."""

    path: str | None = Field(None, description="The one build for every platform (instead of one per platform).")
    cuda: str | None = Field(None, description="The build for NVIDIA GPUs.")
    rocm: str | None = Field(None, description="The build for the AMD GPUs ROCm has kernels for.")
    vulkan: str | None = Field(None, description="The build for other AMD Radeon GPUs.")
    metal: str | None = Field(None, description="The build for Apple silicon.")
    cpu: str | None = Field(None, description="The build for CPUs only.")
    version: str | None = Field(
        None, description="Pin: a host whose build reports another version is left out. Without it, a build that "
        "reports a version other than the seed's release of its engine (see Inventory, Engine builds) is left out."
    )  # fmt: skip
    sha256: str | None = Field(None, description="Pin: a host whose build has another sha256 is left out.")
    decisions: bool | None = Field(
        None, description="true: this build serves decision models (api: decisions) whatever version it reports: "
        "the operator's registration, for a build older than the engine's decisions floor that serves "
        "POST /v1/systemone (a development build). Every replica still proves it with the readiness decision."
    )  # fmt: skip


class HostSettings(_Doc):
    """Fields a host entry and the defaults block share."""

    address: str | None = Field(None, description="IP address or DNS name; defaults to the name.")
    port: int | None = Field(None, description="SSH port (22).")
    user: str | None = Field(None, description="SSH user (default: yours, or your ~/.ssh/config's).")
    identity_file: str | None = Field(None, description="SSH private key file; the SSH agent is used too.")
    known_hosts: str | None = Field(
        None, description="known_hosts file to check host keys against (~/.ssh/known_hosts)."
    )
    host_key: str | None = Field(None, description="Pinned host key: 'ssh-ed25519 AAAA…' (instead of known_hosts).")
    labels: dict[str, str] | None = Field(None, description="Your labels.")
    roles: list[str] | None = Field(
        None, description="Roles: gateway (the host runs the endpoint, HAProxy, for every deployment)."
    )
    gateway_port: int | None = Field(
        None, description=f"The gateway's port on a gateway host ({DEFAULT_GATEWAY_PORT})."
    )
    models_dir: str | None = Field(None, description=f"Where model weights live on the host ({DEFAULT_MODELS_DIR}).")
    network_interface: str | None = Field(
        None, description="The network interface a replica group's members talk over (spec.nodes > 1), e.g. eth1, "
        "where the host has several: the collective libraries' NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME. Left out: "
        "the libraries choose."
    )  # fmt: skip
    cache_dir: str | None = Field(None, description=f"The engine cache directory ({DEFAULT_CACHE_DIR}).")
    engines: dict[EngineKey, str | EngineBuilds] | None = Field(
        None, description="Engine name -> its executable on the host, or one build per platform (cuda, rocm, vulkan, "
        "metal, cpu) with an optional version or sha256 pin."
    )  # fmt: skip
    transport: Literal["ssh", "local"] | None = Field(None, description="local: this machine, without SSH.")
    connect_timeout: float | None = Field(None, description="Seconds to connect (10).")
    command_timeout: float | None = Field(None, description="Seconds a remote command may take (120).")


class HostEntry(HostSettings):
    name: str = Field(description="The host's name in engine-ctl.")


class DownloadSettings(_Doc):
    """How hosts fetch hf: weights into <models_dir>/sources."""

    enabled: bool | None = Field(None, description="false: never download; hf: weights must be put in place.")
    cap: str | int | None = Field(
        None, description="All downloads together (everything under sources/) at most this: 500GiB by default, "
        "or off for no cap."
    )  # fmt: skip


class GatewaySettingsDocument(_Doc):
    """The gateway's settings, the same on every gateway host."""

    hold_s: int | None = Field(
        None, description=f"Seconds a request to a deployment with no serving replica is held before it is answered "
        f"503 with Retry-After: 5 ({DEFAULT_HOLD_S}; {HOLD_S_RANGE[0]} to {HOLD_S_RANGE[1]})."
    )  # fmt: skip
    hold_cap: int | None = Field(
        None, description=f"Requests held at once per deployment; more are answered 503 at once ({DEFAULT_HOLD_CAP}; "
        f"{HOLD_CAP_RANGE[0]} to {HOLD_CAP_RANGE[1]}, 0: never hold)."
    )  # fmt: skip
    threads: int | None = Field(
        None, description=f"HAProxy's threads on each gateway host ({DEFAULT_GATEWAY_THREADS}; "
        f"{GATEWAY_THREADS_RANGE[0]} to {GATEWAY_THREADS_RANGE[1]}): more for a gateway of its own under heavy load."
    )  # fmt: skip
    requests_per_minute: int | None = Field(
        None, description=f"At most this many requests a minute per API key, on each gateway host, for every key "
        f"whose document sets no spec.requests_per_minute ({KEY_RATE_RANGE[0]} to {KEY_RATE_RANGE[1]}; left out: no "
        "limit). More are answered 429 `rate_limit_exceeded` with Retry-After."
    )  # fmt: skip


class MonitoringDocument(_Doc):
    """Prometheus metrics on every gateway host, for the monitoring hosts only."""

    port: int = Field(description="The metrics port on every gateway host (e.g. 8405): HAProxy's exporter on "
                      "/metrics, engine-ctl's series on /metrics/engine-ctl.")  # fmt: skip
    hosts: list[str] = Field(
        default_factory=list,
        description="Who may scrape it besides loopback: inventory host names, IP addresses or networks "
        "(10.0.0.0/24). The same hosts reach each engine's /metrics through its guard.",
    )


class ScalerLockDocument(_Doc):
    """With PostgreSQL state, the scalers on the gateway hosts take a lock in that database: where they reach it
    (the state's host and port by default) and, where engine-ctl may not create roles, the role they log in as."""

    host: str | None = Field(None, description="The database's address as the gateway hosts reach it (the state "
                             "DSN's host).")  # fmt: skip
    port: int | None = Field(None, description="Its port (the state DSN's port, or 5432).")
    role: str | None = Field(None, description="An existing LOGIN role for the scalers (with password_file): "
                             "engine-ctl then creates no role.")  # fmt: skip
    password_file: str | None = Field(None, description="With role: the file on every gateway host (root's, "
                                      "0600) whose first line is that role's password.")  # fmt: skip


class ScalingSettings(_Doc):
    """The scaler's timings (the seeds' values by default; shorter ones for tests). How long the gateway holds a
    request is the gateway block's hold_s."""

    decide_every_s: int | None = Field(None, ge=1, le=86400, description="At most one scaling decision per "
                                       "deployment this often, in seconds (120).")  # fmt: skip
    poll_s: int | None = Field(None, ge=1, le=3600, description="Seconds between reads of the engines' /metrics (15).")
    lock: ScalerLockDocument | None = Field(
        None,
        description="With PostgreSQL state: where the gateway hosts' "
        "scalers reach the database for their lock, and the role they use.",
    )


class ScalerLockSettings(BaseModel):
    """scaling.lock as given (engine_ctl.core.plan.scalerlock fills in the rest from the state's DSN)."""

    model_config = ConfigDict(frozen=True, defer_build=True)

    host: str | None = None
    port: int | None = None
    role: str | None = None
    password_file: str | None = None
    line: int | None = None
    column: int | None = None
    """Where scaling.lock is in the inventory file (for the plan's errors about it)."""


class Scaling(BaseModel):
    model_config = ConfigDict(frozen=True, defer_build=True)

    decide_every_s: int = 120
    poll_s: int = 15
    lock: ScalerLockSettings = ScalerLockSettings()


class InventoryDocument(_Doc):
    kind: Literal["Inventory"] = "Inventory"
    defaults: HostSettings | None = None
    downloads: DownloadSettings | None = Field(None, description="hf: downloads: on or off, and their cap.")
    gateway: GatewaySettingsDocument | None = Field(
        None,
        description="The gateway's settings: how long and how many requests are held (hold_s, hold_cap), "
        "HAProxy's threads (threads), the requests a minute per API key (requests_per_minute).",
    )
    scaling: ScalingSettings | None = Field(None, description="The scaler's timings: decide_every_s, poll_s.")
    monitoring: MonitoringDocument | None = Field(
        None, description="Prometheus metrics on the gateway hosts: their port and the hosts that may scrape them."
    )
    hosts: list[dict[str, object]] = Field(description="The hosts.")


class Host(BaseModel):
    """A host, with the defaults applied."""

    model_config = ConfigDict(frozen=True, defer_build=True)

    name: str
    address: str
    port: int = 22
    user: str | None = None
    identity_file: str | None = None
    known_hosts: str | None = None
    host_key: str | None = None
    labels: dict[str, str] = {}
    roles: tuple[str, ...] = ()
    gateway_port: int = DEFAULT_GATEWAY_PORT
    models_dir: str = DEFAULT_MODELS_DIR
    cache_dir: str = DEFAULT_CACHE_DIR
    network_interface: str | None = None
    """The interface a replica group's members talk over on this host (None: the collective libraries choose)."""
    engines: dict[str, str] = {}
    """Engine -> the one executable for every platform."""
    engine_builds: dict[str, dict[str, str]] = {}
    """Engine -> platform -> the build's executable (cuda, rocm, vulkan, metal, cpu)."""
    engine_pins: dict[str, dict[str, str]] = {}
    """Engine -> {"version": …, "sha256": …}: what its build must be on this host."""
    engine_decisions: dict[str, bool] = {}
    """Engine -> true where the inventory registers its build as serving decision models (below the floor)."""
    transport: Literal["ssh", "local"] = "ssh"
    connect_timeout: float = 10.0
    command_timeout: float = 120.0


class Downloads(BaseModel):
    model_config = ConfigDict(frozen=True, defer_build=True)

    enabled: bool = True
    cap_bytes: int | None = DEFAULT_DOWNLOAD_CAP
    """None: no cap."""


class GatewaySettings(BaseModel):
    model_config = ConfigDict(frozen=True, defer_build=True)

    hold_s: int = DEFAULT_HOLD_S
    hold_cap: int = DEFAULT_HOLD_CAP
    threads: int = DEFAULT_GATEWAY_THREADS
    requests_per_minute: int | None = None
    """Per API key, for keys whose document sets none (None: no limit)."""
    metrics_port: int | None = None
    """The inventory's monitoring.port: the gateway's metrics port (None: no metrics)."""
    metrics_allow: tuple[str, ...] = ()
    """monitoring.hosts as addresses and networks: who may connect to the metrics port besides loopback."""


class Inventory(BaseModel):
    model_config = ConfigDict(frozen=True, defer_build=True)

    file: str | None = None
    hosts: tuple[Host, ...] = ()
    downloads: Downloads = Downloads()
    gateway: GatewaySettings = GatewaySettings()
    scaling: Scaling = Scaling()

    def gateways(self) -> list[Host]:
        """The hosts with the gateway role, in inventory order."""
        return [h for h in self.hosts if GATEWAY_ROLE in h.roles]

    def host(self, name: str) -> Host | None:
        return next((h for h in self.hosts if h.name == name), None)

    def select(self, names: list[str]) -> list[Host]:
        """Hosts by name, in inventory order; raise InputError naming the unknown ones."""
        unknown = [n for n in names if self.host(n) is None]
        if unknown:
            from engine_ctl.core.diagnostics import Location

            raise InputError(
                [
                    Diagnostic(
                        Location(self.file or "inventory"),
                        "hosts",
                        f"no host named {n!r} in the inventory",
                        hint=f"hosts: {', '.join(h.name for h in self.hosts) or '(none)'}",
                        code="unknown_host",
                    )
                    for n in unknown
                ]
            )
        return [h for h in self.hosts if not names or h.name in names]


def _expand(path: str | None, base: Path | None) -> str | None:
    if path is None:
        return None
    p = Path(path).expanduser()
    if not p.is_absolute() and base is not None:
        p = base / p
    return str(p)


def _path_problems(doc: SourceDocument, where: tuple[str | int, ...], settings: HostSettings) -> list[Diagnostic]:
    """Paths a unit or an argv is built from: absolute, and executables in the characters ExecStart takes; the
    network interface a unit's environment names."""
    out: list[Diagnostic] = []
    interface = settings.network_interface
    if interface is not None and not INTERFACE_NAME.fullmatch(interface):
        path = (*where, "network_interface")
        out.append(Diagnostic(doc.locate(path), format_path(path), f"{interface!r} is not a network interface's name",
                              hint="name it as `ip link` shows it, e.g. eth1 or ens5 (1 to 15 letters, digits, _ . -)",
                              code="invalid_interface"))  # fmt: skip
    for key in ("models_dir", "cache_dir"):
        value = getattr(settings, key)
        if value is not None and not value.startswith("/"):
            path = (*where, key)
            out.append(Diagnostic(doc.locate(path), format_path(path), f"{value!r}: an absolute path on the host",
                                  code="not_absolute_path"))  # fmt: skip
    for _engine, exe, path in _executables(where, settings):
        if exe is not None and not EXECUTABLE.fullmatch(exe):
            out.append(
                Diagnostic(
                    doc.locate(path),
                    format_path(path),
                    f"executable {exe!r}: {EXECUTABLE_MESSAGE}",
                    hint=f"install or link the engine under such a path, e.g. {_install_example()}",
                    code="invalid_executable",
                )
            )
    return out


def _executables(
    where: tuple[str | int, ...], settings: HostSettings
) -> list[tuple[str, str | None, tuple[str | int, ...]]]:
    """Every executable the settings name, with its document path."""
    out: list[tuple[str, str | None, tuple[str | int, ...]]] = []
    for engine, value in (settings.engines or {}).items():
        if isinstance(value, str):
            out.append((engine, value, (*where, "engines", engine)))
        else:
            out += [(engine, getattr(value, p), (*where, "engines", engine, p)) for p in ("path", *BUILD_PLATFORMS)]
    return out


def _pin_problems(doc: SourceDocument, where: tuple[str | int, ...], settings: HostSettings) -> list[Diagnostic]:
    out = []
    for engine, value in (settings.engines or {}).items():
        if isinstance(value, EngineBuilds) and value.sha256 is not None and not SHA256_HEX.fullmatch(value.sha256):
            path = (*where, "engines", engine, "sha256")
            out.append(Diagnostic(doc.locate(path), format_path(path), f"{value.sha256!r}: a sha256 is 64 "
                                  "lowercase hexadecimal digits", hint="sha256sum the engine's binary",
                                  code="invalid_sha256"))  # fmt: skip
        platforms = [p for p in BUILD_PLATFORMS if isinstance(value, EngineBuilds) and getattr(value, p)]
        if isinstance(value, EngineBuilds) and not value.path and not platforms:
            path = (*where, "engines", engine)
            out.append(Diagnostic(doc.locate(path), format_path(path), "no build: name one per platform ("
                                  + ", ".join(BUILD_PLATFORMS) + "), or path: one for every platform",
                                  code="no_engine_build"))  # fmt: skip
        if isinstance(value, EngineBuilds) and value.path and platforms:
            path = (*where, "engines", engine, "path")
            out.append(Diagnostic(doc.locate(path), format_path(path), "path is the one build for every platform: "
                                  f"it cannot stand beside builds per platform ({', '.join(platforms)})",
                                  hint="keep path alone, or name a build for each platform instead",
                                  code="no_engine_build"))  # fmt: skip
    return out


def split_engines(engines: dict[str, object]) -> dict[str, dict[str, object]]:
    """The engines entry as Host keeps it: plain executables, builds per platform, and pins."""
    plain: dict[str, object] = {}
    builds: dict[str, object] = {}
    pins: dict[str, object] = {}
    decisions: dict[str, object] = {}
    for key, value in engines.items():
        name = canonical_engine(key)
        if isinstance(value, str):
            plain[name] = value
            continue
        assert isinstance(value, dict)
        if value.get("path"):
            plain[name] = value["path"]
        else:
            builds[name] = {p: value[p] for p in BUILD_PLATFORMS if value.get(p)}
        pinned = {k: value[k] for k in ("version", "sha256") if value.get(k)}
        if pinned:
            pins[name] = pinned
        if value.get("decisions") is not None:
            decisions[name] = bool(value["decisions"])
    return {"engines": plain, "engine_builds": builds, "engine_pins": pins, "engine_decisions": decisions}


def _host_entry(doc: SourceDocument, i: int, raw: object) -> tuple[HostEntry | None, list[Diagnostic]]:
    """hosts[i] as a HostEntry, or its problems (positioned in the document, named hosts[i].field)."""
    try:
        return HostEntry.model_validate(raw), []
    except ValidationError as exc:
        shifted = SourceDocument(
            file=doc.file,
            index=doc.index,
            data=raw,
            line=doc.locate(("hosts", i)).line or 1,
            column=doc.locate(("hosts", i)).column or 1,
            value_positions={k[2:]: v for k, v in doc.value_positions.items() if k[:2] == ("hosts", i)},
            key_positions={k[2:]: v for k, v in doc.key_positions.items() if k[:2] == ("hosts", i)},
        )
        return None, [
            Diagnostic(
                d.location, f"hosts[{i}].{d.field}" if d.field else f"hosts[{i}]", d.message, d.hint, code=d.code
            )
            for d in diagnostics_from(exc, shifted, HostEntry)
        ]


def _name_problem(doc: SourceDocument, i: int, name: str, seen: dict[str, int]) -> Diagnostic | None:
    """A host name that breaks the naming rule or names a host twice."""
    where = doc.locate(("hosts", i, "name"))
    if not HOST_NAME.fullmatch(name):
        message = f"host name {name!r}: letters, digits, '.', '_' and '-', at most 63 characters"
        return Diagnostic(where, f"hosts[{i}].name", message, code="invalid_name")
    if name in seen:
        why = f"duplicate host name {name!r} (also hosts[{seen[name]}])"
        return Diagnostic(where, f"hosts[{i}].name", why, code="duplicate_name")
    return None


def inventory_from(doc: SourceDocument) -> tuple[Inventory, list[Diagnostic]]:
    """Build an Inventory from a parsed document. Pure apart from path expansion."""
    unsafe = text_problems(doc)
    if unsafe:
        return Inventory(file=doc.file), unsafe
    try:
        parsed = InventoryDocument.model_validate(doc.data)
    except ValidationError as exc:
        return Inventory(file=doc.file), diagnostics_from(exc, doc, InventoryDocument)
    base = Path(doc.file).parent
    defaults = (parsed.defaults or HostSettings()).model_dump(exclude_none=True)
    problems: list[Diagnostic] = _path_problems(doc, ("defaults",), parsed.defaults or HostSettings())
    problems += _pin_problems(doc, ("defaults",), parsed.defaults or HostSettings())
    hosts: list[Host] = []
    seen: dict[str, int] = {}
    addresses: dict[str, int] = {}
    for i, raw in enumerate(parsed.hosts):
        entry, entry_problems = _host_entry(doc, i, raw)
        problems.extend(entry_problems)
        if entry is None:
            continue
        problems.extend(_path_problems(doc, ("hosts", i), entry) + _pin_problems(doc, ("hosts", i), entry))
        named = _name_problem(doc, i, entry.name, seen)
        if named is not None:
            problems.append(named)
            continue
        seen[entry.name] = i
        values = {**defaults, **entry.model_dump(exclude_none=True)}
        values["labels"] = {**defaults.get("labels", {}), **(entry.labels or {})}
        problems.extend(_port_problems(doc, i, entry))
        values.setdefault("address", entry.name)
        same = addresses.setdefault(str(values["address"]).lower(), i)
        if same != i:
            problems.append(
                Diagnostic(
                    doc.locate(("hosts", i, "address")),
                    f"hosts[{i}].address",
                    f"address {values['address']!r} is also hosts[{same}]'s: one machine listed twice would have "
                    "its GPUs, cores and memory counted twice",
                    hint="list each machine once",
                    code="duplicate_address",
                )
            )
            continue
        values.update(split_engines(values.get("engines", {})))
        for key in ("identity_file", "known_hosts"):
            values[key] = _expand(values.get(key), base)
        values["roles"] = tuple(values.get("roles", ()))
        hosts.append(Host(**values))
    if not parsed.hosts:
        problems.append(
            Diagnostic(doc.locate(("hosts",)), "hosts", "no hosts: list at least one host", code="no_hosts")
        )
    downloads, wrong = _downloads(doc, parsed.downloads)
    gateway, out_of_range = _gateway_settings(doc, parsed.gateway)
    gateway, monitoring_problems = _monitoring(doc, parsed.monitoring, gateway, hosts)
    out_of_range += monitoring_problems
    scaling, lock_problems = _scaling(doc, parsed.scaling)
    inventory = Inventory(file=doc.file, hosts=tuple(hosts), downloads=downloads, gateway=gateway, scaling=scaling)
    return inventory, problems + wrong + out_of_range + lock_problems


PG_ROLE = re.compile(r"[a-z_][a-z0-9_]{0,62}")


def _scaling(doc: SourceDocument, settings: ScalingSettings | None) -> tuple[Scaling, list[Diagnostic]]:
    """The scaler's timings, and scaling.lock checked: a port in range, role and password_file together (a role
    name PostgreSQL takes unquoted, an absolute path on the hosts)."""
    if settings is None:
        return Scaling(), []
    timings = settings.model_dump(exclude_none=True, exclude={"lock"})
    lock = settings.lock
    if lock is None:
        return Scaling(**timings), []
    problems = []

    def wrong(key: str, message: str, hint: str, code: str) -> None:
        where = ("scaling", "lock", key) if key else ("scaling", "lock")
        problems.append(Diagnostic(doc.locate(where), format_path(where), message, hint=hint, code=code))

    if lock.port is not None and not 1 <= lock.port <= 65535:
        wrong(
            "port",
            f"between 1 and 65535, not {lock.port}",
            "leave it out for the state DSN's port",
            code="out_of_range",
        )
    if (lock.role is None) != (lock.password_file is None):
        wrong(
            "",
            "role and password_file go together: an existing role and the file with its password on every gateway host",
            "name both, or neither (engine-ctl then creates the scalers' role)",
            "scaler_lock_role",
        )
    if lock.role is not None and not PG_ROLE.fullmatch(lock.role):
        wrong("role", f"{lock.role!r}: a role name of lowercase letters, digits and _ (not starting with a digit)",
              "name the role as PostgreSQL lists it unquoted", code="scaler_lock_role")  # fmt: skip
    if lock.password_file is not None and not lock.password_file.startswith("/"):
        wrong("password_file", f"{lock.password_file!r}: an absolute path on the gateway hosts", "e.g. "
              "/etc/engine-ctl/scaler/role-password", code="not_absolute_path")  # fmt: skip
    at = doc.locate(("scaling", "lock"), key=True)
    found = ScalerLockSettings(**lock.model_dump(exclude_none=True), line=at.line, column=at.column)
    return Scaling(**timings, lock=found), problems


def _gateway_settings(
    doc: SourceDocument, settings: GatewaySettingsDocument | None
) -> tuple[GatewaySettings, list[Diagnostic]]:
    """The gateway block's hold time and cap and HAProxy's threads, each within its range (an error at the field
    otherwise)."""
    if settings is None:
        return GatewaySettings(), []
    problems = []
    limits = (
        ("hold_s", HOLD_S_RANGE, DEFAULT_HOLD_S, " seconds"),
        ("hold_cap", HOLD_CAP_RANGE, DEFAULT_HOLD_CAP, ""),
        ("threads", GATEWAY_THREADS_RANGE, DEFAULT_GATEWAY_THREADS, ""),
        ("requests_per_minute", KEY_RATE_RANGE, "no limit", " requests a minute"),
    )
    for key, (low, high), default, unit in limits:
        value = getattr(settings, key)
        if value is not None and not low <= value <= high:
            where = ("gateway", key)
            problems.append(Diagnostic(doc.locate(where), format_path(where), f"between {low} and {high}{unit}, "
                                       f"not {value}", hint=f"leave it out for the default, {default}",
                                       code="out_of_range"))  # fmt: skip
    if problems:
        return GatewaySettings(), problems
    return GatewaySettings(**settings.model_dump(exclude_none=True)), []


RESERVED_PORTS = {8809: "the scaler's wake port", 22: "SSH"}


def _monitoring(
    doc: SourceDocument, settings: MonitoringDocument | None, gateway: GatewaySettings, hosts: list[Host]
) -> tuple[GatewaySettings, list[Diagnostic]]:
    """The monitoring block: a port in range that no gateway host uses already, and each of its hosts an inventory
    host with an IP address, an IP address or a network (HAProxy compares a connection's source with them)."""
    if settings is None:
        return gateway, []
    problems = []

    def wrong(where: tuple[str | int, ...], message: str, hint: str, code: str) -> None:
        problems.append(Diagnostic(doc.locate(where), format_path(where), message, hint=hint, code=code))

    port = settings.port
    taken = {h.gateway_port: f"{h.name}'s gateway_port" for h in hosts if GATEWAY_ROLE in h.roles}
    taken.update({h.port: f"{h.name}'s SSH port" for h in hosts if GATEWAY_ROLE in h.roles})
    taken.update(RESERVED_PORTS)
    if not 1 <= port <= 65535:
        wrong(("monitoring", "port"), f"between 1 and 65535, not {port}", "e.g. 8405", code="out_of_range")
    elif port in taken:
        wrong(("monitoring", "port"), f"{port} is already {taken[port]} on the gateway hosts",
              "choose a free port, e.g. 8405", code="port_taken")  # fmt: skip
    by_name = {h.name: h for h in hosts}
    allow: list[str] = []
    for i, entry in enumerate(settings.hosts):
        named = by_name.get(entry)
        value = named.address if named is not None else entry
        try:
            network = ipaddress.ip_network(value, strict=False)
        except ValueError:
            if named is not None:
                wrong(("monitoring", "hosts", i), f"host {entry!r} has the address {value!r}, not an IP address: "
                      "the gateway compares a scraper's source address with it", "give the host's IP address "
                      "here instead", code="monitoring_host")  # fmt: skip
            else:
                known = ", ".join(sorted(by_name)) or "(none)"
                wrong(("monitoring", "hosts", i), f"{entry!r} is neither a host of this inventory nor an IP "
                      "address or network", f"an inventory host ({known}), an address such as 10.0.0.5 or a "
                      "network such as 10.0.0.0/24", code="monitoring_host")  # fmt: skip
            continue
        allow.append(str(network.network_address) if network.num_addresses == 1 else str(network))
    if problems:
        return gateway, problems
    return gateway.model_copy(update={"metrics_port": port, "metrics_allow": tuple(dict.fromkeys(allow))}), []


def _port_problems(doc: SourceDocument, i: int, entry: HostEntry) -> list[Diagnostic]:
    """The host's SSH port and gateway port, each between 1 and 65535."""
    out = []
    for key in ("port", "gateway_port"):
        value = getattr(entry, key)
        if value is not None and not 1 <= value <= 65535:
            where = doc.locate(("hosts", i, key))
            out.append(Diagnostic(where, f"hosts[{i}].{key}", "between 1 and 65535", code="out_of_range"))
    return out


def _downloads(doc: SourceDocument, settings: DownloadSettings | None) -> tuple[Downloads, list[Diagnostic]]:
    if settings is None:
        return Downloads(), []
    cap: int | None = DEFAULT_DOWNLOAD_CAP
    if isinstance(settings.cap, str) and settings.cap.strip().lower() in ("off", "none"):
        cap = None
    elif settings.cap is not None:
        try:
            cap = parse_size(settings.cap)
        except ValueError as exc:
            where = ("downloads", "cap")
            return Downloads(), [
                Diagnostic(doc.locate(where), format_path(where), f"{exc}, or off for no cap", code="invalid_size")
            ]
    return Downloads(enabled=settings.enabled is not False, cap_bytes=cap), []


def load_inventory(path: Path) -> Inventory:
    """Read hosts.yaml (imperative shell); raise InputError with located diagnostics."""
    docs, problems = read_path(path)
    if problems:
        raise InputError(problems)
    if len(docs) != 1:
        from engine_ctl.core.diagnostics import Location

        raise InputError(
            [Diagnostic(Location(str(path)), "", "an inventory file holds one document", code="one_inventory_document")]
        )
    inventory, problems = inventory_from(docs[0])
    if problems:
        raise InputError(problems)
    return inventory
