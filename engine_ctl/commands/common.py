"""What the commands share: loading documents and the inventory, SSH options, reporting host failures."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from engine_ctl.diagnostics import Diagnostic, InputError, Location
from engine_ctl.inventory import Inventory, load_inventory
from engine_ctl.loader import LoadResult, load_paths
from engine_ctl.model import LoadedDeployment
from engine_ctl.output import console
from engine_ctl.rules import check
from engine_ctl.transport import HostFailure, SSHOptions

F = TypeVar("F", bound=Callable[..., Any])


def inventory_option(f: F) -> F:
    return click.option(
        "--inventory",
        "inventory_path",
        type=click.Path(path_type=Path),
        help="The hosts file (default: a hosts.yaml among PATHS, else ./hosts.yaml).",
    )(f)


def ssh_options(f: F) -> F:
    f = click.option(
        "--accept-new-host-keys",
        is_flag=True,
        help="Accept and record host keys of hosts not yet known (never a changed key).",
    )(f)
    f = click.option("--parallel", default=32, show_default=True, help="Hosts contacted at once.")(f)
    return f


def ssh_settings(accept_new_host_keys: bool) -> SSHOptions:
    return SSHOptions(accept_new_host_keys=accept_new_host_keys)


def load_checked(paths: tuple[Path, ...]) -> LoadResult:
    """Load documents and refuse invalid ones (exit 1 with located diagnostics)."""
    result = load_paths(list(paths) or [Path(".")])
    diagnostics = result.diagnostics + check(result.desired, frozenset(result.broken_models))
    errors = [d for d in diagnostics if d.severity == "error"]
    warnings = [d for d in diagnostics if d.severity == "warning"]
    err = console(stderr=True)
    for w in warnings:
        err.print(w.render())
    if errors:
        raise InputError(errors)
    return result


def load_for_plan(paths: tuple[Path, ...]) -> tuple[LoadResult, list[Diagnostic]]:
    """Load documents for `plan`: one bad document never blocks the others' plan. The errors are printed and
    returned; the deployments they touch are left out of what is planned (and, being absent, held: the planner
    destroys nothing while any document has errors)."""
    result = load_paths(list(paths) or [Path(".")])
    diagnostics = result.diagnostics + check(result.desired, frozenset(result.broken_models))
    errors = [d for d in diagnostics if d.severity == "error"]
    err = console(stderr=True)
    for d in sorted(diagnostics, key=lambda d: d.severity != "error"):
        err.print(d.render())
    if not errors:
        return result, []
    models = frozenset(result.broken_models)

    def sound(ld: LoadedDeployment) -> bool:
        alone = result.desired.model_copy(update={"deployments": (ld,)})
        return not any(d.severity == "error" for d in check(alone, models))

    good = tuple(ld for ld in result.desired.deployments if sound(ld))
    result.desired = result.desired.model_copy(update={"deployments": good})
    return result, errors


def resolve_inventory(explicit: Path | None, loaded: LoadResult | None) -> Inventory:
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
