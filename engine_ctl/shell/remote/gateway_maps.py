"""Run on a gateway host: send commands (JSON on stdin) to HAProxy's admin socket (argv[1]), one connection each;
a {"map": name, "entries": {...}} item replaces a map's entries atomically (prepare, add, commit). Prints the
answers as a JSON list. Shipped by engine_ctl.shell.gateway.runtime (engine_ctl.shell.shipped)."""

from __future__ import annotations

import json
import sys

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


if __name__ == "__main__":
    print(json.dumps(send(sys.argv[1], json.load(sys.stdin))))
