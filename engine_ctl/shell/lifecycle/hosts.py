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
from engine_ctl.core.plan.operator import DRAIN_S, STOP_SETTLE_S, STOP_WAIT_S
from engine_ctl.core.record.model import DeploymentRecord, MemberRecord, ReplicaRecord
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
def hexaddrs(name):
    import socket, struct
    out = set()
    try:
        found = {a[4][0] for a in socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)}
    except OSError:
        return None
    for ip in found:
        if ":" in ip:
            raw = socket.inet_pton(socket.AF_INET6, ip.split("%")[0])
            out.add("".join("%08X" % struct.unpack("<I", raw[i:i + 4]) for i in range(0, 16, 4)))
        else:
            v4 = "%08X" % struct.unpack("<I", socket.inet_aton(ip))
            out |= {v4, "0000000000000000FFFF0000" + v4}
    return out
def joined(w):
    heads = hexaddrs(w["address"])
    if not heads:
        return True
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = open(path).read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            f = row.split()
            (_, lport), (raddr, rport) = f[1].split(":"), f[2].split(":")
            if f[3] == "01" and raddr in heads and (int(lport, 16) == w["port"] or int(rport, 16) in w["peer_ports"]):
                return True
    return False
time.sleep(job.get("settle_s", 0))
w = job.get("wait_head")
if w:
    deadline = time.monotonic() + w["within_s"]
    while joined(w) and time.monotonic() < deadline:
        time.sleep(0.5)
    print("the head let go" if not joined(w) else "the head still holds on: stopped anyway", flush=True)
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
    wait_head: Mapping[str, Any] | None = None
    """A group worker's stop: first wait (bounded) until no TCP connection joins it to its head (member_stop_job)."""

    def as_json(self) -> str:
        doc = {
            "base": self.base, "metrics_path": self.metrics_path, "metric": self.metric, "settle_s": self.settle_s,
            "drain_s": self.drain_s, "calls": [c.__dict__ for c in self.calls], "check": self.check,
            "then": list(self.then), "key_file": self.key_file, "wait_head": self.wait_head,
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


WORKER_WAIT_S = STOP_WAIT_S - 10
"""How long a group worker's stop waits for its head to let go (the head's own stop: settle, drain, exit) before it
stops anyway: within the STOP_WAIT_S that `start --wait` and `delete --stop` wait for a stop."""


def member_stop_job(head: Host, r: ReplicaRecord, m: MemberRecord) -> Job:
    """A replica group's worker, stopped on its own host once its head has stopped (never under a request the head
    still serves: the head drains first, on its host): it waits until no TCP connection joins it to the head's
    address (the head dials the worker's port, or the worker dials the head's rendezvous or API port: each engine's
    runtime does one or the other), at most WORKER_WAIT_S, then disables and stops the unit."""
    wait = {"address": head.address, "port": m.port, "peer_ports": sorted({r.port, r.group_port or r.port}),
            "within_s": WORKER_WAIT_S}  # fmt: skip
    return Job(base="", key_file=None, wait_head=wait, then=tuple(stop_argv(m.unit)))


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
