"""Render each replica's systemd unit from its argv (Jinja template, systemd escaping). Pure."""

from __future__ import annotations

import dataclasses
import hashlib
import posixpath
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict

from engine_ctl.core.documents.inventory import GATEWAY_ROLE, Host
from engine_ctl.core.fit.runspec import FitPlan, Placement, ReplicaRun
from engine_ctl.core.model import Deployment, Model
from engine_ctl.core.names import UNIT_PREFIX as UNIT_PREFIX  # re-exported: plan and gather use it
from engine_ctl.core.names import UNIT_SUFFIX, unit_name
from engine_ctl.core.render.gateway import LOOPBACK, internal_key_path, is_ip
from engine_ctl.core.render.guard import needs_guard, render_guard, residency_of, wake_line
from engine_ctl.core.render.systemd_escape import env_assignment, exec_line, path_value
from engine_ctl.core.render.templates import load_template
from engine_ctl.providers import Provider
from engine_ctl.providers.base import Group, is_template_name

if TYPE_CHECKING:
    pass

CURL = "/usr/bin/curl"
SH = "/bin/sh"
VAR_CACHE = "/var/cache"
CREDENTIALS_DIR = "/run/credentials"
TEMPLATE_CREDENTIAL = "chat-template"
HASH_LINE = "\n# content-sha256: \n"
RESTART_SEC = 5
"""A replica that exits other than by a stop (a crash) is started again this many seconds later."""
EXITS_DIR = "/run/engine-ctl/exits"
"""Where a replica's unit records each exit that was not a stop (one line: epoch, systemd's result, exit code and
status: `1733312345 signal killed SEGV`), in a file named after the unit; the facts probe reads it."""
"""The template's header line for the content hash, as the body (rendered without the hash) has it."""
NVIDIA_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")


class RenderedMember(BaseModel):
    """A worker's unit of a replica group (spec.nodes > 1), on its own host."""

    model_config = ConfigDict(frozen=True)

    rank: int
    name: str
    host: str
    port: int
    gpus: tuple[str, ...] = ()
    argv: tuple[str, ...]
    text: str
    sha256: str


class RenderedUnit(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    host: str
    index: int
    slot: str
    port: int
    gpus: tuple[str, ...]
    argv: tuple[str, ...]
    environment: dict[str, str]
    text: str
    sha256: str
    """sha256 of the whole file as written: what plan compares with the host's file."""
    content_hash: str
    """sha256 of the unit without its header line: what the header records."""
    lineage: str | None = None
    """The state lineage in the unit's header (None: a unit without one, as older engine-ctl wrote them)."""
    members: tuple[RenderedMember, ...] = ()
    """A replica group's workers' units (rank 1 first); this unit is the head's, and names each with its sha256,
    so that a change to any member is a change to the replica."""


def model_path_on_host(model: Model, host: Host) -> str:
    """Absolute path of the weights on a host: the .gguf file, or the checkpoint directory."""
    if model.path is not None:
        base = model.path if model.path.startswith("/") else posixpath.join(host.models_dir, model.path)
    elif model.hf is not None:
        base = posixpath.join(host.models_dir, "sources", model.hf.repo, model.hf.commit or "main")
    else:  # pragma: no cover - refused by the rules
        raise ValueError(f"model {model.name} has no path")
    if model.file and not base.endswith(".gguf"):
        return posixpath.join(base, model.file)
    return posixpath.normpath(base)


def bind_address(host: Host) -> str:
    """Engines listen on the host's inventory address (where the gateway reaches them), not on every interface;
    an inventory address that is a DNS name leaves 0.0.0.0."""
    return host.address if is_ip(host.address) else "0.0.0.0"


def local_address(bind: str) -> str:
    """Where the health gate and the facts probe reach the engine from the host itself (for a URL)."""
    if bind in ("0.0.0.0", "::"):
        return "127.0.0.1"
    return f"[{bind}]" if ":" in bind else bind


_last_allow: list[tuple[Mapping[str, Host], int, tuple[str, ...]]] = []
"""gateway_allow's last answer: a plan renders every replica against the same hosts (5,000 units on 1,000 hosts
read every host 5,000 times: bench.scale)."""


def gateway_allow(hosts: Mapping[str, Host]) -> tuple[str, ...]:
    """The gateway hosts' IP addresses (IPAddressAllow= takes addresses, not names)."""
    last = _last_allow[-1] if _last_allow else None
    if last is not None and last[0] is hosts and last[1] == len(hosts):
        return last[2]
    allow = tuple(sorted({h.address for h in hosts.values() if GATEWAY_ROLE in h.roles and is_ip(h.address)}))
    _last_allow[:] = [(hosts, len(hosts), allow)]
    return allow


def device_allow(run: ReplicaRun) -> list[str]:
    if not run.gpus or run.gpus[0].vendor == "apple":
        return []
    if run.gpus[0].vendor == "amd":
        return ["/dev/kfd rw", "char-drm rw"]
    return [f"{n} rw" for n in NVIDIA_NODES] + [f"/dev/nvidia{g.index} rw" for g in run.gpus]


CPU_WEIGHT_PER_CORE = 100
"""systemd's CPUWeight= of one core: its default for a unit, so a replica of N cores weighs N units' share."""
CPU_WEIGHT_MAX = 10_000


def cpu_weight(cores: int) -> int:
    """A replica's cores are its share when the machine is busy, not a ceiling (seed 000: "its share when the
    machine is busy, not a ceiling: it uses the machine's idle cores too"): CPUWeight= by cores, never a quota."""
    return max(1, min(CPU_WEIGHT_MAX, CPU_WEIGHT_PER_CORE * cores))


def _cpu_share(run: ReplicaRun) -> dict[str, int]:
    """The template's CPU lines: the replica's cores, and its CPUWeight= by them."""
    cores = run.plan.cpu_cores
    return {"cpu_cores": cores, "cpu_weight": cpu_weight(cores), "cpu_weight_per_core": CPU_WEIGHT_PER_CORE}


FAST_POLL_S = 10
"""The health gate's first seconds, when it asks every 50 ms."""


def health_argv(port: int, path: str, budget_s: int, address: str = "127.0.0.1") -> list[str]:
    """The health gate (ExecStartPost): GET /health until it answers 200 within the start-up budget, and fail at
    once if the engine exits first ($MAINPID is set for control processes). It asks every 50 ms for the first
    FAST_POLL_S seconds (a small model is ready in well under a second, and each wait is a start's overhead) and
    four times a second after that (a large one loads for minutes)."""
    fast = FAST_POLL_S * 20
    polls = fast + max(0, budget_s - FAST_POLL_S) * 4
    script = (
        f"i=0; while [ $i -lt {polls} ]; do "
        'kill -0 "$MAINPID" 2>/dev/null || { echo "the engine exited before readiness" >&2; exit 1; }; '
        f"code=$({CURL} -s -o /dev/null -w '%{{http_code}}' --max-time 3 http://{address}:{port}{path}); "
        f'[ "$code" = 200 ] && exit 0; i=$((i+1)); if [ $i -le {fast} ]; then sleep 0.05; else sleep 0.25; fi; done; '
        f'echo "no healthy answer within {budget_s} s" >&2; exit 1'
    )
    return [SH, "-c", script]


def cache_path(host: Host, deployment: str) -> str:
    """The replica's engine cache on the host: the inventory's cache_dir, one directory per deployment."""
    return posixpath.join(posixpath.normpath(host.cache_dir), deployment)


def chat_template_path(unit: str) -> str:
    """Where systemd puts the unit's chat-template credential (SetCredential=): $CREDENTIALS_DIRECTORY."""
    return f"{CREDENTIALS_DIR}/{unit}/{TEMPLATE_CREDENTIAL}"


def credential_value(text: str) -> str:
    """Text for SetCredential=ID:VALUE on one line: systemd resolves C-style escapes in it (systemd.exec(5)).
    Everything but printable ASCII is escaped, and so are `\\`, `%` and the spaces at either end (which the unit
    parser would strip)."""
    out = []
    for i, ch in enumerate(text):
        code = ord(ch)
        edge = i == 0 or i == len(text) - 1
        if (0x21 <= code <= 0x7E and ch not in "\\%") or (ch == " " and not edge):
            out.append(ch)
        elif ch in "\n\t":
            out.append("\\n" if ch == "\n" else "\\t")
        elif code < 0x80:
            out.append(f"\\x{code:02x}")
        else:
            out.append(f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}")
    return "".join(out)


def _cache_directives(cache: str) -> tuple[str | None, str | None]:
    """(CacheDirectory=, ReadWritePaths=): systemd makes and owns a cache under /var/cache for the unit's dynamic
    user; a cache_dir elsewhere is made writable in the unit and must exist on the host."""
    if cache.startswith(VAR_CACHE + "/"):
        return cache.removeprefix(VAR_CACHE + "/"), None
    return None, path_value(cache)


def _environment(run: ReplicaRun, provider: Provider, cache: str) -> dict[str, str]:
    """The engine's environment, with its home and caches in the unit's cache directory."""
    return {
        **provider.environment(run),
        "HOME": cache,
        "XDG_CACHE_HOME": cache,
        "HF_HOME": posixpath.join(cache, "huggingface"),
    }


def _guards(run: ReplicaRun, provider: Provider, group: Group | None = None) -> dict[str, object]:
    """Who may call the engine: the addresses allowed (with the host's own: the health gate and the facts probe
    call the engine there; a group's head, its workers, which it talks to), and the internal key the gateways
    send, as a credential or an environment file."""
    allowed = {*run.allow_from, *([run.bind_address] if is_ip(run.bind_address) else [])}
    if group is not None:
        allowed |= {a for a in group.addresses if is_ip(a)}
    credential = f"{provider.internal_key_credential}:{internal_key_path(provider)}" if run.api_key_file else None
    return {
        "ip_allow": sorted(allowed) if run.allow_from else [],
        "replica_key": credential,
        "replica_key_env": run.api_key_env_file,
    }


MEMBER_SUFFIX = re.compile(r"-w(?P<rank>[1-9][0-9]?)" + re.escape(UNIT_SUFFIX) + r"\Z")


def member_name(unit: str, rank: int) -> str:
    """engine-ctl-<deployment>-<index><slot>-w<rank>.service: never a replica unit's name (it ends in the slot)."""
    return unit.removesuffix(UNIT_SUFFIX) + f"-w{rank}{UNIT_SUFFIX}"


def parse_member_name(name: str) -> tuple[str, int] | None:
    """A worker's unit name read back (member_name's inverse): its head's unit and its rank (None: not a
    worker's name)."""
    m = MEMBER_SUFFIX.search(name)
    return (name[: m.start()] + UNIT_SUFFIX, int(m["rank"])) if m and name.startswith(UNIT_PREFIX) else None


def member_of(name: str) -> str | None:
    """The head's unit a worker's unit name belongs to (None: not a worker's name)."""
    parsed = parse_member_name(name)
    return parsed[0] if parsed else None


def group_of(p: Placement, hosts: Mapping[str, Host]) -> Group | None:
    """The replica group placed at `p` (None: a replica on one machine): each member's inventory address, its
    runtime port (the head's group_port first), and the head host's network interface (render_member gives each
    worker its own host's)."""
    if not p.members:
        return None
    addresses = (hosts[p.host].address, *(hosts[m.host].address for m in p.members))
    ports = (p.group_port or p.port, *(m.port for m in p.members))
    return Group(addresses=addresses, ports=ports, interface=hosts[p.host].network_interface)


def listening_argv(port: int, budget_s: int) -> list[str]:
    """A worker's gate (ExecStartPost): its runtime listens on `port` (ss, iproute2) within the start-up budget,
    and fail at once if it exits first."""
    polls = budget_s * 10
    script = (
        f"i=0; while [ $i -lt {polls} ]; do "
        'kill -0 "$MAINPID" 2>/dev/null || { echo "the worker exited before it listened" >&2; exit 1; }; '
        f'[ -n "$(ss -Hltn sport = :{port})" ] && exit 0; i=$((i+1)); sleep 0.1; done; '
        f'echo "not listening on port {port} within {budget_s} s" >&2; exit 1'
    )
    return [SH, "-c", script]


def render_member(
    run: ReplicaRun, provider: Provider, host: Host, group: Group, rank: int, head_unit: str
) -> RenderedMember:
    """Worker `rank` of a replica group: its runtime's argv (the provider's), the same hardening as a replica,
    reachable only from the group's hosts (IPAddressAllow=), gated on its runtime port listening."""
    group = dataclasses.replace(group, interface=host.network_interface)  # the interface is each host's own
    argv = provider.group_worker_argv(run, group, rank)
    cache = run.cache_dir or cache_path(host, run.deployment)
    cache_directory, cache_rw = _cache_directives(cache)
    environment = {**provider.group_environment(run, group, rank), "HOME": cache, "XDG_CACHE_HOME": cache,
                   "HF_HOME": posixpath.join(cache, "huggingface")}  # fmt: skip
    weights_dir = run.model_path if run.model.format == "safetensors" else posixpath.dirname(run.model_path)
    budget = run.startup_budget_s or provider.startup_budget_s
    name = member_name(head_unit, rank)
    values = {
        "deployment": run.deployment,
        "index": run.index,
        "slot": run.slot,
        "rank": rank,
        "nodes": group.nodes,
        "head_unit": head_unit,
        "revision": run.revision,
        "engine": provider.name,
        "host": host.name,
        "port": group.ports[rank],
        "gpus": [g.uuid for g in run.gpus],
        "start_limit_interval": budget * 4 + 120,
        "restart_sec": RESTART_SEC,
        "exits_dir": EXITS_DIR,
        "exec_start": exec_line(argv),
        "exec_listening": (
            exec_line(listening_argv(group.ports[rank], budget)) if provider.worker_listens_before_head else None
        ),
        "startup_budget": budget,
        "ip_allow": sorted({*group.addresses, *([run.bind_address] if is_ip(run.bind_address) else [])}),
        "environment": [env_assignment(k, v) for k, v in sorted(environment.items())],
        "cache_directory": cache_directory,
        "cache_rw": cache_rw,
        "working_directory": path_value(cache),
        "weights_path": path_value(weights_dir),
        "device_allow": device_allow(run),
        "mdwe": not provider.jit_compiles and not run.gpus,
        "syscall_deny": "~@privileged" if provider.jit_compiles else "~@privileged @resources",
        "lineage": run.lineage,
        "deployment_id": run.deployment_id,
        **_cpu_share(run),
    }
    body = load_template("group-worker.service.j2").render(**values, content_hash="")
    content_hash = hashlib.sha256(body.encode()).hexdigest()
    text = body.replace(HASH_LINE, HASH_LINE.removesuffix("\n") + content_hash + "\n", 1)
    return RenderedMember(
        rank=rank, name=name, host=host.name, port=group.ports[rank], gpus=tuple(g.uuid for g in run.gpus),
        argv=tuple(argv), text=text, sha256=hashlib.sha256(text.encode()).hexdigest(),
    )  # fmt: skip


def render_unit(
    run: ReplicaRun, provider: Provider, host: Host, group: Group | None = None,
    members: tuple[RenderedMember, ...] = (),
) -> RenderedUnit:  # fmt: skip
    """A replica's unit; with `group`, the head's of a replica group whose workers' units are `members`."""
    argv = provider.group_head_argv(run, group) if group is not None else provider.argv(run)
    cache = run.cache_dir or cache_path(host, run.deployment)
    cache_directory, cache_rw = _cache_directives(cache)
    environment = _environment(run, provider, cache)
    if group is not None:
        environment = {**environment, **provider.group_environment(run, group, 0)}
    template = run.model.chat_template if run.chat_template_file else None
    weights_dir = run.model_path if run.model.format == "safetensors" else posixpath.dirname(run.model_path)
    deny = "~@privileged" if provider.jit_compiles else "~@privileged @resources"
    budget = run.startup_budget_s or provider.startup_budget_s
    values = {
        "deployment": run.deployment,
        "index": run.index,
        "slot": run.slot,
        "revision": run.revision,
        "engine": provider.name,
        "host": host.name,
        "port": run.port,
        "gpus": [g.uuid for g in run.gpus],
        "start_limit_interval": budget * 4 + 120,
        "restart_sec": RESTART_SEC,
        "exits_dir": EXITS_DIR,
        "exec_start": exec_line(argv),
        "exec_health": exec_line(health_argv(run.port, provider.health_path, budget, local_address(run.bind_address))),
        **_guards(run, provider, group),
        "health_path": provider.health_path,
        "startup_budget": budget,
        "environment": [env_assignment(k, v) for k, v in sorted(environment.items())],
        "cache_directory": cache_directory,
        "cache_rw": cache_rw,
        "working_directory": path_value(cache),
        "credentials": [f"{TEMPLATE_CREDENTIAL}:{credential_value(template)}"] if template else [],
        "weights_path": path_value(weights_dir),
        "device_allow": device_allow(run),
        # JIT compilers (provider.jit_compiles; the CUDA and ROCm runtimes for GPU kernels) need W+X memory.
        "mdwe": not provider.jit_compiles and not run.gpus,
        "syscall_deny": deny,
        "lineage": run.lineage,
        "deployment_id": run.deployment_id,
        "members": [{"rank": m.rank, "name": m.name, "host": m.host, "port": m.port, "sha256": m.sha256}
                    for m in members],
        "group_port": group.ports[0] if group is not None else None,
        **_cpu_share(run),
    }  # fmt: skip
    name = unit_name(run.deployment, run.index, run.slot)
    values["guard"] = render_guard(name, run, provider, credential_value)
    values["wake"] = wake_line(run, provider)
    body = load_template("engine.service.j2").render(**values, content_hash="")
    content_hash = hashlib.sha256(body.encode()).hexdigest()
    text = body.replace(HASH_LINE, HASH_LINE.removesuffix("\n") + content_hash + "\n", 1)
    return RenderedUnit(
        name=name, host=host.name, index=run.index, slot=run.slot, port=run.port, gpus=tuple(g.uuid for g in run.gpus),
        argv=tuple(argv), environment=environment, text=text, sha256=hashlib.sha256(text.encode()).hexdigest(),
        content_hash=content_hash, lineage=run.lineage, members=members,
    )  # fmt: skip


def replica_run(
    d: Deployment, model: Model, provider: Provider, fitted: FitPlan, p: Placement, host: Host, revision: int = 1,
    slot: str = "a", lineage: str | None = None, gateways: tuple[str, ...] = (), deployment_id: str | None = None,
) -> ReplicaRun:  # fmt: skip
    """What the replica placed at `p` on `host` runs: everything its provider needs for its argv; `lineage` is the
    owning state's, written into the unit's header; `gateways` are the addresses it accepts requests from (with
    loopback and itself), none when the inventory has no gateway."""
    jinja = bool(model.chat_template) and not is_template_name(model.chat_template or "")
    model_path = model_path_on_host(model, host)
    platform = provider.build_platform(p.gpus[0] if p.gpus else None)
    builds = host.engine_builds.get(provider.name) or {}
    executable = builds.get(platform or "") or host.engines.get(provider.name) or provider.default_executable
    unit = unit_name(d.name, p.index, slot)
    credential = provider.internal_key_credential if gateways else None
    key_file = f"{CREDENTIALS_DIR}/{unit}/{credential}" if credential else None
    key_env = internal_key_path(provider) if gateways and provider.internal_key_env else None
    residency = residency_of(d)
    guarded = needs_guard(provider, residency)
    return ReplicaRun(
        deployment=d.name,
        revision=revision,
        index=p.index,
        slot=slot,
        model=model,
        model_path=model_path,
        mmproj_path=posixpath.join(posixpath.dirname(model_path), model.mmproj) if model.mmproj else None,
        executable=executable,
        bind_address=LOOPBACK if guarded else bind_address(host),
        guard_address=host.address if guarded else None,
        allow_from=gateways,
        api_key_file=key_file,
        api_key_env_file=key_env,
        port=p.port,
        gpus=p.gpus,
        plan=fitted.model_copy(update={"port": p.port, "threads": p.threads or fitted.threads}),
        threads=p.threads,
        engine_args=d.engine_args,
        gpu_memory_bytes=d.gpu_memory_bytes,
        engine_options=d.engine_options,
        chat_template_file=chat_template_path(unit) if jinja else None,
        cache_dir=cache_path(host, d.name),
        lineage=lineage,
        deployment_id=deployment_id or None,
        residency=residency,
        startup_budget_s=d.startup_timeout_s,
    )
