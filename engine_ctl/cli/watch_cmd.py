"""`engine-ctl status --watch`: a live board, redrawn every 2 s with rich's Live display, one line per deployment:
its state, ready replicas, requests in flight and queued at the gateways, requests since the gateways started,
their time to first byte, and the scaler's last decision. Ctrl-C ends it (exit status 130, the terminal as it was).

The state and the replicas' health come as for `status` (one gather of the hosts each round); the gateway's figures
from each gateway host, over one SSH connection per gateway host kept open: its stats socket (`show stat`: per
backend, scur in flight, qcur queued, stot requests) and its access log (the last RECENT_LINES requests of the last
RECENT_SINCE, for the median time to the first byte: HAProxy's own rtime is a mean)."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from engine_ctl.cli.views.output import console
from engine_ctl.core.accesslog import RequestLine
from engine_ctl.core.plan.status import DeploymentStatus
from engine_ctl.core.render.gateway import BACKEND_PREFIX
from engine_ctl.shell.transport import HostFailure

REFRESH_S = 2.0
RECENT_LINES = 1024
RECENT_SINCE = "-5min"
"""The requests the TTFB column is the median of: each gateway's last RECENT_LINES of the last five minutes."""
STATE_STYLE = {"ready": "green", "serving": "green", "degraded": "yellow", "pending": "yellow", "failed": "red"}


@dataclass
class BackendFigures:
    """One deployment's figures at the gateways, added over every gateway host."""

    in_flight: int = 0
    queued: int = 0
    requests: int = 0
    ttfb_ms: list[int] = field(default_factory=list)
    """The time to the first byte of each recent request the gateways logged for it (RECENT_LINES)."""

    def ttfb(self) -> int | None:
        """The median of the recent requests' times to the first byte (the lower middle of an even count)."""
        if not self.ttfb_ms:
            return None
        ordered = sorted(self.ttfb_ms)
        return ordered[(len(ordered) - 1) // 2]


def backend_figures(csv_texts: list[str], recent: Iterable[RequestLine] = ()) -> dict[str, BackendFigures]:
    """`show stat` CSV of each gateway -> deployment -> its figures (BACKEND rows of d_<name> proxies), with the
    times to the first byte of the `recent` requests the gateways logged. Pure."""
    out: dict[str, BackendFigures] = {}
    for text in csv_texts:
        lines = [ln for ln in text.splitlines() if ln.strip()]
        if not lines or not lines[0].startswith("#"):
            continue
        header = lines[0].lstrip("# ").split(",")
        for line in lines[1:]:
            row = dict(zip(header, line.split(","), strict=False))
            proxy = row.get("pxname", "")
            if row.get("svname") != "BACKEND" or not proxy.startswith(BACKEND_PREFIX):
                continue
            f = out.setdefault(proxy[len(BACKEND_PREFIX) :], BackendFigures())
            f.in_flight += _int(row.get("scur"))
            f.queued += _int(row.get("qcur"))
            requests = _int(row.get("req_tot")) or _int(row.get("stot"))
            f.requests += requests
    for r in recent:
        if r.deployment is not None and r.ttfb_ms >= 0:
            out.setdefault(r.deployment, BackendFigures()).ttfb_ms.append(r.ttfb_ms)
    return out


def _int(value: str | None) -> int:
    try:
        return int(value or 0)
    except ValueError:
        return 0


def board(
    statuses: list[DeploymentStatus], figures: dict[str, BackendFigures], failures: dict[str, HostFailure],
    now: datetime, took_s: float,
) -> Group:  # fmt: skip
    """The board: one line per deployment, then when it was drawn and which hosts did not answer. Pure."""
    table = Table(box=None, pad_edge=False)
    for col in ("DEPLOYMENT", "STATE", "READY", "IN FLIGHT", "QUEUE", "REQUESTS", "TTFB"):
        table.add_column(col, no_wrap=True, justify="right" if col not in ("DEPLOYMENT", "STATE") else "left")
    table.add_column("SCALER'S LAST DECISION", overflow="ellipsis", no_wrap=True, ratio=1)
    for s in statuses:
        f = figures.get(s.name, BackendFigures())
        state = s.state.lower()
        last = s.decisions[-1] if s.decisions else None
        decided = "-" if last is None else f"{last.action} {last.at} {last.reason}"
        ttfb = f.ttfb()
        table.add_row(
            s.name, Text(state, style=STATE_STYLE.get(state, "")), f"{s.ready}/{s.replicas}", str(f.in_flight),
            str(f.queued), str(f.requests), "-" if ttfb is None else f"{ttfb} ms", decided,
        )  # fmt: skip
    if not statuses:
        table.add_row("(no deployments)", "", "", "", "", "", "", "")
    lines: list[Text | Table] = [table, Text("")]
    stamp = now.strftime("%H:%M:%S")
    lines.append(Text(f"{stamp} UTC, every {REFRESH_S:g} s (this round took {took_s:.1f} s); TTFB: the median "
                      f"time to the first byte of each gateway's last {RECENT_LINES} requests of the last 5 minutes; "
                      "Ctrl-C to end", style="dim"))  # fmt: skip
    for host, failure in sorted(failures.items()):
        lines.append(Text(f"{host}: {failure.message}", style="red"))
    return Group(*lines)


Round = tuple[list[DeploymentStatus], dict[str, BackendFigures], dict[str, HostFailure]]


def watch(fetch: Callable[[], Round]) -> None:
    """Draw the board every REFRESH_S until Ctrl-C. `fetch` runs in its own thread (a slow round never freezes
    the display or Ctrl-C); the board shows the newest round."""
    tty = sys.stdout.isatty()
    # On a terminal the board is redrawn in place, in colour unless NO_COLOR is set; elsewhere (a pipe, a file)
    # each round is printed after the last, plain.
    out = Console(no_color=bool(os.environ.get("NO_COLOR")), highlight=False, emoji=False) if tty else console()
    latest: list[Group] = [Group(Text("gathering the hosts' facts and the gateways' figures …"))]
    changed = threading.Event()
    stop = threading.Event()

    def rounds() -> None:
        while not stop.is_set():
            began = time.monotonic()
            try:
                statuses, figures, failures = fetch()
                latest[0] = board(statuses, figures, failures, datetime.now(UTC), time.monotonic() - began)
            except Exception as exc:  # a round that failed is shown, and the next one tries again
                latest[0] = Group(Text(f"this round failed: {exc}", style="red"))
            changed.set()
            stop.wait(max(0.0, REFRESH_S - (time.monotonic() - began)))

    worker = threading.Thread(target=rounds, name="watch", daemon=True)
    worker.start()
    try:
        if not tty:
            while True:
                if changed.wait(timeout=0.2):
                    changed.clear()
                    out.print(latest[0])
                    out.print("")
        with Live(latest[0], console=out, auto_refresh=False, transient=False, redirect_stdout=False) as live:
            while True:
                if changed.wait(timeout=0.2):
                    changed.clear()
                    live.update(latest[0], refresh=True)
    except KeyboardInterrupt:
        stop.set()
        sys.stdout.flush()
        sys.exit(130)


__all__ = ["RECENT_LINES", "RECENT_SINCE", "BackendFigures", "backend_figures", "board", "watch"]
