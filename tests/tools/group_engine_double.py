#!/usr/bin/python3
"""A test double of vLLM 0.30.0's `vllm serve` and SGLang 0.5.22's `python -m sglang.launch_server` for a replica
group on the test fleet, where no GPU runs (tests/test_fleet_multinode_engines.py installs it on two hosts).

What it copies from the real engines, and from where:
- vLLM: the flags of "Running vLLM with MultiProcessing" in docs/serving/parallelism_scaling.md
  (https://docs.vllm.ai/en/v0.30.0/serving/parallelism_scaling.html): every node runs `vllm serve` with --nnodes,
  --node-rank, --master-addr and --master-port; the workers add --headless, serve no API and listen on no port
  of their own: they dial the head's --master-port (torch.distributed's TCPStore, which vLLM's multiprocessing
  executor initialises with tcp://MASTER_ADDR:MASTER_PORT; its client retries until the head answers).
- SGLang: the flags of its multi-node deployment page
  (https://docs.sglang.io/references/multi_node_deployment/multi_node.html): --nnodes, --node-rank and the head's
  --dist-init-addr HOST:PORT on every node. A worker (node rank > 0) joins the head there first, and only then
  serves its health check on its own --host:--port (srt/entrypoints/engine.py: wait_for_ready, then
  launch_dummy_health_check_server, which answers /health and /health_generate).
- The head (rank 0) listens on the rendezvous address and starts its OpenAI-compatible API on --host:--port only
  once every worker has joined (the engines' API servers start after their engine is up): GET /health is 200,
  /v1/models lists --served-model-name, /metrics is Prometheus text with the engine's metric names.
- `vllm --version` prints the release.
- A worker whose head goes away exits 1, as the engines' workers die with their head.

It records its argv, its environment (an API key's value left out) and what happened, with CLOCK_MONOTONIC times
(one kernel clock for every fleet host), to $HOME/<engine>-double-rank<R>.json: $HOME is the unit's cache
directory, the one place its hardened unit may write.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

VLLM_RELEASE = "0.30.0"
SECRETS = ("VLLM_API_KEY",)


def option(argv: list[str], name: str, default: str | None = None) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else default


def host_port(text: str) -> tuple[str, int]:
    """`10.0.0.1:29600` or `[fd00::1]:29600`."""
    host, _, port = text.rpartition(":")
    return host.strip("[]"), int(port)


class Record:
    def __init__(self, engine: str, rank: int) -> None:
        env = {k: ("<set>" if k in SECRETS else v) for k, v in os.environ.items()}
        self.path = os.path.join(os.environ.get("HOME", "/tmp"), f"{engine}-double-rank{rank}.json")
        self.data: dict[str, object] = {"argv": sys.argv, "env": env, "started": time.monotonic(), "pid": os.getpid()}
        self.lock = threading.Lock()
        self.save()

    def set(self, **values: object) -> None:
        with self.lock:
            self.data.update(values)
            self.save()

    def save(self) -> None:
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.data, f)
        os.replace(tmp, self.path)


def http_server(address: tuple[str, int], routes: dict[str, tuple[bytes, str]]) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body, kind = routes.get(self.path, (b'{"detail":"Not Found"}', ""))
            self.send_response(200 if kind else 404)
            self.send_header("Content-Type", kind or "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    return ThreadingHTTPServer(address, Handler)


def join(master: tuple[str, int], record: Record, rank: int) -> socket.socket:
    """Dial the head's rendezvous until it answers (a worker may start before its head)."""
    attempts = 0
    while True:
        attempts += 1
        try:
            conn = socket.create_connection(master, timeout=2)
            break
        except OSError:
            time.sleep(0.2)
    conn.sendall(f"rank {rank}\n".encode())
    record.set(joined=time.monotonic(), attempts=attempts, local=conn.getsockname()[0])
    conn.settimeout(None)
    return conn


def wait_for_head_to_go(conn: socket.socket, record: Record) -> None:
    while conn.recv(1024):  # the head's rendezvous stays open while the group serves
        pass
    record.set(head_gone=time.monotonic())
    sys.exit(1)


def rendezvous(master: tuple[str, int], nodes: int, record: Record) -> list[socket.socket]:
    """The head's side: listen on the rendezvous address until every worker has joined."""
    server = socket.socket(socket.AF_INET6 if ":" in master[0] else socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(master)
    server.listen(16)
    joined: list[dict[str, object]] = []
    keep = []
    while len(joined) < nodes - 1:
        conn, peer = server.accept()
        said = conn.makefile().readline().strip()
        joined.append({"said": said, "peer": peer[0], "at": time.monotonic()})
        keep.append(conn)
        record.set(workers=joined)
    return keep


def serve_api(argv: list[str], record: Record, metric: str) -> None:
    name = option(argv, "--served-model-name", "model")
    models = {"object": "list", "data": [{"id": name, "object": "model"}]}
    routes = {
        "/health": (b"", "application/json"),
        "/v1/models": (json.dumps(models).encode(), "application/json"),
        "/metrics": (f'{metric}{{model_name="{name}"}} 0.0\n'.encode(), "text/plain; version=0.0.4"),
    }
    server = http_server((str(option(argv, "--host")), int(str(option(argv, "--port")))), routes)
    record.set(serving=time.monotonic())
    server.serve_forever()


def vllm(argv: list[str]) -> None:
    if argv[:1] == ["--version"]:
        print(VLLM_RELEASE)
        return
    if argv[:1] != ["serve"]:
        sys.exit(f"the vllm double runs `serve` only, not {argv[:1]}")
    rank, nodes = int(str(option(argv, "--node-rank", "0"))), int(str(option(argv, "--nnodes", "1")))
    master = (str(option(argv, "--master-addr")), int(str(option(argv, "--master-port"))))
    record = Record("vllm", rank)
    if rank > 0:
        if "--headless" not in argv or "--port" in argv:
            sys.exit("a vLLM worker (--node-rank > 0) runs --headless, with no API port")
        wait_for_head_to_go(join(master, record, rank), record)
    keep = rendezvous(master, nodes, record)
    serve_api(argv, record, "vllm:num_requests_running")
    del keep


def sglang(argv: list[str]) -> None:
    rank, nodes = int(str(option(argv, "--node-rank", "0"))), int(str(option(argv, "--nnodes", "1")))
    master = host_port(str(option(argv, "--dist-init-addr")))
    record = Record("sglang", rank)
    if rank > 0:
        conn = join(master, record, rank)
        routes = {"/health": (b"", "text/plain"), "/health_generate": (b"", "text/plain")}
        server = http_server((str(option(argv, "--host")), int(str(option(argv, "--port")))), routes)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        record.set(serving=time.monotonic())
        wait_for_head_to_go(conn, record)
    keep = rendezvous(master, nodes, record)
    serve_api(argv, record, "sglang:num_running_reqs")
    del keep


if __name__ == "__main__":
    if os.path.basename(sys.argv[0]) == "launch_server.py":  # python -m sglang.launch_server
        sglang(sys.argv[1:])
    else:
        vllm(sys.argv[1:])
