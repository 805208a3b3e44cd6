"""`engine-ctl show PLANFILE`: a saved plan rendered as the terminal, JSON or a pull-request comment shows it.

It reads only the file: no host, no state, no inventory. So CI can post exactly the plan `apply PLANFILE` will
carry out (apply still refuses it if it is stale or not engine-ctl's own).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from engine_ctl.cli.views.output import console, emit_json
from engine_ctl.cli.views.plan import RICH_STYLES, plan_json, plan_markdown, render_plan
from engine_ctl.core.diagnostics import Diagnostic, InputError, Location
from engine_ctl.core.documents.loader import classify
from engine_ctl.core.documents.yamlsource import parse_text
from engine_ctl.core.jsonbounds import MAX_PLAN_BYTES, bounded_json
from engine_ctl.core.plan.changes import Plan
from engine_ctl.core.plan.savedplan import PlanFileError, decode_plan

HINT = "save a plan with `engine-ctl plan PATHS --out FILE`, then `engine-ctl show FILE`"
DOCUMENT_KINDS = {
    "Deployment": "a deployment",
    "FlatDeployment": "a deployment",
    "Model": "a model",
    "Inventory": "an inventory",
}


def _refuse(path: Path, message: str, hint: str = HINT) -> InputError:
    return InputError([Diagnostic(Location(str(path)), "", message, hint=hint, code="not_a_plan")])


def read_plan(path: Path) -> Plan:
    """The saved plan in `path`, or a located error that says what the file is instead."""
    if path.is_dir():
        raise _refuse(path, "is a directory, not a saved plan")
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_PLAN_BYTES + 1)
    except FileNotFoundError:
        raise _refuse(path, "does not exist") from None
    except OSError as exc:
        raise _refuse(path, f"cannot be read: {exc.strerror or exc}") from None
    if len(raw) > MAX_PLAN_BYTES:
        raise _refuse(path, f"is larger than {MAX_PLAN_BYTES // 1024**2} MiB: not a plan engine-ctl wrote")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _refuse(path, "is not text (not UTF-8): not a saved plan") from None
    try:
        plan = decode_plan(text)
    except PlanFileError as exc:
        where = Location(str(path), exc.line, exc.column)
        hint = "engine-ctl can show only plans it can read"
        raise InputError([Diagnostic(where, "", str(exc), hint=hint, code="not_a_plan")]) from None
    if plan is None:
        raise _refuse(path, f"is not a saved plan: it is {what_it_is(text, str(path))}")
    return plan


def what_it_is(text: str, file: str) -> str:
    """What a file that is not a saved plan holds, in a few words."""
    stripped = text.lstrip()
    if not stripped:
        return "empty"
    if stripped.startswith("### engine-ctl plan:"):
        return "a plan's Markdown (from plan --markdown), which cannot be applied"
    if stripped.startswith(("engine-ctl will perform", "No changes.", "Plan: ")):
        return "a plan's terminal output, which cannot be applied"
    try:
        data = bounded_json(text, "saved plan", MAX_PLAN_BYTES)
    except ValueError:  # not JSON, or past the bounds: the YAML reader has its own
        return _yaml_kind(text, file)
    return _json_kind(data)


def _json_kind(data: object) -> str:
    if not isinstance(data, dict):
        return f"JSON, a {type(data).__name__} rather than a plan's object"
    if "lineage" in data and "serial" in data:
        return "an engine-ctl state (it records what runs; plans are made against it)"
    if "hosts" in data and "failures" in data:
        return "the output of engine-ctl facts --json"
    if "deployments" in data and "format_version" in data:
        return "the output of engine-ctl status/list --json"
    if "valid" in data:
        return "the output of engine-ctl validate --json"
    keys = ", ".join(map(str, list(data)[:5])) or "none"
    return f"JSON without a plan's changes and state_lineage (keys: {keys})"


def _yaml_kind(text: str, file: str) -> str:
    docs, problems = parse_text(text, file)
    if not docs:
        return "neither JSON nor YAML" if problems else "empty"
    kinds = []
    for doc in docs:
        kind, _problem = classify(doc)
        what = DOCUMENT_KINDS.get(kind or "")
        if what and what not in kinds:
            kinds.append(what)
    if kinds:
        return f"engine-ctl documents ({', '.join(kinds)}), which a plan is made from"
    return "YAML that is not an engine-ctl document"


def _header(plan: Plan, path: Path) -> str:
    made = f"made {plan.created_at} " if plan.created_at else ""
    targets = f", only {', '.join(plan.targets)}" if plan.targets else ""
    return (
        f"Saved plan {path}: {made}against state serial {plan.state_serial} (lineage {plan.state_lineage})"
        f"{targets}; apply exactly it with: engine-ctl apply {path}\n"
    )


def _exit_code(plan: Plan, detailed: bool) -> int:
    if not detailed:
        return 0
    if plan.problems:
        return 1
    return 2 if plan.has_changes else 0


@click.command()
@click.argument("planfile", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="The plan as versioned JSON, as plan --json prints it.")
@click.option("--markdown", is_flag=True, help="The plan as Markdown, for a pull-request comment.")
@click.option("--detailed-exitcode", is_flag=True, help="Exit 0 no changes, 1 problems, 2 changes present.")
@click.option("--verbose", "-v", is_flag=True, help="A new gateway's whole HAProxy configuration, not its summary.")
def show(planfile: Path, as_json: bool, markdown: bool, detailed_exitcode: bool, verbose: bool) -> None:
    """Show a saved plan without touching hosts or state.

    PLANFILE is from `plan --out`: the same plan that `apply PLANFILE` would carry out, as text, --json or
    --markdown (for CI to post on a pull request). A file that is not a saved plan is refused with what it is."""
    if as_json and markdown:
        raise _refuse(planfile, "--json and --markdown are two renderings: choose one", hint="pass one of them")
    plan = read_plan(planfile)
    if as_json:
        emit_json(plan_json(plan))
    elif markdown:
        sys.stdout.write(plan_markdown(plan, full_plan=str(planfile)))
    else:
        out = console()
        out.print(_header(plan, planfile))
        for style, line in render_plan(plan, verbose=verbose):
            out.print(line, style=RICH_STYLES[style] or None)
    sys.exit(_exit_code(plan, detailed_exitcode))


__all__ = ["read_plan", "show", "what_it_is"]
