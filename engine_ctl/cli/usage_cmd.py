"""`engine-ctl usage`: requests, errors and bytes per key name or deployment, added up from the gateways' request
logs (core.accesslog), read from every gateway host's journal as `engine-ctl logs --gateway` reads them.

What is exact and what is not, as the output says: requests, errors and bytes are counted from one log line per
request, exact for the lines the journal kept (the gateway's unit lifts journald's rate limit; journald still
rotates old lines away past its SystemMaxUse=, and the metrics port's counters are the exact ones since the
gateway's last reload). The lines HAProxy could not write (journald behind, the pipe full) are counted by HAProxy
and reported per gateway as lines not logged. Tokens per key and deployment come from the same lines: the gateway
reads a whole JSON answer's `usage` counts (the engine's own), exact for those answers; a stream, or an answer
bigger than the gateway's buffer, is counted as a request without tokens (`uncounted`). Per deployment, the engines'
own counters are shown too (exact, streams included, but since each replica started)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from engine_ctl.cli.common import inventory_option, report_failures, resolve_inventory, ssh_options, ssh_settings
from engine_ctl.cli.context import backend_for, read_state, state_exists, state_option
from engine_ctl.cli.logs_cmd import _gateway_hosts, journal_requests, merged, since_argument
from engine_ctl.core.accesslog import RequestLine, Usage, counter_sum
from engine_ctl.core.accesslog import usage as add_up
from engine_ctl.core.documents.inventory import Host, Inventory
from engine_ctl.core.documents.loader import load_paths
from engine_ctl.core.plan.gateway import backends_from_state
from engine_ctl.core.render.gateway import ADMIN_SOCKET
from engine_ctl.providers import PROVIDERS
from engine_ctl.shell import shipped
from engine_ctl.shell.transport import HostFailure, SSHOptions, Transport, fan_out, python_argv, transport_for

FETCH = r"""
import json, sys, urllib.request
port, paths = int(sys.argv[1]), json.load(sys.stdin)
out = {}
for path in paths:
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d%s" % (port, path), timeout=10) as answer:
            out[path] = answer.read().decode("utf-8", "replace")
    except Exception as exc:
        out[path] = None
print(json.dumps(out))
"""
"""Run on a gateway host: each replica's engine metrics from its own metrics port on loopback."""


def engine_tokens(
    inventory: Inventory, state_path: str | None, paths: tuple[Path, ...], options: SSHOptions
) -> tuple[dict[str, dict[str, float]], list[str]]:  # fmt: skip
    """deployment -> {"prompt_tokens", "generated_tokens"} added over its replicas' engine counters (since each
    started), read through the first gateway's metrics port; and the replicas that could not be read."""
    backend = backend_for(state_path, paths)
    port = inventory.gateway.metrics_port
    if port is None or not inventory.gateways() or not state_exists(backend):
        return {}, []
    state = read_state(backend)
    engines = {n: PROVIDERS.get(r.plan.engine) if r.plan else None for n, r in state.deployments.items()}
    asked = {f"/metrics/replica/{b.deployment}/{s.name}": b.deployment
             for b in backends_from_state(state, {h.name: h for h in inventory.hosts}) for s in b.servers}  # fmt: skip
    if not asked:
        return {}, []
    transport = transport_for(inventory.gateways()[0], options)
    try:
        result = transport.run(python_argv("-c", FETCH, str(port)), stdin=json.dumps(sorted(asked)), timeout=60)
    finally:
        transport.close()
    texts = json.loads(result.stdout) if result.exit_code == 0 else {}
    out: dict[str, dict[str, float]] = {}
    unread = []
    for path, deployment in sorted(asked.items()):
        provider, text = engines.get(deployment), texts.get(path)
        if provider is None or not provider.token_metrics[0] or text is None:
            unread.append(path.rsplit("/", 2)[-2] + "/" + path.rsplit("/", 1)[-1])
            continue
        row = out.setdefault(deployment, {"prompt_tokens": 0.0, "generated_tokens": 0.0})
        for key, name in zip(("prompt_tokens", "generated_tokens"), provider.token_metrics, strict=True):
            row[key] += counter_sum(text, name) or 0.0
    return out, unread


def requests_and_dropped(
    hosts: list[Host], by_address: dict[str, str], since: str | None, options: SSHOptions, parallel: int
) -> tuple[list[RequestLine], dict[str, int | None], dict[str, HostFailure]]:  # fmt: skip
    """Every gateway host's request lines since `since` (merged in time order) and, on the same connection, the
    lines HAProxy could not write to the journal since the gateway last started or reloaded (its stdout is not
    blocking: a line journald has not read in time when the pipe is full is dropped; None where it could not be
    read); and the hosts that could not be read."""

    def read(transport: Transport) -> tuple[list[RequestLine], int | None]:
        lines = journal_requests(transport, by_address, None, since, None)
        said = transport.run(python_argv("-c", shipped.script("gateway_dropped.py"), ADMIN_SOCKET), timeout=30)
        count = said.stdout.strip()
        return lines, int(count) if said.exit_code == 0 and count.isdigit() else None

    found, failures = fan_out(hosts, read, options=options, parallel=parallel)
    lines = merged({name: got[0] for name, got in found.items()})
    return lines, {h.name: found[h.name][1] for h in hosts if h.name in found}, failures


NOTE = ("requests, errors (4xx and 5xx) and bytes: exact, counted from the gateways' request logs, for the lines "
        "their journals kept; p50 TTFB: from the same lines; tokens: exact for whole JSON answers (the engine's own "
        "usage counts, which the gateway logs), not measured for streams and answers past the gateway's buffer "
        "(UNCOUNTED)")  # fmt: skip
DROPPED_NOTE = ("request lines a gateway could not write to its journal since it last started or reloaded (journald "
                "did not read them in time): those requests are in no count above")  # fmt: skip
TOKENS_NOTE = ("engine tokens per deployment: exact, the engines' own counters, streams included, but since each "
               "replica started, not since --since (a replica that restarted or stopped takes its count with "
               "it)")  # fmt: skip


def _row(by: str, name: str, u: Usage, engine: dict[str, float] | None) -> dict[str, object]:
    """One row of `usage --json`."""
    row: dict[str, object] = {
        by: name, "requests": u.requests, "errors": u.errors, "bytes_in": u.bytes_in, "bytes_out": u.bytes_out,
        "p50_ttfb_ms": u.p50_ttfb_ms(), "prompt_tokens": u.prompt_tokens, "generated_tokens": u.generated_tokens,
        "uncounted": u.uncounted,
    }  # fmt: skip
    if engine is not None:
        row |= {f"engine_{k}": int(v) for k, v in engine.items()}
    return row


def _table(by: str, rows: dict[str, Usage], tokens: dict[str, dict[str, float]]) -> list[tuple[str, ...]]:
    """The table `usage` prints: a header, then one line a key or deployment."""
    engine = by == "deployment"
    header = (by.upper(), "REQUESTS", "ERRORS", "BYTES IN", "BYTES OUT", "P50 TTFB", "PROMPT TOKENS",
              "GENERATED TOKENS", "UNCOUNTED") + (("ENGINE PROMPT", "ENGINE GENERATED") if engine else ())  # fmt: skip
    table: list[tuple[str, ...]] = [header]
    for name, u in rows.items():
        p50 = u.p50_ttfb_ms()
        line: tuple[str, ...] = (name, str(u.requests), str(u.errors), str(u.bytes_in), str(u.bytes_out),
                                 "-" if p50 is None else f"{p50} ms", str(u.prompt_tokens),
                                 str(u.generated_tokens), str(u.uncounted))  # fmt: skip
        if engine:
            counted = tokens.get(name)
            line += (
                (str(int(counted["prompt_tokens"])), str(int(counted["generated_tokens"]))) if counted else ("-", "-")
            )
        table.append(line)
    return table


@click.command()
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@click.option("--since", default="24h", show_default=True, help="From T: 30m, 24h, 7d, or a time such as "
              "2024-05-01T12:00.")  # fmt: skip
@click.option("--by", type=click.Choice(["key", "deployment"]), default="key", show_default=True,
              help="One row per key name or per deployment.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="One JSON object: the rows and what is exact.")
@inventory_option
@state_option
@ssh_options
def usage(
    paths: tuple[Path, ...], since: str, by: str, as_json: bool, inventory_path: Path | None, state_path: str | None,
    parallel: int, accept_new_host_keys: bool,
) -> None:  # fmt: skip
    """Requests, errors, bytes in and out, p50 time to first byte and tokens per key name (--by key) or
    deployment, from every gateway host's request log since --since. Tokens are the engine's own `usage` counts
    of whole JSON answers; streams are counted under UNCOUNTED. Requests a gateway refused before it knew a key
    or a deployment (a wrong key, an unknown model) count under "-". With --by deployment, each replica's engine
    counters too (through a gateway's metrics port: the inventory's monitoring block), streams included, which
    count since the replica started."""
    inventory = resolve_inventory(inventory_path, load_paths(list(paths)) if paths else None)
    hosts, by_address = _gateway_hosts(inventory_path, paths)
    options = ssh_settings(accept_new_host_keys)
    lines, dropped, failures = requests_and_dropped(hosts, by_address, since_argument(since), options, parallel)
    rows = add_up(lines, by)
    tokens, unread = engine_tokens(inventory, state_path, paths, options) if by == "deployment" else ({}, [])
    if as_json:
        out = {
            "since": since, "by": by, "gateways": sorted(h.name for h in hosts if h.name not in failures),
            "exact": ["requests", "errors", "bytes_in", "bytes_out", "prompt_tokens", "generated_tokens"]
                     + (["engine_prompt_tokens", "engine_generated_tokens"] if by == "deployment" else []),
            "estimates": [], "not_measured": ["tokens of the answers counted in uncounted"],
            "note": NOTE + ("; " + TOKENS_NOTE if by == "deployment" else ""), "tokens_unread": unread,
            "dropped_lines": dropped, "dropped_lines_note": DROPPED_NOTE,
            "rows": [_row(by, name, u, tokens.get(name, {}) if by == "deployment" else None)
                     for name, u in rows.items()],
        }  # fmt: skip
        sys.stdout.write(json.dumps(out, indent=2) + "\n")
    else:
        table = _table(by, rows, tokens)
        widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
        for r in table:
            sys.stdout.write("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() + "\n")
        if not rows:
            sys.stdout.write(f"(no requests since {since})\n")
        sys.stdout.write(f"\nSince {since}. {NOTE[0].upper()}{NOTE[1:]}.\n")
        lost = {name: n for name, n in dropped.items() if n != 0}
        if lost:
            said = ", ".join(f"{name} {'not read' if n is None else n}" for name, n in sorted(lost.items()))
            sys.stdout.write(f"Lines not logged ({said}): {DROPPED_NOTE}.\n")
        if by == "deployment":
            sys.stdout.write(f"{TOKENS_NOTE[0].upper()}{TOKENS_NOTE[1:]}.\n")
            if unread:
                sys.stdout.write(f"Tokens not read (no metrics port, or not serving): {', '.join(unread)}.\n")
    report_failures(failures)
    sys.exit(1 if failures else 0)
