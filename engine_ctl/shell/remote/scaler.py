"""The scaler: starts and stops a deployment's on-demand replicas within the plan's envelope. Stdlib only.

Runs on one gateway host (the first by name) as engine-ctl-scaler.service: `python3 -I -S scaler.py --config
/etc/engine-ctl/scaler/scaler.json`. Every poll_s (15 s) it reads each serving replica's GET /metrics (the
provider's in-flight metric) and every gateway's counts (queued, sessions, request totals per backend, summed): its
own over the admin socket, the other gateway hosts' over SSH (the forced command's `gateway-stat`). It hears the
gateways' Lua on <wake_port> (`wake <deployment>` for a held request): on 127.0.0.1 from its own gateway, on its
host's address from the other gateway hosts (and from no one else). It decides at most once every decide_every_s
per deployment, one replica at a time:
- up when requests in flight per replica exceed 3/4 of `parallel` or requests queue (at zero: on the first
  request, at once);
- down when load stayed low (one replica fewer would be at most half full) for decide_every_s;
- to zero when a `min: 0` deployment had no client request for idle_minutes (health checks and metrics reads
  never reach a backend's request count, so they never count).
It starts a slot health-gated (GET health_path answers 200), then puts its server into the backend on every
gateway; it drains a server on every gateway (no new request, wait for those in flight) before stopping it. A
gateway that does not answer within gateway_timeout_s never holds up the others; it is named in the decisions.
Each poll it reconciles every gateway that answers: the servers of its on-demand slots that run and pass health are
in service, the others in maintenance (so a gateway that restarted, or joined later, converges).
A slot whose devices (or whose cores and memory, on a CPU host) are taken by another running engine-ctl unit or a
GPU process is not started: another slot is, or the decision says why none is free; a higher-priority deployment
may preempt a lower-priority replica above that deployment's min.

Replica hosts are reached over SSH with the scaler's own key, which a forced command there limits to start, stop,
is-active, reset-failed (a failed slot, before a new start) and wake of engine-ctl's replica units and a read-only
status (scaler_command.py): a parked engine's wake calls are made there, on loopback, since its guard passes no
sleep control on. State (decisions, times, averages, what is in flight) is kept in
/var/lib/engine-ctl/scaler/state.json, written atomically, so a restart carries on where it was and does not flap.

Hosts may run an older Python than engine-ctl: this file keeps to Python 3.7's grammar and library. The decision
(`decide`) and the slot choice (`choose_slot`) are pure functions over plain values, unit-tested locally."""

from __future__ import annotations

import argparse
import json
import os
import select
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

from engine_ctl.shell.remote.haproxy_admin import haproxy_ask  # shipped: this line becomes haproxy_admin.py

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    Obj = dict[str, Any]

STATE_PATH = "/var/lib/engine-ctl/scaler/state.json"
INTERNAL_ENV = "/etc/engine-ctl/gateway/internal.env"
KEEP_DECISIONS = 20
DECISIONS_MAP = "decisions.map"
"""The gateway's map of the scaler's decisions so far, "<deployment>/<action>" -> count (render/gateway.py)."""
UP_FRACTION = 0.75
LOW_FRACTION = 0.5
DRAIN_S = 120
START_BUDGET_S = 600
ENTER_S = 60
PARK_WAIT_S = 160
"""How long a wake on a request waits for the park's job to finish (engine-ctl's STOP_WAIT_S)."""
WAKE_TIMEOUT_S = 1900
"""A wake over the forced command: its calls (a reload of the weights from the checkpoint among them, at most
600 s each: scaler_command.CALL_TIMEOUT_S) and its check."""
AVERAGE_WEIGHT = 0.3
IN_USE = ("active", "activating", "deactivating", "reloading")
GATEWAY_TIMEOUT_S = 8
"""How long a gateway host may take to answer (its counts, a server's state) before the scaler goes on without it."""
SET_COMMANDS = {"ready": ("state ready", "health up"), "drain": ("state drain",), "maint": ("state maint",)}
"""A server's state as the admin socket sets it (the forced command's gateway-set does the same on other hosts)."""


def utc(now: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))


# The decision (pure) ------------------------------------------------------------------------------------------


def decide(dep: Obj, obs: Obj, mem: Obj, now: float, every: float) -> Obj | None:
    """What to do for one deployment now: {"action": up|down|zero, "reason", "figure"} or None.

    obs: running (slot indexes in service or starting), ready (serving), in_flight, queued, held, idle_s.
    mem: last_decision_at, low_since (kept by `observe_low`)."""
    if dep.get("stopped") or mem.get("busy"):
        return None
    running, ready = obs["running"], obs["ready"]
    parallel = max(int(dep["parallel"]), 1)
    since = now - float(mem.get("last_decision_at") or 0)
    if not running:
        waiting = obs["held"] + obs["queued"]
        if waiting > 0 and mem.get("hold_reason") and since < every:  # no slot was free: tried again in time
            return None
        if waiting > 0:
            return {"action": "up", "reason": "a request at zero (%d waiting)" % waiting, "figure": float(waiting)}
        return None
    per = obs["in_flight"] / max(len(ready), 1)
    if len(running) < dep["max"] and since >= every:
        if obs["queued"] > 0 or obs["held"] > 0:
            n = obs["queued"] + obs["held"]
            return {"action": "up", "reason": "%d requests queued" % n, "figure": float(n)}
        if per > UP_FRACTION * parallel:
            return {"action": "up", "reason": "in flight %.1f/replica > 3/4 of parallel %d" % (per, parallel),
                    "figure": round(per, 2)}  # fmt: skip
    floor = max(int(dep["min"]), 1)
    low_since = mem.get("low_since")
    if len(running) > floor and low_since is not None and now - low_since >= every and since >= every:
        fewer = obs["in_flight"] / (len(running) - 1)
        return {"action": "down", "reason": "load low for %ds: in flight %.1f/replica with one fewer <= 1/2 of "
                "parallel %d" % (now - low_since, fewer, parallel), "figure": round(fewer, 2)}  # fmt: skip
    idle = dep.get("idle_minutes")
    if int(dep["min"]) == 0 and len(running) == 1 and idle and obs["idle_s"] >= idle * 60 and obs["in_flight"] == 0:
        return {"action": "zero", "reason": "no request for %d min (idle_minutes %d)" % (obs["idle_s"] // 60, idle),
                "figure": float(int(obs["idle_s"]))}  # fmt: skip
    return None


def observe_low(dep: Obj, obs: Obj, mem: Obj, now: float) -> None:
    """Keep low_since: since when one replica fewer would have been at most half full, with nothing queued."""
    running = obs["running"]
    parallel = max(int(dep["parallel"]), 1)
    low = (
        len(running) > 1
        and obs["queued"] == 0
        and obs["held"] == 0
        and obs["in_flight"] / (len(running) - 1) <= LOW_FRACTION * parallel
    )
    if not low:
        mem["low_since"] = None
    elif mem.get("low_since") is None:
        mem["low_since"] = now


# Choosing a slot (pure) ---------------------------------------------------------------------------------------


def slot_conflict(slot: Obj, host: Obj, known: dict[str, Obj]) -> str | None:
    """Why a slot cannot start now on its host, or None. host: the forced command's `status` (active units with
    their devices, busy GPUs, cores, memory); known: unit -> its slot in any deployment of the config."""
    mine = set(slot.get("devices") or [])
    cores, ram = int(slot.get("cpu_cores") or 0), int(slot.get("ram_bytes") or 0)
    for unit in host.get("active", []):
        name = unit["unit"]
        if name == slot["unit"]:
            continue
        taken = mine & set(unit.get("devices") or [])
        if taken:
            return "GPU %s in use by %s" % (sorted(taken)[0], name)
        other = known.get(name) or {}
        cores += int(other.get("cpu_cores") or 0)
        ram += int(other.get("ram_bytes") or 0)
    busy = mine & set(host.get("gpu_busy") or [])
    if busy:
        return "GPU %s in use by another process" % sorted(busy)[0]
    if not mine and slot.get("cpu_cores") and host.get("cores") and cores > int(host["cores"]):
        return "%d cores in use on %s of %s" % (cores - int(slot["cpu_cores"]), slot["host"], host["cores"])
    if not mine and ram and host.get("mem_total") and ram > int(host["mem_total"]):
        return "memory in use on %s" % slot["host"]
    return None


def choose_slot(dep: Obj, running: list[int], hosts: dict[str, Obj], known: dict[str, Obj]) -> tuple[Obj | None, str]:
    """The lowest on-demand slot not running whose host has room; else (None, why none is free)."""
    why = []
    for slot in sorted(dep["slots"], key=lambda s: s["index"]):
        if slot["always_on"] or slot["index"] in running:
            continue
        host = hosts.get(slot["host"])
        if host is None:
            why.append("%s unreachable" % slot["host"])
            continue
        conflict = slot_conflict(slot, host, known)
        if conflict is None:
            return slot, ""
        why.append("slot %d: %s" % (slot["index"], conflict))
    return None, "; ".join(why) or "every slot runs (max %d)" % dep["max"]


def preemptable(dep: Obj, deps: list[Obj], running: dict[str, list[int]]) -> list[tuple[Obj, Obj]]:
    """(deployment, slot) of lower priority that run above their min, on demand, lowest priority first."""
    out = []
    for other in sorted(deps, key=lambda d: (d.get("priority", 0), d["name"])):
        if other["name"] == dep["name"] or other.get("priority", 0) >= dep.get("priority", 0):
            continue
        mine = running.get(other["name"], [])
        if len(mine) <= int(other["min"]):
            continue
        for slot in sorted(other["slots"], key=lambda s: -s["index"]):
            if slot["index"] in mine and not slot["always_on"]:
                out.append((other, slot))
    return out


def wake_slots(dep: Obj) -> list[Obj]:
    """The slots a wake on a request brings back: the always-on ones (0..min-1), or the lowest for `min: 0`."""
    slots = sorted(dep["slots"], key=lambda s: s["index"])
    return [s for s in slots if s["always_on"]] or slots[:1]


# Several gateways (pure) -------------------------------------------------------------------------------------


def status_rank(status: str) -> int:
    """In service first: UP, then DRAIN, then the rest (DOWN, no check), MAINT last."""
    for rank, prefix in enumerate(("UP", "DRAIN")):
        if status.startswith(prefix):
            return rank
    return 3 if status.startswith("MAINT") else 2


def merge_stats(per_gateway: dict[str, dict[str, Obj]]) -> dict[str, Obj]:
    """Each gateway's parse_stat -> one view per backend: queued, sessions and request totals summed (requests_by:
    gateway -> its total), each server's sessions summed and its status the most in service of any gateway."""
    out: dict[str, Obj] = {}
    for gw in sorted(per_gateway):
        for backend, b in per_gateway[gw].items():
            m = out.setdefault(backend, {"queued": 0, "sessions": 0, "requests": 0, "requests_by": {}, "servers": {}})
            m["queued"] += b["queued"]
            m["sessions"] += b["sessions"]
            m["requests"] += b["requests"]
            m["requests_by"][gw] = b["requests"]
            for name, server in b["servers"].items():
                have = m["servers"].setdefault(name, {"status": server["status"], "sessions": 0})
                if status_rank(server["status"]) < status_rank(have["status"]):
                    have["status"] = server["status"]
                have["sessions"] += server["sessions"]
    return out


def requests_rose(seen: Obj, now_by: Obj) -> bool:
    """Whether a gateway's request total rose since it was last read. A gateway read for the first time, or whose
    total went back (its HAProxy restarted), only sets its mark; one that did not answer keeps its old one."""
    return any(gw in seen and int(n) > int(seen[gw]) for gw, n in now_by.items())


def reconcile(
    slots: list[Obj], wanted: set[int], unknown: set[int], servers_by_gateway: dict[str, Obj]
) -> list[tuple[str, str, str]]:
    """(gateway, server, ready|maint) to set so that on every gateway the servers of the on-demand slots in
    `wanted` (running, healthy) are in service and the others in maintenance; slots in `unknown` (their host not
    read, or acted on since) and always-on slots are left alone."""
    out = []
    for gw in sorted(servers_by_gateway):
        for slot in sorted(slots, key=lambda s: s["index"]):
            server = servers_by_gateway[gw].get(slot["server"])
            if slot["always_on"] or slot["index"] in unknown or server is None:
                continue
            status = server["status"]
            if slot["index"] in wanted and (status.startswith("MAINT") or status.startswith("DRAIN")):
                out.append((gw, slot["server"], "ready"))
            elif slot["index"] not in wanted and not status.startswith("MAINT"):
                out.append((gw, slot["server"], "maint"))
    return out


def wake_allowed(peer: str, allowed: list[str]) -> bool:
    """A wake is heard from loopback and from the gateway hosts' addresses only."""
    return peer.startswith("127.") or peer in ("::1", "::ffff:127.0.0.1") or peer in allowed


# The gateway's admin socket and the replicas ------------------------------------------------------------------


def admin(path: str, command: str, timeout: float = 10) -> str:
    return haproxy_ask(path, command, timeout)


def parse_stat(text: str) -> dict[str, Obj]:
    """`show stat` -> backend -> {queued, sessions, requests, servers: name -> {status, sessions}}."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines or not lines[0].startswith("#"):
        return {}
    header = lines[0].lstrip("# ").split(",")
    out: dict[str, Obj] = {}
    for line in lines[1:]:
        row = dict(zip(header, line.split(",")))  # noqa: B905 (strict= is Python 3.10)
        b = out.setdefault(row.get("pxname", ""), {"queued": 0, "sessions": 0, "requests": 0, "servers": {}})
        if row.get("svname") == "BACKEND":
            b["queued"] = int(row.get("qcur") or 0)
            b["sessions"] = int(row.get("scur") or 0)
            b["requests"] = int(row.get("req_tot") or row.get("stot") or 0)
        elif row.get("svname") != "FRONTEND":
            b["servers"][row["svname"]] = {"status": row.get("status", ""), "sessions": int(row.get("scur") or 0)}
    return out


def metric_sum(text: str, name: str) -> float | None:
    """The sum of a Prometheus metric's samples (any labels); None when absent."""
    total, seen = 0.0, False
    for line in text.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in (" ", "{"):
            try:
                total += float(line.rsplit(" ", 1)[-1])
                seen = True
            except ValueError:
                continue
    return total if seen else None


def http_get(url: str, key: str, timeout: float = 5) -> tuple[int, str]:
    request = urllib.request.Request(url, headers={"Authorization": "Bearer " + key} if key else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except (OSError, ValueError):
        return 0, ""


def read_key(path: str = INTERNAL_ENV) -> str:
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("ENGINE_CTL_GATEWAY_KEY="):
                    return line.strip().split("=", 1)[1]
    except OSError:
        pass
    return ""


def resolved(names: list[str]) -> list[str]:
    """Addresses as the listener sees peers: IP literals as they are, a host name resolved (when it resolves)."""
    out = []
    for name in names:
        try:
            out += sorted({str(info[4][0]) for info in socket.getaddrinfo(name, None)})
        except OSError:
            continue
    return out


# State --------------------------------------------------------------------------------------------------------


def load_state(path: str) -> Obj:
    try:
        with open(path) as f:
            state = json.load(f)
        if isinstance(state, dict) and isinstance(state.get("deployments"), dict):
            return state
    except (OSError, ValueError):
        pass
    return {"format": 1, "deployments": {}}


def save_state(path: str, state: Obj) -> None:
    """Atomically: a whole new file, synced, renamed over the old one."""
    tmp = path + ".new"
    with open(tmp, "w") as f:
        json.dump(state, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


# The PostgreSQL lock (with PostgreSQL state: a scaler on every gateway host, one acts) -------------------------

SESSION_SETTINGS = (
    "SET tcp_keepalives_idle = 5; SET tcp_keepalives_interval = 2; SET tcp_keepalives_count = 3; "
    "SET tcp_user_timeout = 10000; SET statement_timeout = 5000; SET idle_session_timeout = 0;"
)
"""The lock's session, on the server's side: a leader whose host or network died is noticed within about 11 s,
and its lock freed for another scaler."""
LOCK_ANSWER_S = 5
"""How long psql may take to answer; longer and the session is taken for dead (psql ended: no lock held)."""
END_MARK = "__engine_ctl_scaler_end__"
APPLICATION = "engine-ctl-scaler "


def conninfo(lock: Obj) -> str:
    """libpq's key=value connection string (values quoted, as libpq reads them)."""

    def quoted(v: object) -> str:
        return "'" + str(v).replace("\\", "\\\\").replace("'", "\\'") + "'"

    pairs = [("host", lock["host"]), ("port", lock["port"]), ("dbname", lock["dbname"]), ("user", lock["user"]),
             ("connect_timeout", 5), ("keepalives", 1), ("keepalives_idle", 5), ("keepalives_interval", 2),
             ("keepalives_count", 3), ("application_name", APPLICATION + str(lock["name"]))]  # fmt: skip
    return " ".join("%s=%s" % (k, quoted(v)) for k, v in pairs)


def key_parts(key: int) -> tuple[int, int]:
    """How pg_locks shows a bigint advisory key: classid the high 32 bits, objid the low 32."""
    unsigned = key & 0xFFFFFFFFFFFFFFFF
    return unsigned >> 32, unsigned & 0xFFFFFFFF


def holder_sql(key: int) -> str:
    """The application_name of the session that holds the key (all scalers log in as one role: they see it)."""
    high, low = key_parts(key)
    return (
        "(SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid WHERE "
        "l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 AND l.classid = %d AND l.objid = %d AND "
        "l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) LIMIT 1)" % (high, low)
    )


def holds_sql(key: int) -> str:
    high, low = key_parts(key)
    return (
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted "
        "AND objsubid = 1 AND classid = %d AND objid = %d;" % (high, low)
    )


def read_password(path: str) -> str:
    try:
        with open(path) as f:
            return f.readline().strip()
    except OSError:
        return ""


class PgLock:
    """A session-level advisory lock held through a psql child (the scaler is stdlib only): the session is the
    lock. psql ends when its connection is lost, and the lock is freed by the server when the session ends."""

    def __init__(self, lock: Obj, log: Callable[[str], None]) -> None:
        self.lock, self.log = lock, log
        self.proc: subprocess.Popen[bytes] | None = None
        self.mutex = threading.Lock()
        self.held = False
        self.holder = ""
        """Who holds it, as last seen (the gateway host's name), when another scaler does."""

    def ask(self, sql: str) -> list[str] | None:
        """psql's answer lines to `sql`, or None (no answer in time, psql gone: the session is ended)."""
        proc = self.proc
        if proc is None or proc.stdin is None or proc.stdout is None:
            return None
        try:
            proc.stdin.write((sql + "\n\\echo " + END_MARK + "\n").encode())
            proc.stdin.flush()
        except OSError:
            self.end("psql ended")
            return None
        out, deadline = b"", time.time() + LOCK_ANSWER_S
        while (END_MARK + "\n").encode() not in out:
            ready = select.select([proc.stdout], [], [], max(deadline - time.time(), 0))[0]
            chunk = os.read(proc.stdout.fileno(), 65536) if ready else b""
            if not chunk:
                self.end("no answer from the database within %d s" % LOCK_ANSWER_S if not ready else
                         "the session ended: " + out.decode(errors="replace").strip()[-200:])  # fmt: skip
                return None
            out += chunk
        text = out.decode(errors="replace").split(END_MARK)[0]
        return [line for line in text.splitlines() if line.strip()]

    def start(self) -> bool:
        env = dict(os.environ, PGPASSWORD=read_password(self.lock["password_file"]), PGCONNECT_TIMEOUT="5")
        argv = [self.lock.get("psql") or "psql", "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=0", "-d",
                conninfo(self.lock)]  # fmt: skip
        try:
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, env=env)  # fmt: skip
        except OSError as exc:
            self.log("the lock: psql: %s" % exc)
            return False
        said = self.ask(SESSION_SETTINGS + " SELECT 'ready';")
        if not said or said[-1] != "ready":  # (a setting an older server lacks is said before, and is no matter)
            if said is not None:
                self.end("the session: " + " ".join(said)[-300:])
            return False
        return True

    def end(self, why: str) -> None:
        proc, self.proc = self.proc, None
        if self.held:
            self.log("the lock: lost (%s)" % why)
        elif proc is not None:
            self.log("the lock: no session (%s)" % why)
        self.held = False
        if proc is not None:
            try:
                proc.kill()
                proc.wait(5)
            except (OSError, subprocess.TimeoutExpired):
                pass

    def try_lead(self) -> bool:
        """Whether this scaler holds the lock now: checked on its live session when it did, tried for when not."""
        with self.mutex:
            if self.held:
                return self.check()
            if self.proc is None and not self.start():
                return False
            said = self.ask("SELECT pg_try_advisory_lock(%d), %s;" % (int(self.lock["key"]),
                                                                      holder_sql(int(self.lock["key"]))))  # fmt: skip
            if not said or "|" not in said[-1]:
                self.log("the lock: %s" % " ".join(said or ["no answer"])[-300:])
                return False
            got, _, holder = said[-1].partition("|")
            self.held = got == "t"
            self.holder = str(self.lock["name"]) if self.held else holder[len(APPLICATION) :]
            return self.held

    def holds(self) -> bool:
        """Fencing, before each action: the lock is still held on a live session (else no longer the leader)."""
        with self.mutex:
            return self.held and self.check()

    def check(self) -> bool:
        said = self.ask(holds_sql(int(self.lock["key"])))
        if said != ["1"]:
            if said is not None:
                self.end("the session holds it no more: %s" % " ".join(said)[-200:])
            return False
        return True


# The scaler ---------------------------------------------------------------------------------------------------


def scaled_to_zero(mem: Obj, idle_minutes: int) -> None:
    """What the scaler says of a min-0 deployment with no replica running (its hold's reason, if one is held)."""
    mem["state"] = "ScaledToZero"
    mem["reason"] = mem.get("hold_reason") or "no request for %d min: it holds no GPU" % idle_minutes


class Scaler:
    def __init__(self, config: Obj, state_path: str, log: Callable[[str], None]) -> None:
        self.config, self.state_path, self.log = config, state_path, log
        self.deps = [d for d in config["deployments"]]
        self.known = {s["unit"]: dict(s, deployment=d["name"]) for d in self.deps for s in d["slots"]}
        self.state = load_state(state_path)
        self.lock = threading.RLock()
        self.wakes: dict[str, int] = {}
        self.woken = threading.Event()
        self.key = read_key(config.get("internal_env", INTERNAL_ENV))
        self.seen: dict[str, tuple[float, Obj]] = {}
        """host -> (when, its status): read each poll, so a wake need not wait for an SSH round trip."""
        self.acted_at: dict[str, float] = {}
        """host -> when a start or stop there last ended: a status read before then is not reconciled on."""
        self.unreachable: dict[str, str] = {}
        """gateway -> why it did not answer (named once in the decisions, and once when it is back)."""
        lock = config.get("lock")
        self.pglock = PgLock(lock, log) if lock else None
        """With PostgreSQL state: the lock that makes this scaler the one that acts (None: it always acts)."""
        for d in self.deps:
            kept = self.state["deployments"].get(d["name"])
            if kept is not None and kept.get("id", d.get("id")) != d.get("id"):
                del self.state["deployments"][d["name"]]  # deleted and made again under its name: none of its past
            self.mem(d["name"])["id"] = d.get("id")
            self.mem(d["name"])["revision"] = d.get("revision")  # with the ID: what `import` reads back
            self.mem(d["name"]).setdefault("last_request_at", time.time())

    def mem(self, name: str) -> Obj:
        return self.state["deployments"].setdefault(name, {"decisions": [], "running": [], "state": "Ready"})

    def save(self) -> None:
        with self.lock:
            self.state["updated"] = utc(time.time())
            live = {d["name"] for d in self.deps}
            self.state["deployments"] = {k: v for k, v in self.state["deployments"].items() if k in live}
            save_state(self.state_path, self.state)

    def record(self, name: str, action: str, reason: str, figure: float | None = None, slot: Obj | None = None) -> None:
        with self.lock:
            mem = self.mem(name)
            entry = {"at": utc(time.time()), "action": action, "reason": reason, "figure": figure}
            if slot is not None:
                entry.update(slot=slot["index"], host=slot["host"])
            mem["decisions"] = [*(mem.get("decisions") or [])[-(KEEP_DECISIONS - 1) :], entry]
            counts = mem.setdefault("decision_counts", {})
            counts[action] = counts.get(action, 0) + 1
            count = counts[action]
            self.save()
        self.count_decision(name, action, count)
        self.log("%s: %s%s: %s" % (name, action, "" if slot is None else " slot %d" % slot["index"], reason))

    def count_decision(self, name: str, action: str, count: int) -> None:
        """Its decisions so far, per deployment and action, in this host's gateway's decisions.map (kept across the
        scaler's restarts in its state): the gateway's metrics port exports them. `set map` changes an entry at
        once; a new one is added. A gateway that does not answer misses a count until the next decision."""
        sock = self.config.get("gateway_socket")
        if not sock:
            return
        key = "%s/%s" % (name, action)
        try:
            said = admin(sock, "set map %s %s %d" % (DECISIONS_MAP, key, count), 2)
            if said.strip():
                admin(sock, "add map %s %s %d" % (DECISIONS_MAP, key, count), 2)
        except OSError:
            pass

    # --- hearing the gateway ----------------------------------------------------------------------------------
    def listen(self, port: int) -> None:
        """On 127.0.0.1 and, with other gateway hosts, on this host's address (wake_bind); from those hosts only."""
        allowed = resolved(self.config.get("wake_from") or [])
        binds = self.config.get("wake_bind") or ["127.0.0.1"]
        for address in binds[1:]:
            threading.Thread(target=self.listen_on, args=(address, port, allowed), daemon=True).start()
        self.listen_on(binds[0], port, allowed)

    def listen_on(self, address: str, port: int, allowed: list[str]) -> None:
        try:
            server = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_STREAM)
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            server.bind((address, port))
            server.listen(64)
        except OSError as exc:
            self.log("the wake listener on %s:%d: %s" % (address, port, exc))
            return
        while True:
            conn, peer = server.accept()
            if not wake_allowed(peer[0], allowed):
                self.log("a wake from %s refused: not a gateway host" % peer[0])
                conn.close()
                continue
            threading.Thread(target=self._heard, args=(conn,), daemon=True).start()

    def _heard(self, conn: socket.socket) -> None:
        conn.settimeout(2)
        try:
            words = conn.recv(256).decode(errors="replace").split()
        except OSError:
            words = []
        finally:
            conn.close()
        if len(words) in (2, 3) and words[0] == "wake" and any(d["name"] == words[1] for d in self.deps):
            if not self.leading():
                if len(words) == 2:  # from a gateway's Lua, not relayed already: to the scaler that acts
                    self.relay(words[1])
                return
            with self.lock:
                self.wakes[words[1]] = self.wakes.get(words[1], 0) + 1
            self.woken.set()

    # --- observing --------------------------------------------------------------------------------------------
    def drives(self) -> list[Obj]:
        """The gateway hosts whose HAProxy it drives (an older scaler.json: its own only)."""
        return list(self.config.get("gateways") or [{"name": "local", "local": True}])

    def on_gateway(self, gw: Obj, words: list[str]) -> tuple[int, str]:
        """`gateway-stat` or `gateway-set BACKEND SERVER STATE` on one gateway: its own admin socket here, the
        forced command over SSH elsewhere. (exit status, output)."""
        timeout = float(self.config.get("gateway_timeout_s", GATEWAY_TIMEOUT_S))
        if not gw.get("local"):
            return self.ssh(gw, " ".join(words), timeout=timeout)
        sock = self.config["gateway_socket"]
        if words[0] == "gateway-set":
            self.fence()
        try:
            if words == ["gateway-stat"]:
                return 0, admin(sock, "show stat", timeout)
            for command in SET_COMMANDS[words[3]]:
                said = admin(sock, "set server %s/%s %s" % (words[1], words[2], command), timeout)
                if said.strip():
                    return 1, said
        except OSError as exc:
            return -1, "its admin socket: %s" % exc
        return 0, ""

    def each_gateway(self, words: list[str], gateways: list[Obj] | None = None) -> dict[str, tuple[int, str]]:
        """The same on every gateway (or those given) at once; one that has not answered within the timeout is not
        waited for."""
        timeout = float(self.config.get("gateway_timeout_s", GATEWAY_TIMEOUT_S))
        results: dict[str, tuple[int, str]] = {}
        gateways = self.drives() if gateways is None else gateways

        def one(gw: Obj) -> None:
            results[gw["name"]] = self.on_gateway(gw, words)

        threads = [threading.Thread(target=one, args=(gw,), daemon=True) for gw in gateways]
        for t in threads:
            t.start()
        deadline = time.time() + timeout + 1
        for t in threads:
            t.join(max(deadline - time.time(), 0))
        late = (-1, "no answer within %d s" % timeout)
        return {gw["name"]: results.get(gw["name"], late) for gw in gateways}

    def gateway_stats(self, all_gateways: bool = True) -> dict[str, dict[str, Obj]]:
        """Every gateway's counts that answered (gateway -> parse_stat); the others are named in the decisions.
        Not all_gateways (a wake): those that did not answer last time are not waited for again."""
        asked = [gw for gw in self.drives() if all_gateways or gw["name"] not in self.unreachable]
        out = {}
        for name, (code, text) in sorted(self.each_gateway(["gateway-stat"], asked).items()):
            if code == 0 and text.lstrip().startswith("#"):
                out[name] = parse_stat(text)
            problem = None if name in out else (text.strip()[-200:] or "exit status %d" % code)
            self.note_gateway(name, problem)
        return out

    def note_gateway(self, name: str, problem: str | None) -> None:
        """Name a gateway in every deployment's decisions when it stops answering, and when it answers again."""
        with self.lock:
            was = self.unreachable.get(name)
            if (problem is None) == (was is None):
                return
            if problem is None:
                self.unreachable.pop(name, None)
            else:
                self.unreachable[name] = problem
            self.state["gateways_unreachable"] = dict(self.unreachable)
        reason = "gateway %s unreachable: %s" % (name, problem) if problem else "gateway %s answers again" % name
        for dep in self.deps:
            self.record(dep["name"], "gateway", reason)

    def set_everywhere(self, dep: Obj, slot: Obj, state: str) -> list[str]:
        """A server's state on every gateway; those where it failed (recorded in the decisions), each with why."""
        results = self.each_gateway(["gateway-set", dep["backend"], slot["server"], state])
        failed = ["%s: %s" % (n, out.strip()[-200:] or "exit status %d" % code)
                  for n, (code, out) in sorted(results.items()) if code != 0]  # fmt: skip
        if failed:
            reason = "slot %d not set %s on %s" % (slot["index"], state, "; ".join(failed))
            self.record(dep["name"], "gateway", reason, None, slot)
        return failed

    def reconcile_gateways(self, per: dict[str, dict[str, Obj]]) -> None:
        """Every gateway that answered: the servers of on-demand slots that run and pass health in service, the
        others in maintenance (a deployment busy starting, waking or stopping, or stopped or parked by an operator,
        is left alone: a parked engine asleep still runs and may answer its health check)."""
        drives = {gw["name"]: gw for gw in self.drives()}
        for dep in self.deps:
            if dep.get("stopped") or dep.get("parked") or self.mem(dep["name"]).get("busy"):
                continue
            wanted, unknown = self.healthy_slots(dep)
            servers = {gw: stats.get(dep["backend"], {}).get("servers", {}) for gw, stats in per.items()}
            for gw, server, state in reconcile(dep["slots"], wanted, unknown, servers):
                code, out = self.on_gateway(drives[gw], ["gateway-set", dep["backend"], server, state])
                said = "" if code == 0 else ": " + out.strip()[-200:]
                self.log("%s: %s %s on %s (reconciled)%s" % (dep["name"], server, state, gw, said))

    def healthy_slots(self, dep: Obj) -> tuple[set[int], set[int]]:
        """(on-demand slots whose unit is active and whose engine answers its health check, those not known: their
        host not read since the scaler last acted there)."""
        wanted, unknown = set(), set()
        for slot in dep["slots"]:
            if slot["always_on"]:
                continue
            when, status = self.seen.get(slot["host"], (0.0, None))
            if status is None or when <= self.acted_at.get(slot["host"], 0.0):
                unknown.add(slot["index"])
                continue
            if any(u["unit"] == slot["unit"] and u.get("state") == "active" for u in status.get("active", [])):
                url = "http://%s:%d%s" % (slot["address"], slot["port"], slot["health_path"])
                if http_get(url, "", timeout=2)[0] == 200:
                    wanted.add(slot["index"])
        return wanted, unknown

    def observe(self, dep: Obj, stats: Obj, held: int, now: float) -> Obj:
        servers = stats.get("servers", {})
        mem = self.mem(dep["name"])
        running, ready, in_flight = [], [], 0.0
        for slot in dep["slots"]:
            s = servers.get(slot["server"])
            if not self.runs(slot, s):
                continue
            running.append(slot["index"])
            if s is None:
                continue
            if s["status"].startswith("UP") or s["status"].startswith("DRAIN"):
                ready.append(slot["index"])
                code, text = http_get("http://%s:%d/metrics" % (slot["address"], slot["port"]), self.key)
                found = metric_sum(text, dep["metric"]) if code == 200 and dep.get("metric") else None
                in_flight += found if found is not None else s["sessions"]
        busy = mem.get("busy") or {}
        if busy.get("action") == "up" and busy.get("slot") not in running:
            running.append(busy["slot"])
        requests = int(stats.get("requests", 0))
        by = stats.get("requests_by") or {}
        if requests_rose(mem.get("requests_by") or {}, by) or held or in_flight or stats.get("queued"):
            mem["last_request_at"] = now
        mem["requests_seen"] = requests
        mem["requests_by"] = dict(mem.get("requests_by") or {}, **by)
        mem["average"] = round(AVERAGE_WEIGHT * in_flight + (1 - AVERAGE_WEIGHT) * float(mem.get("average") or 0), 3)
        idle = now - float(mem.get("last_request_at") or now)
        return {"running": sorted(running), "ready": sorted(ready), "in_flight": in_flight,
                "queued": int(stats.get("queued", 0)), "held": held, "idle_s": idle}  # fmt: skip

    def runs(self, slot: Obj, server: Obj | None) -> bool:
        """Whether a slot runs: its gateway server in service (not in maintenance) and, for an on-demand one, its
        unit in use on its host (as last read there)."""
        in_service = server is not None and not server["status"].startswith("MAINT")
        seen = self.seen.get(slot["host"])
        if not slot["always_on"] and seen is not None:
            return in_service and any(u["unit"] == slot["unit"] for u in seen[1].get("active", []))
        return in_service

    def statuses(self, names: list[str], fresh: bool) -> dict[str, Obj]:
        """Each host's status: read now (fresh), or as read within the last poll when the scaler has not acted
        on that host since (a start or stop forgets it)."""
        out = {}
        poll = float(self.config.get("poll_s", 15))
        for name in names:
            when, status = self.seen.get(name, (0.0, {}))
            if fresh or time.time() - when > 2 * poll or not status:
                found = self.host_status(name)
                if found is None:
                    self.seen.pop(name, None)
                    continue
                when, status = time.time(), found
                self.seen[name] = (when, status)
            out[name] = status
        return out

    def host_status(self, host: str) -> Obj | None:
        slot = next(s for s in self.known.values() if s["host"] == host)
        code, out = self.ssh(slot, "status")
        if code != 0:
            self.log("%s: status: %s" % (host, out.strip()[-200:]))
            return None
        try:
            status = json.loads(out)
        except ValueError:
            return None
        return status if isinstance(status, dict) else None

    def ssh(self, slot: Obj, command: str, timeout: float = 60) -> tuple[int, str]:
        if command.split()[0] in ("start", "stop", "reset-failed", "gateway-set", "wake"):
            self.fence()
        argv = ["ssh", "-F", "/dev/null", "-i", self.config["key"], "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
                "-o", "StrictHostKeyChecking=yes", "-o", "UserKnownHostsFile=" + self.config["known_hosts"],
                "-o", "GlobalKnownHostsFile=/dev/null", "-o", "ConnectTimeout=10", "-o", "LogLevel=ERROR",
                "-p", str(slot.get("ssh_port", 22)), slot["ssh_host"], command]  # fmt: skip
        control = self.config.get("control_dir")
        if control and os.path.isdir(control):  # one connection per host, kept: a wake costs no SSH handshake
            argv[1:1] = ["-o", "ControlMaster=auto", "-o", "ControlPath=%s/%%C" % control, "-o", "ControlPersist=600"]
        try:
            p = subprocess.run(argv, capture_output=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            return -1, "no answer within %d s" % timeout
        except OSError as exc:
            return -1, str(exc)
        return p.returncode, (p.stdout or p.stderr).decode(errors="replace")

    # --- one cycle --------------------------------------------------------------------------------------------
    def cycle(self, refresh: bool = True) -> None:
        """One look and the decisions it leads to; `refresh`: read the hosts' status too (a regular poll; a wake
        uses what the last poll read, so it waits for no SSH round trip)."""
        now = time.time()
        per = self.gateway_stats(all_gateways=refresh)
        stats = merge_stats(per)
        with self.lock:
            wakes, self.wakes = self.wakes, {}
        if refresh:
            idle = [d for d in self.deps if not self.mem(d["name"]).get("busy")]
            self.statuses(sorted({s["host"] for d in idle for s in d["slots"] if not s["always_on"]}), fresh=True)
        observed = {}
        for dep in self.deps:
            observed[dep["name"]] = self.observe(dep, stats.get(dep["backend"], {}), wakes.get(dep["name"], 0), now)
        if refresh:
            self.reconcile_gateways(per)
        every = float(self.config.get("decide_every_s", 120))
        if self.pglock is not None and not self.pglock.holds():  # lost while it looked: it decides nothing
            return
        order = sorted(self.deps, key=lambda d: (-int(d.get("priority", 0)), d["name"]))
        for dep in order:
            if dep.get("parked"):  # an operator's park: never scaled, woken on a request
                self.parked_cycle(dep, wakes.get(dep["name"], 0))
                continue
            obs, mem = observed[dep["name"]], self.mem(dep["name"])
            observe_low(dep, obs, mem, now)
            self.summarise(dep, obs)
            choice = decide(dep, obs, mem, now, every)
            if choice is not None:
                self.act(dep, choice, obs, observed)
        self.save()

    def summarise(self, dep: Obj, obs: Obj) -> None:
        mem = self.mem(dep["name"])
        busy = mem.get("busy") or {}
        mem["running"], mem["ready"] = obs["running"], len(obs["ready"])
        mem["wanted"] = len(obs["running"])
        if not obs["running"] and int(dep["min"]) == 0:
            scaled_to_zero(mem, int(obs["idle_s"] // 60))
        elif not obs["ready"]:
            mem["state"] = "Starting"
            mem["reason"] = "replica %s is loading" % busy.get("slot", "?")
        else:
            mem["state"], mem["reason"] = "Ready", "%d of %d..%d serving" % (len(obs["ready"]), dep["min"], dep["max"])

    def act(self, dep: Obj, choice: Obj, obs: Obj, observed: dict[str, Obj]) -> None:
        name, mem = dep["name"], self.mem(dep["name"])
        if choice["action"] in ("down", "zero"):
            slot = next(s for s in sorted(dep["slots"], key=lambda s: -s["index"])
                        if s["index"] in obs["running"] and not s["always_on"])  # fmt: skip
            self.launch(dep, "down", slot, choice)
            return
        hosts = self.statuses(sorted({s["host"] for s in dep["slots"] if not s["always_on"]}), fresh=False)
        slot, why = choose_slot(dep, obs["running"], hosts, self.known)
        if slot is None:
            slot = self.preempt(dep, obs, observed, hosts, choice)
        if slot is None:
            mem["hold_reason"] = "no slot free: " + why
            mem["last_decision_at"] = time.time()
            self.record(name, "hold", "no slot free: " + why, choice["figure"])
            return
        mem.pop("hold_reason", None)
        self.launch(dep, "up", slot, choice)

    def preempt(self, dep: Obj, obs: Obj, observed: dict[str, Obj], hosts: dict[str, Obj], choice: Obj) -> Obj | None:
        """Drain and stop a lower-priority replica above its min whose stopping frees a slot of `dep`."""
        running = {n: o["running"] for n, o in observed.items()}
        for other, victim in preemptable(dep, self.deps, running):
            if self.mem(other["name"]).get("busy") or victim["host"] not in hosts:
                continue
            left = dict(hosts[victim["host"]])
            left["active"] = [u for u in left.get("active", []) if u["unit"] != victim["unit"]]
            slot, _ = choose_slot(dep, obs["running"], dict(hosts, **{victim["host"]: left}), self.known)
            if slot is None:
                continue
            reason = "preempted by %s (priority %s > %s)" % (
                dep["name"],
                dep.get("priority", 0),
                other.get("priority", 0),
            )
            self.mem(other["name"])["last_decision_at"] = time.time()
            self.record(other["name"], "preempt", reason, choice["figure"], victim)
            self.drain_and_stop(other, victim)
            self.seen.pop(victim["host"], None)
            return slot
        return None

    def launch(self, dep: Obj, action: str, slot: Obj, choice: Obj) -> None:
        mem = self.mem(dep["name"])
        with self.lock:
            mem["busy"] = {"action": action, "slot": slot["index"], "since": time.time()}
            mem["last_decision_at"] = time.time()
        self.record(dep["name"], choice["action"], choice["reason"], choice["figure"], slot)
        threading.Thread(target=self.carry_out, args=(dep, action, slot), daemon=True).start()

    def carry_out(self, dep: Obj, action: str, slot: Obj) -> None:
        self.seen.pop(slot["host"], None)
        try:
            self._carry_out(dep, action, slot)
        finally:
            self.seen.pop(slot["host"], None)
            self.acted_at[slot["host"]] = time.time()

    def _carry_out(self, dep: Obj, action: str, slot: Obj) -> None:
        """One replica's start (health-gated, then into the backend) or drain and stop; `busy` until done, so a
        scaler killed half-way resumes it (resume)."""
        try:
            if action == "up":
                self.start(dep, slot)
            else:
                self.drain_and_stop(dep, slot)
        except Exception as exc:  # a failure is a decision to record, never the end of the scaler
            self.record(dep["name"], "failed", "%s slot %d: %s" % (action, slot["index"], exc), None, slot)
        finally:
            with self.lock:
                self.mem(dep["name"]).pop("busy", None)
                self.save()
            self.woken.set()

    def start(self, dep: Obj, slot: Obj) -> None:
        self.reset_if_failed(dep, slot)
        code, out = self.ssh(slot, "start " + slot["unit"], timeout=120)
        if code != 0:
            raise RuntimeError("start %s on %s: %s" % (slot["unit"], slot["host"], out.strip()[-300:]))
        url = "http://%s:%d%s" % (slot["address"], slot["port"], slot["health_path"])
        started = time.time()
        checked = started
        while http_get(url, "", timeout=2)[0] != 200:
            if time.time() > started + START_BUDGET_S:
                self.ssh(slot, "stop " + slot["unit"])
                raise RuntimeError("%s did not answer %s with 200 within %d s" % (slot["unit"], url, START_BUDGET_S))
            if time.time() - checked >= 5:  # a unit that died while loading is not waited for
                checked = time.time()
                if self.ssh(slot, "is-active " + slot["unit"])[0] != 0:
                    raise RuntimeError("%s on %s stopped while loading" % (slot["unit"], slot["host"]))
            time.sleep(0.1)
        failed = self.set_everywhere(dep, slot, "ready")
        if len(failed) == len(self.drives()):
            raise RuntimeError("slot %d serves but no gateway took it: %s" % (slot["index"], "; ".join(failed)))
        self.log("%s: slot %d serving" % (dep["name"], slot["index"]))

    def reset_if_failed(self, dep: Obj, slot: Obj) -> None:
        """A slot whose last start failed is in systemd's start limit (StartLimitIntervalSec, up to 42 min): no
        start would run. The forced command resets it when it is failed (and only then); recorded as a decision."""
        code, out = self.ssh(slot, "reset-failed " + slot["unit"], timeout=30)
        if code != 0:
            self.log("%s: reset-failed %s on %s: %s" % (dep["name"], slot["unit"], slot["host"], out.strip()[-300:]))
        elif out.strip().endswith("reset (it had failed)"):
            self.record(dep["name"], "reset", "slot %d had failed its last start: reset before this start"
                        % slot["index"], None, slot)  # fmt: skip

    def drain_and_stop(self, dep: Obj, slot: Obj) -> None:
        """Drain on every gateway, wait until no gateway that answers has a request on it, maintenance on every
        gateway, then stop (a gateway that did not answer is reconciled into maintenance when it is back)."""
        failed = self.set_everywhere(dep, slot, "drain")
        names = [gw["name"] for gw in self.drives() if not any(f.startswith(gw["name"] + ":") for f in failed)]
        self.log("%s: slot %d draining on %s" % (dep["name"], slot["index"], ", ".join(names) or "no gateway"))
        deadline = time.time() + DRAIN_S
        while time.time() < deadline:
            stats = merge_stats(self.gateway_stats()).get(dep["backend"], {})
            server = stats.get("servers", {}).get(slot["server"])
            if server is None or server["sessions"] == 0:
                break
            time.sleep(0.5)
        failed = self.set_everywhere(dep, slot, "maint")
        names = [gw["name"] for gw in self.drives() if not any(f.startswith(gw["name"] + ":") for f in failed)]
        self.log("%s: slot %d in maintenance on %s" % (dep["name"], slot["index"], ", ".join(names) or "no gateway"))
        code, out = self.ssh(slot, "stop " + slot["unit"], timeout=120)
        if code != 0:
            raise RuntimeError("stop %s on %s: %s" % (slot["unit"], slot["host"], out.strip()[-300:]))
        self.log("%s: slot %d stopped" % (dep["name"], slot["index"]))
        self.stopped(dep, slot)

    def stopped(self, dep: Obj, slot: Obj) -> None:
        """What the scaler says of a deployment follows its stop at once, not at the next cycle: status read between
        the two would see no unit serving beside a scaler that still says Ready, and call it Failed."""
        with self.lock:
            mem = self.mem(dep["name"])
            running = [i for i in mem.get("running", []) if i != slot["index"]]
            mem["running"], mem["wanted"] = running, len(running)
            mem["ready"] = min(int(mem.get("ready", 0)), len(running))
            if not running and int(dep["min"]) == 0:
                scaled_to_zero(mem, int(dep.get("idle_minutes") or 0))

    # --- a parked deployment, woken on a request (engine_ctl.core.plan.wake) -----------------------------------
    def parked_cycle(self, dep: Obj, held: int) -> None:
        """Parked by an operator (`parked` in the config: its wake steps and the park's operation): left as the
        park left it until a held request asks, then woken once (single flight: a wake under way is not repeated,
        and it runs to its end whether or not the held client stays). Once woken it serves until the operator
        parks it again (a new park, a new operation) or starts it."""
        name, park = dep["name"], dep["parked"]
        mem = self.mem(name)
        with self.lock:
            if (mem.get("woken") or {}).get("park") != park["operation"]:
                mem.pop("woken", None)  # woken from an earlier park: this one is not
            woken, busy = mem.get("woken"), mem.get("busy")
            slots = wake_slots(dep)
            mem["wanted"] = len(slots)
            if woken:
                mem["state"], mem["reason"] = "Ready", "woken by a request at %s" % woken["at"]
                mem["running"], mem["ready"] = [s["index"] for s in slots], len(slots)
                return
            mem["running"], mem["ready"] = [], 0
            mem["state"], mem["reason"] = "Parked", "parked by an operator: a request through the gateway wakes it"
            if busy or held <= 0:
                return
            mem["busy"] = {"action": "wake", "since": time.time()}
            mem["last_decision_at"] = time.time()
        self.record(name, "wake", "a request for the parked deployment (%d held)" % held, float(held))
        threading.Thread(target=self.wake_parked, args=(dep,), daemon=True).start()

    def wake_parked(self, dep: Obj) -> None:
        """Each slot: the engine's wake calls and their check, then the scaler's start of it (health-gated, then
        into the gateway's backend), as a scale-up starts one."""
        name, park = dep["name"], dep["parked"]
        try:
            slots = wake_slots(dep)
            for slot in slots:
                self.wait_for_park(slot, park)
                self.wake_calls(slot, park)
                self.start(dep, slot)
            with self.lock:
                self.mem(name)["woken"] = {"at": utc(time.time()), "park": park["operation"]}
            self.record(name, "woken", "woken by a request: %d serving" % len(slots), None)
        except Exception as exc:  # a failed wake is a decision to record; the next held request tries again
            self.record(name, "failed", "wake: %s" % exc, None)
        finally:
            with self.lock:
                self.mem(name).pop("busy", None)
                self.save()
            self.woken.set()

    def wait_for_park(self, slot: Obj, park: Obj) -> None:
        """A request right after `park` waits for the park's job on the slot's host (its drain, then the engine's
        sleep or stop) to finish, so that the job does not put to sleep or stop what the wake just brought back."""
        job = ("park-" if park.get("level") else "stop-") + slot["unit"]
        deadline = time.time() + PARK_WAIT_S
        while self.ssh(slot, "is-active " + job)[0] == 0:
            if time.time() > deadline:
                raise RuntimeError("the park's job %s on %s still runs after %d s" % (job, slot["host"], PARK_WAIT_S))
            time.sleep(1)

    def wake_calls(self, slot: Obj, park: Obj) -> None:
        """The engine's own wake calls, in order, then (where it has one) its word that it is awake; none for an
        engine that restarts instead (restart_only). They are made on the replica's host, on loopback, by the
        forced command's `wake UNIT` (its guard passes no sleep control on): the calls are those apply wrote into
        the unit, never the scaler's."""
        if not park.get("calls"):
            return
        code, out = self.ssh(slot, "wake " + slot["unit"], timeout=WAKE_TIMEOUT_S)
        if code != 0:
            raise RuntimeError("wake %s on %s: %s" % (slot["unit"], slot["host"], out.strip()[-300:]))
        self.log("%s: woken on %s" % (slot["unit"], slot["host"]))

    # --- one of several: the PostgreSQL lock ------------------------------------------------------------------
    def leading(self) -> bool:
        """Whether this scaler acts: always without a lock; with one, while it holds it."""
        return self.pglock is None or self.pglock.held

    def fence(self) -> None:
        """Before each action: the lock still held on a live session, or the action is not taken."""
        if self.pglock is not None and not self.pglock.holds():
            raise RuntimeError("this scaler no longer holds the lock (%s acts)" % (self.pglock.holder or "no one"))

    def lead_loop(self) -> None:
        """Every retry_s: the leader checks it still holds the lock, the others try for it."""
        assert self.pglock is not None
        every = float(self.pglock.lock.get("retry_s", 2))
        while True:
            was = self.pglock.held
            try:
                now = self.pglock.try_lead()
            except Exception as exc:  # never the end of the scaler: it only acts no more
                self.log("the lock: %r" % (exc,))
                self.pglock.end("an error")
                now = False
            if now != was:
                self.changed_lead(now)
            time.sleep(every)

    def changed_lead(self, leads: bool) -> None:
        """Taken: act from the world as it is now (a half-done start or stop of another leader, or of this one
        before, is not resumed: reconciling the gateways converges it), and wait one decision interval before
        scaling up or down, since when the last leader acted is not known here. Lost: act no more."""
        assert self.pglock is not None
        name, now = self.pglock.lock.get("name", "?"), time.time()
        with self.lock:
            self.state["lock"] = {"leader": leads, "holder": self.pglock.holder, "since": utc(now)}
            for dep in self.deps:
                mem = self.mem(dep["name"])
                if leads:
                    mem.pop("busy", None)
                    mem["last_decision_at"] = max(float(mem.get("last_decision_at") or 0), now)
                    mem["last_request_at"] = now
        why = "took the PostgreSQL lock: the scaler on %s acts" if leads else "lost the PostgreSQL lock: %s stops"
        for dep in self.deps:
            self.record(dep["name"], "lead" if leads else "follow", why % name)
        self.woken.set()

    def follow(self) -> None:
        """Not the leader: nothing is decided or done here; state.json says who leads."""
        assert self.pglock is not None
        with self.lock:
            self.wakes = {}
            self.state["lock"] = {"leader": False, "holder": self.pglock.holder,
                                  "since": (self.state.get("lock") or {}).get("since") or utc(time.time())}  # fmt: skip
            self.save()

    def relay(self, name: str) -> None:
        """A wake heard by a scaler that does not act: passed to the one that does (once: marked relayed)."""
        holder = self.pglock.holder if self.pglock is not None else ""
        gw = next((g for g in self.drives() if g["name"] == holder and not g.get("local")), None)
        if gw is None or not gw.get("address"):
            return
        try:
            s = socket.create_connection((gw["address"], int(self.config.get("wake_port", 8809))), timeout=1)
            try:
                s.sendall(("wake %s relayed\n" % name).encode())
            finally:
                s.close()
        except OSError as exc:
            self.log("%s: the wake not relayed to %s: %s" % (name, holder, exc))

    def resume(self) -> None:
        """What a killed scaler left half-done: carry it out (a start is idempotent, so is a stop)."""
        for dep in self.deps:
            busy = self.mem(dep["name"]).get("busy")
            slot = next((s for s in dep["slots"] if busy and s["index"] == busy.get("slot")), None)
            if busy and slot is not None:
                self.log("%s: resuming %s of slot %d" % (dep["name"], busy["action"], slot["index"]))
                threading.Thread(target=self.carry_out, args=(dep, busy["action"], slot), daemon=True).start()
            elif busy:
                self.mem(dep["name"]).pop("busy", None)

    def run(self) -> None:
        threading.Thread(target=self.listen, args=(int(self.config.get("wake_port", 8809)),), daemon=True).start()
        if self.pglock is None:
            self.resume()
        else:
            threading.Thread(target=self.lead_loop, daemon=True).start()
        poll = float(self.config.get("poll_s", 15))
        woken = False
        while True:
            try:
                if self.leading():
                    self.cycle(refresh=not woken)
                else:
                    self.follow()
            except Exception as exc:  # one bad cycle (a socket gone during a reload) never ends the scaler
                self.log("cycle failed: %r" % (exc,))
            woken = self.woken.wait(poll)
            self.woken.clear()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="engine-ctl's scaler")
    parser.add_argument("--config", required=True)
    parser.add_argument("--state", default=STATE_PATH)
    args = parser.parse_args(argv)
    with open(args.config) as f:
        config = json.load(f)

    def log(message: str) -> None:
        sys.stdout.write(message + "\n")
        sys.stdout.flush()

    log("engine-ctl scaler: %d deployments" % len(config.get("deployments", [])))
    Scaler(config, args.state, log).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
