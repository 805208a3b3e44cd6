"""`engine-ctl validate` and `engine-ctl schema`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from engine_ctl.cli.common import find_inventory, no_documents
from engine_ctl.cli.environments import current_env, env_of_inventory, env_option
from engine_ctl.cli.views.output import emit_json, printer
from engine_ctl.core.diagnostics import Diagnostic, InputError, by_place
from engine_ctl.core.documents.inventory import load_inventory
from engine_ctl.core.documents.loader import OWN_KINDS, load_paths
from engine_ctl.core.documents.rules import check, check_hosts, check_profiles
from engine_ctl.core.documents.validate import build_report, not_checked_lines, report_json


@click.command()
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@click.option(
    "--inventory", "inventory_path", type=click.Path(path_type=Path), envvar="ENGINE_CTL_INVENTORY", show_envvar=True,
    help="Also check this hosts.yaml.",
)  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print a versioned JSON result.")
@env_option
def validate(paths: tuple[Path, ...], inventory_path: Path | None, as_json: bool) -> None:
    """Check deployment, model and inventory documents offline.

    PATHS are files or directories (every *.yaml, *.yml and *.json in them), validated together:
    models in one file, deployments in another. Default: the current directory.
    Exit 0 valid, 1 invalid.
    """
    result = load_paths(list(paths) or [Path(".")])
    diagnostics = list(result.diagnostics)
    # among the documents, the default environment's inventory (never hosts.production.yaml for it); with --env
    # NAME, NAME's, found as plan finds it (an error when there is none)
    default = [inv for f, inv in result.inventories.items() if env_of_inventory(f) is None]
    inventory = default[-1] if default else None
    if inventory_path is None and current_env() is not None:
        try:
            inventory = find_inventory(None, result)
        except InputError as exc:
            diagnostics.extend(exc.diagnostics)
    if inventory_path is not None:
        try:
            inventory = load_inventory(inventory_path)
        except InputError as exc:
            diagnostics.extend(exc.diagnostics)
    diagnostics.extend(check(result.desired, frozenset(result.broken_models)))
    if inventory is not None:  # spec.host names a host of the inventory
        diagnostics.extend(check_hosts(result.desired, [h.name for h in inventory.hosts], inventory.file))
        diagnostics.extend(check_profiles(result.desired, inventory.hosts))
    if not result.documents and not diagnostics:  # nothing at all: never "valid"
        diagnostics.append(no_documents(result))
    diagnostics = by_place(diagnostics)  # in reading order, whichever check found them
    errors = [d for d in diagnostics if d.severity == "error"]
    valid = not errors
    if as_json:
        doc = report_json(result, diagnostics, valid, inventory.file if inventory is not None else None)
        doc["skipped"] = [{"file": f, "what": what} for f, what in sorted(result.skipped.items())]
        emit_json(doc)
        sys.exit(0 if valid else 1)
    _print_human(result, diagnostics, valid, inventory.file if inventory is not None else None)
    sys.exit(0 if valid else 1)


def _print_human(result, diagnostics: list[Diagnostic], valid: bool, inventory: str | None = None) -> None:
    out, err = printer(), printer(stderr=True)  # lines only: no rich to import
    for f, what in sorted(result.skipped.items()):  # what each of engine-ctl's own files is
        todo = f"; apply it with: engine-ctl apply {f}" if what == OWN_KINDS["Plan"] else ""
        out(f"{f} is {what}, engine-ctl's own file, not a document: skipped{todo}")
    for d in diagnostics:
        err(d.render())
    if not valid:
        n = sum(1 for d in diagnostics if d.severity == "error")
        err(f"400 INVALID_DEPLOYMENT: {n} problem(s); nothing was changed")
        return
    for f in result.files:
        kinds = result.documents.get(f, [])
        noun = (
            "deployment document"
            if any(k.startswith("deployment") for k in kinds)
            else ("inventory" if kinds == ["inventory"] else "model document")
        )
        out(f"{f} is a valid {noun}")
    for report in build_report(result):
        now = [x for x in report.defaults if not x.at_plan]
        later = [x for x in report.defaults if x.at_plan]
        out(f"\nDeployment {report.name} ({report.engine or 'engine chosen at plan'})")
        if now:
            out("  Filled in")
            for x in now:
                out(f"    {x.field:<28} {x.value}   ({x.why})")
        if later:
            out("  Resolved at plan (needs host facts)")
            for x in later:
                out(f"    {x.field:<28} {x.why}")
    out("\nNot checked")
    for line in not_checked_lines(inventory):
        out(f"  {line}")


@click.command()
@click.option("--out", "out_path", type=click.Path(path_type=Path), help="Write to a file instead of stdout.")
def schema(out_path: Path | None) -> None:
    """Print the JSON Schema of engine-ctl documents (for editors' YAML language servers).

    Put `# yaml-language-server: $schema=<path or URL>` at the top of a document to use it.
    """
    from engine_ctl.core.documents.schema import document_schema

    text = json.dumps(document_schema(), indent=2) + "\n"
    if out_path is None:
        sys.stdout.write(text)
    else:
        out_path.write_text(text)
