"""What the commands share: loading documents and the inventory, SSH options, reporting host failures."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from engine_ctl.cli.environments import (
    VARIABLE,
    beside,
    current_env,
    env_of_inventory,
    env_option,
    inventory_names,
    project_root,
)
from engine_ctl.cli.views.output import console
from engine_ctl.core.diagnostics import Diagnostic, InputError, Location, by_place
from engine_ctl.core.documents.inventory import Inventory, load_inventory
from engine_ctl.core.documents.loader import LoadResult, load_paths
from engine_ctl.core.documents.rules import check, check_hosts
from engine_ctl.core.model import DesiredState, LoadedDeployment

if TYPE_CHECKING:  # the transport is imported by the commands that reach hosts, not by validate
    from engine_ctl.shell.transport import HostFailure, SSHOptions

F = TypeVar("F", bound=Callable[..., Any])


ENVIRONMENT: dict[str, str] = {
    "--state": "ENGINE_CTL_STATE",
    "--inventory": "ENGINE_CTL_INVENTORY",
    "--fanout": "ENGINE_CTL_FANOUT",
    "--lock-timeout": "ENGINE_CTL_LOCK_TIMEOUT",
    "--accept-new-host-keys": "ENGINE_CTL_ACCEPT_NEW_HOST_KEYS",
    "--target": "ENGINE_CTL_TARGET",
    "--env": VARIABLE,
}
"""Every global option and the environment variable that sets it (as CI systems expect); the flag wins over
the variable, `--help` shows each one, and a bad value is refused naming the variable."""

DEPRECATED = {"--parallel": ("ENGINE_CTL_PARALLEL", "--fanout", "ENGINE_CTL_FANOUT")}
"""Old names kept for one release: old flag -> (its variable, the new flag, the new variable). `--parallel` was
renamed `--fanout` so that hosts contacted at once is never confused with a deployment's spec.parallel."""


def inventory_option(f: F) -> F:
    f = click.option(
        "--inventory",
        "inventory_path",
        type=click.Path(path_type=Path),
        envvar=ENVIRONMENT["--inventory"],
        show_envvar=True,
        help="The hosts file (default: hosts.yaml beside the documents, else ./hosts.yaml; with --env NAME, "
        "hosts.NAME.yaml).",
    )(f)
    return env_option(f)


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
        "--fanout",
        "parallel",
        default=32,
        show_default=True,
        type=click.IntRange(min=1),
        envvar=ENVIRONMENT["--fanout"],
        show_envvar=True,
        callback=_fanout,
        help="Hosts contacted at once (over SSH; not a deployment's spec.parallel).",
    )(f)
    f = click.option(
        "--parallel",
        "deprecated_parallel",
        type=click.IntRange(min=1),
        envvar=DEPRECATED["--parallel"][0],
        show_envvar=True,  # a bad value names the variable
        hidden=True,
        expose_value=False,
        is_eager=True,  # seen before --fanout, which takes its value when --fanout is not given
        callback=_deprecated_parallel,
    )(f)
    return f


_OLD_FANOUT = "engine_ctl.deprecated_parallel"


def _deprecated_parallel(ctx: click.Context, param: click.Parameter, value: int | None) -> None:
    """`--parallel N` / ENGINE_CTL_PARALLEL: still read for a release, with a note on stderr to use the new name."""
    if value is None:
        return
    source = ctx.get_parameter_source(param.name or "")
    variable, flag, new_variable = DEPRECATED["--parallel"]
    old, new = (variable, new_variable) if source == click.core.ParameterSource.ENVIRONMENT else ("--parallel", flag)
    console(stderr=True).print(
        f"warning: {old} is deprecated and will be removed in the next release: use {new} "
        "(hosts contacted at once; spec.parallel is a deployment's requests at once)"
    )
    ctx.meta[_OLD_FANOUT] = (value, source)


def _fanout(ctx: click.Context, param: click.Parameter, value: int) -> int:
    """--fanout's value: the old name's when --fanout is not given, or only by its variable while the old flag
    is (the flag wins over any variable)."""
    old = ctx.meta.get(_OLD_FANOUT)
    if old is None:
        return value
    old_value, old_source = old
    source = ctx.get_parameter_source(param.name or "")
    ParameterSource = click.core.ParameterSource
    if source == ParameterSource.DEFAULT or (
        source == ParameterSource.ENVIRONMENT and old_source == ParameterSource.COMMANDLINE
    ):
        return int(old_value)
    return value


def ssh_settings(accept_new_host_keys: bool) -> SSHOptions:
    from engine_ctl.shell.transport import SSHOptions

    return SSHOptions(accept_new_host_keys=accept_new_host_keys)


Pin = Callable[[DesiredState], tuple[DesiredState, list[Diagnostic]]]
"""Pins the documents' hf: references (engine_ctl.shell.pinning.Pinner): plan and apply pin, the others don't."""


def _loaded(paths: tuple[Path, ...], pin: Pin | None) -> tuple[LoadResult, list[Diagnostic]]:
    """Load, pin (when asked) and check: the result and every diagnostic."""
    result = load_paths(list(paths) or [Path(".")])
    pinned: list[Diagnostic] = []
    if pin is not None:
        result.desired, pinned = pin(result.desired)
    said = {(d.location, d.field) for d in pinned}  # the hub's refusal says it: not also "no commit" there
    checked = [d for d in check(result.desired, frozenset(result.broken_models)) if (d.location, d.field) not in said]
    return result, result.diagnostics + pinned + checked


def load_checked(paths: tuple[Path, ...], *, documents_required: bool = True, pin: Pin | None = None) -> LoadResult:
    """Load documents and refuse invalid ones (exit 1 with located diagnostics). Loading no deployment or model
    document at all is an error that says what was searched (never a plan that the hosts match nothing)."""
    result, diagnostics = _loaded(paths, pin)
    errors = [d for d in diagnostics if d.severity == "error"]
    warnings = [d for d in diagnostics if d.severity == "warning"]
    err = console(stderr=True)
    note = result.skipped_note()
    if note:
        err.print(note)
    for w in by_place(warnings):
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
        code="no_documents",
    )


def load_for_plan(paths: tuple[Path, ...], pin: Pin | None = None) -> tuple[LoadResult, list[Diagnostic]]:
    """Load documents for `plan`: one bad document never blocks the others' plan. The errors are printed and
    returned; the deployments they touch are left out of what is planned (and, being absent, held: the planner
    destroys nothing while any document has errors)."""
    result, diagnostics = _loaded(paths, pin)
    errors = [d for d in diagnostics if d.severity == "error"]
    err = console(stderr=True)
    note = result.skipped_note()
    if note:
        err.print(note)
    for d in by_place(diagnostics):
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


def resolve_inventory(explicit: Path | None, loaded: LoadResult | None, known: Inventory | None = None) -> Inventory:
    """The inventory; with documents, each spec.host must name one of its hosts (a did-you-mean otherwise).
    `known`: the --inventory file already loaded (by plan_cmd.connect_early), not read again."""
    inventory = known if known is not None and explicit is not None else find_inventory(explicit, loaded)
    if loaded is not None:
        wrong = check_hosts(loaded.desired, [h.name for h in inventory.hosts], inventory.file)
        if wrong:
            raise InputError(wrong)
    return inventory


def find_inventory(explicit: Path | None, loaded: LoadResult | None) -> Inventory:
    """--inventory; else, for the environment (--env NAME: hosts.NAME.yaml; none: hosts.yaml), the one among the
    documents, then the one beside them, then the one in the current directory, then the one in the project's root
    above them (environments.project_root: where the state is found too). Another environment's inventory
    (hosts.production.yaml) is never taken for this one's."""
    if explicit is not None:
        return load_inventory(explicit)
    env = current_env()
    names = inventory_names(env)
    if loaded is not None:
        own = [inv for f, inv in loaded.inventories.items() if env_of_inventory(f) == env]
        if env is None:  # an inventory passed by any name is the default environment's, unless named for one
            own = [inv for f, inv in loaded.inventories.items() if env_of_inventory(f) is None]
        if own:
            return own[-1]
    searched = beside([Path(p) for p in loaded.searched]) if loaded is not None else []
    places = [*searched, Path(".")]
    for directory in dict.fromkeys([*places, *(project_root(d) for d in places)]):  # then up, as the state is found
        for name in names:
            if (directory / name).is_file():
                return load_inventory(directory / name)
    where = ", ".join(dict.fromkeys(str(d) for d in [*searched, Path(".")]))
    others = sorted({e for d in [*searched, Path(".")] for f in _listed(d) if (e := env_of_inventory(f))} - {env})
    hint = f"pass --inventory FILE, or write {names[0]} (see the README)"
    if others:
        hint = f"environments found: {', '.join(others)}; choose one with --env NAME (or {VARIABLE}), or " + hint
    message = f"no inventory: no {names[0]} in {where}" + (f" for environment {env!r}" if env else "")
    raise InputError([Diagnostic(Location(names[0]), "", message, hint=hint, code="no_inventory")])


def _listed(directory: Path) -> list[str]:
    try:
        return [p.name for p in directory.iterdir()]
    except OSError:
        return []


def report_failures(failures: dict[str, HostFailure]) -> None:
    err = console(stderr=True)
    for name in sorted(failures):
        f = failures[name]
        err.print(f"error: host {name}: {f.kind}: {f.message}")
        if f.hint:
            err.print(f"  hint: {f.hint}")
