"""What the commands share: loading documents and the inventory, SSH options, reporting host failures."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from engine_ctl.cli.output import console
from engine_ctl.core.diagnostics import Diagnostic, InputError, Location
from engine_ctl.core.documents.inventory import Inventory, load_inventory
from engine_ctl.core.documents.loader import LoadResult, load_paths
from engine_ctl.core.documents.rules import check, check_hosts
from engine_ctl.core.model import LoadedDeployment

if TYPE_CHECKING:  # the transport is imported by the commands that reach hosts, not by validate
    from engine_ctl.shell.transport import HostFailure, SSHOptions

F = TypeVar("F", bound=Callable[..., Any])


ENVIRONMENT: dict[str, str] = {
    "--state": "ENGINE_CTL_STATE",
    "--inventory": "ENGINE_CTL_INVENTORY",
    "--parallel": "ENGINE_CTL_PARALLEL",
    "--lock-timeout": "ENGINE_CTL_LOCK_TIMEOUT",
    "--accept-new-host-keys": "ENGINE_CTL_ACCEPT_NEW_HOST_KEYS",
    "--target": "ENGINE_CTL_TARGET",
}
"""Every global option and the environment variable that sets it (as CI systems expect); the flag wins over
the variable, `--help` shows each one, and a bad value is refused naming the variable."""


def inventory_option(f: F) -> F:
    return click.option(
        "--inventory",
        "inventory_path",
        type=click.Path(path_type=Path),
        envvar=ENVIRONMENT["--inventory"],
        show_envvar=True,
        help="The hosts file (default: a hosts.yaml among PATHS, else ./hosts.yaml).",
    )(f)


def ssh_options(f: F) -> F:
    f = click.option(
        "--accept-new-host-keys",
        is_flag=True,
        envvar=ENVIRONMENT["--accept-new-host-keys"],
        show_envvar=True,
        help="Accept and record host keys of hosts not yet known (never a changed key); the variable takes "
        "1/0, true/false, yes/no.",
    )(f)
    f = click.option(
        "--parallel",
        default=32,
        show_default=True,
        type=click.IntRange(min=1),
        envvar=ENVIRONMENT["--parallel"],
        show_envvar=True,
        help="Hosts contacted at once.",
    )(f)
    return f


def ssh_settings(accept_new_host_keys: bool) -> SSHOptions:
    from engine_ctl.shell.transport import SSHOptions

    return SSHOptions(accept_new_host_keys=accept_new_host_keys)


def load_checked(paths: tuple[Path, ...], *, documents_required: bool = True) -> LoadResult:
    """Load documents and refuse invalid ones (exit 1 with located diagnostics). Loading no deployment or model
    document at all is an error that says what was searched (never a plan that the hosts match nothing)."""
    result = load_paths(list(paths) or [Path(".")])
    diagnostics = result.diagnostics + check(result.desired, frozenset(result.broken_models))
    errors = [d for d in diagnostics if d.severity == "error"]
    warnings = [d for d in diagnostics if d.severity == "warning"]
    err = console(stderr=True)
    note = result.skipped_note()
    if note:
        err.print(note)
    for w in warnings:
        err.print(w.render())
    if errors:
        raise InputError(errors)
    if documents_required and not result.has_documents:
        raise InputError([no_documents(result)])
    return result


def no_documents(result: LoadResult) -> Diagnostic:
    """The error for a set of paths that held no deployment or model document: what was searched and found."""
    searched = ", ".join(result.searched) or "."
    found = [f"{f} ({what})" for f, what in sorted(result.skipped.items())]
    found += [f"{f} (an inventory)" for f, kinds in sorted(result.documents.items()) if kinds == ["inventory"]]
    seen = f"; found only {', '.join(found)}" if found else ""
    return Diagnostic(
        Location(searched),
        "",
        f"no deployment or model document was loaded from {searched}{seen}",
        hint="pass the directory or files that hold the documents (*.yaml, *.yml, *.json); "
        "to remove every deployment, use engine-ctl destroy",
    )


def load_for_plan(paths: tuple[Path, ...]) -> tuple[LoadResult, list[Diagnostic]]:
    """Load documents for `plan`: one bad document never blocks the others' plan. The errors are printed and
    returned; the deployments they touch are left out of what is planned (and, being absent, held: the planner
    destroys nothing while any document has errors)."""
    result = load_paths(list(paths) or [Path(".")])
    diagnostics = result.diagnostics + check(result.desired, frozenset(result.broken_models))
    errors = [d for d in diagnostics if d.severity == "error"]
    err = console(stderr=True)
    note = result.skipped_note()
    if note:
        err.print(note)
    for d in sorted(diagnostics, key=lambda d: d.severity != "error"):
        err.print(d.render())
    if not result.has_documents:  # nothing to plan: never "No changes"
        raise InputError([no_documents(result)])
    if not errors:
        return result, []
    models = frozenset(result.broken_models)

    def sound(ld: LoadedDeployment) -> bool:
        """No error of its own, and its model loaded (a broken Model document takes its deployments along)."""
        if result.desired.model(ld.deployment.model) is None:
            return False
        alone = result.desired.model_copy(update={"deployments": (ld,)})
        return not any(d.severity == "error" for d in check(alone, models))

    good = tuple(ld for ld in result.desired.deployments if sound(ld))
    result.desired = result.desired.model_copy(update={"deployments": good})
    return result, errors


def resolve_inventory(explicit: Path | None, loaded: LoadResult | None) -> Inventory:
    """The inventory; with documents, each spec.host must name one of its hosts (a did-you-mean otherwise)."""
    inventory = _find_inventory(explicit, loaded)
    if loaded is not None:
        wrong = check_hosts(loaded.desired, [h.name for h in inventory.hosts], inventory.file)
        if wrong:
            raise InputError(wrong)
    return inventory


def _find_inventory(explicit: Path | None, loaded: LoadResult | None) -> Inventory:
    if explicit is not None:
        return load_inventory(explicit)
    if loaded is not None and loaded.inventory is not None:
        return loaded.inventory
    default = Path("hosts.yaml")
    if default.exists():
        return load_inventory(default)
    raise InputError(
        [Diagnostic(Location("hosts.yaml"), "", "no inventory", hint="pass --inventory hosts.yaml (see the README)")]
    )


def report_failures(failures: dict[str, HostFailure]) -> None:
    err = console(stderr=True)
    for name in sorted(failures):
        f = failures[name]
        err.print(f"error: host {name}: {f.kind}: {f.message}")
        if f.hint:
            err.print(f"  hint: {f.hint}")
