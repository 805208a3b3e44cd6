"""Environments (`--env NAME`, ENGINE_CTL_ENV): staging and production from one repository, as Kamal's
destinations and Terraform's workspaces allow. An environment chooses its inventory, `hosts.NAME.yaml` beside
the documents, and a state of its own in the state's backend; the documents are shared."""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])

VARIABLE = "ENGINE_CTL_ENV"
NAME_RULE = re.compile(r"[a-z0-9][a-z0-9_-]{0,39}")
INVENTORY_FILE = re.compile(r"hosts\.([a-z0-9][a-z0-9_-]{0,39})\.ya?ml")
_ENV = r"(\.[a-z0-9][a-z0-9_-]{0,39})?"
PROJECT_MARKER = re.compile(rf"hosts{_ENV}\.ya?ml|engine-ctl{_ENV}\.state\.json")
"""What makes a directory a project's root: an inventory (hosts.yaml, hosts.NAME.yaml) or a state
(engine-ctl.state.json, engine-ctl.NAME.state.json), of any environment."""
_META = "engine_ctl.env"


def _remember(ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    if value is not None and value != "" and not NAME_RULE.fullmatch(value):
        raise click.BadParameter(f"{value!r}: an environment is lowercase letters, digits, '-' and '_' (e.g. staging)")
    ctx.meta[_META] = value or None
    return value


def env_option(f: F) -> F:
    """--env NAME on a command (once, however many of its option groups ask for it)."""
    if any(p.name == "env" for p in getattr(f, "__click_params__", [])):
        return f
    return click.option(
        "--env",
        "env",
        metavar="NAME",
        envvar=VARIABLE,
        show_envvar=True,
        expose_value=False,
        is_eager=True,
        callback=_remember,
        help="The environment (e.g. staging, production): its inventory is hosts.NAME.yaml beside the documents "
        "and its state its own (engine-ctl.NAME.state.json, or NAME's state in the --state backend).",
    )(f)


def current_env() -> str | None:
    """The environment the running command was given (None: the default one)."""
    ctx = click.get_current_context(silent=True)
    return ctx.meta.get(_META) if ctx is not None else None


def env_of_inventory(file: str | Path) -> str | None:
    """`hosts.staging.yaml` -> 'staging': the inventory of an environment (None for any other file)."""
    found = INVENTORY_FILE.fullmatch(Path(file).name)
    return found.group(1) if found else None


def inventory_names(env: str | None) -> tuple[str, ...]:
    return (f"hosts.{env}.yaml", f"hosts.{env}.yml") if env else ("hosts.yaml", "hosts.yml")


def state_file_name(env: str | None, default: str) -> str:
    """engine-ctl.state.json -> engine-ctl.staging.state.json."""
    if not env:
        return default
    head, dot, rest = default.partition(".")
    return f"{head}.{env}.{rest}" if dot else f"{default}.{env}"


def state_for_env(location: str, env: str | None) -> str:
    """The environment's own state in the backend `location` names: a file x.json -> x.NAME.json; a PostgreSQL
    state postgresql://…#name -> #name-NAME (without #name: the state named NAME)."""
    if not env:
        return location
    if location.startswith(("postgresql://", "postgres://")):
        dsn, _, name = location.partition("#")
        return f"{dsn}#{name}-{env}" if name else f"{dsn}#{env}"
    path = Path(location)
    if path.suffix:
        return str(path.with_name(f"{path.stem}.{env}{path.suffix}"))
    return f"{location}.{env}"


def _shared_places() -> set[Path]:
    """Directories that are never a project's root when reached by walking up: the filesystem's root, the home
    directory and the temporary directory (a stray hosts.yaml there must not join unrelated projects)."""
    places = {Path("/"), Path(tempfile.gettempdir()).resolve()}
    home = os.environ.get("HOME")
    if home:
        places.add(Path(home).resolve())
    return places


def is_project_root(directory: Path) -> bool:
    try:
        return any(PROJECT_MARKER.fullmatch(p.name) and p.is_file() for p in directory.iterdir())
    except OSError:
        return False


def project_root(start: Path) -> Path:
    """Where the state lives, found as git finds its repository: `start` (the documents' directory, or the current
    one) if it holds an inventory or a state (PROJECT_MARKER), else the nearest directory above it that does. The
    walk stops at a repository's root (a directory holding .git) and never takes the filesystem's root, the home
    or the temporary directory; with no such directory, `start` itself."""
    here = start.resolve()
    if is_project_root(here):
        return start
    shared = _shared_places()
    probe = here
    while not (probe / ".git").exists() and probe.parent != probe:
        probe = probe.parent
        if probe in shared:
            break
        if is_project_root(probe):
            return probe
    return start


def states_below(directory: Path, name: str) -> list[Path]:
    """The state files `name` in the directories right below `directory`: where an engine-ctl before the project's
    root rule wrote them (beside the documents, deploy/engine-ctl.state.json), for the hint of a command that finds
    none here."""
    try:
        return sorted(d / name for d in directory.iterdir() if d.is_dir() and (d / name).is_file())
    except OSError:
        return []


def beside(paths: tuple[Path, ...] | list[Path]) -> list[Path]:
    """The directories the documents are in: each directory given, and the directory of each file given."""
    out: list[Path] = []
    for p in paths or [Path(".")]:
        d = p if p.is_dir() else p.parent
        if d not in out:
            out.append(d)
    return out


__all__ = [
    "VARIABLE",
    "beside",
    "current_env",
    "env_of_inventory",
    "env_option",
    "inventory_names",
    "project_root",
    "state_file_name",
    "state_for_env",
    "states_below",
]
