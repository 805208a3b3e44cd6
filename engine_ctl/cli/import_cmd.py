"""`engine-ctl import`: rebuild a lost (or new) state from the units on the hosts and the documents.

Under the state's lock: refuse a state that records deployments (unless --force), gather every host (all must
answer: a unit on a host that was not read would be started again elsewhere), adopt the units
(engine_ctl.core.plan.adoption), show them, and write the state with an entry in its operations log."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from engine_ctl import __version__
from engine_ctl.cli.common import (
    inventory_option,
    load_checked,
    report_failures,
    resolve_inventory,
    ssh_options,
    ssh_settings,
)
from engine_ctl.cli.context import backend_for, lock_timeout_option, locked, read_state, state_option
from engine_ctl.cli.requests import recorded_command
from engine_ctl.cli.state_cmd import backup_of, log_operation
from engine_ctl.cli.views.output import console, emit_json
from engine_ctl.core.diagnostics import Diagnostic, InputError, Location
from engine_ctl.core.plan.adoption import Adoption, AdoptionError, adopt
from engine_ctl.core.record.model import HostRecord, State, StateError
from engine_ctl.shell.world import gather_world
from engine_ctl.state import StateBackend
from engine_ctl.state.base import now

FORMAT_VERSION = 1


def _refuse(backend: StateBackend, message: str, hint: str | None = None) -> InputError:
    return InputError([Diagnostic(Location(backend.location), "", message, hint=hint, code="import_refused")])


def _summary(adoption: Adoption) -> str:
    counts: dict[str, int] = {}
    for a in adoption.adopted:
        counts[a.deployment] = counts.get(a.deployment, 0) + 1
    listed = ", ".join(f"{name} ({n})" for name, n in sorted(counts.items()))
    return f"adopted {len(adoption.adopted)} unit(s) of {len(counts)} deployment(s), lineage {adoption.lineage}" + (
        f": {listed}" if listed else ""
    )


def _show(adoption: Adoption, location: str) -> None:
    out = console()
    out.print(f"Importing into {location}: lineage {adoption.lineage} ({adoption.lineage_reason})")
    for a in adoption.adopted:
        gpus = f", GPUs {','.join(a.gpus)}" if a.gpus else ""
        out.print(
            f"  + {a.deployment} replica {a.index} on {a.host}: {a.unit} (revision {a.revision}, port {a.port}{gpus}, "
            f"{a.status})" + (f": {a.note}" if a.note else ""),
            style="green",
        )
        for m in a.members:  # a replica group's workers, each on its own host
            on = f", GPUs {','.join(m.gpus)}" if m.gpus else ""
            line = f"      group member {m.rank} on {m.host}: {m.unit} (port {m.port}{on}, {m.status})"
            out.print(line + (f": {m.note}" if m.note else ""), style="yellow" if m.status == "missing" else "green")
    for g in adoption.adopted_gateways:
        out.print(f"  + gateway on {g.host}: http://{g.endpoint}/v1" + (f": {g.note}" if g.note else ""), style="green")
    for name, gateway in sorted(adoption.stopped.items()):
        out.print(f"  · {name}: stopped by an operator (the gateway on {gateway} answers it deployment_stopped, and no "
                  f"unit of it runs): recorded stopped; `engine-ctl start deployment {name}` starts it")  # fmt: skip
    for name in sorted(set(adoption.deployments) - set(adoption.ids)):
        out.print(f"  · {name}: no host carries its ID (a scaler's state carries those it acts on); the next apply "
                  "gives it a new one")  # fmt: skip
    if adoption.skipped:
        out.print("Left as they are:")
        for s in adoption.skipped:
            out.print(f"  · {s.host} {s.unit}: {s.why}")


def _written(state: State, adoption: Adoption, fingerprints: dict[str, str]) -> State:
    """The imported state: the adopted records (and lineage) in place of the state's, one serial on."""
    imported = state.model_copy(
        update={
            "lineage": adoption.lineage,
            "deployments": adoption.deployments,
            "gateways": adoption.gateways,
            "hosts": {h: HostRecord(facts_fingerprint=fp) for h, fp in sorted(fingerprints.items())},
        }
    )
    logged = log_operation(imported, "import", _summary(adoption))
    return logged.model_copy(update={"serial": state.serial + 1, "engine_ctl_version": __version__})


@click.command(name="import")
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@inventory_option
@state_option
@ssh_options
@lock_timeout_option
@click.option("--lineage", help="Rebuild the state of this lineage (when the units name more than one).")
@click.option("--force", is_flag=True, help="Replace the deployments a non-empty state records (kept as the backup).")
@click.option("--dry-run", is_flag=True, help="Show what would be adopted; write nothing.")
@click.option("--json", "as_json", is_flag=True, help="What was adopted and left, as versioned JSON.")
@recorded_command(lambda kw: None if kw.get("dry_run") else "import", inline=True)
def import_cmd(
    paths: tuple[Path, ...], inventory_path: Path | None, state_path: str | None, parallel: int,
    accept_new_host_keys: bool, lock_timeout: float, lineage: str | None, force: bool, dry_run: bool, as_json: bool,
) -> None:  # fmt: skip
    """Rebuild the state from the units on the hosts and the documents (PATHS), touching no host.

    Each unit engine-ctl writes says in its header which deployment, replica, revision, port and GPUs it is and
    which state (lineage) made it. A unit is adopted when a document names its deployment and its lineage is the
    state's being rebuilt; other states' units are left to them. Refused when the state records deployments,
    unless --force. Every host of the inventory must answer."""
    loaded = load_checked(paths)
    inventory = resolve_inventory(inventory_path, loaded)
    backend = backend_for(state_path, paths)
    with locked(backend, "import", lock_timeout):
        state = read_state(backend)
        if state.deployments and not force:
            names = ", ".join(sorted(state.deployments))
            raise _refuse(
                backend,
                f"the state already records {len(state.deployments)} deployment(s) ({names}); import rebuilds a "
                "lost or new state and overwrote nothing",
                "`engine-ctl plan` compares it with the hosts; --force replaces its records with what the hosts "
                "run (the current state is kept as the backup)",
            )
        facts, failures, model_facts, _notes = gather_world(
            loaded.desired, inventory, ssh_settings(accept_new_host_keys), parallel
        )
        if failures:
            report_failures(failures)
            raise _refuse(
                backend,
                f"{len(failures)} host(s) could not be read, so nothing was imported: the units there would be "
                "missed, and the next apply would start them again elsewhere",
                "make every host of the inventory reachable, then run import again",
            )
        try:
            adoption = adopt(loaded.desired, inventory, facts, model_facts, state, lineage, now=now())
        except AdoptionError as exc:
            raise _refuse(backend, str(exc)) from None
        write = bool(adoption.adopted) and not dry_run
        if write:
            new = _written(state, adoption, {h: f.fingerprint() for h, f in facts.items()})
            try:
                backend.put(new, state)
            except StateError as exc:
                raise _refuse(backend, str(exc)) from None
    if as_json:
        emit_json(
            {
                "format_version": FORMAT_VERSION,
                "state": backend.location,
                "lineage": adoption.lineage,
                "written": write,
                "adopted": [a.model_dump(mode="json") for a in adoption.adopted],
                "skipped": [s.model_dump(mode="json") for s in adoption.skipped],
                "gateways": [g.model_dump(mode="json") for g in adoption.adopted_gateways],
                "ids": adoption.ids,
                "stopped": adoption.stopped,
            }
        )
        sys.exit(0)
    _show(adoption, backend.location)
    out = console()
    if not adoption.adopted:
        out.print("Nothing to import: no unit of these documents' deployments runs on the hosts for this state.")
    elif dry_run:
        out.print(f"Dry run: {_summary(adoption)}; nothing was written.")
    else:
        kept = f"; the previous state (serial {state.serial}) is kept in {backup_of(backend, state)}"
        out.print(
            f"Imported: {_summary(adoption)} (serial {state.serial + 1}){kept if state.serial else ''}. "
            "`engine-ctl plan` compares it with the documents."
        )


__all__ = ["import_cmd"]
