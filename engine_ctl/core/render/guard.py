"""The guard of a replica whose engine runs with its sleep controls enabled (a residency that parks it asleep):
the engine listens on loopback only, and a small HAProxy unit beside it listens on the replica's address and port
and passes on only what other hosts need (the OpenAI API under /v1/, the health check, the metrics). Anything
else, the sleep controls among it, is answered 404 there; those controls answer on the engine's own host alone
(the park's job, the scaler's forced `wake`). Pure.

The guard's unit is carried inside the replica's unit as `#|` comment lines (systemd ignores them): one file, one
hash, so the plan's unit diff shows the guard, drift covers it, and a saved plan proves it. apply writes the guard's
file from those lines beside the replica's (engine_ctl.shell.systemd) and removes it with the replica."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine_ctl.core.documents.inventory import Host
from engine_ctl.core.fit.hostfacts import HostFacts
from engine_ctl.core.model import Deployment
from engine_ctl.core.names import UNIT_SUFFIX
from engine_ctl.core.render.gateway import HAPROXY, LOOPBACK, is_ip
from engine_ctl.core.render.templates import load_template

if TYPE_CHECKING:
    from engine_ctl.core.fit.runspec import ReplicaRun
    from engine_ctl.providers import Provider

GUARD_SUFFIX = "-guard" + UNIT_SUFFIX
GUARD_LINE = "#|"
"""The prefix of the replica unit's lines that are the guard's unit."""
MAXCONN = 1000
CREDENTIAL = "guard.cfg"


@dataclass(frozen=True)
class RenderedGuard:
    name: str
    listen: str
    """address:port the guard listens on (the replica's address for the other hosts)."""
    text: str
    """The guard's unit file."""

    engine: str
    """address:port the engine listens on (loopback)."""
    paths: tuple[str, ...]

    @property
    def lines(self) -> list[str]:
        return self.text.rstrip("\n").split("\n")

    @property
    def note(self) -> str:
        """What the plan and the unit say of it."""
        return (f"{self.name} on {self.listen} passes on only {', '.join(self.paths)} to the engine, which listens "
                f"on {self.engine} with its sleep controls")  # fmt: skip


NOTE_LINE = "# guard: "


def guard_text(unit_text: str | None) -> str | None:
    """The guard's unit file as apply writes it from a replica unit's `#|` lines (None: the unit has none)."""
    if not unit_text or "\n" + GUARD_LINE not in unit_text:  # most units: one scan, no split (plans of thousands)
        return None
    lines = [ln for ln in unit_text.split("\n") if ln.startswith(GUARD_LINE)]
    return "".join(ln.removeprefix(GUARD_LINE).removeprefix(" ") + "\n" for ln in lines)


def guard_note(unit_text: str | None) -> str | None:
    """The guard's note in a rendered replica unit (None: the unit has no guard)."""
    at = (unit_text or "").find("\n" + NOTE_LINE)
    if at < 0 or unit_text is None:
        return None
    return unit_text[at + 1 + len(NOTE_LINE) :].split("\n", 1)[0]


def guard_name(unit: str) -> str:
    """engine-ctl-<deployment>-<index><slot>-guard.service: never a replica unit's name (it ends in the slot)."""
    return unit.removesuffix(UNIT_SUFFIX) + GUARD_SUFFIX


def guarded_by(name: str) -> str | None:
    """The replica unit a guard's unit name belongs to (None: not a guard's name)."""
    return name.removesuffix(GUARD_SUFFIX) + UNIT_SUFFIX if name.endswith(GUARD_SUFFIX) else None


def residency_of(d: Deployment) -> str:
    """How a park treats the deployment's replicas: a decisions deployment always restarts (restart_only)."""
    return d.residency if d.api == "chat" else "restart_only"


def needs_guard(provider: Provider, residency: str) -> bool:
    """A replica gets a guard when its engine is launched with its sleep controls (its residency parks it
    asleep): every other replica is left as it was, with no extra hop."""
    return provider.parks_asleep(residency)


def guard_refusal(host: Host, facts: HostFacts | None) -> str | None:
    """Why a replica with sleep controls cannot run on `host` (None: it can): its guard binds the host's
    inventory address next to the engine on loopback (a DNS name would need the wildcard, which the engine's
    loopback port would conflict with), and it is HAProxy."""
    if not is_ip(host.address):
        return (f"the guard of the engine's sleep controls listens on the host's inventory address, and "
                f"{host.address!r} is a name: give {host.name} its IP address in the inventory")  # fmt: skip
    if facts is not None and facts.haproxy_version is None:
        return (f"the guard of the engine's sleep controls is HAProxy, which is not installed on {host.name}: "
                f"install it (apt install haproxy)")  # fmt: skip
    return None


def guard_refusals(hosts: Mapping[str, Host], facts: Mapping[str, HostFacts]) -> dict[str, str]:
    out = {}
    for name, host in hosts.items():
        why = guard_refusal(host, facts.get(name))
        if why is not None:
            out[name] = why
    return out


def host_port(address: str, port: int) -> str:
    """address:port as HAProxy's bind and server lines take it (an IPv6 address as it is: the last colon splits)."""
    return f"{address}:{port}"


def guard_config(listen: str, engine: str, provider: Provider, allow: tuple[str, ...]) -> str:
    """The guard's HAProxy configuration: `allow` the sources it accepts (none: any)."""
    return load_template("guard.cfg.j2").render(
        listen=listen, engine=engine, allow=list(allow), maxconn=MAXCONN,
        health_path=provider.health_path, metrics_path=provider.metrics_path,
    )  # fmt: skip


def render_guard(
    unit: str, run: ReplicaRun, provider: Provider, credential: Callable[[str], str]
) -> RenderedGuard | None:
    """The guard of `unit` (None when the run has none): `credential` turns the configuration into a
    SetCredential= value (engine_ctl.core.render.units.credential_value)."""
    if run.guard_address is None:
        return None
    listen = host_port(run.guard_address, run.port)
    allow = tuple(sorted({*run.allow_from, run.guard_address})) if run.allow_from else ()
    engine = host_port(LOOPBACK, run.port)
    config = guard_config(listen, engine, provider, allow)
    text = load_template("guard.service.j2").render(
        unit=unit, config=credential(config), haproxy=HAPROXY, ip_allow=list(allow), listen=listen, engine=engine
    )
    paths = ("/v1/", provider.health_path, provider.metrics_path)
    return RenderedGuard(name=guard_name(unit), listen=listen, text=text, engine=engine, paths=paths)


def wake_line(run: ReplicaRun, provider: Provider) -> str | None:
    """The engine's wake calls for this replica's residency, as the scaler's forced command reads them from the
    unit (`wake UNIT`: made on loopback, never taken from the caller); None without sleep controls."""
    controls = provider.sleep_controls
    if controls is None or run.guard_address is None:
        return None
    level = controls.level(run.residency)
    calls = [{"method": c.method, "path": c.path, "body": c.body} for c in controls.wake(level)]
    check = {"path": controls.asleep.path, "key": controls.asleep_key} if controls.asleep else None
    return json.dumps({"port": run.port, "level": level, "calls": calls, "check": check}, sort_keys=True)
