"""What runs on the fleet, read by the test itself (never through engine-ctl): the stateful test's oracle.

One SSH session per host runs a small Python probe that lists engine-ctl's unit files, their systemd states,
the argv each unit file says (ExecStart) and the argv its process really runs (/proc/PID/cmdline), the health of
each replica's port, the sha256 of each model file an argv names, and whether the gateway and scaler run.

`Poller` watches the replicas' health during an apply (one SSH session per host, a sample every 0.4 s), so the
test can see two replicas of one deployment down at once."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from tests.fleet import Fleet, FleetHost

UNIT = re.compile(r"^engine-ctl-(?P<dep>[a-z0-9][a-z0-9-]*?)-(?P<index>\d+)(?P<slot>[a-z])\.service$")

PROBE = r"""
import glob, hashlib, json, os, re, shlex, subprocess, urllib.request
out = {"units": {}, "sha256": {}, "gateway": None, "scaler": None}
def show(unit):
    props = subprocess.run(["systemctl", "show", "-p", "ActiveState,SubState,MainPID,UnitFileState,NRestarts", unit],
                           capture_output=True, text=True).stdout
    return dict(line.split("=", 1) for line in props.splitlines() if "=" in line)
def health(host, port):
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/health", timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except Exception:
        return None
def flag(argv, name):
    return argv[argv.index(name) + 1] if name in argv[:-1] else None
for path in sorted(glob.glob("/etc/systemd/system/engine-ctl-*.service")):
    name = os.path.basename(path)
    if name in ("engine-ctl-gateway.service", "engine-ctl-scaler.service"):
        continue
    text = open(path).read()
    line = next((l for l in text.splitlines() if l.startswith("ExecStart=")), "ExecStart=")
    argv = shlex.split(line[len("ExecStart="):])
    props = show(name)
    pid = int(props.get("MainPID", "0") or 0)
    running = []
    if pid:
        try:
            running = open(f"/proc/{pid}/cmdline", "rb").read().decode().split("\0")[:-1]
        except OSError:
            running = []
    host, port = flag(argv, "--host"), flag(argv, "--port")
    code = health(flag(running, "--host"), flag(running, "--port")) if running else None
    out["units"][name] = {"argv": argv, "running": running, "active": props.get("ActiveState"),
                          "sub": props.get("SubState"), "enabled": props.get("UnitFileState"), "health": code,
                          "restarts": props.get("NRestarts")}
    for model in {flag(argv, "--model"), flag(running, "--model")} - {None}:
        if model not in out["sha256"]:
            try:
                out["sha256"][model] = hashlib.sha256(open(model, "rb").read()).hexdigest()
            except OSError as e:
                out["sha256"][model] = "unreadable: " + e.strerror
for key, unit in (("gateway", "engine-ctl-gateway.service"), ("scaler", "engine-ctl-scaler.service")):
    if os.path.exists("/etc/systemd/system/" + unit):
        props = show(unit)
        # killed, and systemd restarts it by itself (Restart=always, RestartSec=2): no apply is needed for that
        restarting = props.get("ActiveState") == "activating" and props.get("SubState") == "auto-restart"
        out[key] = "restarting" if restarting else props.get("ActiveState")
print(json.dumps(out))
"""

POLL = r"""
import glob, json, os, shlex, subprocess, sys, time, urllib.request
def health(host, port):
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/health", timeout=0.5) as r:
            return r.status
    except Exception:
        return None
while True:
    listed = subprocess.run(["systemctl", "list-units", "--plain", "--no-legend", "--state=active",
                             "engine-ctl-*.service"], capture_output=True, text=True).stdout.split()
    serving = []
    for name in [w for w in listed if w.startswith("engine-ctl-") and w.endswith(".service")]:
        try:
            line = next(l for l in open("/etc/systemd/system/" + name) if l.startswith("ExecStart="))
        except (OSError, StopIteration):
            continue
        argv = shlex.split(line[len("ExecStart="):])
        if "--port" in argv and "--host" in argv:
            if health(argv[argv.index("--host") + 1], argv[argv.index("--port") + 1]) == 200:
                serving.append(name)
    print(json.dumps({"t": time.time(), "serving": serving}), flush=True)
    time.sleep(0.4)
"""


@dataclass
class MuxFleet(Fleet):
    """The fleet, reached over one SSH connection per host kept open between commands (OpenSSH's ControlMaster):
    the stateful test reads every host after every step, and a handshake costs more than the reading."""

    control_dir: str = ""

    @classmethod
    def of(cls, fleet: Fleet) -> MuxFleet:
        control = tempfile.mkdtemp(prefix="ectl-mux-")  # short: a socket path is at most 108 bytes
        return cls(hosts=fleet.hosts, key=fleet.key, known_hosts=fleet.known_hosts, inventory=fleet.inventory,
                   control_dir=control)  # fmt: skip

    down: set[str] = field(default_factory=set)
    """Hosts cut off: no connection is kept to them until they are back."""
    starting: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def _path(self, host: FleetHost) -> str:
        return f"{self.control_dir}/{host.name}"

    def ssh_argv(self, host: FleetHost) -> list[str]:
        """A command's ssh over the host's kept connection, started here if there is none (a command whose
        connection is gone, or a host cut off, connects on its own as plain ssh does)."""
        argv = super().ssh_argv(host)
        with self.starting:
            self._start(host, argv)
        return [*argv[:-1], "-o", "ControlMaster=no", "-o", f"ControlPath={self._path(host)}", argv[-1]]

    def _start(self, host: FleetHost, argv: list[str]) -> None:
        if host.name not in self.down and not os.path.exists(self._path(host)):
            # the master has no stdio of ours: a caller reading a command's output to its end must not wait for it
            subprocess.run([*argv[:-1], "-o", "ControlMaster=yes", "-o", f"ControlPath={self._path(host)}",
                            "-o", "ControlPersist=300", "-o", "ServerAliveInterval=2", "-o", "ServerAliveCountMax=3",
                            "-N", "-f", argv[-1]], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, check=False, timeout=30)  # fmt: skip

    def drop(self, host: FleetHost) -> None:
        """Close the host's kept connection and keep none (it is being cut off: its sessions would hang)."""
        self.down.add(host.name)
        subprocess.run([*super().ssh_argv(host)[:-1], "-o", f"ControlPath={self._path(host)}", "-O", "exit",
                        host.address], capture_output=True, check=False)  # fmt: skip

    def back(self, host: FleetHost) -> None:
        self.down.discard(host.name)

    def close(self) -> None:
        for h in self.hosts:
            self.drop(h)
        shutil.rmtree(self.control_dir, ignore_errors=True)


@dataclass
class Unit:
    host: str
    name: str
    dep: str
    index: int
    slot: str
    argv: list[str]
    running: list[str]
    active: str
    health: int | None
    enabled: str

    @property
    def serving(self) -> bool:
        return self.active == "active" and self.health == 200


@dataclass
class Truth:
    """Every host's engine-ctl units and files, as they are; a host that did not answer is in `unreachable`."""

    units: list[Unit] = field(default_factory=list)
    sha256: dict[tuple[str, str], str] = field(default_factory=dict)
    gateway: dict[str, str | None] = field(default_factory=dict)
    scaler: dict[str, str | None] = field(default_factory=dict)
    unreachable: list[str] = field(default_factory=list)

    def of(self, dep: str) -> list[Unit]:
        return [u for u in self.units if u.dep == dep]


def probe_host(fleet: Fleet, host: FleetHost) -> dict[str, Any] | None:
    argv = [*fleet.ssh_argv(host), "python3", "-c", shlex.quote(PROBE)]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=40, check=False)
    except subprocess.TimeoutExpired:
        return None
    if proc.returncode != 0:
        return None
    return json.loads(proc.stdout)  # type: ignore[no-any-return]


def probe(fleet: Fleet, hosts: list[FleetHost]) -> Truth:
    truth = Truth()
    results: dict[str, dict[str, Any] | None] = {}
    threads = [threading.Thread(target=lambda h=h: results.__setitem__(h.name, probe_host(fleet, h))) for h in hosts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for h in hosts:
        found = results[h.name]
        if found is None:
            truth.unreachable.append(h.name)
            continue
        for name, u in found["units"].items():
            m = UNIT.match(name)
            if not m:
                continue
            truth.units.append(
                Unit(h.name, name, m["dep"], int(m["index"]), m["slot"], u["argv"], u["running"], u["active"],
                     u["health"], u["enabled"])
            )  # fmt: skip
        for path, digest in found["sha256"].items():
            truth.sha256[(h.name, path)] = digest
        truth.gateway[h.name] = found["gateway"]
        truth.scaler[h.name] = found["scaler"]
    return truth


class Poller:
    """Samples, on every host, which engine-ctl units answer /health 200 (every 0.4 s) until stopped."""

    def __init__(self, fleet: Fleet, hosts: list[FleetHost]) -> None:
        self.samples: list[tuple[float, str, list[str]]] = []
        self._procs = [
            subprocess.Popen(
                [*fleet.ssh_argv(h), "python3", "-u", "-c", shlex.quote(POLL)],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            )
            for h in hosts
        ]  # fmt: skip
        self._threads = [
            threading.Thread(target=self._read, args=(p, h.name), daemon=True)
            for p, h in zip(self._procs, hosts, strict=True)
        ]
        for t in self._threads:
            t.start()
        deadline = time.monotonic() + 20
        while {h for _, h, _ in list(self.samples)} < {h.name for h in hosts} and time.monotonic() < deadline:
            time.sleep(0.2)

    @property
    def first(self) -> dict[str, list[str]]:
        """Each host's first sample: what served when the poller began."""
        first: dict[str, list[str]] = {}
        for _, host, serving in list(self.samples):
            first.setdefault(host, serving)
        return first

    def serving_first(self, dep: str) -> set[int]:
        """The indexes of `dep`'s replicas that served in the hosts' first samples."""
        names = [n for serving in self.first.values() for n in serving]
        return {int(m["index"]) for n in names if (m := UNIT.match(n)) and m["dep"] == dep}

    def _read(self, proc: subprocess.Popen[str], host: str) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            try:
                sample = json.loads(line)
            except ValueError:
                continue
            self.samples.append((float(sample["t"]), host, list(sample["serving"])))

    def stop(self) -> None:
        for p in self._procs:
            p.kill()
            p.wait()
        for t in self._threads:
            t.join(timeout=5)

    def down_together(self, dep: str, indexes: set[int], hosts: set[str]) -> list[tuple[float, float, set[int]]]:
        """The spans (from, to, indexes) during which two or more of `indexes` had no serving unit, each seen
        in at least 3 consecutive rounds of every host (a lag between two hosts' samples is not an overlap)."""
        latest: dict[str, list[str]] = {}
        spans: list[tuple[float, float, set[int]]] = []
        run: list[tuple[float, set[int]]] = []
        for t, host, serving in sorted(self.samples):
            latest[host] = serving
            if set(latest) < hosts:
                continue
            up = {
                int(m["index"]) for names in latest.values() for n in names if (m := UNIT.match(n)) and m["dep"] == dep
            }
            down = indexes - up
            if len(down) >= 2:
                run.append((t, down))
                continue
            if len(run) >= 3 * len(hosts):
                spans.append((run[0][0], run[-1][0], set().union(*(d for _, d in run))))
            run = []
        if len(run) >= 3 * len(hosts):
            spans.append((run[0][0], run[-1][0], set().union(*(d for _, d in run))))
        return spans
