"""Free loopback ports for tests that start listeners of their own.

A port the kernel hands out for `bind(("127.0.0.1", 0))` is free only until the socket closes, so two calls can
return the same port. HAProxy binds with SO_REUSEPORT: two of its listeners (or two tests' gateways) on one port
both start, and the kernel splits connections between them, so a request meant for the client endpoint reached the
internal listener (CI, stop 37). Here each port is handed out once per process, and under pytest-xdist each worker
takes only ports whose half is its own modulo the number of workers (the half: Linux
hands `bind` even ports first), so no two workers share one either."""

from __future__ import annotations

import os
import socket

_HANDED_OUT: set[int] = set()


def _worker_share() -> tuple[int, int]:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    index = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0
    return index, max(count, 1)


def free_port(address: str = "127.0.0.1") -> int:
    """A port free on `address` now, never handed out before in this process and this worker's own."""
    index, count = _worker_share()
    for _ in range(10_000):
        with socket.socket() as s:
            s.bind((address, 0))
            port = int(s.getsockname()[1])
        if (port >> 1) % count == index and port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
    raise RuntimeError(f"no free port on {address} for worker {index} of {count}")
