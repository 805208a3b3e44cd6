"""The gateway's cost, side by side in one run on this machine (loopback): the real llama-server with the tiny
model, and the real HAProxy with the configuration engine-ctl renders in front of it.

- overhead per request, p50 and p99: a 1-token completion through the gateway minus the same request sent
  straight to the replica, alternating (target: p50 <= 1 ms);
- throughput at 8 concurrent clients through the gateway against direct (target: >= 0.95x).

Run:  .venv/bin/python -m bench.gateway [REQUESTS]
"""

from __future__ import annotations

import http.client
import json
import socket
import statistics
import subprocess
import sys
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


def throughput(port: int, key: bool, clients: int = 8, seconds: float = 10) -> float:
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


def main(requests: int) -> None:
    replica, gateway = free_port(), free_port()
    llama = llama_server_dir() / "bin" / "llama-server"
    engine = subprocess.Popen(
        [str(llama), "--model", str(tiny_model()), "--alias", "bench", "--ctx-size", "2048", "--parallel", "8",
         "--host", "127.0.0.1", "--port", str(replica), "--threads", "1", "--no-webui"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        host = Host(name="bench", address="127.0.0.1", gateway_port=gateway)
        server = GatewayServer(name="r0a", address="127.0.0.1", port=replica, maxconn=8)
        backends = [GatewayBackend(deployment="bench", servers=(server,))]
        keys = [ApiKey(name="bench", sha256=key_sha256(KEY))]
        rendered = render_gateway(host, backends, keys, internal_key=False, run_dir=tmp)
        for name, text in rendered.files.items():
            (Path(tmp) / name).write_text(text)
        (Path(tmp) / "server-state").write_text("")
        haproxy = subprocess.Popen(["haproxy", "-f", f"{tmp}/haproxy.cfg"], stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)  # fmt: skip
        try:
            wait(replica, "/health")
            wait(gateway, "/health")
            time.sleep(6)  # the gateway's first check marks the replica up
            direct = http.client.HTTPConnection("127.0.0.1", replica, timeout=60)
            through = http.client.HTTPConnection("127.0.0.1", gateway, timeout=60)
            for _ in range(20):  # warm both paths
                one(direct, False)
                one(through, True)
            overhead = []
            for _ in range(requests):
                d = one(direct, False)
                g = one(through, True)
                overhead.append((g - d) * 1000)
            overhead.sort()
            p50 = statistics.median(overhead)
            p99 = overhead[min(len(overhead) - 1, int(len(overhead) * 0.99))]
            print(f"overhead per request ({requests} pairs, 1-token completion): p50 {p50:.2f} ms, p99 {p99:.2f} ms"
                  f"  (target p50 <= 1 ms: {'ok' if p50 <= 1 else 'MISSED'})")  # fmt: skip
            rounds = [(throughput(replica, False, seconds=5), throughput(gateway, True, seconds=5)) for _ in range(3)]
            rate_direct = statistics.mean(d for d, _ in rounds)  # alternating rounds: the machine's load drifts
            rate_gateway = statistics.mean(g for _, g in rounds)
            ratio = rate_gateway / rate_direct
            print(f"throughput at 8 clients: direct {rate_direct:.1f} req/s, gateway {rate_gateway:.1f} req/s, "
                  f"ratio {ratio:.3f}  (target >= 0.95: {'ok' if ratio >= 0.95 else 'MISSED'})")  # fmt: skip
        finally:
            haproxy.terminate()
            engine.terminate()
            haproxy.wait(10)
            engine.wait(10)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 300)
