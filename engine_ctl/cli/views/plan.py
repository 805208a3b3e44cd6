"""Showing a plan: Terraform's symbols, field diffs, argv diffs, drift, and the closing summary. Pure."""

from __future__ import annotations

import difflib
import html
import json
import re
import shlex
from typing import Any

from engine_ctl.core.fit.runspec import FitPlan
from engine_ctl.core.plan.changes import CREATE, DeploymentChange, Drift, Plan, ReplicaChange
from engine_ctl.core.plan.envelope import gpu_list
from engine_ctl.core.plan.fetching import fetch_lines
from engine_ctl.core.plan.gateway import GatewayChange
from engine_ctl.core.render.guard import guard_note
from engine_ctl.core.sizes import human_bytes
from engine_ctl.core.weights import human
from engine_ctl.providers import PROVIDERS, canonical_engine

SENSITIVE_WORDS = ("key", "token", "secret", "password")

MEMORY_BASIS = {
    "arch": "estimated from the model's shape: layers, KV heads and head size",
    "weights": "the weights' file size",
    "catalog": "as the documents state it",
    "estimate": "estimated from the parameter count",
}
"""What a fit's memory_basis means, said in words wherever a size is shown."""

REPLICA_VERBS = {("create",): "to start", ("create", "delete"): "to replace", ("delete", "create"): "to replace",
                 ("update",): "to repair", ("delete",): "to remove", ("install",): "to install"}  # fmt: skip
"""How the closing line counts replicas, by action (an on-demand replica's unit created: `install`)."""


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


def _revision(c: DeploymentChange) -> str:
    """`revision 3 → 4`, or, when the documents did not change (a repair, a leftover removed), that it stays."""
    if c.old_revision == c.revision:
        return f"revision {c.revision} stays: the documents did not change"
    return f"revision {c.old_revision} → {c.revision}"


def _header(c: DeploymentChange, command: str = "apply") -> str:
    if c.action == ["create"]:
        return f"# {c.name} will be created (revision {c.revision})"
    if c.action == ["delete"] and command == "destroy":
        return f"# {c.name} will be destroyed: its units stopped and removed (the model stays)"
    if c.action == ["delete"]:
        return f"# {c.name} will be destroyed"
    if c.replaces:
        how = c.strategy or "rolling"
        return (
            f"# {c.name} will be replaced one replica at a time ({how}), {_revision(c)}: "
            "the next replica only once the previous one serves; a failure halts the roll"
        )
    if c.state_only:
        return f"# {c.name}: the state is updated (revision {c.revision}); nothing changes on the hosts"
    if c.action == ["update"]:
        return f"# {c.name} will be updated in place ({_revision(c)})"
    return f"# {c.name}: no changes"


def fit_note(fit: FitPlan, key: str) -> str:
    """What a fit figure means where the bare number would mislead: the context is per request, beside an
    engine flag that may be context × parallel (the provider says)."""
    if key != "context_length":
        return ""
    return context_meaning(fit.engine, fit.context_length, fit.parallel)


def context_meaning(engine: str, context: int, parallel: int) -> str:
    provider = PROVIDERS.get(canonical_engine(engine))
    return (provider.context_note(context, parallel) if provider else None) or "tokens per request"


def fit_value(c: DeploymentChange, key: str) -> str:
    assert c.fit is not None
    note = fit_note(c.fit, key)
    return _value(key, getattr(c.fit, key)) + (f" ({note})" if note else "")


def memory_value(fit: FitPlan) -> str:
    """`6.7 GiB (estimated from the model's shape: …)`: the size readable at any scale, the basis in words."""
    basis = fit.memory_basis
    return f"{human_bytes(fit.memory_bytes)} ({MEMORY_BASIS.get(basis, basis)})"


def host_memory_value(c: DeploymentChange) -> str:
    """memory_value of the change's fit; for a replica group, what each of its machines sets aside (the fit
    sizes each machine: fitting's docstring)."""
    assert c.fit is not None
    nodes = c.spec.node_count if c.spec is not None else 1
    return memory_value(c.fit) + (f", on each of its {nodes} machines" if nodes > 1 else "")


def replica_counts(plan: Plan) -> dict[str, int]:
    """Replicas this plan starts, replaces, repairs and removes, by REPLICA_VERBS (zero counts left out)."""
    counts: dict[str, int] = {}
    disabled = {(d.host, d.unit) for d in plan.drift if d.kind == "disabled"}  # enabled again: a repair, no start
    for c in plan.changes:
        for r in c.replicas if c.changed else ():
            if r.role == "on-demand":  # min fell: it only stops being started at boot
                continue
            rose = r.role == "always-on" and (r.host, r.unit) not in disabled  # min rose: started
            verb = "to start" if rose else REPLICA_VERBS[tuple(r.action)]
            verb = "to install" if r.on_demand and r.actions == CREATE else verb
            counts[verb] = counts.get(verb, 0) + 1
    return {verb: counts[verb] for verb in REPLICA_VERBS.values() if verb in counts}


def replicas_line(plan: Plan) -> str:
    """`Replicas: 2 to start, 1 to remove.`; empty when no replica changes."""
    counts = replica_counts(plan)
    return "Replicas: " + ", ".join(f"{n} {verb}" for verb, n in counts.items()) + "." if counts else ""


def summary_line(plan: Plan) -> str:
    s = plan.summary()
    line = f"Plan: {s['add']} to add, {s['change']} to change, {s['destroy']} to destroy."
    replicas = replicas_line(plan)
    line = f"{line} {replicas}" if replicas else line
    if plan.scaler is not None and plan.scaler.stopped:
        line += f" The scaler to start on {', '.join(plan.scaler.stopped)}."
    if plan.scaler is not None and plan.scaler.stale:
        line += f" The scaler's configuration to rewrite on {', '.join(plan.scaler.stale)}."
    if plan.scaler is not None and plan.scaler.unit_drift:
        line += f" The scaler's unit to set right on {', '.join(sorted(plan.scaler.unit_drift))}."
    return f"{line} Weights to prune: {prune_total(plan)}." if plan.prunes else line


def _chosen(c: DeploymentChange, key: str) -> str:
    return f"  (chosen at revision {c.chosen[key]})" if key in c.chosen else ""


def _replica_lines(r: ReplicaChange) -> list[str]:
    gpus = f", GPUs {','.join(map(str, r.gpu_indexes))}" if r.gpu_indexes else ""
    gpus += ", on demand" if r.on_demand else ""
    action = tuple(r.action)
    if action == ("create",):
        lines = [f"+ replica {r.index} on {r.host}: {r.unit} (port {r.port}{gpus})", f"    argv: {argv_line(r.argv)}"]
        if r.on_demand:
            lines[0] += ": installed, not started (the scaler starts it)"
        lines += _engine_lines(r) + _guard_lines(r)
    elif action == ("delete",):
        lines = [f"- replica {r.index} on {r.old_host or r.host}: {r.old_unit or r.unit} ({r.reason})"]
    elif action == ("update",) and r.role:
        lines = [f"~ replica {r.index} on {r.host}: {r.unit} {r.reason}"]
    elif action == ("update",):
        how = "rewritten (restarted only if the scaler runs it)" if r.on_demand else "rewritten and restarted"
        lines = [f"~ replica {r.index} on {r.host}: {r.unit} {how} ({r.reason})"]
    else:
        where = r.host if r.host == r.old_host else f"{r.old_host} → {r.host}"
        what = f"{r.old_unit} → {r.unit} ({r.strategy}, port {r.port}{gpus})"
        lines = [f"{r.symbol} replica {r.index} on {where}: {what}"]
        diff = argv_diff(r.old_argv or [], r.argv)
        if diff:
            lines.append("    argv:")
            lines += [f"      {d}" for d in diff]
        lines += _engine_lines(r) + _guard_lines(r)
    return lines + _member_lines(r)


def _member_lines(r: ReplicaChange) -> list[str]:
    """A replica group's members (spec.nodes > 1): the head is the replica's line, each worker its own."""
    if not r.members and not r.old_members:
        return []
    if not r.members or tuple(r.action) == ("delete",):
        return [f"    - group member {m.rank} on {m.host}: {m.unit} (removed with the head)" for m in r.old_members]
    placed = r.placement.members if r.placement is not None else ()
    cores = f", {r.placement.cpu_cores} cores" if r.placement is not None and not r.gpus else ""
    lines = [f"    group of {len(r.members) + 1} machines: head on {r.host} (port {r.port}{cores}, serves the API)"]
    if r.placement is not None:  # the fit sized each machine: each takes its share, not the whole replica's
        lines.append(f"    each machine sets aside {human_bytes(r.placement.memory_bytes)} of host memory")
    for i, m in enumerate(r.members):
        gpus = f", GPUs {','.join(m.gpus)}" if m.gpus else ""
        gpus += f", {placed[i].cpu_cores} cores" if i < len(placed) and not m.gpus else ""
        lines += [
            f"    member {m.rank} on {m.host}: {m.unit} (port {m.port}{gpus})",
            f"      argv: {argv_line(m.argv)}",
        ]
    return lines


def _engine_lines(r: ReplicaChange) -> list[str]:
    """The version of the engine build the replica runs, as the host's build reports it (seed 001's releases)."""
    if not r.engine_version:
        return []
    digest = f" (sha256 {r.engine_sha256[:12]}…)" if r.engine_sha256 else ""
    return [f"    engine: version {r.engine_version}{digest}"]


def _guard_lines(r: ReplicaChange) -> list[str]:
    """The replica's guard (engine_ctl.core.render.guard), for a unit written anew."""
    note = guard_note(r.unit_text)
    return [f"    guard: {note}"] if note else []


def _line_style(line: str, default: str) -> str:
    """A replica's line in its change's style; an argv diff line (`- word`, `+ word`) in its own sign's."""
    bare = line.lstrip()
    if bare.startswith("- "):
        return "destroy"
    if bare.startswith("+ "):
        return "add"
    return default if line[:1] in "+-~" else ""


def unit_diff_lines(d: Drift) -> list[tuple[str, str]]:
    """The unified diff of a hand-edited unit, each line styled by its sign (headers bold)."""
    out = []
    for line in d.diff:
        style = "bold" if line.startswith(("---", "+++", "@@")) else _line_style(line, "")
        out.append((style, line))
    return out


def render_plan(plan: Plan, command: str = "apply", verbose: bool = False) -> list[tuple[str, str]]:
    """(style, line) pairs; style is one of '', 'add', 'change', 'destroy', 'warn', 'bold'. `command` is the
    command that shows it: `destroy` speaks of destroying, never of documents. `verbose`: a new gateway's whole
    configuration too (else a summary of it)."""
    out = _render_top(plan)
    if plan.refresh_only:
        out.append(("bold", "Refresh only: apply records what drifted into the state; nothing on the hosts changes."))
        return out
    changed = [c for c in plan.changes if c.changed]
    gateways = [g for g in plan.gateways if g.changed]
    if changed and command == "destroy":
        out.append(("bold", "engine-ctl destroy will stop and remove the units of these deployments:"))
    elif changed or gateways or plan.prunes:
        out.append(("bold", "engine-ctl will perform the following actions:"))
    for c in changed:
        out += _render_change(c, command)
    for g in gateways:
        out += _gateway_lines(g, verbose)
    for g in plan.gateways:
        out += [("warn", f"Warning: gateway {g.host}: {w}") for w in g.warnings]
    for c in plan.changes:
        out += _render_notes(c)
    out += _scaler_lines(plan)
    out += _prune_lines(plan)
    out.append(("", ""))
    return out + _render_end(plan, command, bool(changed or gateways or plan.prunes) or plan.has_changes)


def _prune_lines(plan: Plan) -> list[tuple[str, str]]:
    """The hf: checkouts no deployment uses any more, deleted once everything else succeeded."""
    if not plan.prunes:
        return []
    out = [("", ""), ("bold", f"  # weights no deployment uses any more (deleted after the roll): {prune_total(plan)}")]
    return out + [("destroy", f"  - checkout {p.line}") for p in plan.prunes]


def prune_total(plan: Plan) -> str:
    """`2 checkouts, frees up to 3.4 GB` (a file another checkout links to by then is not freed)."""
    n = len(plan.prunes)
    return f"{n} checkout{'s' if n != 1 else ''}, frees up to {human(sum(p.freed_bytes for p in plan.prunes))}"


def _scaler_lines(plan: Plan) -> list[tuple[str, str]]:
    """Where the scaler runs (one, the first gateway host by name; or with PostgreSQL state one on every gateway
    host, of which the one holding the lock acts) and what it says runs now."""
    s = plan.scaler
    if s is None:
        return []
    where = f"{s.host} (the first gateway host by name)"
    if s.lock is not None:
        where = f"{', '.join(s.lock.hosts)} (one acts, by a PostgreSQL lock in {s.lock.dbname} at {s.lock.host}:" \
                f"{s.lock.port}, role {s.lock.role})"  # fmt: skip
    out = [("", ""), ("bold", f"  # scaler on {where}: {', '.join(s.deployments)}")]
    out += [("", f"    {name}: {line}") for name, line in sorted(s.running.items())]
    out += [("change", f"    not running on {host}: apply starts it") for host in s.stopped]
    out += [("change", f"    on {host} it runs with another configuration (deployments, settings) than the documents "
             "and the recorded deployments give: apply rewrites its configuration and restarts it")
            for host in s.stale]  # fmt: skip
    out += [("change", f"    {detail}") for _, detail in sorted(s.unit_drift.items())]
    return out


def _render_top(plan: Plan) -> list[tuple[str, str]]:
    """What stands above the actions: deployments destroyed for absent documents, refusals, unreachable hosts,
    drift (a hand-edited unit with the diff of its text)."""
    out: list[tuple[str, str]] = []
    if plan.context.env:  # issue 26: on hosts shared by environments, which one this plan is for
        out += [("bold", f"Environment: {plan.context.env}"), ("", "")]
    if plan.absent:  # first: with --auto-approve this is an outage nobody asked for by name
        n = len(plan.absent)
        out.append(("destroy", f"This plan destroys {n} deployment{'s' if n != 1 else ''} because "
                    f"{'their documents are' if n != 1 else 'its document is'} absent: {', '.join(plan.absent)} "
                    "(pass the documents to keep them)"))  # fmt: skip
    for r in plan.refused:
        out.append(("destroy", f"Refused: {r}"))
    for host, why in sorted(plan.unreachable.items()):
        out.append(("warn", f"Warning: host {host} is unreachable: {why}; its replicas are not checked"))
    if plan.drift:
        out.append(("bold", "Changed outside engine-ctl (drift):"))
        for d in plan.drift:
            out.append(("warn", f"  ~ {d.host} {d.unit}: {d.detail}"))
            out += [(style, f"      {line}") for style, line in unit_diff_lines(d)]
        out.append(("", ""))
    if plan.owned_elsewhere:
        out.append(("bold", "Owned elsewhere (units of another state on these hosts; this state leaves them alone):"))
        out += [("", f"  · {f.line}") for f in plan.owned_elsewhere]
        out.append(("", ""))
    return out


def _render_change(c: DeploymentChange, command: str) -> list[tuple[str, str]]:
    """One changed deployment: its header and reasons, field changes, fit (when created), replicas."""
    style = {"+": "add", "-": "destroy", "~": "change", "+/-": "change", "-/+": "change"}[c.symbol]
    out = [("", ""), ("bold", f"  {_header(c, command)}")]
    out += [("", f"  #   {reason}") for reason in c.reasons]
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
            out.append(("add", f"      + {key:<15} = {fit_value(c, key)}{_chosen(c, key)}"))
        out.append(("add", f"      + {'host memory':<15} = {host_memory_value(c)}"))
    for step in c.replicas:
        out += [(_line_style(line, style), f"      {line}") for line in _replica_lines(step)]
    out += [("", f"      {line}") for line in fetch_lines(c)]
    out.append((style, "    }"))
    return out


def _render_notes(c: DeploymentChange) -> list[tuple[str, str]]:
    """Below the actions: choices kept, replicas not reconciled, Pending, Failed, warnings."""
    out: list[tuple[str, str]] = []
    fit = c.fit
    chosen = [(k, r) for k, r in sorted(c.chosen.items()) if fit and hasattr(fit, k) and c.actions != CREATE]
    if chosen and fit:
        said = ", ".join(f"{k} {getattr(fit, k)}, chosen at revision {r}" for k, r in chosen)
        out.append(("", f"{c.name}: {said} (the documents leave them out; chosen again when they change)"))
    out += [("destroy", f"Not reconciled: {c.name}: {b}") for b in c.blocked]
    if c.operator:
        out.append(("bold", f"Held: {c.name} was {c.operator}"))
    if c.pending_reason:
        out.append(("warn", f"Pending: {c.name}: {c.pending_reason}"))
        out += [("warn", f"  {host}: {why}") for host, why in sorted(c.waiting.items())]
    if c.failed_reason:
        out.append(("destroy", f"Failed: {c.name}: {c.failed_reason}"))
    out += [("", line) for line in envelope_lines(c)]
    return out + [("warn", f"Warning: {w}") for w in c.warnings]


def envelope_lines(c: DeploymentChange) -> list[str]:
    """The scaling envelope: every slot, where it is, always on or on demand, and what an on-demand slot shares
    with other deployments' (`replica 2 on gpu-02 GPUs 2–3: on demand`)."""
    if not c.envelope or c.spec is None:
        return []
    d = c.spec
    out = [f"{c.name}: replicas {d.replicas_min}..{d.replicas_max}: {d.replicas_min} always on, "
           f"{len([s for s in c.envelope if s.on_demand])} on demand (installed; the scaler starts them):"]  # fmt: skip
    for s in c.envelope:
        if s.gpu_indexes:
            where = f"GPU{'s' if len(s.gpu_indexes) > 1 else ''} {gpu_list(s.gpu_indexes)}"
        else:
            where = f"({s.cpu_cores} core{'s' if s.cpu_cores != 1 else ''}, {human_bytes(s.memory_bytes)})"
        role = "on demand" if s.on_demand else "always on"
        shares = f", shares {'; '.join(s.shares)}" if s.shares else ""
        out.append(f"  replica {s.index} on {s.host} {where}: {role}{shares}")
    return out


UNMENDABLE = "but not everything runs as the documents say, and apply cannot mend it: see the warnings above."


def _render_end(plan: Plan, command: str, changed: bool) -> list[tuple[str, str]]:
    """The closing lines: why nothing changes (in destroy's words for destroy), then the counts."""
    out: list[tuple[str, str]] = []
    if not changed and command == "destroy":
        which = "no deployment of the state is named by --target." if plan.targets else "the state has no deployments."
        out.append(("bold", f"Nothing to destroy: {which}"))
        out += [("destroy", f"  {p}") for p in plan.problems]
    elif not changed and not plan.problems and any(c.unmendable for c in plan.changes):
        out.append(("warn", f"No changes apply can make; {UNMENDABLE}"))
    elif not changed and not plan.problems:
        out.append(("bold", "No changes. The hosts match the documents."))
    elif not changed:
        out.append(("destroy", "No changes can be made; but the hosts do not match the documents:"))
        out += [("destroy", f"  {p}") for p in plan.problems]
    return [*out, ("bold", summary_line(plan))]


def _gateway_lines(g: GatewayChange, verbose: bool = False) -> list[tuple[str, str]]:
    """`+ gateway "edge-01"` with its endpoint, its reasons and a diff of its HAProxy configuration; a new
    gateway's configuration is a short summary unless `verbose` (--json and --markdown carry it whole)."""
    style = {"+": "add", "-": "destroy", "~": "change"}[g.symbol]
    out: list[tuple[str, str]] = [("", ""), ("bold", f"  # gateway {g.host}: http://{g.endpoint}/v1")]
    out += [("", f"  #   {reason}") for reason in g.reasons]
    out.append((style, f'{g.symbol:>3} gateway "{g.host}" {{'))
    if g.interim_files is not None:
        out.append(
            ("", f"      # replicas enter once healthy; old ones drain (up to {g.drain_timeout_s} s) before they stop")
        )
    summary = g.action == ["create"] and not verbose
    if summary:
        out += [("add", f"      {line}") for line in gateway_summary(g)]
    else:
        out += [({"+": "add", "-": "destroy"}.get(ln[:1], ""), f"      {ln}") for ln in g.diff[2:]]
    if g.maps:
        out.append(("", f"      keys:     {_keys_said(g)} (sha256 only; applied over the stats socket, no reload)"))
    if summary:
        lines = g.files.get("haproxy.cfg", "").count("\n")
        out.append(("", f"      # haproxy.cfg ({lines} lines): shown with --verbose; --json and --markdown carry it"))
    out.append((style, "    }"))
    return out


def _keys_said(g: GatewayChange) -> str:
    """How many keys, and how many of them have a rate limit."""
    keys, limited = len(g.maps.get("keys.map", {})), len(g.maps.get("limits.map", {}))
    return f"{keys}" + (f", {limited} limited in requests a minute" if limited else "")


def gateway_summary(g: GatewayChange) -> list[str]:
    """A new gateway in a few lines: where it listens, what it routes, how long it holds, HAProxy's threads."""
    routed = sorted(g.maps.get("models.map", {}))
    return [
        f"endpoint: http://{g.endpoint}/v1",
        f"routes:   {', '.join(routed) if routed else '(no deployment yet)'}",
        f"hold:     up to {g.hold_s} s, at most {g.hold_cap} requests per deployment; then 503",
        f"threads:  {g.threads}",
    ]


def plan_text(plan: Plan, command: str = "apply", verbose: bool = False) -> str:
    return "\n".join(line for _, line in render_plan(plan, command, verbose)) + "\n"


RICH_STYLES = {"add": "green", "change": "yellow", "destroy": "red", "warn": "yellow", "bold": "bold", "": ""}
"""render_plan's styles as rich styles, for the terminal."""

COMMENT_LIMIT = 65_536
"""GitHub's limit on a comment's body, in characters."""

DOWNTIME = "no serving replica during the change"


def plan_markdown(plan: Plan, full_plan: str | None = None, limit: int = COMMENT_LIMIT) -> str:
    """For a pull-request comment: the summary line and the warnings (downtime, pending, failed, not reconciled,
    drift) first; then one collapsible section per changed deployment with its field changes and an argv diff
    word by word. Past `limit` (GitHub's comment limit) it is cut between pieces, with a note saying where the
    full plan is: `full_plan` is the saved plan's path (`engine-ctl show FULL_PLAN` prints it)."""
    pieces = [_Piece("head", _md_head(plan))]
    pieces += [_Piece("warning", text) for text in _md_warnings(plan)]
    pieces += [_Piece("unit diff", _md_unit_diff(d)) for d in plan.drift if d.diff]
    pieces += [_Piece("deployment", _md_section(c)) for c in plan.changes if c.changed]
    pieces += [_Piece("gateway", _md_gateway(g)) for g in plan.gateways if g.changed and g.diff]
    if plan.prunes:
        lines = "".join(f"- {_text(p.line)}\n" for p in plan.prunes)
        pieces.append(_Piece("deployment", f"\n**Weights to prune** ({prune_total(plan)}):\n\n{lines}"))
    foot = _md_foot(plan, full_plan)
    whole = "".join(p.text for p in pieces) + foot
    return whole if _length(whole) <= limit else _cut(pieces, foot, full_plan, limit)


class _Piece:
    def __init__(self, kind: str, text: str) -> None:
        self.kind, self.text = kind, text


def _length(text: str) -> int:
    """Characters as a browser counts them (UTF-16 code units): never fewer than Python's, so never too long."""
    return len(text.encode("utf-16-le")) // 2


def _cut(pieces: list[_Piece], foot: str, full_plan: str | None, limit: int) -> str:
    """The pieces that fit, in order, then a note of what was left out and where the whole plan is."""
    kept: list[str] = []
    used = 0
    for i, piece in enumerate(pieces):
        after = _cut_note(pieces[i + 1 :], full_plan, limit) + foot
        if used + _length(piece.text + after) > limit:
            break
        kept.append(piece.text)
        used += _length(piece.text)
    while kept and used + _length(_cut_note(pieces[len(kept) :], full_plan, limit) + foot) > limit:
        used -= _length(kept.pop())
    return "".join(kept) + _cut_note(pieces[len(kept) :], full_plan, limit) + foot


def _cut_note(left_out: list[_Piece], full_plan: str | None, limit: int) -> str:
    kinds = ("warning", "unit diff", "deployment", "gateway")
    counts = {kind: sum(1 for p in left_out if p.kind == kind) for kind in kinds}
    names = {"warning": "warning(s)", "unit diff": "unit diff(s)", "deployment": "deployment section(s)",
             "gateway": "gateway section(s)"}  # fmt: skip
    parts = [f"{n} {names[kind]}" for kind, n in counts.items() if n]
    missing = " and ".join(parts) or "the rest"
    where = (
        f"`engine-ctl show {_code_text(full_plan)}`"
        if full_plan
        else "`engine-ctl plan --out FILE`, then `engine-ctl show FILE`"
    )
    return (
        f"\n---\n**The plan is cut here:** it is longer than a GitHub comment ({limit:,} characters); "
        f"{missing} not shown. The full plan: {where}.\n\n"
    )


def _md_head(plan: Plan) -> str:
    s = plan.summary()
    where = f" ({_code(plan.context.env)})" if plan.context.env else ""
    head = f"### engine-ctl plan{where}: {s['add']} to add, {s['change']} to change, {s['destroy']} to destroy\n\n"
    if replicas_line(plan):
        head += replicas_line(plan) + "\n\n"
    if plan.refresh_only:
        head += "Refresh only: apply records what drifted into the state; nothing on the hosts changes.\n\n"
    elif not plan.has_changes and not plan.problems and any(c.unmendable for c in plan.changes):
        head += f"No changes apply can make; {UNMENDABLE}\n\n"
    elif not plan.has_changes and not plan.problems:
        head += "No changes. The hosts match the documents.\n\n"
    elif not plan.has_changes:
        head += "No changes can be made; but the hosts do not match the documents.\n\n"
    if plan.targets:
        head += "Only " + ", ".join(_code(t) for t in plan.targets) + " (`--target`).\n\n"
    return head


def _md_warnings(plan: Plan) -> list[str]:
    """The warnings as alert items: CAUTION (refused, destroyed for absent documents, unreachable, failed, not
    reconciled) above WARNING (downtime, pending, drift, then the rest). Each item is one piece; the first of a
    group opens its alert."""
    owned = [f"**Owned elsewhere** (another state's unit, left alone): {_text(f.line)}" for f in plan.owned_elsewhere]
    owned += [f"**Held:** {_code(c.name)} was {_text(c.operator)}" for c in plan.changes if c.operator]
    return _alert("CAUTION", _cautions(plan)) + _alert("WARNING", _warnings(plan)) + _alert("NOTE", owned)


def _cautions(plan: Plan) -> list[str]:
    out = [f"**Refused:** {_text(r)}" for r in plan.refused]
    if plan.absent:
        names = ", ".join(_code(n) for n in plan.absent)
        out.append(f"**Destroyed because the documents are absent:** {names} (pass the documents to keep them)")
    for host, why in sorted(plan.unreachable.items()):
        out.append(f"**Unreachable:** host {_code(host)}: {_text(why)}; its replicas are not checked")
    for c in plan.changes:
        if c.failed_reason:
            out.append(f"**Failed:** {_code(c.name)}: {_text(c.failed_reason)}")
        out += [f"**Not reconciled:** {_code(c.name)}: {_text(b)}" for b in c.blocked]
    return out


def _warnings(plan: Plan) -> list[str]:
    downtime: list[str] = []
    pending: list[str] = []
    other: list[str] = []
    for c in plan.changes:
        for w in c.warnings:
            if c.failed_reason and c.failed_reason in w:
                continue  # the Failed caution says it
            (downtime if DOWNTIME in w else other).append(w)
        if c.pending_reason:
            waiting = [(h, y) for h, y in sorted(c.waiting.items()) if y != c.pending_reason or len(c.waiting) > 1]
            hosts = "".join(f"\n>   - {_code(h)}: {_text(why)}" for h, why in waiting)
            pending.append(f"**Pending:** {_code(c.name)}: {_text(c.pending_reason)}{hosts}")
    drift = [f"**Drift** (changed outside engine-ctl): {_code(d.host)} {_code(d.unit)}: {_text(d.detail)}"
             + ("; its diff is below" if d.diff else "") for d in plan.drift]  # fmt: skip
    rest = [f"**Warning:** {_text(w)}" for w in other]
    return [f"**Downtime:** {_text(w)}" for w in downtime] + pending + drift + rest


def _alert(kind: str, items: list[str]) -> list[str]:
    out = [f"> - {item}\n" for item in items]
    if out:
        out[0] = f"> [!{kind}]\n" + out[0]
        out[-1] += "\n"
    return out


def _md_unit_diff(d: Drift) -> str:
    """A hand-edited unit: what the edit changed, as a collapsed diff below the warnings."""
    summary = f"Edited by hand: <code>{html.escape(d.host)}</code> <code>{html.escape(d.unit)}</code>"
    return f"<details><summary>{summary}</summary>\n\n" + _fenced("diff", d.diff) + "\n</details>\n\n"


def _md_gateway(g: GatewayChange) -> str:
    """A changed gateway: its summary, and its whole HAProxy configuration (a diff), collapsed."""
    summary = f"<code>{html.escape(g.symbol)}</code> gateway <b>{html.escape(g.host)}</b>: http://"
    summary += html.escape(g.endpoint) + "/v1"
    body = "".join(f"- {_text(line)}\n" for line in [*g.reasons, *gateway_summary(g), f"keys: {_keys_said(g)}"])
    return f"<details><summary>{summary}</summary>\n\n{body}\n" + _fenced("diff", g.diff) + "\n</details>\n\n"


def _md_section(c: DeploymentChange) -> str:
    """One collapsible section: what happens, why, the field changes, each replica and its argv diff."""
    summary = f"<code>{html.escape(c.symbol)}</code> <b>{html.escape(c.name)}</b>: "
    summary += html.escape(_header(c).removeprefix("# ").removeprefix(c.name).lstrip(": "))
    body = [f"<details><summary>{summary}</summary>\n\n"]
    body += [f"- {_text(r)}\n" for r in c.reasons]
    if c.reasons:
        body.append("\n")
    if c.field_changes:
        body.append("| Field | Before | After |\n|---|---|---|\n")
        for f in c.field_changes:
            before = "" if f.old is None else _code(_value(f.path, f.old), cell=True)
            after = "" if f.new is None else _code(_value(f.path, f.new), cell=True)
            body.append(f"| {_code(f.path, cell=True)} | {before} | {after} |\n")
        body.append("\n")
    if c.action == ["create"] and c.fit:
        body.append(_fit_table(c))
    for r in c.replicas:
        body.append(_md_replica(r))
    envelope = envelope_lines(c)
    if envelope:
        body.append("\n" + _fenced("text", envelope) + "\n")
    body += [f"- {_text(line)}\n" for line in fetch_lines(c)]
    body.append("</details>\n\n")
    return "".join(body)


def _fit_table(c: DeploymentChange) -> str:
    assert c.fit is not None
    rows = ["| Fit | Value |\n|---|---|\n"]
    for key in ("engine", "accelerator", "gpus", "cpu_cores", "context_length", "parallel"):
        chosen = f" (chosen at revision {c.chosen[key]})" if key in c.chosen else ""
        note = fit_note(c.fit, key)
        said = f" ({_text(note)})" if note else ""
        rows.append(f"| {key} | {_code(_value(key, getattr(c.fit, key)), cell=True)}{said}{chosen} |\n")
    rows.append(f"| host memory | {_text(host_memory_value(c))} |\n")
    return "".join(rows) + "\n"


def _md_replica(r: ReplicaChange) -> str:
    line = _replica_lines(r)[0]
    symbol, _, rest = line.partition(" ")
    text = f"- {_code(symbol)} {_text(rest)}\n"
    action = tuple(r.action)
    if action == ("create",):
        diff = [f"+ {g}" for g in argv_groups(r.argv)]
    elif r.replaces:
        diff = argv_word_diff(r.old_argv or [], r.argv)
    else:
        return text + "\n"
    return text + "\n" + _fenced("diff", diff) + "\n"


def argv_word_diff(old: list[str], new: list[str]) -> list[str]:
    """The whole argv, one flag and its value a line (shell-quoted): unchanged lines start with two spaces,
    removed ones with `- `, added ones with `+ `, so a reviewer sees which words changed and where."""
    a, b = argv_groups(old), argv_groups(new)
    out: list[str] = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if tag == "equal":
            out += [f"  {g}" for g in a[i1:i2]]
            continue
        out += [f"- {g}" for g in a[i1:i2]]
        out += [f"+ {g}" for g in b[j1:j2]]
    return out


def _fenced(language: str, lines: list[str]) -> str:
    """A fenced code block no line can close: the fence is longer than any run of backticks inside."""
    longest = max((len(run) for line in lines for run in re.findall(r"`+", line)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{language}\n" + "".join(f"{line}\n" for line in lines) + f"{fence}\n"


def _md_foot(plan: Plan, full_plan: str | None) -> str:
    made = f" at {_text(plan.created_at)}" if plan.created_at else ""
    where = f"; apply exactly it with `engine-ctl apply {_code_text(full_plan)}`" if full_plan else ""
    return (
        f"<sub>Planned against state serial {plan.state_serial} (lineage {_text(plan.state_lineage)}){made}; "
        f"plan sha256 {plan.digest()[:16]}{where}.</sub>\n"
    )


def _code(text: str, cell: bool = False) -> str:
    """An inline code span holding `text` exactly: a fence longer than any backtick run in it; `|` escaped in a
    table cell (GitHub splits cells on it even inside code)."""
    text = text.replace("\n", " ")
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or not text.strip() else ""
    body = text.replace("|", "\\|") if cell else text
    return f"{fence}{pad}{body}{pad}{fence}"


def _code_text(text: str | None) -> str:
    """A path inside a code span the note already opened: no backticks or line breaks in it."""
    return (text or "").replace("`", "'").replace("\n", " ")


MARKDOWN_SPECIAL = re.compile(r"([\\`*_\[\]<>~|])")


def _text(text: str) -> str:
    """Plain text from messages and hosts, shown as written: Markdown and HTML characters escaped, one line."""
    return MARKDOWN_SPECIAL.sub(r"\\\1", text.replace("&", "&amp;").replace("\n", " "))


def plan_json(plan: Plan) -> dict[str, Any]:
    doc = plan.model_dump(mode="json")
    counts = replica_counts(plan)
    doc["summary"] = {
        **plan.summary(),
        "replicas": {v.removeprefix("to "): counts.get(v, 0) for v in REPLICA_VERBS.values()},
    }
    doc["has_changes"] = plan.has_changes
    doc.setdefault("prunes", [])  # in the plan's digest only when there are some; always in the document
    for change, shown in zip(plan.changes, doc.get("changes", []), strict=False):
        shown["startup_provenance"] = change.startup_provenance  # measured start-up, or the estimate (default)
        shown["whole_host"] = change.whole_host
    return doc
