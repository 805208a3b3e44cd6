"""A soak through an engine-ctl gateway: N clients at once (half of them streaming), each asking in a loop with the
official `openai` package and max_retries=0 (a failure is a failure, never hidden by a retry), for a while at each
level; prints requests, failures and latency p50/p99 per level, and the first failures in full.

Run against a running gateway:
    .venv/bin/python -m bench.gateway_soak --base http://GATEWAY:8800/v1 --key KEY --model DEPLOYMENT
        [--clients 4,16,64] [--seconds 600] [--json]

Run on this machine alone (no fleet, no gateway to bring):
    .venv/bin/python -m bench.gateway_soak --local [--roll-every 60] [--clients 4,16,64] [--seconds 600] [--json]

--local starts, on loopback, two real llama-server replicas of the tiny model (tests/llama.py; set
ENGINE_CTL_LLAMA_SERVER_DIR to a built one) and one real HAProxy with the configuration engine-ctl renders
(render_gateway, unchanged: one backend holding both replicas, an API key), and waits until the gateway has marked
both replicas UP. During each level a roll thread does, every --roll-every seconds (0: never), what apply's roll
does to one replica, the two in turn, through the gateway's admin socket: `set server d_bench/rN state drain`,
wait until its requests in flight (`show stat` scur) are 0, `state maint`, stop the llama-server (SIGTERM),
start it again on the same port, wait for its /health, `state ready`, and wait until the gateway sees it UP.
Each level also prints the gateway's retries (`show stat` wretr of the backend: connections it tried again, each a
request whose connection a replica refused, sent on to another; a request a replica took is never sent again), the
rolls done, and the load average before and after it (the CPUs are shared by the
clients, HAProxy and both engines). --keep keeps the folder with HAProxy's request log and the replicas' logs.

The target (issue 24): 0 failed requests at every level, also while a roll is under way. Exit status 1 when any
request failed (or, with --local, a roll failed).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import openai

LOCAL_MODEL = "bench"
LOCAL_KEY = "ak-soak-" + "0" * 40
PARALLEL = 8
"""Each local replica's --parallel, and so its gateway server's maxconn (as engine-ctl renders it)."""
HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
DRAIN_TIMEOUT_S = 120
"""As apply's drain (DRAIN_S): requests still in flight after this are cut by the stop."""


@dataclass
class Level:
    clients: int
    seconds: float
    latencies: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    rolls: list[str] = field(default_factory=list)
    roll_seconds: list[float] = field(default_factory=list)
    roll_failures: list[str] = field(default_factory=list)
    retries: int | None = None
    """--local: connections the gateway tried again (`show stat` wretr of the backend): each one a request whose
    connection a replica refused (`retry-on conn-failure`), sent on to another."""
    load_before: tuple[float, float, float] = (0.0, 0.0, 0.0)
    load_after: tuple[float, float, float] = (0.0, 0.0, 0.0)

    def summary(self) -> dict[str, object]:
        ordered = sorted(self.latencies)
        p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] if ordered else None
        return {
            "clients": self.clients,
            "seconds": self.seconds,
            "requests": len(self.latencies) + len(self.failures),
            "failures": len(self.failures),
            "p50_ms": round(statistics.median(ordered) * 1000, 1) if ordered else None,
            "p99_ms": round(p99 * 1000, 1) if p99 is not None else None,
            "first_failures": self.failures[:5],
            "gateway_retries": self.retries,
            "rolls": len(self.rolls),
            "roll_times": self.rolls,
            "roll_s_max": round(max(self.roll_seconds), 1) if self.roll_seconds else None,
            "roll_failures": self.roll_failures,
            "load_before": [round(x, 2) for x in self.load_before],
            "load_after": [round(x, 2) for x in self.load_after],
            "cpus": os.cpu_count(),
        }


def ask(client: openai.OpenAI, model: str, stream: bool) -> None:
    messages = [{"role": "user", "content": "hi"}]
    if stream:
        chunks = list(client.chat.completions.create(model=model, messages=messages, max_tokens=4, stream=True))  # type: ignore[arg-type]
        if not chunks:
            raise RuntimeError("a stream with no chunk")
    else:
        client.chat.completions.create(model=model, messages=messages, max_tokens=4)  # type: ignore[arg-type]


def run_level(base: str, key: str, model: str, clients: int, seconds: float, local: Local | None = None,
              roll_every: float = 0) -> Level:  # fmt: skip
    level = Level(clients, seconds)
    lock = threading.Lock()
    began = time.monotonic()
    deadline = began + seconds
    level.load_before = os.getloadavg()
    retried = local.retries() if local is not None else 0

    def loop(stream: bool) -> None:
        client = openai.OpenAI(base_url=base, api_key=key, max_retries=0, timeout=120)  # one pooled client each
        while time.monotonic() < deadline:
            started = time.monotonic()
            try:
                ask(client, model, stream)
                with lock:
                    level.latencies.append(time.monotonic() - started)
            except Exception as exc:  # every failure of the client counts, whatever it is
                at = started - began
                with lock:
                    level.failures.append(
                        f"at {at:.1f} s {'stream' if stream else 'plain'}: {type(exc).__name__}: {exc}"[:300]
                    )

    threads = [threading.Thread(target=loop, args=(i % 2 == 1,)) for i in range(clients)]
    stop = threading.Event()
    roller = None
    if local is not None and roll_every > 0:
        roller = threading.Thread(target=local.roll_loop, args=(level, began, roll_every, deadline, stop))
        roller.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    if roller is not None:
        roller.join()  # a roll under way ends before the next level
    level.load_after = os.getloadavg()
    if local is not None:
        level.retries = local.retries() - retried
    return level


# --local: two replicas and the rendered gateway on loopback ---------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def healthy(port: int) -> bool:
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        c.request("GET", "/health")
        return c.getresponse().status == 200
    except OSError:
        return False


def admin(sock: str, command: str) -> str:
    """One command to HAProxy's admin socket, as engine-ctl's haproxy_ask sends it."""
    from engine_ctl.shell.remote.haproxy_admin import haproxy_ask

    return haproxy_ask(sock, command)


@dataclass
class Replica:
    name: str
    port: int
    proc: subprocess.Popen[bytes] | None = None


class Local:
    """Two llama-server replicas of the tiny model and one HAProxy with the configuration engine-ctl renders."""

    def __init__(self, folder: Path) -> None:
        from tests.llama import llama_server_dir, tiny_model

        self.folder = folder
        self.llama = str(llama_server_dir() / "bin" / "llama-server")
        self.model = str(tiny_model())
        self.replicas = [Replica("r0a", free_port()), Replica("r1a", free_port())]
        self.port = free_port()
        self.sock = str(folder / "admin.sock")
        self.backend = ""
        self.haproxy: subprocess.Popen[bytes] | None = None
        self.base = f"http://127.0.0.1:{self.port}/v1"

    # the replicas
    def start_replica(self, r: Replica) -> None:
        log = (self.folder / f"{r.name}.log").open("ab")
        r.proc = subprocess.Popen(
            [self.llama, "--model", self.model, "--alias", LOCAL_MODEL, "--ctx-size", str(256 * PARALLEL),
             "--parallel", str(PARALLEL), "--host", "127.0.0.1", "--port", str(r.port), "--threads", "1",
             "--no-webui"], stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        log.close()

    def wait_replica(self, r: Replica, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not healthy(r.port):
            if r.proc is not None and r.proc.poll() is not None:
                log = self.folder / f"{r.name}.log"
                raise RuntimeError(f"llama-server {r.name} exited with {r.proc.returncode} ({log})")
            if time.monotonic() > deadline:
                raise RuntimeError(f"llama-server {r.name} did not answer /health within {timeout:.0f} s")
            time.sleep(0.1)

    def stop_replica(self, r: Replica) -> None:
        if r.proc is not None and r.proc.poll() is None:
            r.proc.send_signal(signal.SIGTERM)
            try:
                r.proc.wait(30)
            except subprocess.TimeoutExpired:
                r.proc.kill()
                r.proc.wait(10)

    # the gateway
    def start_gateway(self) -> None:
        from engine_ctl.core.documents.apikey import key_sha256
        from engine_ctl.core.documents.inventory import Host
        from engine_ctl.core.model import ApiKey
        from engine_ctl.core.render.gateway import (
            ALLOCATOR_ENV,
            START_STATE_FILE,
            GatewayBackend,
            GatewayServer,
            render_gateway,
        )

        host = Host(name="soak", address="127.0.0.1", gateway_port=self.port)
        servers = tuple(GatewayServer(name=r.name, address="127.0.0.1", port=r.port, maxconn=PARALLEL)
                        for r in self.replicas)  # fmt: skip
        backend = GatewayBackend(deployment=LOCAL_MODEL, servers=servers)
        self.backend = backend.backend
        rendered = render_gateway(host, [backend], [ApiKey(name="soak", sha256=key_sha256(LOCAL_KEY))],
                                  internal_key=False, run_dir=str(self.folder))  # fmt: skip
        for name, text in rendered.files.items():
            (self.folder / name).write_text(text)
        # as the gateway's unit: every server DOWN until its first check passes, then HAProxy in master-worker mode
        # with its allocator settings; its stdout (the request log, the journal in the unit) to a file
        shutil.copyfile(self.folder / START_STATE_FILE, self.folder / "server-state")
        config = str(self.folder / "haproxy.cfg")
        subprocess.run([HAPROXY, "-f", config, "-c", "-q"], check=True)
        log = (self.folder / "haproxy.log").open("ab")
        self.haproxy = subprocess.Popen(
            [HAPROXY, "-Ws", "-f", config, "-p", str(self.folder / "haproxy.pid"), "-S",
             str(self.folder / "master.sock")],
            env={**os.environ, **ALLOCATOR_ENV}, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        log.close()

    def states(self) -> dict[str, tuple[str, int]]:
        """The gateway's view of each replica: its status and its requests in flight (`show stat`)."""
        from engine_ctl.shell.gateway.runtime import parse_stat

        stat = parse_stat(admin(self.sock, "show stat"))
        return {srv: (s.status, s.in_flight) for (be, srv), s in stat.items() if be == self.backend}

    def wait_state(self, name: str, ok: str, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                status, in_flight = self.states()[name]
            except (OSError, KeyError):
                status, in_flight = "", -1
            if (ok == "UP" and status.startswith("UP")) or (ok == "drained" and in_flight == 0):
                return True
            time.sleep(0.2)
        return False

    def retries(self) -> int:
        """The backend's retries so far (`show stat`, its BACKEND row's wretr)."""
        lines = admin(self.sock, "show stat").splitlines()
        header = lines[0].lstrip("# ").split(",")
        for line in lines[1:]:
            row = dict(zip(header, line.split(","), strict=False))
            if row.get("pxname") == self.backend and row.get("svname") == "BACKEND":
                return int(row.get("wretr") or 0)
        return 0

    def set_state(self, name: str, state: str) -> None:
        said = admin(self.sock, f"set server {self.backend}/{name} state {state}").strip()
        if said:
            raise RuntimeError(f"set server {self.backend}/{name} state {state}: {said}")

    def start(self) -> None:
        for r in self.replicas:
            self.start_replica(r)
        for r in self.replicas:
            self.wait_replica(r)
        self.start_gateway()
        for r in self.replicas:
            if not self.wait_state(r.name, "UP", 60):
                raise RuntimeError(f"the gateway did not mark {r.name} UP within 60 s ({self.folder}/haproxy.log)")

    def close(self) -> None:
        for p in [self.haproxy, *(r.proc for r in self.replicas)]:
            if p is not None and p.poll() is None:
                p.terminate()
        for p in [self.haproxy, *(r.proc for r in self.replicas)]:
            if p is not None:
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(5)

    # a roll of one replica, as apply's: drain, wait, maint, stop, start, health, ready, UP
    def roll(self, r: Replica) -> None:
        self.set_state(r.name, "drain")
        if not self.wait_state(r.name, "drained", DRAIN_TIMEOUT_S):
            raise RuntimeError(f"{r.name} still had requests in flight after {DRAIN_TIMEOUT_S} s of draining")
        self.set_state(r.name, "maint")
        self.stop_replica(r)
        self.start_replica(r)
        self.wait_replica(r)
        self.set_state(r.name, "ready")
        if not self.wait_state(r.name, "UP", 60):
            raise RuntimeError(f"the gateway did not see {r.name} UP within 60 s of `state ready`")

    def roll_loop(self, level: Level, began: float, every: float, deadline: float, stop: threading.Event) -> None:
        """Every `every` seconds until the level's end, a roll of the next replica (the two in turn)."""
        n = 0
        while not stop.wait(max(began + every * (n + 1) - time.monotonic(), 0)):
            if time.monotonic() >= deadline:
                return
            r = self.replicas[n % len(self.replicas)]
            at = time.monotonic()
            try:
                self.roll(r)
                took = time.monotonic() - at
                level.rolls.append(f"{r.name} at {at - began:.1f} s in {took:.1f} s")
                level.roll_seconds.append(took)
            except (OSError, RuntimeError) as exc:
                level.roll_failures.append(f"{r.name} at {at - began:.1f} s: {exc}")
                return
            n += 1


@contextlib.contextmanager
def local_gateway(keep: bool) -> Iterator[Local]:
    folder = Path(tempfile.mkdtemp(prefix="soak-"))
    local = Local(folder)
    failed = True
    try:
        local.start()
        yield local
        failed = False
    finally:
        local.close()
        if keep or failed:
            print(f"kept: {folder} (haproxy.log: the gateway's request log; r0a.log, r1a.log: the replicas')",
                  file=sys.stderr, flush=True)  # fmt: skip
        else:
            shutil.rmtree(folder, ignore_errors=True)


def print_level(s: dict[str, object], local: bool) -> None:
    line = (f"{s['clients']:>3} clients  {s['seconds']:>6.0f} s  requests {s['requests']:>7}"
            f"  failures {s['failures']:>4}  p50 {s['p50_ms']} ms  p99 {s['p99_ms']} ms")  # fmt: skip
    if local:
        loads = [" ".join(f"{x:.2f}" for x in s[k]) for k in ("load_before", "load_after")]  # type: ignore[attr-defined]
        line += (f"  gateway retries {s['gateway_retries']}  rolls {s['rolls']} (longest {s['roll_s_max']} s)"
                 f"  load {loads[0]} -> {loads[1]}")  # fmt: skip
    print(line, flush=True)
    for text in [*s["first_failures"], *s["roll_failures"]]:  # type: ignore[misc]
        print(f"      {text}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", help="the gateway's OpenAI base URL, http://HOST:8800/v1")
    parser.add_argument("--key", help="an API key the gateway accepts for the deployment")
    parser.add_argument("--model", help="the deployment's name")
    parser.add_argument("--local", action="store_true",
                        help="two llama-server replicas and the rendered gateway on loopback (no --base)")  # fmt: skip
    parser.add_argument("--roll-every", type=float, default=None,
                        help="--local: seconds between rolls of one replica in each level (60; 0: never)")  # fmt: skip
    parser.add_argument("--keep", action="store_true", help="--local: keep the folder with the logs afterwards")
    parser.add_argument("--clients", default="4,16,64", help="the levels: clients at once, comma-separated")
    parser.add_argument("--seconds", type=float, default=600, help="how long each level runs (default 10 min)")
    parser.add_argument("--json", action="store_true", help="one JSON document instead of the table")
    args = parser.parse_args(argv)
    if args.local and (args.base or args.key or args.model):
        parser.error("--local starts its own gateway: give no --base, --key or --model with it")
    if not args.local and not (args.base and args.key and args.model):
        parser.error("give --base, --key and --model (a running gateway), or --local")
    if not args.local and args.roll_every is not None:
        parser.error("--roll-every needs --local (against a running gateway, roll with engine-ctl apply)")
    counts = [int(x) for x in args.clients.split(",") if x.strip()]
    if args.local:
        roll_every = 60.0 if args.roll_every is None else args.roll_every
        with local_gateway(args.keep) as local:
            if not args.json:
                print(f"local: replicas {', '.join(f'{r.name} :{r.port}' for r in local.replicas)}, gateway "
                      f":{local.port}; {os.cpu_count()} CPUs; a roll every {roll_every:g} s"
                      f"{' (never)' if roll_every <= 0 else ''}", flush=True)  # fmt: skip
            levels = []
            for n in counts:
                level = run_level(local.base, LOCAL_KEY, LOCAL_MODEL, n, args.seconds, local, roll_every)
                levels.append(level.summary())
                if not args.json:
                    print_level(levels[-1], True)
    else:
        levels = []
        for n in counts:
            levels.append(run_level(args.base, args.key, args.model, n, args.seconds).summary())
            if not args.json:
                print_level(levels[-1], False)
    if args.json:
        print(json.dumps({"levels": levels, "cpus": os.cpu_count()}, indent=2))
    return 1 if any(s["failures"] or s["roll_failures"] for s in levels) else 0


if __name__ == "__main__":
    sys.exit(main())
