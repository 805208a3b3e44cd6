"""Render the scaler's configuration (scaler.json) and its systemd unit from the planned deployments. Pure.

The scaler (engine_ctl/shell/remote/scaler.py, stdlib only) runs on one gateway host, the first by name, and
starts and stops a deployment's on-demand replica units within the plan's envelope: slots 0..min-1 are always
on, slots min..max-1 on demand (with `min: 0`, all are). Its configuration names every slot it may act on, with
the host, the unit, the gateway server and the devices (GPUs, or memory on a CPU host) the slot takes."""

from __future__ import annotations

import hashlib
import ipaddress
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict

from engine_ctl.core.documents.inventory import Host, Inventory
from engine_ctl.core.render.gateway import (
    ADMIN_SOCKET,
    GATEWAY_UNIT,
    HOLD_S,
    LOOPBACK,
    WAKE_PORT,
    backend_name,
    first_gateway,
    server_name,
)
from engine_ctl.core.render.scalerlock import ScalerLock
from engine_ctl.core.render.templates import load_template

if TYPE_CHECKING:
    pass

SCALER_UNIT = "engine-ctl-scaler.service"
GATEWAY_HOST_UNITS = (GATEWAY_UNIT, SCALER_UNIT)
"""The units a gateway host runs beside its replicas: engine-ctl's own, never a replica and never unmanaged."""
SCALER_DIR = "/etc/engine-ctl/scaler"
SCALER_CONFIG = f"{SCALER_DIR}/scaler.json"
SCALER_PROGRAM = f"{SCALER_DIR}/scaler.py"
SCALER_KEY = f"{SCALER_DIR}/id_ed25519"
"""The scaler's SSH key: generated on the scaler host by apply, 0600, root's; it never leaves that host."""
SCALER_KNOWN_HOSTS = f"{SCALER_DIR}/known_hosts"
STATE_DIR_NAME = "engine-ctl/scaler"
RUN_DIR_NAME = "engine-ctl-scaler"
"""/run/engine-ctl-scaler: the scaler's SSH connections to the replica hosts, kept open (ControlMaster)."""
SCALER_STATE = f"/var/lib/{STATE_DIR_NAME}/state.json"
COMMAND_PATH = "/usr/local/lib/engine-ctl/scaler-command"
"""On replica hosts: the forced command of the scaler's key (start, stop, is-active, reset-failed, wake of replica
units; status)."""
KEY_COMMENT = "engine-ctl-scaler"
POLL_S = 15
"""Seed 000: the engines' /metrics are read every 15 s."""
DECIDE_EVERY_S = 120
"""Seed 000: at most one decision per deployment every 120 s."""
FORMAT = 1
PYTHON = "/usr/bin/python3"


class ScalerSlot(BaseModel):
    model_config = ConfigDict(frozen=True)

    index: int
    host: str
    ssh_host: str
    """user@address[:port] as the scaler's ssh reaches it ("root@198.18.0.12", port apart)."""
    ssh_port: int = 22
    address: str
    port: int
    unit: str
    server: str
    devices: tuple[str, ...] = ()
    ram_bytes: int = 0
    cpu_cores: int = 0
    always_on: bool = False
    health_path: str = "/health"


class WakeCall(BaseModel):
    """One of the engine's own wake calls, on the replica's port (its provider's SleepControls.wake)."""

    model_config = ConfigDict(frozen=True)

    method: str
    path: str
    body: str | None = None


class WakeCheck(BaseModel):
    """The engine's word that it is awake: GET path answers JSON with `key` false (as its provider gives it)."""

    model_config = ConfigDict(frozen=True)

    path: str
    key: str


class ScalerWake(BaseModel):
    """A parked deployment, as the scaler wakes it on a request (engine_ctl.core.plan.wake): the park it belongs
    to, the engine's wake calls in order (none for restart_only: the unit's start is the wake) and their check.
    Every wake ends with the scaler's own start of each slot: the unit started (a no-op for an engine asleep, which
    still runs), health-gated, then its server put into the gateway's backend."""

    model_config = ConfigDict(frozen=True)

    operation: str
    """The park's operation ID: a wake the scaler recorded for another park is not this one's."""
    level: int = 0
    calls: tuple[WakeCall, ...] = ()
    check: WakeCheck | None = None


class ScalerDeployment(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    id: str
    revision: int = 0
    """The deployment's recorded revision: the scaler's state.json carries it with the ID (import reads both back)."""
    min: int
    max: int
    parallel: int
    idle_minutes: int | None = None
    priority: int = 0
    metric: str = ""
    stopped: bool = False
    parked: ScalerWake | None = None
    """Parked by an operator: the scaler starts none of its slots as it scales, and wakes it on a request."""
    slots: tuple[ScalerSlot, ...] = ()

    @property
    def backend(self) -> str:
        return backend_name(self.name)

    @property
    def scales(self) -> bool:
        """Whether the scaler has anything to do: a slot that is on demand."""
        return any(not s.always_on for s in self.slots)

    @property
    def acts(self) -> bool:
        """Whether the scaler has it in its configuration: it scales, or a request wakes it from a park."""
        return self.scales or self.parked is not None


class SlotInput(BaseModel):
    """One placed replica as the plan or the state knows it."""

    model_config = ConfigDict(frozen=True)

    index: int
    slot: str = "a"
    host: str
    port: int
    unit: str
    gpus: tuple[str, ...] = ()
    ram_bytes: int = 0
    cpu_cores: int = 0
    on_demand: bool = False


class RenderedScaler(BaseModel):
    model_config = ConfigDict(frozen=True)

    host: str
    config: str
    unit_text: str

    @property
    def config_sha256(self) -> str:
        return sha256(self.config)

    @property
    def unit_sha256(self) -> str:
        return sha256(self.unit_text)


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def scaler_host(inventory: Inventory) -> Host | None:
    """Exactly one scaler: on the first gateway host by name (None without a gateway)."""
    return first_gateway(inventory.hosts)


class ScalerGateway(BaseModel):
    """A gateway host whose HAProxy the scaler drives: its own over the admin socket (local), the others over SSH
    with its key, whose forced command there allows only the gateway verbs (scaler_command.py)."""

    model_config = ConfigDict(frozen=True)

    name: str
    local: bool = False
    ssh_host: str = ""
    ssh_port: int = 22
    address: str = ""


def scaler_gateways(scaler: Host, gateways: Iterable[Host]) -> tuple[ScalerGateway, ...]:
    """Every gateway host by name, the scaler's own marked local."""
    return tuple(
        ScalerGateway(name=g.name, local=True)
        if g.name == scaler.name
        else ScalerGateway(name=g.name, ssh_host=ssh_target(g), ssh_port=g.port, address=g.address)
        for g in sorted(gateways, key=lambda h: h.name)
    )


def wake_binds(scaler: Host, gateways: Sequence[ScalerGateway]) -> list[str]:
    """Where the wake listener binds: 127.0.0.1 and, when there are other gateway hosts, the scaler host's own
    inventory address (they poke it there)."""
    remote = any(not g.local for g in gateways)
    return [LOOPBACK] + ([scaler.address] if remote and scaler.address != LOOPBACK else [])


def ip_literals(addresses: Iterable[str]) -> list[str] | None:
    """The addresses as IP literals for IPAddressAllow=, or None when one is a name (systemd takes only IPs: the
    unit then restricts no address and the listener's own check is the guard)."""
    out = []
    for a in addresses:
        try:
            out.append(str(ipaddress.ip_address(a)))
        except ValueError:
            return None
    return sorted(set(out))


def ssh_target(host: Host) -> str:
    return f"{host.user or 'root'}@{host.address}"


def scaler_slot(s: SlotInput, hosts: Mapping[str, Host], health_path: str) -> ScalerSlot | None:
    host = hosts.get(s.host)
    if host is None:
        return None
    return ScalerSlot(
        index=s.index, host=s.host, ssh_host=ssh_target(host), ssh_port=host.port, address=host.address,
        port=s.port, unit=s.unit, server=server_name(s.index, s.slot), devices=tuple(s.gpus),
        ram_bytes=s.ram_bytes, cpu_cores=s.cpu_cores, always_on=not s.on_demand, health_path=health_path,
    )  # fmt: skip


def render_config(
    deployments: Iterable[ScalerDeployment],
    *,
    poll_s: int = POLL_S,
    decide_every_s: int = DECIDE_EVERY_S,
    hold_s: int = HOLD_S,
    wake_port: int = WAKE_PORT,
    gateways: Sequence[ScalerGateway] = (ScalerGateway(name="local", local=True),),
    wake_bind: Sequence[str] = (LOOPBACK,),
) -> str:
    """scaler.json: the envelope of every deployment the scaler acts on, in name order (stable text), and the
    gateway hosts it drives and hears (wakes only from loopback and their addresses)."""
    out = {
        "gateways": [g.model_dump(mode="json") for g in gateways],
        "wake_bind": list(wake_bind),
        "wake_from": sorted({LOOPBACK, *(g.address for g in gateways if not g.local)}),
        "format": FORMAT,
        "poll_s": poll_s,
        "decide_every_s": decide_every_s,
        "hold_s": hold_s,
        "wake_port": wake_port,
        "gateway_socket": ADMIN_SOCKET,
        "key": SCALER_KEY,
        "known_hosts": SCALER_KNOWN_HOSTS,
        "control_dir": f"/run/{RUN_DIR_NAME}",
        "deployments": [_deployment_json(d) for d in sorted(deployments, key=lambda d: d.name)],
    }
    return json.dumps(out, indent=1, sort_keys=True) + "\n"


def with_lock(config: str, lock: ScalerLock, name: str, psql: str) -> str:
    """scaler.json with the lock the scaler on `name` takes (its `lock` section, psql's path in it)."""
    body = json.loads(config)
    body["lock"] = {**lock.config(name), "psql": psql}
    return json.dumps(body, indent=1, sort_keys=True) + "\n"


def deployments_digest(deployments: Iterable[ScalerDeployment]) -> str:
    """sha256 of scaler.json's `deployments` as render_config writes them (the facts probe's scaler_config
    computes it from the file the same way): a scaler configured from another record differs."""
    body = [_deployment_json(d) for d in sorted(deployments, key=lambda d: d.name)]
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _deployment_json(d: ScalerDeployment) -> dict[str, object]:
    body = d.model_dump(mode="json")
    if body.get("parked") is None:  # only a parked deployment says so: the others' text is as before
        body.pop("parked", None)
    body["backend"] = d.backend
    body["slots"] = [s.model_dump(mode="json") for s in sorted(d.slots, key=lambda s: (s.index, s.server))]
    return body


def render_unit(host: str, program_sha256: str, python: str = PYTHON, ip_allow: Sequence[str] | None = None) -> str:
    """engine-ctl-scaler.service, hardened; the program's sha256 in its header so a new program restarts it.
    ip_allow: the only addresses it may talk with, beyond loopback (the gateway and replica hosts); None: any."""
    values = {
        "host": host, "python": python, "program": SCALER_PROGRAM, "config": SCALER_CONFIG,
        "state_dir": STATE_DIR_NAME, "run_dir": RUN_DIR_NAME, "program_sha256": program_sha256,
        "scaler_dir": SCALER_DIR, "ip_allow": ip_allow,
    }  # fmt: skip
    body = load_template("scaler.service.j2").render(**values, content_hash="")
    return load_template("scaler.service.j2").render(**values, content_hash=sha256(body))


def render_scaler(
    host: Host,
    deployments: Sequence[ScalerDeployment],
    program_sha256: str,
    gateways: Iterable[Host] = (),
    lock: ScalerLock | None = None,
    psql: str = "psql",
    **settings: int,
) -> RenderedScaler:
    """The scaler on `host`, driving every gateway host (`gateways`; the scaler's own alone when empty). With
    `lock` (PostgreSQL state) it is one of several and acts only while it holds the lock (psql: its client)."""
    drives = scaler_gateways(host, gateways) or (ScalerGateway(name=host.name, local=True),)
    binds = wake_binds(host, drives)
    config = render_config(deployments, gateways=drives, wake_bind=binds, **settings)
    if lock is not None:
        config = with_lock(config, lock, host.name, psql)
    peers = [g.address for g in drives if not g.local] + [s.address for d in deployments for s in d.slots]
    peers += [lock.host] if lock is not None else []
    allow = ip_literals([*peers, *binds])
    unit = render_unit(host.name, program_sha256, ip_allow=allow)
    return RenderedScaler(host=host.name, config=config, unit_text=unit)
