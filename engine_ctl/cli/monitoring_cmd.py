"""`engine-ctl monitoring scrape-config`: what Prometheus scrapes, from the inventory (core.render.scrape)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from engine_ctl.cli.common import inventory_option, resolve_inventory
from engine_ctl.cli.context import backend_for, read_state, state_exists, state_option
from engine_ctl.core.diagnostics import Diagnostic, InputError, Location
from engine_ctl.core.documents.loader import load_paths
from engine_ctl.core.plan.gateway import backends_from_state
from engine_ctl.core.render.scrape import scrape_configs


@click.group()
def monitoring() -> None:
    """Prometheus: what to scrape on the gateway hosts (the inventory's monitoring block)."""


@monitoring.command("scrape-config")
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@click.option("--interval", type=click.IntRange(min=1, max=3600), default=15, show_default=True,
              help="Seconds between scrapes.")  # fmt: skip
@inventory_option
@state_option
def scrape_config(paths: tuple[Path, ...], interval: int, inventory_path: Path | None, state_path: str | None) -> None:
    """Print a Prometheus scrape_configs block for every gateway host of the inventory: HAProxy's exporter and
    engine-ctl's own series, on the inventory's monitoring.port; with a state, each replica's engine metrics too,
    through a gateway. Run Prometheus on one of monitoring.hosts: only those (and loopback) may connect. Print it
    again after an apply that adds or moves replicas."""
    inventory = resolve_inventory(inventory_path, load_paths(list(paths)) if paths else None)
    backend = backend_for(state_path, paths)
    backends = []
    if state_exists(backend):
        backends = backends_from_state(read_state(backend), {h.name: h for h in inventory.hosts})
    text = scrape_configs(inventory, interval, backends)
    if not text:
        why = "no monitoring block: the gateways export no metrics" if inventory.gateway.metrics_port is None else (
            "no host has the gateway role: nothing exports metrics")  # fmt: skip
        raise InputError([Diagnostic(Location(inventory.file or "the inventory"), "monitoring", why,
                                     hint="add `monitoring: {port: 8405, hosts: [<your Prometheus host>]}` "
                                     "and a host with roles: [gateway], then engine-ctl apply",
                                     code="no_metrics")])  # fmt: skip
    sys.stdout.write(text)
