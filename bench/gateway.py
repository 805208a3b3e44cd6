"""The gateway's cost, side by side in one run on this machine (loopback): the real llama-server with the tiny
model, and the real HAProxy with the configuration engine-ctl renders in front of it.

- overhead per request, p50 and p99: a 1-token completion through the gateway minus the same request sent
  straight to the replica, alternating (target: p50 <= 1 ms);
- throughput at 8 concurrent clients through the gateway against direct (target: >= 0.95x).

Run:  .venv/bin/python -m bench.gateway [REQUESTS] [--rounds 6] [--seconds 5] [--variants]

Throughput is measured in rounds: each round measures direct and the gateway back to back, in an order that turns
around every round, and the ratio reported is the median of the rounds' ratios (the machine is shared and its load
drifts). --variants adds gateways with one suspect of overhead taken out each (body buffering, the large buffers,
the hold's rules, the per-server maxconn), side by side in the same rounds.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from engine_ctl.core.documents.apikey import key_sha256
from engine_ctl.core.documents.inventory import Host
from engine_ctl.core.model import ApiKey
from engine_ctl.core.render.gateway import GatewayBackend, GatewayServer, render_gateway
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
    """Requests per second that `clients` keep-alive connections complete in `seconds`."""
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
    (wait-for-body, and so the route on the body's model: the model map is skipped for a fixed backend), the
    large buffers (tune.bufsize 256 KiB, HAProxy's default 16 KiB instead), the hold's rules (Lua runs only with no
    server up, but its ACLs are evaluated on every request) and the per-server maxconn (HAProxy's own queue)."""
    lines = config.splitlines(keepends=True)

    def without(*needles: str) -> str:
        return "".join(ln for ln in lines if not any(n in ln for n in needles))

    no_body = without("wait-for-body", "req.body", "json_query", "must provide a model", "models.map", "scopes.map")
    no_body = no_body.replace("use_backend %[var(txn.backend)]", "use_backend d_bench")
    return {
        "rendered": config,
        "no body buffering": no_body,
        "bufsize 16 KiB": config.replace("tune.bufsize 262144", "tune.bufsize 16384"),
        "no hold rules": without("lua.hold", "var(txn.hold)"),
        "no server maxconn": config.replace(" maxconn 8", ""),
    }


def start_gateways(tmp: str, replica: int, chosen: list[str]) -> tuple[dict[str, int], list[subprocess.Popen[bytes]]]:
    """One HAProxy per variant of the rendered configuration, each in its own directory and port."""
    ports: dict[str, int] = {}
    procs = []
    for i, name in enumerate(chosen):
        folder = Path(tmp) / f"v{i}"
        folder.mkdir()
        port = free_port()
        host = Host(name="bench", address="127.0.0.1", gateway_port=port)
        server = GatewayServer(name="r0a", address="127.0.0.1", port=replica, maxconn=8)
        keys = [ApiKey(name="bench", sha256=key_sha256(KEY))]
        rendered = render_gateway(host, [GatewayBackend(deployment="bench", servers=(server,))], keys,
                                  internal_key=False, run_dir=str(folder))  # fmt: skip
        for file, text in rendered.files.items():
            (folder / file).write_text(text)
        (folder / "haproxy.cfg").write_text(variants(rendered.files["haproxy.cfg"])[name])
        (folder / "server-state").write_text("")
        procs.append(subprocess.Popen(["haproxy", "-f", f"{folder}/haproxy.cfg"], stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL))  # fmt: skip
        ports[name] = port
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


def rounds_of(replica: int, ports: dict[str, int], rounds: int, seconds: float) -> dict[str, list[float]]:
    """Each round measures direct and every gateway back to back, the order turned around every round (the
    machine's load drifts); a gateway's ratio in a round is against the direct figure of the same round."""
    ratios: dict[str, list[float]] = {name: [] for name in ports}
    rates: dict[str, list[float]] = {"direct": [], **{name: [] for name in ports}}
    order = ["direct", *ports]
    for r in range(rounds):
        this = order if r % 2 == 0 else order[::-1]
        got = {n: throughput(replica if n == "direct" else ports[n], n != "direct", seconds=seconds) for n in this}
        for n, v in got.items():
            rates[n].append(v)
        for n in ports:
            ratios[n].append(got[n] / got["direct"])
        print(f"  round {r + 1}/{rounds} ({' -> '.join(this)}): "
              + ", ".join(f"{n} {v:.1f}/s" for n, v in got.items()), flush=True)  # fmt: skip
    for n in ["direct", *ports]:
        line = f"  {n:<18} median {statistics.median(rates[n]):6.1f} req/s"
        if n != "direct":
            line += f", ratio to direct: median {statistics.median(ratios[n]):.3f} (rounds: " + ", ".join(
                f"{x:.3f}" for x in ratios[n]) + ")"  # fmt: skip
        print(line, flush=True)
    return ratios


def main(requests: int, rounds: int, seconds: float, all_variants: bool) -> None:
    replica = free_port()
    llama = llama_server_dir() / "bin" / "llama-server"
    engine = subprocess.Popen(
        [str(llama), "--model", str(tiny_model()), "--alias", "bench", "--ctx-size", "2048", "--parallel", "8",
         "--host", "127.0.0.1", "--port", str(replica), "--threads", "1", "--no-webui"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    chosen = list(variants("")) if all_variants else ["rendered"]
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs",
          flush=True)  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        ports, procs = start_gateways(tmp, replica, chosen)
        try:
            wait(replica, "/health")
            for port in ports.values():
                wait(port, "/health")
            time.sleep(6)  # the gateway's first check marks the replica up
            overhead(replica, ports["rendered"], requests)
            for port in (replica, *ports.values()):  # warm every path (the first seconds run slower)
                throughput(port, port != replica, seconds=1)
            print(f"throughput at 8 clients, {rounds} rounds of {seconds:g} s each:", flush=True)
            ratios = rounds_of(replica, ports, rounds, seconds)
            ratio = statistics.median(ratios["rendered"])
            print(f"throughput ratio gateway/direct at 8 clients (median of {rounds} rounds): {ratio:.3f}"
                  f"  (target >= 0.95: {'ok' if ratio >= 0.95 else 'MISSED'})", flush=True)  # fmt: skip
        finally:
            for p in [*procs, engine]:
                p.terminate()
            for p in [*procs, engine]:
                p.wait(10)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="The gateway's overhead and throughput against direct calls.")
    parser.add_argument("requests", nargs="?", type=int, default=300, help="request pairs for the overhead (300)")
    parser.add_argument("--rounds", type=int, default=6, help="throughput rounds, order alternating (6)")
    parser.add_argument("--seconds", type=float, default=5, help="seconds per throughput measurement (5)")
    parser.add_argument("--variants", action="store_true",
                        help="also measure the configuration without each suspect of overhead")  # fmt: skip
    args = parser.parse_args()
    main(args.requests, args.rounds, args.seconds, args.variants)
