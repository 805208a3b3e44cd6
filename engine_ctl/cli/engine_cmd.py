"""`engine-ctl engine list` and `engine-ctl engine add` (seed 003, "Add an engine"): the engines the inventory
registers, with their builds, versions and the hosts that have them; and registering a new build in the
inventory, its version (as the hosts report it) recorded as the pin."""

from __future__ import annotations

import os
import re
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click

from engine_ctl.cli.common import inventory_option, report_failures, resolve_inventory, ssh_options, ssh_settings
from engine_ctl.cli.views.output import console, emit_json
from engine_ctl.core.diagnostics import Diagnostic, InputError, Location

if TYPE_CHECKING:
    from rich.table import Table

    from engine_ctl.core.documents.inventory import Host
    from engine_ctl.core.plan.enginelist import EngineRow

FORMAT_VERSION = 1


@click.group(name="engine")
def engine() -> None:
    """The engines the inventory registers: `list` them with their builds, versions and hosts; `add` a build."""


@engine.command(name="list")
@click.argument("hosts", nargs=-1)
@inventory_option
@ssh_options
@click.option("--json", "as_json", is_flag=True, help="A versioned JSON document: one entry per build and version.")
def list_engines(
    hosts: tuple[str, ...], inventory_path: Path | None, parallel: int, accept_new_host_keys: bool, as_json: bool
) -> None:
    """Every engine build the inventory registers (on HOSTS, default all): ENGINE BUILD VERSION SHA256 HOSTS, the
    path below each; the hosts that register a build and lack it are named. Exit 1 if a host could not be asked."""
    from engine_ctl.core.plan.enginelist import engine_rows
    from engine_ctl.shell.gather import gather

    inventory = resolve_inventory(inventory_path, None)
    selected = inventory.select(list(hosts))
    found, failures = gather(selected, ssh_settings(accept_new_host_keys), parallel=parallel)
    rows = engine_rows(selected, found)
    if as_json:
        emit_json({"format_version": FORMAT_VERSION, "engines": [r.model_dump(mode="json") for r in rows],
                   "failures": {n: failures[n].as_json() for n in sorted(failures)}})  # fmt: skip
    else:
        out = console()
        out.print(engine_table(rows) if rows else "No engine is registered in the inventory (engines: in hosts.yaml)")
        report_failures(failures)
    sys.exit(1 if failures else 0)


def engine_table(rows: list[EngineRow]) -> Table:
    """ENGINE BUILD VERSION SHA256 PATH HOSTS; a pinned version says so, and HOSTS names those that register the
    build and lack it, and those not asked."""
    from rich.table import Table

    table = Table(box=None, pad_edge=False)
    for col in ("ENGINE", "BUILD", "VERSION", "SHA256"):
        table.add_column(col, no_wrap=True)
    table.add_column("PATH", overflow="fold")
    table.add_column("HOSTS", overflow="fold", ratio=1)
    for r in rows:
        version = (r.version or "-") + (" (pinned)" if r.pinned.get("version") else "")
        hosts = [", ".join(r.hosts) or "-"]
        hosts += [f"not at this path: {', '.join(r.missing)}"] if r.missing else []
        hosts += [f"not asked: {', '.join(r.unknown)}"] if r.unknown else []
        table.add_row(r.engine, r.build, version, (r.sha256 or "-")[:12], r.path, "; ".join(hosts))
    return table


@engine.command(name="add")
@click.argument("name")
@click.argument("path")
@click.option("--build", "build", default=None, help="The platform the build is for (cuda, rocm, vulkan, metal, cpu); "
              "default: each host's own (its GPUs' build, or cpu).")  # fmt: skip
@click.option("--host", "on_hosts", multiple=True, help="Register it for this host only (repeatable); default: "
              "every host, in the inventory's defaults.")  # fmt: skip
@click.option("--decisions", is_flag=True, default=None, help="Register the build as serving decision models.")
@inventory_option
@ssh_options
def add_engine(
    name: str, path: str, build: str | None, on_hosts: tuple[str, ...], decisions: bool | None,
    inventory_path: Path | None, parallel: int, accept_new_host_keys: bool,
) -> None:  # fmt: skip
    """Register PATH as a build of engine NAME (an engine's name or alias) in the inventory: each host it is
    for is asked first (the build must be there: its `--version` and sha256), then the inventory file is written
    with the build and, when every build of the engine reports one version, that version as its pin. Comments and
    the rest of the file are kept."""
    from engine_ctl.providers import PROVIDERS, canonical_engine

    engine_name = canonical_engine(name)
    if engine_name not in PROVIDERS:
        refuse("name", f"engine {name!r}: one of {', '.join(PROVIDERS)}", "unknown_engine")
    if not path.startswith("/"):
        refuse("path", f"{path!r}: an absolute path of the executable on the hosts", "not_absolute")
    inventory = resolve_inventory(inventory_path, None)
    targets = inventory.select(list(on_hosts)) if on_hosts else list(inventory.hosts)
    if inventory.file is None:
        refuse("inventory", "the inventory was not read from a file: pass --inventory FILE", "no_inventory_file")
    _add(Path(inventory.file), PROVIDERS[engine_name], path, build, list(on_hosts), targets, decisions,
         ssh_settings(accept_new_host_keys), parallel)  # fmt: skip


def _add(
    file: Path, provider: Any, path: str, build: str | None, on_hosts: list[str], targets: list[Host],
    decisions: bool | None, options: Any, parallel: int,
) -> None:  # fmt: skip
    from engine_ctl.core.plan.enginelist import platforms_for
    from engine_ctl.shell.gather import gather

    asked = [h.model_copy(update={"engine_builds": {**h.engine_builds, provider.name: {"probe": path}}})
             for h in targets]  # fmt: skip
    found, failures = gather(asked, options, parallel=parallel)
    if failures:
        report_failures(failures)
        refuse("hosts", "nothing was written: every host the build is for must be asked", "host_unreachable")
    from engine_ctl.core.plan.engines import engine_at

    lacking = [h.name for h in targets if engine_at(found[h.name], path) is None]
    if lacking:
        refuse("path", f"{path} is not an executable {provider.title} on {', '.join(lacking)}: put the build there "
               "first; nothing was written", "engine_missing")  # fmt: skip
    builds = [e for h in targets if (e := engine_at(found[h.name], path)) is not None]
    versions, digests = [e.version for e in builds], [e.sha256 for e in builds]
    platforms = platforms_for(provider, [found[h.name] for h in targets], build)
    written = write_registration(file, provider, path, platforms, (versions, digests), on_hosts, decisions, found)
    out = console()
    where = f"hosts {', '.join(on_hosts)}" if on_hosts else "defaults"
    version = written.version or "unknown"
    out.print(f"Registered {provider.title} {path} ({', '.join(platforms)}) in {file} ({where}): version {version}"
              + (", pinned" if "version" in written.entry else ", not pinned: its builds report other versions"),
              markup=False, highlight=False)  # fmt: skip


def write_registration(
    file: Path, provider: Any, path: str, platforms: list[str], found: tuple[list[str | None], list[str | None]],
    on_hosts: list[str], decisions: bool | None, facts: dict[str, Any],
) -> Any:  # fmt: skip
    """The inventory file with the build registered (ruamel's round trip: comments and order kept), checked by
    loading it again before it replaces the file."""
    from ruamel.yaml import YAML
    from ruamel.yaml.comments import CommentedMap

    from engine_ctl.core.documents.inventory import load_inventory
    from engine_ctl.core.plan.enginelist import Registration, registration
    from engine_ctl.core.plan.engines import engine_at
    from engine_ctl.providers import canonical_engine

    yaml = YAML()
    yaml.preserve_quotes = True
    text = file.read_text()
    dashes = re.search(r"^( *)- ", text, re.MULTILINE)  # keep the file's own indentation of lists
    offset = len(dashes.group(1)) if dashes else 0
    yaml.indent(mapping=2, sequence=offset + 2, offset=offset)
    data = yaml.load(text)
    blocks = _blocks(data, on_hosts, file)
    last: Registration | None = None
    for block in blocks:
        engines = block.setdefault("engines", CommentedMap())
        key = next((k for k in engines if canonical_engine(str(k)) == provider.name), provider.name)
        existing = engines.get(key)
        other_paths = [str(v) for k, v in dict(existing).items() if k not in ("version", "sha256", "decisions")
                       and str(v) != path] if isinstance(existing, dict) else []  # fmt: skip
        others = [e.version for p in other_paths for hf in facts.values() if (e := engine_at(hf, p)) is not None]
        made = registration(provider, path, existing, platforms, found[0], others, found[1])
        if isinstance(made, str):
            refuse("engines", made, "engine_entry")
        entry = CommentedMap(made.entry)
        if decisions is not None:
            entry["decisions"] = decisions
        engines[key] = entry
        last = made
    fd, tmp = tempfile.mkstemp(dir=file.parent, prefix=f".{file.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as out:
            yaml.dump(data, out)
        os.chmod(tmp, file.stat().st_mode & 0o777)
        load_inventory(Path(tmp))  # what is written must load: else nothing changes
        os.replace(tmp, file)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return last


def _blocks(data: Any, on_hosts: list[str], file: Path) -> list[Any]:
    """The mappings to write the engine into: the defaults block, or each named host's entry."""
    from ruamel.yaml.comments import CommentedMap

    if not on_hosts:
        if data.get("defaults") is None:
            data.insert(0, "defaults", CommentedMap())
        return [data["defaults"]]
    entries = {str(h.get("name")): h for h in data.get("hosts") or [] if isinstance(h, dict)}
    missing = [n for n in on_hosts if n not in entries]
    if missing:
        refuse("hosts", f"no host named {', '.join(missing)} in {file}", "unknown_host")
    return [entries[n] for n in on_hosts]


def refuse(field: str, message: str, code: str) -> NoReturn:
    raise InputError([Diagnostic(Location("engine add"), field, message, code=code)])
