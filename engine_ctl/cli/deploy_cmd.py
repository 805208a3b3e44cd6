"""`engine-ctl deploy model --file FILE [--activate] [--wait] [--revision N]`: seed 003's deploy, which saves a
revision and starts it only when asked (engine_ctl.core.plan.deploy says what each form does)."""

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
from engine_ctl.cli.context import backend_for, lock_operation, lock_timeout_option, locked, read_state, state_option
from engine_ctl.cli.plan_cmd import Deploying, Request, connect_early, execute, plan_for, show_plan
from engine_ctl.cli.requests import announce, request_identity, request_option
from engine_ctl.core.diagnostics import Diagnostic, InputError, Location
from engine_ctl.core.model import LoadedDeployment
from engine_ctl.core.plan.deploy import (
    deployed_block,
    digest_text,
    revision_refusal,
    saved_block,
    saved_verb,
    waiting_for_digest,
)
from engine_ctl.core.plan.status import startup_status, startup_text
from engine_ctl.core.record.model import DeploymentRecord, State
from engine_ctl.shell.apply import new_id
from engine_ctl.shell.lifecycle.verbs import Verbs
from engine_ctl.shell.pinning import Pinner
from engine_ctl.shell.transport import Kept


def say(line: str = "") -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


@click.group("deploy")
def deploy() -> None:
    """`deploy model --file FILE`: save a new revision of the deployment(s) of FILE without starting it, or with
    --activate start it; --revision N deploys only while N is the recorded revision."""


@deploy.command("model")
@click.option("--file", "file", required=True, type=click.Path(path_type=Path, dir_okay=False),
              help="The document of the deployment(s) to deploy; the other documents of its directory (models, API "
              "keys, the inventory) are read with it, and only its deployments are acted on.")  # fmt: skip
@click.option("--activate", is_flag=True, help="Start it too, and return when the model answers (as apply does); "
              "without it a new deployment is only saved: `engine-ctl start deployment NAME` starts it.")  # fmt: skip
@click.option("--wait", is_flag=True, help="With --activate: return when the model answers (what deploy --activate "
              "always does: its start is health-gated).")  # fmt: skip
@click.option("--revision", "revision", type=click.IntRange(min=0), metavar="N",
              help="Deploy only while the deployment's recorded revision is N (the REVISION column of `engine-ctl "
              "list`): refused with revision_mismatch (exit 26), nothing changed, when a change was deployed "
              "since.")  # fmt: skip
@inventory_option
@state_option
@ssh_options
@lock_timeout_option
@request_option
def model(file: Path, activate: bool, wait: bool, revision: int | None, inventory_path: Path | None,
          state_path: str | None, parallel: int, accept_new_host_keys: bool, lock_timeout: float,
          request_id: str | None) -> None:  # fmt: skip
    """Deploy the deployment(s) of FILE: saved (its units written, not started, held stopped) or, with --activate,
    started. A deployment that already runs is updated (a change restarts its engine)."""
    if wait and not activate:
        raise InputError([Diagnostic(
            Location("--wait"), "", "--wait waits for the start, and deploy starts nothing without --activate",
            hint="pass --activate --wait, or deploy without --wait and start it later with `engine-ctl start "
            "deployment NAME --wait`", code="conflicting_options",
        )])  # fmt: skip
    request = Request(request_identity(request_id))
    announce(request.id)
    command = f"deploy model --file {file}" + (" --activate" if activate else "")
    sys.exit(_deploy(file, activate, revision, inventory_path, state_path, parallel, accept_new_host_keys,
                     lock_timeout, request, command))  # fmt: skip


def _names_in(file: Path, deployments: list[LoadedDeployment]) -> list[str]:
    """The deployments whose document is FILE."""
    here = file.resolve()
    names = [ld.deployment.name for ld in deployments if Path(ld.origin.file).resolve() == here]
    if not names:
        raise InputError([Diagnostic(Location(str(file)), "", f"{file} holds no deployment document",
                                     hint="pass the file of a Deployment (or a flat document with engine:)",
                                     code="unknown_deployment")])  # fmt: skip
    return names


def _refusals(names: list[str], state: State, revision: int | None, where: str) -> list[Diagnostic]:
    out = []
    for name in names:
        rec = state.deployments.get(name)
        held = rec.operator.verb if rec is not None and rec.operator is not None else None
        if held in ("parked", "deleted"):
            out.append(Diagnostic(Location(where), "", f"{name} is {held} by an operator; nothing was deployed",
                                  hint=f"run `engine-ctl start deployment {name}` first, then deploy again",
                                  code="deployment_held"))  # fmt: skip
        found = revision_refusal(name, revision, rec, where)
        if found is not None:
            out.append(found)
    return out


def _deploy(file: Path, activate: bool, revision: int | None, inventory_path: Path | None, state_path: str | None,
            parallel: int, accept_new_host_keys: bool, lock_timeout: float, request: Request,
            command: str) -> int:  # fmt: skip
    options = ssh_settings(accept_new_host_keys)
    paths = (file.parent,)
    if not file.is_file():
        raise InputError([Diagnostic(Location(str(file)), "", f"{file}: no such file", code="path_not_found")])
    ahead, early = connect_early(inventory_path, options, parallel)
    pinner = Pinner()
    loaded = load_checked(paths, pin=pinner)
    names = _names_in(file, list(loaded.desired.deployments))
    inventory = resolve_inventory(inventory_path, loaded, early)
    backend = backend_for(state_path, paths)
    with locked(backend, lock_operation("deploy", request.id), lock_timeout, request.id):
        state = read_state(backend)
        finished = request.check(state, command, backend.location, stderr=True)
        if finished is not None:
            return finished
        refused = _refusals(names, state, revision, backend.location)
        if refused:
            raise InputError(refused)
        before = {n: state.deployments[n].model_copy(deep=True) for n in names if n in state.deployments}
        held = {n: r.operator for n, r in before.items() if r.operator is not None}
        save = frozenset(n for n in names if not activate and (n not in before or n in held))
        for n in held:  # planned as if not held: deploy saves (or, with --activate, starts) the new revision
            state.deployments[n].operator = None
        kept: Kept = {}
        result, failures = plan_for(loaded.desired, inventory, state, backend, options, parallel, tuple(names),
                                     checkouts=pinner.checkouts, ahead=ahead, keep=kept)  # fmt: skip
        if result.problems:  # what cannot be deployed, and why (seed 003's deploy shows no plan otherwise)
            show_plan(result, stderr=True)
        report_failures(failures)
        if result.refused:
            return 1
        starting = [n for n in names if n not in save]
        for n in starting:
            if not any(r.checkpoint_digest for r in (before[n].replicas if n in before else [])):
                say(waiting_for_digest(n))
        run = Deploying(operation=new_id(), save_only=save, fingerprint=frozenset(starting))
        code = 0
        if result.has_changes:
            code = execute(result, inventory, backend, state, options, command, None, request.id, fanout=parallel,
                           transports=kept, deploy=run)  # fmt: skip
        code = code or (1 if failures or result.problems else 0)
        verbs = Verbs(backend=backend, inventory=inventory, options=options, progress=_progress)
        try:
            if save:
                verbs.hold_saved(read_state(backend), sorted(save), run.operation, held)
            if activate and held and code == 0:
                verbs.release(read_state(backend), sorted(held))
        finally:
            verbs.close()
        if code == 0:
            _report(read_state(backend), names, before, activate, run.operation)
        return code


def _progress(line: str) -> None:
    sys.stderr.write(line + "\n")


def _report(state: State, names: list[str], before: dict[str, DeploymentRecord], activate: bool,
            operation: str) -> None:  # fmt: skip
    """Seed 003's block for each deployment: `Deployed NAME: ready` after --activate, else `Deployment NAME created
    (revision 1)` or `updated (revision 2)` (`unchanged` when its documents did not change)."""
    for i, name in enumerate(names):
        rec = state.deployments.get(name)
        if rec is None:
            continue
        if i:
            say()
        if activate:
            serving = [r for r in rec.replicas if r.status == "serving"]
            wanted = rec.spec.replicas_min if rec.spec is not None else len(rec.replicas)
            say("\n".join(deployed_block(
                name, rec.revision, sorted({r.host for r in serving}), len(serving), max(wanted, len(serving)),
                startup_text(startup_status(rec)), rec.plan.context_length if rec.plan else None,
                rec.last_operation or "-",
            )))  # fmt: skip
            continue
        digest = digest_text(r.checkpoint_digest for r in rec.replicas)
        verb = saved_verb(before.get(name), rec)
        say("\n".join(saved_block(name, verb, rec.revision, rec.id, operation, digest)))


__all__ = ["deploy"]
