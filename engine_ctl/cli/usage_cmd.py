"""`engine-ctl usage`: requests, errors and bytes per key name or deployment, added up from the gateways' request
logs (core.accesslog), read from every gateway host's journal as `engine-ctl logs --gateway` reads them.

What is exact and what is not, as the output says: requests, errors and bytes are counted from one log line per
request, exact for the lines the journal kept (journald drops lines past its rate limit and rotates old ones: a
busy gateway's counts are then low, and the metrics port's counters are the exact ones since the gateway's last
reload). Tokens are not in the gateway's log (it never reads a response body): they are not reported here."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from engine_ctl.cli.common import inventory_option, report_failures, ssh_options, ssh_settings
from engine_ctl.cli.logs_cmd import _gateway_hosts, read_gateway_requests, since_argument
from engine_ctl.core.accesslog import usage as add_up

NOTE = ("requests, errors (4xx and 5xx) and bytes: exact, counted from the gateways' request logs, for the lines "
        "their journals kept; p50 TTFB: from the same lines; tokens: not measured (the gateway never reads a "
        "response body)")  # fmt: skip


@click.command()
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@click.option("--since", default="24h", show_default=True, help="From T: 30m, 24h, 7d, or a time such as "
              "2024-05-01T12:00.")  # fmt: skip
@click.option("--by", type=click.Choice(["key", "deployment"]), default="key", show_default=True,
              help="One row per key name or per deployment.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="One JSON object: the rows and what is exact.")
@inventory_option
@ssh_options
def usage(
    paths: tuple[Path, ...], since: str, by: str, as_json: bool, inventory_path: Path | None, parallel: int,
    accept_new_host_keys: bool,
) -> None:  # fmt: skip
    """Requests, errors, bytes in and out and p50 time to first byte per key name (--by key) or deployment, from
    every gateway host's request log since --since. Requests a gateway refused before it knew a key or a
    deployment (a wrong key, an unknown model) count under "-"."""
    hosts, by_address = _gateway_hosts(inventory_path, paths)
    lines, failures = read_gateway_requests(hosts, by_address, None, since_argument(since), None,
                                            ssh_settings(accept_new_host_keys), parallel)  # fmt: skip
    rows = add_up(lines, by)
    if as_json:
        out = {
            "since": since, "by": by, "gateways": sorted(h.name for h in hosts if h.name not in failures),
            "exact": ["requests", "errors", "bytes_in", "bytes_out"], "estimates": [], "not_measured": ["tokens"],
            "note": NOTE,
            "rows": [{by: name, "requests": u.requests, "errors": u.errors, "bytes_in": u.bytes_in,
                      "bytes_out": u.bytes_out, "p50_ttfb_ms": u.p50_ttfb_ms()} for name, u in rows.items()],
        }  # fmt: skip
        sys.stdout.write(json.dumps(out, indent=2) + "\n")
    else:
        header = (by.upper(), "REQUESTS", "ERRORS", "BYTES IN", "BYTES OUT", "P50 TTFB")
        table = [header] + [
            (name, str(u.requests), str(u.errors), str(u.bytes_in), str(u.bytes_out),
             "-" if u.p50_ttfb_ms() is None else f"{u.p50_ttfb_ms()} ms") for name, u in rows.items()
        ]  # fmt: skip
        widths = [max(len(r[i]) for r in table) for i in range(len(header))]
        for r in table:
            sys.stdout.write("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() + "\n")
        if not rows:
            sys.stdout.write(f"(no requests since {since})\n")
        sys.stdout.write(f"\nSince {since}. {NOTE[0].upper()}{NOTE[1:]}.\n")
    report_failures(failures)
    sys.exit(1 if failures else 0)
