"""How `status` and `list` show deployments: seed 003's tables for a terminal, and the versioned JSON documents
(`status --json`, `list --json`). Values in (DeploymentStatus from the pure core), text out; the commands in
cli/status_cmd.py gather the values and print what these build."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from engine_ctl.core.names import UNIT_PREFIX, UNIT_SUFFIX, parse_unit_name
from engine_ctl.core.plan.status import DeploymentStatus, initialize_text, startup_text

FORMAT_VERSION = 1


def show_statuses(out: Console, statuses: list[DeploymentStatus], decisions: bool) -> None:
    """Each deployment: its row, its details, its endpoint, its instances, its units (and the scaler's decisions)."""
    for s in statuses:
        out.print(deployment_table(s))
        for line in detail_lines(s):
            out.print(line, markup=False, highlight=False)
        if s.gateways:
            behind = sum(1 for m in s.members if m.ready)
            out.print(f"endpoint: {', '.join(g + '/v1' for g in s.gateways)} (model: {s.served_model_name}; "
                      f"{behind} of {len(s.members)} behind the gateway)", markup=False, highlight=False)  # fmt: skip
            for down in s.gateways_down:
                out.print(f"  but {down}", style="red", markup=False, highlight=False)
        out.print("")
        out.print(instance_table(s))
        if s.instances:
            out.print(units_line(s))
        if decisions:
            out.print(decisions_table(s) if s.decisions else "decisions: none recorded by the scaler", markup=False)
        out.print("")


def url_of(address: str | None, port: int) -> str | None:
    """Where a replica answers: its host's address (IPv6 in brackets) and its port."""
    if address is None:
        return None
    host = f"[{address}]" if ":" in address else address
    return f"http://{host}:{port}"


def list_json(statuses: list[DeploymentStatus]) -> dict[str, object]:
    """`list --json`: one summary row per deployment (no members; `status --json` has them)."""
    rows = [without_chat_api(s.model_dump(mode="json", exclude={"instances", "members"})) for s in statuses]
    return {"format_version": FORMAT_VERSION, "deployments": rows}


def without_chat_api(doc: dict[str, Any]) -> dict[str, Any]:
    """A chat deployment has no `api` (seed 003: a decisions deployment says "api": "decisions"); `status` is seed
    000's status.state and status.reason beside them."""
    if doc.get("api") is None:
        doc.pop("api", None)
    doc["status"] = {"state": doc.get("state"), "reason": doc.get("reason")}
    return doc


def status_json(statuses: list[DeploymentStatus], addresses: dict[str, str]) -> dict[str, object]:
    """`status --json`: per deployment, its members, each with its host's address, its port and its URL, and
    `ready`: behind the endpoint with its health check passing as every gateway sees it (with no gateway in the
    inventory there is no endpoint, and ready is the replica's own health)."""
    out = []
    for s in statuses:
        doc = without_chat_api(s.model_dump(mode="json", exclude={"instances"}))
        behind = {m.run: m.ready for m in s.members}
        doc["members"] = [
            {
                **i.model_dump(mode="json"),
                "address": addresses.get(i.host),
                "url": url_of(addresses.get(i.host), i.port),
                "ready": behind.get(i.unit, False) if s.members else i.state == "ready",
            }
            for i in s.instances
        ]
        out.append(doc)
    return {"format_version": FORMAT_VERSION, "deployments": out}


def list_table(statuses: list[DeploymentStatus]) -> Table:
    """NAME STATE READY REVISION HOSTS, the hosts wrapping between names."""
    table = Table(box=None, pad_edge=False)
    for col in ("NAME", "STATE", "READY", "REVISION"):
        table.add_column(col, no_wrap=True)
    table.add_column("HOSTS", overflow="fold")
    for s in statuses:
        revision = f"{s.revision} (documents changed)" if s.documents_changed else str(s.revision)
        table.add_row(s.name, s.state.lower(), f"{s.ready}/{s.replicas}", revision, ", ".join(s.hosts) or "-")
    return table


def deployment_table(s: DeploymentStatus) -> Table:
    """Seed 003's NAME STATE READY REVISION STARTUP INITIALIZE LAST OPERATION (the state in lowercase, as the
    seed writes it); the last operation wraps, so the table fits the terminal (80 columns)."""
    table = Table(box=None, pad_edge=False)
    for col in ("NAME", "STATE", "READY", "REVISION", "STARTUP", "INITIALIZE"):
        table.add_column(col, no_wrap=True)
    table.add_column("LAST OPERATION", overflow="fold", ratio=1)
    revision = f"{s.revision} (documents changed)" if s.documents_changed else str(s.revision)
    table.add_row(
        s.name, s.state.lower(), f"{s.ready}/{s.replicas}", revision, startup_text(s.startup),
        initialize_text(s.initialize_s), s.last_operation or "-",
    )  # fmt: skip
    return table


def detail_lines(s: DeploymentStatus) -> list[str]:
    """Under the deployment's row: its API (a decisions deployment only), its hosts and why it is in its state."""
    lines = [f"API       {s.api}"] if s.api else []
    lines += [f"ID        {s.id}"] if s.id else []  # the deployment's stable ID (a ULID)
    lines.append(f"Hosts     {', '.join(s.hosts) or '-'}")
    if s.reason:
        lines.append(f"Reason    {s.reason}")
    return lines


def instance_table(s: DeploymentStatus) -> Table:
    """Seed 003's INSTANCE HOST STATE LIFECYCLE DEVICES LAST ERROR; the last error wraps, whole. An instance and
    its surge twin (the same index, slots a and b) read 0a and 0b; the unit's whole name is the line below the
    table (units_line)."""
    table = Table(box=None, pad_edge=False)
    for col in ("INSTANCE", "HOST", "STATE", "LIFECYCLE", "DEVICES"):
        table.add_column(col, no_wrap=True)
    table.add_column("LAST ERROR", overflow="fold", ratio=1)
    twins = {i.index for i in s.instances if sum(1 for j in s.instances if j.index == i.index) > 1}
    for i in s.instances:
        table.add_row(
            f"{i.index}{_slot(i.unit)}" if i.index in twins else str(i.index), i.host, i.state, i.lifecycle,
            ",".join(i.devices) or "-", i.last_error or "-",
        )  # fmt: skip
    return table


def decisions_table(s: DeploymentStatus) -> Table:
    """The scaler's last decisions: AT ACTION SLOT HOST FIGURE BY REASON (the reason wraps; BY: the gateway host
    whose scaler decided, the one that held the PostgreSQL lock where each gateway host runs one)."""
    table = Table(box=None, pad_edge=False, title="the scaler's decisions", title_justify="left")
    for col in ("AT", "ACTION", "SLOT", "HOST", "FIGURE", "BY"):
        table.add_column(col, no_wrap=True)
    table.add_column("REASON", overflow="fold", ratio=1)
    for d in s.decisions:
        figure = "-" if d.figure is None else f"{d.figure:g}"
        slot = "-" if d.slot is None else str(d.slot)
        table.add_row(d.at, d.action, slot, d.host or "-", figure, d.scaler or "-", d.reason)
    return table


def units_line(s: DeploymentStatus) -> str:
    """Each instance's unit, by the naming rule: `Units: engine-ctl-chat-<INSTANCE><SLOT>.service`."""
    now = ", ".join(i.unit for i in s.instances if not i.removed)
    return f"Units: {UNIT_PREFIX}{s.name}-<INSTANCE><SLOT>{UNIT_SUFFIX} on each HOST" + (f"; now {now}" if now else "")


def _slot(unit: str) -> str:
    parsed = parse_unit_name(unit)
    return parsed.slot if parsed else "?"
