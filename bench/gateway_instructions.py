"""HAProxy's own work per request through the gateway, in instructions (valgrind's callgrind, Debian's `valgrind`):
the figure no load on the machine moves. bench/gateway.py's throughput ratio on shared cores swings by several
points from run to run on a busy machine; the instructions HAProxy executes for a request do not (the same to
within 1% run after run), so they tell whether a change to the rendered configuration made the gateway cheaper.

Each configuration (the rendered one, and any of bench/gateway.py's variants) runs alone under callgrind, in front
of the real llama-server with the tiny model; after WARM requests the counters are dumped and zeroed, REQUESTS
more are sent one after another on one keep-alive connection, and the counters are dumped again: their total over
REQUESTS is the figure (the worker's user-space instructions, libraries included; not the kernel's, which the
throughput figures count). Each figure is printed with its ratio to the plain proxy's (HAProxy with no rule).

Run:  .venv/bin/python -m bench.gateway_instructions [--requests 200] [--variant NAME ...]
"""

from __future__ import annotations

import argparse
import http.client
import os
import subprocess
import tempfile
import time
from pathlib import Path

from bench.gateway import one, start_engine, variants, wait, write_gateway
from engine_ctl.core.render.gateway import ALLOCATOR_ENV

WARM = 30
PLAIN = "plain proxy"


def dumped_total(text: str) -> int:
    """The instructions in a callgrind dump: its `summary:` (or, from older valgrinds, `totals:`) line."""
    for line in text.splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise ValueError("no summary line in the callgrind dump")


def dump(pid: int, out: Path) -> Path:
    """Dump and zero the counters of the callgrind run `pid`; the dump's file (the newest beside `out`)."""
    subprocess.run(["callgrind_control", "--dump", str(pid)], check=True, capture_output=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        dumps = sorted(out.parent.glob(out.name + "*"), key=lambda p: p.stat().st_mtime)
        if dumps and dumps[-1] != out and dumps[-1].stat().st_size:
            return dumps[-1]
        time.sleep(0.2)
    raise SystemExit("callgrind wrote no dump")


def per_request(replica: int, folder: Path, name: str, requests: int) -> float:
    """HAProxy's instructions per request for the variant `name`, in front of the replica on port `replica`."""
    port = write_gateway(folder, replica, name)
    config = folder / "haproxy.cfg"
    config.write_text(config.read_text().replace("    master-worker\n", ""))  # one process, the one measured
    out = folder / "callgrind.out"
    proc = subprocess.Popen(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "haproxy", "-f", str(config)],
        env={**os.environ, **ALLOCATOR_ENV}, stdout=(folder / "stdout.log").open("wb"), stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait(port, "/health", timeout=120)
        time.sleep(7)  # the gateway's first check marks the replica up
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        for _ in range(WARM):
            one(conn, True)
        first = dump(proc.pid, out)
        for _ in range(requests):
            one(conn, True)
        second = dump(proc.pid, out)
        assert second != first
        return dumped_total(second.read_text()) / requests
    finally:
        proc.terminate()
        proc.wait(30)


def main(requests: int, chosen: list[str]) -> None:
    replica, engine = start_engine(None)
    try:
        wait(replica, "/health")
        figures: dict[str, float] = {}
        with tempfile.TemporaryDirectory() as tmp:
            for i, name in enumerate(dict.fromkeys(["rendered", *chosen, PLAIN])):
                figures[name] = per_request(replica, Path(tmp) / f"v{i}", name, requests)
                print(f"  {name:<32} {figures[name] / 1000:7.1f} k instructions a request", flush=True)
        print(f"the rendered gateway: {figures['rendered'] / figures[PLAIN]:.2f}x a plain proxy's instructions, "
              f"{(figures['rendered'] - figures[PLAIN]) / 1000:.1f} k more a request for its rules")  # fmt: skip
    finally:
        engine.terminate()
        engine.wait(10)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="HAProxy's instructions per request through the gateway.")
    parser.add_argument("--requests", type=int, default=200, help="requests counted per configuration (200)")
    parser.add_argument("--variant", action="append", default=[], choices=[v for v in variants("") if v != "rendered"],
                        help="measure this variant too (repeatable)")  # fmt: skip
    args = parser.parse_args()
    main(args.requests, args.variant)
