"""Operator verbs on the hosts (engine-ctl stop, start, park, delete): what runs there, over the transport.

A stop or a park returns once it is accepted: its work runs on each replica's host as a transient systemd job
(`systemd-run`), named after the replica's unit (stop-<unit>, park-<unit>), so that it finishes whatever becomes
of the command. The job is one stdlib Python script (HOST_JOB): wait a moment, wait (bounded) for the engine's
requests in flight to finish (its provider's in-flight metric), make the engine's own sleep calls (its provider's
SleepControls) and check them, then run a last command (a stop: `systemctl disable --now` of the unit).
A wake runs the same script in place, and returns when the engine answers again."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engine_ctl.core.documents.inventory import Host
from engine_ctl.core.plan.operator import DRAIN_S, STOP_SETTLE_S
from engine_ctl.core.record.model import DeploymentRecord, ReplicaRecord
from engine_ctl.core.render.gateway import LOOPBACK, REPLICA_KEY
from engine_ctl.core.render.units import bind_address, local_address
from engine_ctl.providers import PROVIDERS, Provider
from engine_ctl.providers.base import HttpCall
from engine_ctl.shell.systemd import show, stop_argv
from engine_ctl.shell.transport import CommandResult, Transport

HOST_JOB = r"""
import json, re, subprocess, sys, time, urllib.error, urllib.request
job = json.loads(sys.argv[1])
base = job["base"]
headers = {}
if job.get("key_file"):
    try:
        with open(job["key_file"]) as f:
            headers["Authorization"] = "Bearer " + f.read().strip()
    except OSError:
        pass
SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{.*\})?\s+(\S+)")
def call(method, path, body=None, timeout=600):
    data = body.encode() if body is not None else (b"" if method == "POST" else None)
    extra = {"Content-Type": "application/json"} if body is not None else {}
    req = urllib.request.Request(base + path, data=data, method=method, headers={**headers, **extra})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, r.read().decode()
def in_flight():
    try:
        _, text = call("GET", job["metrics_path"], timeout=10)
    except (OSError, ValueError):
        return 0.0
    total = 0.0
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if m and m.group(1) == job["metric"]:
            total += float(m.group(3))
    return total
time.sleep(job.get("settle_s", 0))
if job.get("metric"):
    deadline = time.monotonic() + job.get("drain_s", 0)
    while in_flight() > 0 and time.monotonic() < deadline:
        time.sleep(0.5)
    print("drained", flush=True)
for c in job.get("calls", []):
    try:
        status, _ = call(c["method"], c["path"], c.get("body"))
    except urllib.error.HTTPError as e:
        sys.exit(f"{c['method']} {c['path']}: HTTP {e.code}: {e.read().decode(errors='replace')[:300]}")
    except OSError as e:
        sys.exit(f"{c['method']} {c['path']}: {e}")
    print(f"{c['method']} {c['path']}: {status}", flush=True)
check = job.get("check")
if check:
    deadline = time.monotonic() + check.get("within_s", 60)
    while True:
        try:
            said = json.loads(call("GET", check["path"], timeout=30)[1]).get(check["key"])
        except (OSError, ValueError) as e:
            said = repr(e)
        if said is check["expect"]:
            break
        if time.monotonic() >= deadline:
            sys.exit(f"GET {check['path']}: {check['key']} is {said!r}, not {check['expect']!r}")
        time.sleep(0.5)
if job.get("then"):
    sys.exit(subprocess.run(job["then"]).returncode)
"""


@dataclass(frozen=True)
class Job:
    """One replica's job: the script's input."""

    base: str
    metrics_path: str = "/metrics"
    metric: str = ""
    settle_s: float = 0
    drain_s: float = DRAIN_S
    calls: tuple[HttpCall, ...] = ()
    check: Mapping[str, Any] | None = None
    then: tuple[str, ...] = ()
    key_file: str | None = REPLICA_KEY

    def as_json(self) -> str:
        doc = {
            "base": self.base, "metrics_path": self.metrics_path, "metric": self.metric, "settle_s": self.settle_s,
            "drain_s": self.drain_s, "calls": [c.__dict__ for c in self.calls], "check": self.check,
            "then": list(self.then), "key_file": self.key_file,
        }  # fmt: skip
        return json.dumps(doc)


def provider_of(record: DeploymentRecord) -> Provider | None:
    return PROVIDERS.get(record.plan.engine) if record.plan else None


def engine_base(host: Host, port: int) -> str:
    """Where the engine answers from its own host (its bind address, loopback for a wildcard)."""
    address = local_address(bind_address(host))
    return f"http://{f'[{address}]' if ':' in address else address}:{port}"


def controls_base(r: ReplicaRecord) -> str:
    """Where an engine with sleep controls answers them: on loopback (its guard passes none of them on). A replica
    an engine-ctl without guards started (recorded listening elsewhere: its argv's --host, until apply rolls its
    guard in) is asked where it listens."""
    argv = list(r.argv)
    bound = argv[argv.index("--host") + 1] if "--host" in argv[:-1] else LOOPBACK
    return f"http://{local_address(bound)}:{r.port}"


def job_unit(verb: str, unit: str) -> str:
    return f"{verb}-{unit}"


def _drain_job(provider: Provider | None, host: Host, r: ReplicaRecord, base: str | None = None, **rest: Any) -> Job:
    metric = provider.in_flight_metric if provider else ""
    path = provider.metrics_path if provider else "/metrics"
    return Job(base=base or engine_base(host, r.port), metrics_path=path, metric=metric, **rest)


def stop_job(provider: Provider | None, host: Host, r: ReplicaRecord) -> Job:
    """Wait STOP_SETTLE_S, drain, then disable and stop the unit (it stays installed: `start` starts it again)."""
    then = tuple(stop_argv(r.unit))
    return _drain_job(provider, host, r, settle_s=STOP_SETTLE_S, then=then)


def sleep_job(provider: Provider, host: Host, r: ReplicaRecord, level: int) -> Job:
    """Drain, then the engine's sleep calls, then (where it has one) its own word that it sleeps: on loopback, where
    the engine of a replica with sleep controls listens (its guard passes none of them on)."""
    controls = provider.sleep_controls
    assert controls is not None
    check = {"path": controls.asleep.path, "key": controls.asleep_key, "expect": True} if controls.asleep else None
    return _drain_job(provider, host, r, controls_base(r), calls=controls.sleep(level), check=check)


def wake_job(provider: Provider, host: Host, r: ReplicaRecord, level: int) -> Job:
    """The engine's wake calls, then its word that it is awake (no drain: nothing is routed to it while parked)."""
    controls = provider.sleep_controls
    assert controls is not None
    check = {"path": controls.asleep.path, "key": controls.asleep_key, "expect": False} if controls.asleep else None
    return Job(base=controls_base(r), calls=controls.wake(level), check=check, drain_s=0)


def job_argv(job: Job, detached_as: str | None = None) -> list[str]:
    """The job's command: in place, or (`detached_as`, a transient unit's name) accepted at once by systemd and
    run there (Type=oneshot, collected once done, whatever its result)."""
    argv = ["python3", "-c", HOST_JOB, job.as_json()]
    if detached_as is None:
        return argv
    return ["systemd-run", "--quiet", "--no-block", "--collect", f"--unit={detached_as}", "-p", "Type=oneshot",
            "/usr/bin/env", *argv]  # fmt: skip


def unit_states(t: Transport, units: Iterable[str]) -> dict[str, str]:
    """Each unit's ActiveState (inactive for one systemd does not know)."""
    names = sorted(set(units))
    if not names:
        return {}
    result = t.run(show(["Id", "ActiveState"], names), timeout=60)
    out: dict[str, str] = dict.fromkeys(names, "inactive")
    for block in result.stdout.split("\n\n"):
        fields = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        if fields.get("Id") in out:
            out[fields["Id"]] = fields.get("ActiveState", "inactive")
    return out


def said(result: CommandResult) -> str:
    lines = (result.stderr or result.stdout).strip().splitlines()
    return lines[-1] if lines else f"exit status {result.exit_code}"


def run_checked(t: Transport, argv: Sequence[str], what: str, timeout: float = 120) -> CommandResult:
    result = t.run(list(argv), timeout=timeout)
    if result.exit_code != 0:
        raise OperatorFailure(f"{what}: {said(result)}")
    return result


class OperatorFailure(Exception):
    """A host step of a verb that failed, in words."""
