"""Run on a gateway host: send commands (JSON on stdin) to HAProxy's admin socket (argv[1]), one connection each;
a {"map": name, "entries": {...}} item replaces a map's entries atomically (prepare, add, commit). Prints the
answers as a JSON list. With argv[2], seconds: first wait that long at most for HAProxy to answer (a restart).
Shipped by engine_ctl.shell.gateway.runtime (engine_ctl.shell.shipped)."""

from __future__ import annotations

import json
import sys
import time

from engine_ctl.shell.remote.haproxy_admin import haproxy_ask  # shipped: this line becomes haproxy_admin.py


def send(path: str, items: list[object]) -> list[str]:
    answers = []
    for item in items:
        if isinstance(item, str):
            answers.append(haproxy_ask(path, item))
            continue
        assert isinstance(item, dict)
        name, entries = item["map"], item["entries"]
        said = haproxy_ask(path, "prepare map " + name)
        version = said.strip().rsplit(" ", 1)[-1]
        if not version.isdigit():
            answers.append("prepare failed: " + said)
            continue
        for key, value in entries.items():
            haproxy_ask(path, "add map @%s %s %s %s" % (version, name, key, value))
        answers.append(haproxy_ask(path, "commit map @%s %s" % (version, name)))
    return answers


def wait_answering(path: str, within: float) -> None:
    """Until HAProxy answers on its admin socket, at most `within` seconds: a gateway systemd is restarting (killed,
    or crashed: Restart=always, RestartSec=2) answers again in a few seconds, and a verb's change waits for it
    rather than failing. Still silent then: the OSError is raised (the caller names the socket)."""
    deadline = time.monotonic() + within
    while True:
        try:
            haproxy_ask(path, "show info", 5)
            return
        except OSError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.5)


if __name__ == "__main__":
    items = json.load(sys.stdin)
    if len(sys.argv) > 2 and float(sys.argv[2]) > 0:
        wait_answering(sys.argv[1], float(sys.argv[2]))
    print(json.dumps(send(sys.argv[1], items)))
