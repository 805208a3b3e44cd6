"""`engine-ctl stop|start|park|delete [deployment] NAME`: the operator verbs (engine_ctl.shell.lifecycle.verbs)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import click
from click.shell_completion import CompletionItem

from engine_ctl.cli.common import find_inventory, inventory_option, ssh_options, ssh_settings
from engine_ctl.cli.completion import deployment_names
from engine_ctl.cli.context import backend_for, lock_timeout_option, no_state_hint, state_exists, state_option
from engine_ctl.cli.requests import recorded_verb
from engine_ctl.cli.views.output import emit_json
from engine_ctl.core.diagnostics import Diagnostic, InputError, Location, error_object
from engine_ctl.core.plan.deploy import waiting_for_digest
from engine_ctl.core.plan.operator import STOP_WAIT_S
from engine_ctl.core.record.model import StateError
from engine_ctl.shell.gateway.runtime import GatewayFailure
from engine_ctl.shell.lifecycle.hosts import OperatorFailure
from engine_ctl.shell.lifecycle.verbs import Outcome, Refused, Verbs
from engine_ctl.shell.transport import HostFailure

FORMAT_VERSION = 1
"""The version of the verbs' --json documents."""
JSON_MODE: list[bool] = [False]
"""--json for this process's one verb: its outcome (or error) as one JSON document on stdout, no text there."""


def say(line: str = "") -> None:
    if JSON_MODE[0]:
        return
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def fail(message: str, code: str | None = None, status: int = 1) -> NoReturn:
    if JSON_MODE[0]:  # the shape of every command's --json error (core.diagnostics.error_object)
        detail = Diagnostic(Location(""), "", message, code="operator_failed")
        if code:  # the verb's own refusal code (still_stopping, unknown_deployment, …)
            detail = Diagnostic(Location(""), "", message, code=code)
        emit_json(error_object([detail]))
    sys.stderr.write((f"error [{code}]: " if code else "error: ") + message + "\n")
    sys.exit(status)


def outcome_json(verb: str, name: str, out: Outcome) -> None:
    """The verb's result for scripts: stable field names, with --json."""
    if JSON_MODE[0]:
        emit_json({
            "format_version": FORMAT_VERSION, "verb": verb, "deployment": name, "operation": out.operation,
            "ready": out.ready, "replicas": out.replicas, "hosts": out.hosts, "note": out.note or None,
        })  # fmt: skip


def _progress(line: str) -> None:
    sys.stderr.write(line + "\n")


def _json_option(f: Any) -> Any:
    def switch(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
        JSON_MODE[0] = value
        return value

    return click.option("--json", "as_json", is_flag=True, expose_value=False, is_eager=True, callback=switch,
                        help="The outcome as one JSON document on stdout (verb, deployment, operation, ready, "
                        "replicas, hosts, note), or {\"error\": {code, message}}.")(f)  # fmt: skip


def verb_options(f: Any) -> Any:
    for option in (lock_timeout_option, ssh_options, state_option, inventory_option, _json_option):
        f = option(f)
    return click.argument("name", shell_complete=deployment_names)(f)


def _verbs(state_path: str | None, inventory_path: Path | None, accept_new_host_keys: bool,
           lock_timeout: float) -> Verbs:  # fmt: skip
    backend = backend_for(state_path, ())
    if not state_exists(backend):  # never a state made here: a verb acts on what an apply recorded
        why = f"no state at {backend.location}: nothing was applied from here"
        raise InputError([Diagnostic(Location(backend.location), "", why, hint=no_state_hint(backend),
                                     code="state_error")])  # fmt: skip
    return Verbs(
        backend=backend, inventory=find_inventory(inventory_path, None),
        options=ssh_settings(accept_new_host_keys), progress=_progress,
        lock_timeout=lock_timeout,
    )  # fmt: skip


def _run(verbs: Verbs, action: Callable[[], Outcome]) -> Outcome:
    """The verb, with its refusals and failures as one `error` line each and their exit status."""
    try:
        return action()
    except Refused as exc:
        fail(exc.message, exc.code, exc.exit_status)
    except (OperatorFailure, StateError) as exc:
        fail(str(exc))
    except HostFailure as exc:
        fail(f"host {exc.host}: {exc.kind}: {exc.message}")
    except GatewayFailure as exc:
        fail(f"{exc}; `engine-ctl plan` shows what the gateway lacks, and `engine-ctl apply` puts it right")
    finally:
        verbs.close()


def _accepted(what: str, name: str, out: Outcome) -> None:
    outcome_json(what.lower(), name, out)
    if out.note:
        say(out.note)
        return
    say(f"{what} requested for {name}")
    say()
    say(f"  Operation   {out.operation}")


class VerbGroup(click.Group):
    """`stop deployment NAME`, and `stop NAME` the same, as `status NAME` is (a word that names no subcommand is
    the deployment's name)."""

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            args = ["deployment", *args]
        return super().resolve_command(ctx, args)

    def shell_complete(self, ctx: click.Context, incomplete: str) -> list[CompletionItem]:
        """`stop <TAB>`: the deployments of the state, beside the `deployment` subcommand."""
        return [*super().shell_complete(ctx, incomplete), *deployment_names(ctx, self, incomplete)]


def _group(name: str, help_text: str) -> click.Group:
    return VerbGroup(
        name=name, help=f"{help_text}\n\n`engine-ctl {name} NAME` and `engine-ctl {name} deployment NAME` are the "
        "same.",
        subcommand_metavar="[deployment] NAME [OPTIONS]",
    )  # fmt: skip


stop = _group("stop", "Stop a deployment's engines and keep them stopped (apply too) until `start`.")
start = _group("start", "Start a deployment an operator stopped or parked, or `deploy` saved (or lift its delete).")
park = _group(
    "park", "Take a deployment off its GPUs without losing it: asleep where its engine has a sleep mode, else stopped."
)
delete = _group("delete", "Delete a deployment's units (never its model files); the state keeps a tombstone.")


@stop.command("deployment")
@recorded_verb("stop")
@verb_options
def stop_deployment(name: str, inventory_path: Path | None, state_path: str | None, parallel: int,
                    accept_new_host_keys: bool, lock_timeout: float) -> None:  # fmt: skip
    """Stop deployment NAME (or its ID): returns once the stop is accepted, while the engine is still going away.
    The gateway answers its requests with deployment_stopped at once; apply keeps it stopped until
    `engine-ctl start`."""
    verbs = _verbs(state_path, inventory_path, accept_new_host_keys, lock_timeout)
    name = verbs.name_of(name)
    _accepted("Stop", name, _run(verbs, lambda: verbs.stop(name)))


@start.command("deployment")
@recorded_verb("start")
@verb_options
@click.option("--wait", is_flag=True, help=f"Wait (at most {STOP_WAIT_S}s) for a stop to finish (or, for a deployment "
              "`deploy` saved, for its checkpoint digest), start, and return when the engine answers.")  # fmt: skip
def start_deployment(name: str, inventory_path: Path | None, state_path: str | None, parallel: int,
                     accept_new_host_keys: bool, lock_timeout: float, wait: bool) -> None:  # fmt: skip
    """Start deployment NAME again. Right after a stop it is refused (exit 25, still_stopping) unless --wait."""
    verbs = _verbs(state_path, inventory_path, accept_new_host_keys, lock_timeout)
    name = verbs.name_of(name)

    def waiting(verb: str) -> None:
        say(waiting_line(verb, name))

    out = _run(verbs, lambda: verbs.start(name, wait, waiting))
    if out.note or out.ready:
        outcome_json("start", name, out)
    if out.note:
        say(out.note)
    elif out.ready:
        say(f"Started {name}: ready")
        say()
        say(f"  Ready       {out.ready}/{out.replicas}")
        say(f"  Hosts       {', '.join(out.hosts)}")
        say("  Operation   initialize succeeded")
    else:
        _accepted("Start", name, out)


def waiting_line(verb: str, name: str) -> str:
    """What `start --wait` waits for: a stop to finish (seed 003's words), a park before the wake, or a saved
    deployment's checkpoint digest (core.plan.deploy)."""
    if verb == "digest":
        return waiting_for_digest(name)
    if verb == "park":
        return f"Waking {name} from its park (waiting at most {STOP_WAIT_S}s for the park to finish first)"
    return f"Waiting for the stop of {name} to finish (at most {STOP_WAIT_S}s)"


@park.command("deployment")
@recorded_verb("park")
@verb_options
def park_deployment(name: str, inventory_path: Path | None, state_path: str | None, parallel: int,
                    accept_new_host_keys: bool, lock_timeout: float) -> None:  # fmt: skip
    """Park deployment NAME by its residency: an engine with a sleep mode sleeps (parked: level 1 keeps the weights
    in host RAM; deep: level 2 drops them), one without stops (restart_only). Returns once the park is accepted;
    status shows parking, then parked; `engine-ctl start` wakes it."""
    verbs = _verbs(state_path, inventory_path, accept_new_host_keys, lock_timeout)
    name = verbs.name_of(name)
    _accepted("Park", name, _run(verbs, lambda: verbs.park(name)))


@delete.command("deployment")
@recorded_verb("delete")
@verb_options
@click.option("--stop", "and_stop", is_flag=True, help="Stop it first and wait for the stop to finish.")
def delete_deployment(name: str, inventory_path: Path | None, state_path: str | None, parallel: int,
                      accept_new_host_keys: bool, lock_timeout: float, and_stop: bool) -> None:  # fmt: skip
    """Delete deployment NAME: its units are removed, its model files never touched. Refused
    (delete_requires_cleanup) until a stop has finished; --stop stops it and waits. The state keeps a tombstone:
    no plan re-creates it while its document is still there."""
    verbs = _verbs(state_path, inventory_path, accept_new_host_keys, lock_timeout)
    name = verbs.name_of(name)

    def waiting() -> None:
        say(f"Waiting for the stop of {name} to finish (at most {STOP_WAIT_S}s)")

    out = _run(verbs, lambda: verbs.delete(name, and_stop, waiting))
    outcome_json("delete", name, out)
    if out.note:
        say(out.note)
        return
    say(f"Deleted {name}")
    say()
    say(f"  Operation   {out.operation}")
    say(f"its units are removed and its model files kept; remove its document (the next apply forgets it), or run "
        f"`engine-ctl start deployment {name}` and apply to bring it back")  # fmt: skip


__all__ = ["delete", "park", "start", "stop"]
