"""Showing a plan: Terraform's symbols, field diffs, argv diffs, drift, and the closing summary. Pure."""

from __future__ import annotations

import difflib
import json
import shlex
from typing import Any

from engine_ctl.plan import DeploymentChange, Plan, ReplicaChange

SENSITIVE_WORDS = ("key", "token", "secret", "password")


def _value(path: str, value: Any) -> str:
    if any(w in path.lower() for w in SENSITIVE_WORDS):
        return "(sensitive)"
    return json.dumps(value, ensure_ascii=False)


def argv_groups(argv: list[str]) -> list[str]:
    """['--ctx-size', '4096', '--jinja'] -> ['--ctx-size 4096', '--jinja'] (the executable first), each word
    shell-quoted, so a reviewer sees where each word begins and ends."""
    groups: list[list[str]] = []
    for token in argv:
        if groups and not token.startswith("--") and groups[-1][0].startswith("--") and len(groups[-1]) == 1:
            groups[-1].append(token)
        else:
            groups.append([token])
    return [shlex.join(g) for g in groups]


def argv_line(argv: list[str]) -> str:
    return shlex.join(argv)


def argv_diff(old: list[str], new: list[str]) -> list[str]:
    lines = []
    for line in difflib.ndiff(argv_groups(old), argv_groups(new)):
        if line.startswith(("- ", "+ ")):
            lines.append(line)
    return lines


def _header(c: DeploymentChange) -> str:
    if c.action == ["create"]:
        return f"# {c.name} will be created (revision {c.revision})"
    if c.action == ["delete"]:
        return f"# {c.name} will be destroyed"
    if c.action == ["delete", "create"]:
        how = c.strategy or "rolling"
        return (
            f"# {c.name} will be replaced one replica at a time ({how}), revision {c.old_revision} → {c.revision}: "
            "the next replica only once the previous one serves; a failure halts the roll"
        )
    if c.state_only:
        return f"# {c.name}: the state is updated (revision {c.revision}); nothing changes on the hosts"
    if c.action == ["update"]:
        return f"# {c.name} will be updated in place (revision {c.old_revision} → {c.revision})"
    return f"# {c.name}: no changes"


def _chosen(c: DeploymentChange, key: str) -> str:
    return f"  (chosen at revision {c.chosen[key]})" if key in c.chosen else ""


def _replica_lines(r: ReplicaChange) -> list[str]:
    gpus = f", GPUs {','.join(map(str, r.gpu_indexes))}" if r.gpu_indexes else ""
    action = tuple(r.action)
    if action == ("create",):
        lines = [f"+ replica {r.index} on {r.host}: {r.unit} (port {r.port}{gpus})", f"    argv: {argv_line(r.argv)}"]
    elif action == ("delete",):
        lines = [f"- replica {r.index} on {r.old_host or r.host}: {r.old_unit or r.unit} ({r.reason})"]
    elif action == ("update",):
        lines = [f"~ replica {r.index} on {r.host}: {r.unit} rewritten and restarted ({r.reason})"]
    else:
        where = r.host if r.host == r.old_host else f"{r.old_host} → {r.host}"
        lines = [f"-/+ replica {r.index} on {where}: {r.old_unit} → {r.unit} ({r.strategy}, port {r.port}{gpus})"]
        diff = argv_diff(r.old_argv or [], r.argv)
        if diff:
            lines.append("    argv:")
            lines += [f"      {d}" for d in diff]
    return lines


def render_plan(plan: Plan) -> list[tuple[str, str]]:
    """(style, line) pairs; style is one of '', 'add', 'change', 'destroy', 'warn', 'bold'."""
    out: list[tuple[str, str]] = []
    changed = [c for c in plan.changes if c.changed]
    for host, why in sorted(plan.unreachable.items()):
        out.append(("warn", f"Warning: host {host} is unreachable: {why}; its replicas are not checked"))
    if plan.drift:
        out.append(("bold", "Changed outside engine-ctl (drift):"))
        for d in plan.drift:
            out.append(("warn", f"  ~ {d.host} {d.unit}: {d.detail}"))
        out.append(("", ""))
    if plan.refresh_only:
        out.append(("bold", "Refresh only: apply records what drifted into the state; nothing on the hosts changes."))
        return out
    if changed:
        out.append(("bold", "engine-ctl will perform the following actions:"))
    for c in changed:
        style = {"+": "add", "-": "destroy", "~": "change", "-/+": "change"}[c.symbol]
        out.append(("", ""))
        out.append(("bold", f"  {_header(c)}"))
        for reason in c.reasons:
            out.append(("", f"  #   {reason}"))
        out.append((style, f'{c.symbol:>3} deployment "{c.name}" {{'))
        for f in c.field_changes:
            if f.old is None:
                out.append(("add", f"      + {f.path} = {_value(f.path, f.new)}"))
            elif f.new is None:
                out.append(("destroy", f"      - {f.path} = {_value(f.path, f.old)}"))
            else:
                out.append(("change", f"      ~ {f.path} = {_value(f.path, f.old)} -> {_value(f.path, f.new)}"))
        if c.action == ["create"] and c.fit:
            for key in ("engine", "accelerator", "gpus", "cpu_cores", "context_length", "parallel"):
                out.append(("add", f"      + {key:<15} = {_value(key, c.fit.get(key))}{_chosen(c, key)}"))
            memory = c.fit.get("memory_bytes") or 0
            out.append(
                ("add", f"      + {'host memory':<15} = {memory / 1024**3:.1f} GiB ({c.fit.get('memory_basis')})")
            )
        for r in c.replicas:
            for line in _replica_lines(r):
                out.append((style if line[0] in "+-~" else "", f"      {line}"))
        out.append((style, "    }"))
    for c in plan.changes:
        chosen = [(k, r) for k, r in sorted(c.chosen.items()) if c.fit and k in c.fit and c.action != ["create"]]
        if chosen and c.fit:
            said = ", ".join(f"{k} {c.fit[k]}, chosen at revision {r}" for k, r in chosen)
            out.append(("", f"{c.name}: {said} (the documents leave them out; chosen again when they change)"))
        for b in c.blocked:
            out.append(("destroy", f"Not reconciled: {c.name}: {b}"))
        if c.pending_reason:
            out.append(("warn", f"Pending: {c.name}: {c.pending_reason}"))
            for host, why in sorted(c.waiting.items()):
                out.append(("warn", f"  {host}: {why}"))
        if c.failed_reason:
            out.append(("destroy", f"Failed: {c.name}: {c.failed_reason}"))
        for w in c.warnings:
            out.append(("warn", f"Warning: {w}"))
    s = plan.summary()
    out.append(("", ""))
    if not changed and not plan.problems:
        out.append(("bold", "No changes. The hosts match the documents."))
    elif not changed:
        out.append(("destroy", "No changes can be made; but the hosts do not match the documents:"))
        out += [("destroy", f"  {p}") for p in plan.problems]
    out.append(("bold", f"Plan: {s['add']} to add, {s['change']} to change, {s['destroy']} to destroy."))
    return out


def plan_text(plan: Plan) -> str:
    return "\n".join(line for _, line in render_plan(plan)) + "\n"


def plan_markdown(plan: Plan) -> str:
    """For a pull-request comment: the summary, then the plan as a diff block whose added and removed lines
    start with + and - (so that renderers colour them)."""
    s = plan.summary()
    head = f"### engine-ctl plan: {s['add']} to add, {s['change']} to change, {s['destroy']} to destroy\n\n"
    lines = []
    for style, line in render_plan(plan):
        text = line.replace("```", "ʼʼʼ")
        stripped = text.lstrip()
        mark = {"add": "+", "destroy": "-", "change": "!"}.get(style, " ")
        if stripped[:3] == "-/+":
            mark = "!"
        elif stripped[:1] in "+-~" and stripped[1:2] == " ":
            mark = {"+": "+", "-": "-", "~": "!"}[stripped[0]]
        lines.append(mark + text)
    return head + "```diff\n" + "\n".join(lines) + "\n```\n"


def plan_json(plan: Plan) -> dict[str, Any]:
    doc = plan.model_dump(mode="json")
    doc["summary"] = plan.summary()
    doc["has_changes"] = plan.has_changes
    return doc
