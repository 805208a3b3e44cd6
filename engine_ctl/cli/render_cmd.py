"""`engine-ctl render`: the fit and the unit(s) a deployment would write, from live host facts."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from engine_ctl.cli.common import (
    inventory_option,
    load_checked,
    report_failures,
    resolve_inventory,
    ssh_options,
    ssh_settings,
)
from engine_ctl.cli.completion import deployment_names
from engine_ctl.cli.context import backend_for, read_state, state_option
from engine_ctl.cli.views.output import console, emit_json
from engine_ctl.cli.views.plan import context_meaning, memory_value
from engine_ctl.core.diagnostics import Diagnostic, InputError, Location
from engine_ctl.core.documents.inventory import Inventory
from engine_ctl.core.plan.pipeline import DeploymentRender, render_deployment
from engine_ctl.core.sizes import human_bytes
from engine_ctl.shell.transport import HostFailure
from engine_ctl.shell.world import gather_world

FORMAT_VERSION = 1


@click.command()
@click.argument("deployment", shell_complete=deployment_names)
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@click.option(
    "--host", "host_names", multiple=True,
    help="Place on this host only (repeatable): the deployment as it would be created there, whatever the state "
    "records for it.",
)  # fmt: skip
@inventory_option
@state_option
@ssh_options
@click.option("--json", "as_json", is_flag=True, help="The fit object and, per unit, its name, text and argv.")
def render(
    deployment: str,
    paths: tuple[Path, ...],
    host_names: tuple[str, ...],
    inventory_path: Path | None,
    state_path: str | None,
    parallel: int,
    accept_new_host_keys: bool,
    as_json: bool,
) -> None:
    """Print the fit of DEPLOYMENT and the systemd unit(s) its replicas would run, from live host facts.

    PATHS are the documents (default: the current directory). The placement is the plan's: the same documents,
    state and facts give the same hosts, ports and GPUs as `engine-ctl plan`."""
    loaded = load_checked(paths)
    found = loaded.desired.deployment(deployment)
    if found is None:
        names = ", ".join(d.deployment.name for d in loaded.desired.deployments) or "none"
        raise InputError(
            [
                Diagnostic(
                    Location(str(paths[0]) if paths else "."),
                    "",
                    f"no deployment named {deployment!r}",
                    hint=f"deployments: {names}",
                    code="unknown_deployment",
                )
            ]
        )
    inventory = resolve_inventory(inventory_path, loaded)
    selected = inventory.select(list(host_names))
    scoped = Inventory(file=inventory.file, hosts=tuple(selected))
    state = read_state(backend_for(state_path, paths))
    if host_names:  # a preview of a new placement on these hosts: this deployment's record is left out
        others = {k: v for k, v in state.deployments.items() if k != deployment}
        state = state.model_copy(update={"deployments": others})
    facts, failures, mfacts, notes = gather_world(loaded.desired, scoped, ssh_settings(accept_new_host_keys), parallel)
    model = found.deployment.model
    note = notes.get(model)
    result = render_deployment(
        loaded.desired, deployment, scoped, facts, mfacts.get(model), state=state, all_model_facts=mfacts
    )
    if as_json:
        emit_json(render_json(result, note, failures))
    else:
        print_render(result, note)
        report_failures(failures)
    blocked = result.fit.failed_reason is not None or not result.units
    sys.exit(1 if blocked else 0)


def render_json(result: DeploymentRender, note: str | None, failures: dict[str, HostFailure]) -> dict[str, object]:
    fit = result.fit
    return {
        "format_version": FORMAT_VERSION,
        "deployment": result.deployment,
        "plan": fit.plan.model_dump(mode="json") if fit.plan else None,
        "placements": [
            {"index": p.index, "host": p.host, "port": p.port, "gpus": [g.uuid for g in p.gpus], "threads": p.threads}
            for p in fit.placements
        ],
        "waiting": fit.waiting,
        "pending_reason": fit.pending_reason,
        "failed_reason": fit.failed_reason,
        "model_facts_note": note,
        "units": [
            {
                "name": u.name,
                "host": u.host,
                "sha256": u.sha256,
                "argv": list(u.argv),
                "environment": u.environment,
                "text": u.text,
            }
            for u in result.units
        ],
        "failures": {name: f.as_json() for name, f in sorted(failures.items())},
    }


def print_render(result: DeploymentRender, note: str | None) -> None:
    out = console()
    fit = result.fit
    if fit.failed_reason:
        out.print(f"Failed: {fit.failed_reason}")
        return
    plan = fit.plan
    if plan is None:  # the fit is not known yet
        out.print(f"Pending: {fit.pending_reason}")
        return
    out.print(f"Deployment {result.deployment}: {plan.engine} on {plan.accelerator}")
    context = f"{plan.context_length} ({context_meaning(plan.engine, plan.context_length, plan.parallel)})"
    rows = [
        ("gpus", plan.gpus),
        ("min_gpu_memory_gb", plan.min_gpu_memory_gb),
        ("cpu_cores", plan.cpu_cores),
        ("threads", plan.threads if plan.threads is not None else "-"),
        ("context_length", context),
        ("parallel", plan.parallel),
        ("weights", human_bytes(plan.weights_bytes)),
        ("kv cache", human_bytes(plan.kv_cache_bytes)),
        ("host memory", memory_value(plan)),
    ]
    for key, value in rows:
        out.print(f"  {key:<18} {value}")
    if note:
        out.print(f"  note: {note}")
    for host, reason in sorted(fit.waiting.items()):
        out.print(f"  {host}: {reason}")
    if fit.pending_reason:
        out.print(f"Pending: {fit.pending_reason}")
    for unit in result.units:
        out.print(f"\n# {unit.host}:/etc/systemd/system/{unit.name}")
        out.print(unit.text, end="")
