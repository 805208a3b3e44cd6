"""The gateway's cost, side by side in one run on this machine (loopback): the real llama-server with the tiny
model, and the real HAProxy with the configuration engine-ctl renders in front of it.

- overhead per request, p50 and p99: a 1-token completion through the gateway minus the same request sent
  straight to the replica, alternating (target: p50 <= 1 ms);
- throughput at 8 concurrent clients through the gateway against direct (target: >= 0.95x).

Run:  .venv/bin/python -m bench.gateway [REQUESTS] [--rounds 16] [--seconds 2] [--variants] [--cores-apart]
      .venv/bin/python -m bench.gateway [REQUESTS] --paired [--rounds 16] [--seconds 2] [--warm 2] [--variant NAME]

Throughput is measured in rounds: each round measures direct, a control (the engine called directly again, by
other clients) and the gateway back to back, in an order that moves every round so that each is measured in each
place equally often, and the ratio reported is the median of the rounds' ratios (the machine is shared and its load
drifts). The control's own ratio to direct is printed too: what a path with no gateway gets, the noise of the
measurement.

--variants adds gateways with one suspect of overhead taken out each (body buffering, the large buffers,
the hold's rules, the per-server maxconn, the request log), and one with the L7 retry engine-ctl rendered before
(--variant NAME picks some), side by side in the same rounds. The rendered gateway has its request log and
metrics port on, as engine-ctl renders them with a monitoring block.

By default the engine, HAProxy and the clients share every CPU: on a saturated machine the gateway's CPU is taken
from the engine's, so the ratio is about 1 - HAProxy's share of a request's CPU. --cores-apart pins the engine to
the first CPU and HAProxy and the clients to the others (in every measurement, direct ones included), as on an
engine host whose engine has cores the gateway does not use: the ratio is then what the gateway's path itself
costs the engine's throughput.

--paired measures the same shared cores with the machine's drift taken out: an engine on each core, and beside it on
the same core its own gateway and, in a process of their own, its clients. Each slice runs two paths at once, one on
each core: the gateway on core 0 beside direct on core 1, then the other way round; the ratio of the two slices
(paired_ratio) cancels each core's speed, and the machine's drift, which slows both paths of a slice alike. A
control is measured the same way: direct beside direct. The first --warm rounds (2) are not counted.
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import multiprocessing
import os
import queue
import socket
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from multiprocessing.queues import Queue
from pathlib import Path

from engine_ctl.core.documents.apikey import key_sha256
from engine_ctl.core.documents.inventory import Host
from engine_ctl.core.model import ApiKey
from engine_ctl.core.render.gateway import (
    ALLOCATOR_ENV,
    DEPTH_PRECHECK,
    STREAM_SET,
    GatewayBackend,
    GatewayServer,
    render_gateway,
)
from tests.llama import llama_server_dir, tiny_model

KEY = "ak-bench-" + "0" * 40
BODY = json.dumps({"messages": [{"role": "user", "content": "hi"}], "model": "bench", "max_tokens": 1}).encode()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait(port: int, path: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", path)
            if c.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"port {port} did not answer {path}")


def one(conn: http.client.HTTPConnection, key: bool) -> float:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {KEY}"} if key else {})}
    began = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", BODY, headers)
    response = conn.getresponse()
    response.read()
    if response.status != 200:
        raise SystemExit(f"status {response.status}")
    return time.perf_counter() - began


def throughput(port: int, key: bool, clients: int = 8, seconds: float = 5) -> float:
    """Requests per second that `clients` keep-alive connections, opened for this call, complete in `seconds` (a
    connection kept from one call to the next would sit idle through the other paths' slices, past llama-server's
    5 s keep-alive, and be closed under the client)."""
    done = [0] * clients
    stop = time.monotonic() + seconds

    def loop(i: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        while time.monotonic() < stop:
            one(conn, key)
            done[i] += 1

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(done) / seconds


def variants(config: str) -> dict[str, str]:
    """The rendered configuration, and the same with one suspect of overhead taken out: the body's buffering
    (wait-for-body, and so the route on the body's model: the model map is skipped for a fixed backend), the large
    buffers (tune.bufsize 256 KiB, HAProxy's default 16 KiB instead), the hold's rules (Lua runs only with no server
    up, but its ACLs are evaluated on every request), the per-server maxconn (HAProxy's own queue), HAProxy's
    threads (one per CPU, HAProxy's default, against the one engine-ctl renders), the request log, the regex that
    spares most requests the Lua depth scan (taken out: the scan runs on every request with a body, as before) and,
    as the floor, a plain proxy with no rule at all. One variant adds what engine-ctl rendered before: the L7 retry
    (`retry-on ... empty-response`: HAProxy copies the whole request buffer, bufsize bytes, before it sends a
    request it may send again)."""
    lines = config.splitlines(keepends=True)

    def without(*needles: str) -> str:
        return "".join(ln for ln in lines if not any(n in ln for n in needles))

    no_body = without(
        "wait-for-body",
        "req.body",
        "res.body",
        "unset-var(txn.tokens)",
        "json_query",
        "must provide a model",
        "models.map",
        "scopes.map",
        "ectl_stream",
    )
    no_body = no_body.replace("use_backend %[var(txn.backend)]", "use_backend d_bench")
    return {
        "rendered": config,
        "no body buffering": no_body,
        "bufsize 16 KiB": config.replace("tune.bufsize 262144", "tune.bufsize 16384"),
        "no hold rules": without("lua.hold", "var(txn.hold)"),
        "no server maxconn": config.replace(" maxconn 8", ""),
        f"nbthread {os.cpu_count()}": config.replace("    nbthread 1\n", f"    nbthread {os.cpu_count()}\n"),
        "no request log": without("log-format", "log stdout format raw"),
        "L7 retry (before)": config.replace("retry-on conn-failure\n", "retry-on conn-failure empty-response\n"),
        "per request, as before": per_request_as_before(config),
        "usage by JSON reader (before)": usage_by_json_reader(config),
        "Lua depth scan always": config.replace(
            f"lua.depth if {{ req.body -m reg {DEPTH_PRECHECK} }}", "lua.depth if { req.body_size gt 0 }"
        ),
        "plain proxy": plain_proxy(config),
    }


def usage_by_json_reader(config: str, passes: str = ",'int'") -> str:
    """The usage counts as engine-ctl rendered them before 6 December 2026: HAProxy's JSON reader (json_query) read
    the answer from its start once for each count (`passes` "": twice for each, as before 5 December), not one
    regex in one pass (USAGE_COUNTS)."""
    lines = []
    for ln in config.splitlines(keepends=True):
        if "unset-var(txn.tokens)" in ln:
            continue
        if "set-var(txn.tokens)" in ln:
            ln = "".join(f"    http-response set-var(txn.{v}) res.body,json_query('$.usage.{count}'{passes}) if "
                         "{ res.hdr(content-type) -m beg application/json }\n"
                         for v, count in (("ptok", "prompt_tokens"), ("gtok", "completion_tokens")))  # fmt: skip
        ln = ln.replace("%[var(txn.tokens),field(1,/)]", "%[var(txn.ptok)]")
        lines.append(ln.replace("%[var(txn.tokens),field(2,/)]", "%[var(txn.gtok)]"))
    return "".join(lines)


def per_request_as_before(config: str) -> str:
    """What engine-ctl rendered before 5 December 2026 (afternoon): the key's sha256 taken on every request (not
    once a connection), HAProxy's JSON reader deciding whether a request is a stream (not a regex), the usage
    counts read by HAProxy's JSON reader, each in two passes (not one regex in one pass), and the key, the ID and
    the deployment escaped in the log."""
    lines = []
    for ln in usage_by_json_reader(config, passes="").splitlines(keepends=True):
        if "acl ectl_key_hashed" in ln or "set-var(sess.key_sha256)" in ln:
            continue
        ln = ln.replace("var(sess.key_sha256),map(keys.map) if ectl_bearer ectl_key_hashed",
                        "req.fhdr(authorization),word(2,' '),sha2(256),hex,lower,map(keys.map) if ectl_bearer "
                        "ectl_bearer_form")  # fmt: skip
        ln = ln.replace(f"req.body -m reg '{STREAM_SET}'", "req.body,json_query('$.stream') -m bool")
        if ln.lstrip().startswith("log-format"):
            for field in ("rid", "key", "deployment"):
                ln = ln.replace(f"%[var(txn.{field})]", f"%[var(txn.{field}),json(utf8s)]")
        lines.append(ln)
    return "".join(lines)


def plain_proxy(config: str) -> str:
    """The floor: HAProxy passing requests to the same server with no rule at all (no key, no route, no body)."""
    lines = [ln.strip() for ln in config.splitlines()]

    def first(prefix: str) -> str:
        return next((ln for ln in lines if ln.startswith(prefix)), "")

    bind, server, sock = first("bind "), first("server "), first("stats socket ")
    return (f"global\n    master-worker\n    nbthread 1\n    {sock}\n    maxconn 1000\n"
            "defaults\n    mode http\n    timeout connect 3s\n    timeout client 10m\n    timeout server 10m\n"
            f"frontend api\n    {bind}\n"
            "    http-request return status 200 content-type text/plain string ok if { path /health }\n"
            "    default_backend d_bench\n"
            f"backend d_bench\n    balance leastconn\n    option httpchk GET /health\n"
            f"    default-server check inter 5s\n    {server}\n")  # fmt: skip


ENGINE_CPUS: set[int] | None = None
"""--cores-apart: the CPU the engine runs on (the others run HAProxy and the clients); None: all share every CPU."""


def pinned(cpus: set[int] | None) -> Callable[[], None] | None:
    """A preexec_fn that pins the child (and so every thread it starts) to `cpus`."""
    return None if cpus is None else lambda: os.sched_setaffinity(0, cpus)


def other_cpus() -> set[int] | None:
    return None if ENGINE_CPUS is None else set(range(os.cpu_count() or 2)) - ENGINE_CPUS


def start_engine(cpus: set[int] | None) -> tuple[int, subprocess.Popen[bytes]]:
    """The real llama-server with the tiny model (1 thread, 8 slots) on a free port, pinned to `cpus` if given."""
    port = free_port()
    llama = llama_server_dir() / "bin" / "llama-server"
    engine = subprocess.Popen(
        [str(llama), "--model", str(tiny_model()), "--alias", "bench", "--ctx-size", "2048", "--parallel", "8",
         "--host", "127.0.0.1", "--port", str(port), "--threads", "1", "--no-webui"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=pinned(cpus),
    )  # fmt: skip
    return port, engine


def write_gateway(folder: Path, replica: int, name: str) -> int:
    """The rendered gateway's files in `folder`, its configuration the variant `name`, in front of the replica on
    port `replica`; its port."""
    folder.mkdir()
    port = free_port()
    host = Host(name="bench", address="127.0.0.1", gateway_port=port)
    server = GatewayServer(name="r0a", address="127.0.0.1", port=replica, maxconn=8)
    keys = [ApiKey(name="bench", sha256=key_sha256(KEY))]
    rendered = render_gateway(host, [GatewayBackend(deployment="bench", servers=(server,))], keys,
                              internal_key=False, run_dir=str(folder), metrics_port=free_port())  # fmt: skip
    for file, text in rendered.files.items():
        (folder / file).write_text(text)
    (folder / "haproxy.cfg").write_text(variants(rendered.files["haproxy.cfg"])[name])
    (folder / "server-state").write_text("")
    return port


def start_gateways(
    tmp: str, replica: int, chosen: list[str], cpus: set[int] | None
) -> tuple[dict[str, int], list[subprocess.Popen[bytes]]]:
    """One HAProxy per variant of the rendered configuration, each in its own directory and port, pinned to `cpus`
    if given."""
    ports: dict[str, int] = {}
    procs = []
    for i, name in enumerate(chosen):
        folder = Path(tmp) / f"v{i}"
        ports[name] = write_gateway(folder, replica, name)
        # the environment the gateway's unit gives HAProxy (its allocator settings); its stdout, where the request
        # log goes (the journal, in the unit), to a file: one write per request, as to journald's pipe
        log = (folder / "stdout.log").open("wb")
        env = {**os.environ, **ALLOCATOR_ENV}
        procs.append(subprocess.Popen(["haproxy", "-f", f"{folder}/haproxy.cfg"], env=env, stdout=log,
                                      stderr=subprocess.DEVNULL, preexec_fn=pinned(cpus)))  # fmt: skip
    return ports, procs


def overhead(replica: int, gateway: int, requests: int) -> None:
    direct = http.client.HTTPConnection("127.0.0.1", replica, timeout=60)
    through = http.client.HTTPConnection("127.0.0.1", gateway, timeout=60)
    for _ in range(20):  # warm both paths
        one(direct, False)
        one(through, True)
    pairs = []
    for i in range(requests):  # alternating which goes first
        if i % 2:
            g, d = one(through, True), one(direct, False)
        else:
            d, g = one(direct, False), one(through, True)
        pairs.append((g - d) * 1000)
    pairs.sort()
    p50 = statistics.median(pairs)
    p99 = pairs[min(len(pairs) - 1, int(len(pairs) * 0.99))]
    print(f"overhead per request ({requests} pairs, 1-token completion): p50 {p50:.2f} ms, p99 {p99:.2f} ms"
          f"  (target p50 <= 1 ms: {'ok' if p50 <= 1 else 'MISSED'})", flush=True)  # fmt: skip


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) of a process and its children (HAProxy's master and its worker)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total = (int(fields[11]) + int(fields[12])) / tick
        for task in Path(f"/proc/{pid}/task").iterdir():
            for child in (task / "children").read_text().split():
                total += cpu_seconds(int(child))
    except (OSError, ValueError, IndexError):
        pass
    return total


class Meter:
    """Requests and CPU seconds per path (direct or a gateway), over every slice of every round."""

    def __init__(self, engine: int, gateways: dict[str, int]) -> None:
        self.engine, self.gateways = engine, gateways
        self.requests: dict[str, float] = {}
        self.engine_cpu: dict[str, float] = {}
        self.gateway_cpu: dict[str, float] = {}
        self.client_cpu: dict[str, float] = {}

    def slice(self, name: str, port: int, seconds: float) -> float:
        pid = self.gateways.get(name)
        e0, g0, c0 = cpu_seconds(self.engine), cpu_seconds(pid) if pid else 0.0, time.process_time()
        rate = throughput(port, pid is not None, seconds=seconds)
        self.requests[name] = self.requests.get(name, 0) + rate * seconds
        self.client_cpu[name] = self.client_cpu.get(name, 0) + time.process_time() - c0
        self.engine_cpu[name] = self.engine_cpu.get(name, 0) + cpu_seconds(self.engine) - e0
        if pid:
            self.gateway_cpu[name] = self.gateway_cpu.get(name, 0) + cpu_seconds(pid) - g0
        return rate

    def report(self) -> None:
        """CPU per request: what the load cannot blur (the engine's and HAProxy's from /proc, the clients' from this
        process's CPU time). On cores the engine, HAProxy and the clients saturate, as here, the throughput ratio is
        about the CPU a request takes direct over what it takes through the gateway, which is printed too; on a
        gateway host of its own, HAProxy takes none of the engine's."""

        def per_request(cpu: dict[str, float], name: str) -> float:
            return cpu[name] / self.requests[name] * 1e6

        engine_us, client_us = per_request(self.engine_cpu, "direct"), per_request(self.client_cpu, "direct")
        print(f"  CPU per request: engine {engine_us:.0f} us, clients {client_us:.0f} us (direct)", flush=True)
        if CONTROL in self.requests:
            print(f"  CPU per request: engine {per_request(self.engine_cpu, CONTROL):.0f} us, clients "
                  f"{per_request(self.client_cpu, CONTROL):.0f} us ({CONTROL})", flush=True)  # fmt: skip
        for name in self.gateway_cpu:
            us, through = per_request(self.gateway_cpu, name), per_request(self.engine_cpu, name)
            clients = per_request(self.client_cpu, name)
            print(f"  CPU per request: engine {through:.0f} us, clients {clients:.0f} us, HAProxy {us:.0f} us "
                  f"({name}): HAProxy {us / (us + engine_us):.1%} of the engine's and its own")  # fmt: skip
            print(f"  the ratio this CPU gives on saturated shared cores ({name}): "
                  f"{(engine_us + client_us) / (through + clients + us):.3f}", flush=True)  # fmt: skip


CONTROL = "direct, again"
"""The control: the engine called directly by a second set of clients, measured as a gateway is (its own slice in
every round, its ratio to direct): the ratio a path with no gateway gets, which is the measurement's own noise."""


def order_of(paths: list[str], r: int) -> list[str]:
    """Round r's order: rotated by one each round and turned around every len(paths) rounds, so that over 2 x
    len(paths) rounds each path is measured in each position equally often, and with up to three paths after each
    other path equally often (a slice runs faster or slower by its place: with three paths, the one always in the
    middle came out lower in every run)."""
    n = len(paths)
    rotated = paths[r % n :] + paths[: r % n]
    return rotated[::-1] if (r // n) % 2 else rotated


def rounds_of(replica: int, ports: dict[str, int], rounds: int, seconds: float, meter: Meter) -> dict[str, list[float]]:
    """Each round measures direct, the control and every gateway back to back, in an order that moves every round
    (order_of: the machine's load drifts); a path's ratio in a round is against the direct figure of the same
    round."""
    paths = {CONTROL: replica, **ports}
    ratios: dict[str, list[float]] = {name: [] for name in paths}
    rates: dict[str, list[float]] = {"direct": [], **{name: [] for name in paths}}
    order = ["direct", *paths]
    for r in range(rounds):
        this = order_of(order, r)
        got = {n: meter.slice(n, replica if n == "direct" else paths[n], seconds) for n in this}
        for n, v in got.items():
            rates[n].append(v)
        for n in paths:
            ratios[n].append(got[n] / got["direct"])
        print(f"  round {r + 1}/{rounds} ({' -> '.join(this)}): "
              + ", ".join(f"{n} {v:.1f}/s" for n, v in got.items()), flush=True)  # fmt: skip
    for n in order:
        line = f"  {n:<18} median {statistics.median(rates[n]):6.1f} req/s"
        if n != "direct":
            line += f", ratio to direct: median {statistics.median(ratios[n]):.3f} (rounds: " + ", ".join(
                f"{x:.3f}" for x in ratios[n]) + ")"  # fmt: skip
        print(line, flush=True)
    meter.report()
    return ratios


def main(requests: int, rounds: int, seconds: float, all_variants: bool, only: list[str] | None = None) -> None:
    replica, engine = start_engine(ENGINE_CPUS)
    if (clients := other_cpus()) is not None:
        os.sched_setaffinity(0, clients)  # this process: the clients (its threads inherit it)
    chosen = list(variants("")) if all_variants else ["rendered", *(only or [])]
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs",
          flush=True)  # fmt: skip
    if ENGINE_CPUS is not None:
        print(f"cores apart: the engine on CPU {sorted(ENGINE_CPUS)}, HAProxy and the clients on CPU "
              f"{sorted(other_cpus() or ())}", flush=True)  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        ports, procs = start_gateways(tmp, replica, chosen, other_cpus())
        try:
            wait(replica, "/health")
            for port in ports.values():
                wait(port, "/health")
            time.sleep(6)  # the gateway's first check marks the replica up
            overhead(replica, ports["rendered"], requests)
            for port in (replica, *ports.values()):  # warm every path (the first seconds run slower)
                throughput(port, port != replica, seconds=1)
            print(f"throughput at 8 clients, {rounds} rounds of {seconds:g} s each:", flush=True)
            meter = Meter(engine.pid, {name: p.pid for name, p in zip(ports, procs, strict=True)})
            ratios = rounds_of(replica, ports, rounds, seconds, meter)
            ratio = statistics.median(ratios["rendered"])
            control = statistics.median(ratios[CONTROL])
            print(f"the control's ratio (direct again / direct, median of {rounds} rounds): {control:.3f}: "
                  f"the measurement's own noise", flush=True)  # fmt: skip
            print(f"throughput ratio gateway/direct at 8 clients (median of {rounds} rounds): {ratio:.3f}"
                  f"  (target >= 0.95: {'ok' if ratio >= 0.95 else 'MISSED'})", flush=True)  # fmt: skip
        finally:
            for p in [*procs, engine]:
                p.terminate()
            for p in [*procs, engine]:
                p.wait(10)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def paired_ratio(first: tuple[float, float], second: tuple[float, float]) -> float:
    """x's throughput over y's from two slices run side by side: `first` is (x on core 0, y on core 1), `second`
    (y on core 0, x on core 1). The machine's drift hits both paths of a slice alike and cancels in each slice's
    quotient; each core's own speed is in one quotient above and one below, and cancels in their product:
    sqrt((x0 / y1) * (x1 / y0))."""
    (x0, y1), (y0, x1) = first, second
    return math.sqrt((x0 / y1) * (x1 / y0))


def _clients_on(core: int, port: int, key: bool, seconds: float, out: Queue[float]) -> None:
    os.sched_setaffinity(0, {core})
    out.put(throughput(port, key, seconds=seconds))


def side_by_side(ports: tuple[int, int], keys: tuple[bool, bool], seconds: float) -> tuple[float, float]:
    """Two paths measured at once: the clients of ports[i] in a process of their own on core i."""
    context = multiprocessing.get_context("fork")
    queues: list[Queue[float]] = [context.Queue(), context.Queue()]
    workers = [context.Process(target=_clients_on, args=(i, ports[i], keys[i], seconds, queues[i])) for i in (0, 1)]
    for w in workers:
        w.start()
    try:
        rates = (queues[0].get(timeout=seconds + 60), queues[1].get(timeout=seconds + 60))
    except queue.Empty:
        raise SystemExit(f"a path's clients gave no figure within {seconds + 60:g} s") from None
    for w in workers:
        w.join()
    return rates


class PairedMeter:
    """CPU seconds per request of the engines (through a gateway, and direct) and of each gateway, over the slices of
    the counted rounds."""

    def __init__(self, engines: tuple[int, int], gateways: dict[tuple[str, int], int]) -> None:
        self.engines, self.gateways = engines, gateways
        self.cpu: dict[str, float] = {}
        self.requests: dict[str, float] = {}

    def add(self, name: str, cpu: float, requests: float) -> None:
        self.cpu[name] = self.cpu.get(name, 0.0) + cpu
        self.requests[name] = self.requests.get(name, 0.0) + requests

    def slice(
        self, paths: tuple[str, str], ports: tuple[int, int], seconds: float, counted: bool
    ) -> tuple[float, float]:
        """paths[i] is "direct" or a gateway's name, on core i."""
        pids = [self.gateways.get((paths[i], i)) for i in (0, 1)]
        before = [cpu_seconds(e) for e in self.engines], [cpu_seconds(p) if p else 0.0 for p in pids]
        rates = side_by_side(ports, (paths[0] != "direct", paths[1] != "direct"), seconds)
        after = [cpu_seconds(e) for e in self.engines], [cpu_seconds(p) if p else 0.0 for p in pids]
        if counted:
            for i in (0, 1):
                n = rates[i] * seconds
                engine = "engine, direct" if paths[i] == "direct" else f"engine, through {paths[i]}"
                self.add(engine, after[0][i] - before[0][i], n)
                if pids[i]:
                    self.add(f"HAProxy, {paths[i]}", after[1][i] - before[1][i], n)
        return rates

    def report(self) -> None:
        for name in self.cpu:
            print(f"  CPU per request: {name} {self.cpu[name] / self.requests[name] * 1e6:.0f} us", flush=True)


def paired_rounds(
    engines: tuple[int, int],
    ports: dict[tuple[str, int], int],
    names: list[str],
    rounds: int,
    warm: int,
    seconds: float,
    meter: PairedMeter,
) -> dict[str, list[float]]:
    """Each round measures, for the control and each gateway, two slices side by side (the path on core 0 and
    direct on core 1, then the other way round), in an order that moves every round; the control is direct beside
    direct, measured the same way: what the method gives two paths that differ in nothing. The first `warm`
    rounds are not counted."""
    ratios: dict[str, list[float]] = {name: [] for name in [CONTROL, *names]}

    def port(path: str, core: int) -> int:
        return engines[core] if path == "direct" else ports[(path, core)]

    for r in range(warm + rounds):
        counted = r >= warm
        got = {}
        for name in order_of([CONTROL, *names], r):
            path = "direct" if name == CONTROL else name
            first = meter.slice((path, "direct"), (port(path, 0), port("direct", 1)), seconds, counted)
            second = meter.slice(("direct", path), (port("direct", 0), port(path, 1)), seconds, counted)
            got[name] = paired_ratio(first, second)
            if counted:
                ratios[name].append(got[name])
        print(f"  round {r + 1}/{warm + rounds}{'' if counted else ' (warm-up, not counted)'}: "
              + ", ".join(f"{n} {v:.3f}" for n, v in got.items()), flush=True)  # fmt: skip
    for name, values in ratios.items():
        print(f"  {name:<18} ratio to direct: median {statistics.median(values):.3f}, mean "
              f"{statistics.mean(values):.3f}, sd {statistics.stdev(values):.3f}", flush=True)  # fmt: skip
    meter.report()
    return ratios


def main_paired(requests: int, rounds: int, warm: int, seconds: float, only: list[str] | None = None) -> None:
    """--paired: two engines, one on each core; a gateway in front of each, on the same core; each slice measures
    two paths at once, each on its own core with its own engine, clients and (for a gateway) HAProxy."""
    if (os.cpu_count() or 1) < 2:
        raise SystemExit("--paired needs two CPUs (it uses CPU 0 and CPU 1)")
    chosen = ["rendered", *(only or [])]
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs",
          flush=True)  # fmt: skip
    print("paired: on each core an engine, its clients and its gateway; two paths measured at once, swapped",
          flush=True)  # fmt: skip
    started = [start_engine({0}), start_engine({1})]
    engines = (started[0][0], started[1][0])
    procs = [e for _, e in started]
    with tempfile.TemporaryDirectory() as tmp:
        ports: dict[tuple[str, int], int] = {}
        pids: dict[tuple[str, int], int] = {}
        try:
            for core in (0, 1):
                Path(tmp, str(core)).mkdir()
                by_name, gateways = start_gateways(str(Path(tmp, str(core))), engines[core], chosen, {core})
                procs += gateways
                for (name, port), proc in zip(by_name.items(), gateways, strict=True):
                    ports[(name, core)], pids[(name, core)] = port, proc.pid
            for port in (*engines, *ports.values()):
                wait(port, "/health")
            time.sleep(6)  # the gateways' first check marks their replica up
            overhead(engines[0], ports[("rendered", 0)], requests)
            print(f"throughput at 8 clients a path, {warm} + {rounds} rounds of 2 x {len(chosen) + 1} slices of "
                  f"{seconds:g} s:", flush=True)  # fmt: skip
            meter = PairedMeter((started[0][1].pid, started[1][1].pid), pids)
            ratios = paired_rounds(engines, ports, chosen, rounds, warm, seconds, meter)
            ratio = statistics.median(ratios["rendered"])
            print(f"the control's ratio (direct beside direct, median of {rounds} rounds): "
                  f"{statistics.median(ratios[CONTROL]):.3f}: the method's own noise", flush=True)  # fmt: skip
            print(f"throughput ratio gateway/direct at 8 clients, paired (median of {rounds} rounds): {ratio:.3f}"
                  f"  (target >= 0.95: {'ok' if ratio >= 0.95 else 'MISSED'})", flush=True)  # fmt: skip
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(10)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="The gateway's overhead and throughput against direct calls.")
    parser.add_argument("requests", nargs="?", type=int, default=300, help="request pairs for the overhead (300)")
    parser.add_argument("--rounds", type=int, default=16, help="throughput rounds, order alternating (16)")
    parser.add_argument("--seconds", type=float, default=2, help="seconds per throughput measurement (2)")
    parser.add_argument("--variants", action="store_true",
                        help="also measure the configuration without each suspect of overhead")  # fmt: skip
    parser.add_argument("--cores-apart", action="store_true",
                        help="the engine on the first CPU, HAProxy and the clients on the others")  # fmt: skip
    parser.add_argument("--variant", action="append", choices=[v for v in variants("") if v != "rendered"],
                        help="measure this variant beside the rendered one (repeatable)")  # fmt: skip
    parser.add_argument("--paired", action="store_true",
                        help="an engine, clients and gateway on each core; two paths at once")  # fmt: skip
    parser.add_argument("--warm", type=int, default=2, help="--paired: rounds run first and not counted (2)")
    args = parser.parse_args()
    if args.paired:
        main_paired(args.requests, args.rounds, args.warm, args.seconds, args.variant)
        raise SystemExit(0)
    if args.cores_apart:
        ENGINE_CPUS = {0}
    main(args.requests, args.rounds, args.seconds, args.variants, args.variant)
