"""Run on a gateway host: print HAProxy's DroppedLogs (`show info` on the admin socket, argv[1]), the request lines
its worker could not write to its stdout (the journal) since it started or reloaded; "-" when the gateway does not
answer. Shipped by engine_ctl.cli.usage_cmd (engine_ctl.shell.shipped)."""

from __future__ import annotations

import sys

from engine_ctl.shell.remote.haproxy_admin import haproxy_ask  # shipped: this line becomes haproxy_admin.py


def dropped(answer: str) -> str:
    """The DroppedLogs figure of a `show info` answer, "-" when it has none."""
    found = [line.split(":", 1)[1].strip() for line in answer.splitlines() if line.startswith("DroppedLogs:")]
    return found[0] if found else "-"


def main(path: str) -> None:
    try:
        answer = haproxy_ask(path, "show info")
    except OSError:
        answer = ""
    print(dropped(answer))


if __name__ == "__main__":
    main(sys.argv[1])
