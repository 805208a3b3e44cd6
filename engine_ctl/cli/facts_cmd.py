"""`engine-ctl facts`: what each host has, gathered in one SSH round trip per host."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from engine_ctl.cli.common import inventory_option, report_failures, resolve_inventory, ssh_options, ssh_settings
from engine_ctl.cli.completion import host_names
from engine_ctl.cli.views.output import console, emit_json
from engine_ctl.core.sizes import gib
from engine_ctl.shell.transport import connect_ahead

if TYPE_CHECKING:
    from rich.table import Table

    from engine_ctl.core.fit.hostfacts import HostFacts


@click.command()
@click.argument("hosts", nargs=-1, shell_complete=host_names)
@inventory_option
@ssh_options
@click.option("--json", "as_json", is_flag=True, help="Print a versioned JSON document.")
def facts(
    hosts: tuple[str, ...], inventory_path: Path | None, parallel: int, accept_new_host_keys: bool, as_json: bool
) -> None:
    """Gather facts from HOSTS (default: every host of the inventory): OS, CPU, memory, disks, GPUs,
    engines, engine-ctl's units, ports in use, model files, HAProxy. Exit 1 if any host failed; the
    others' facts are still shown."""
    inventory = resolve_inventory(inventory_path, None)
    selected = inventory.select(list(hosts))
    options = ssh_settings(accept_new_host_keys)
    ahead = connect_ahead(selected, options, parallel)  # the hosts' handshakes overlap the imports below
    from engine_ctl.core.fit.hostfacts import FORMAT_VERSION
    from engine_ctl.shell.gather import gather

    found, failures = gather(selected, options, parallel=parallel, ahead=ahead)
    if as_json:
        emit_json(
            {
                "format_version": FORMAT_VERSION,
                "hosts": {name: found[name].model_dump(mode="json") for name in sorted(found)},
                "failures": {name: failures[name].as_json() for name in sorted(failures)},
            }
        )
    else:
        out = console()
        for h in selected:
            if h.name in found:
                out.print(host_table(found[h.name]))
        report_failures(failures)
    sys.exit(1 if failures else 0)


def host_table(f: HostFacts) -> Table:
    from rich.table import Table

    table = Table(title=f"{f.host} ({f.hostname})", title_justify="left", show_header=False, box=None)
    table.add_column("fact", style="bold")
    table.add_column("value")
    table.add_row("os", f"{f.os}; kernel {f.kernel}; {f.arch}; systemd {f.systemd_version}")
    table.add_row("cpu", f"{f.cpu.cores} cores, {f.cpu.model}; {' '.join(f.cpu.flags)}")
    table.add_row("memory", f"{gib(f.memory.available_bytes)} available of {gib(f.memory.total_bytes)}")
    for key, d in f.disks.items():
        free = gib(d.free_bytes or 0) if d.free_bytes is not None else "?"
        table.add_row(key, f"{d.path}: {free} free{'' if d.exists else ' (does not exist yet)'}")
    if not f.gpus:
        table.add_row("gpus", "none")
    for g in f.gpus:
        used = gib(g.memory_used_bytes) if g.memory_used_bytes is not None else "?"
        total = gib(g.memory_total_bytes) if g.memory_total_bytes is not None else "?"
        target = f", {g.gfx_target}" if g.gfx_target else ""
        table.add_row(f"gpu {g.index}", f"{g.name} {g.uuid} {used} used of {total}, driver {g.driver_version}{target}")
    for name, e in sorted(f.engines.items()):
        table.add_row(f"engine {name}", f"{e.path} ({e.version or 'version unknown'}) sha256 {(e.sha256 or '-')[:12]}")
    for name, builds in sorted(f.engine_builds.items()):
        for platform, e in sorted(builds.items()):
            said = f"{e.path} ({e.version or 'version unknown'}) sha256 {(e.sha256 or '-')[:12]}"
            table.add_row(f"engine {name} {platform}", said)
    for path, e in sorted(f.worker_engines.items()):  # what a replica group's worker runs beside a build
        table.add_row("group worker", f"{path} ({e.version or 'version unknown'}) sha256 {(e.sha256 or '-')[:12]}")
    if not f.engines and not f.engine_builds:
        table.add_row("engines", "none found")
    for u in f.units:
        table.add_row(
            f"unit {u.name}",
            f"{u.active_state}/{u.sub_state} pid {u.main_pid} restarts {u.n_restarts} sha256 {(u.sha256 or '-')[:12]}"
            + (f"; {len(u.exits)} crash(es), last {u.last_crash}" if u.exits else ""),
        )
    table.add_row("ports", " ".join(map(str, f.ports_in_use)) or "-")
    table.add_row("models", f"{len(f.model_files)} file(s)")
    table.add_row("haproxy", f.haproxy_version or "not installed")
    table.add_row("psql", f.psql or "not installed")  # (the scalers' PostgreSQL lock needs it on a gateway host)
    for w in f.warnings:
        table.add_row("warning", w)
    return table
