"""The fetches a plan carries: for a deployment of an `hf:` model, the pinned checkout each host that gets a
new replica fetches first (or, when the facts found it there, only reads back its checkpoint digest). Pure."""

from __future__ import annotations

from collections.abc import Mapping

from engine_ctl.core.documents.inventory import Inventory
from engine_ctl.core.fit.hostfacts import HostFacts
from engine_ctl.core.model import DesiredState
from engine_ctl.core.plan.changes import DeploymentChange, Drift, Plan
from engine_ctl.core.plan.drift import checkpoint_drift
from engine_ctl.core.record.model import State
from engine_ctl.core.weights import Checkout, WeightsFetch, checkout_dir, human, refusal


def recorded_digest(state: State, deployment: str, host: str, commit: str) -> str | None:
    """The checkpoint digest measured on `host` for this deployment's replicas of `commit`, if any."""
    record = state.deployments.get(deployment)
    hf = record.model.hf if record is not None and record.model is not None else None
    if record is None or hf is None or hf.commit != commit:
        return None
    return next((r.checkpoint_digest for r in record.replicas if r.host == host and r.checkpoint_digest), None)


def plan_fetches(
    plan: Plan, desired: DesiredState, inventory: Inventory, facts: Mapping[str, HostFacts],
    checkouts: Mapping[str, Checkout], state: State,
) -> Plan:  # fmt: skip
    """The plan with each change's fetches (and a warning where one cannot happen as things stand), and the
    checkpoints that changed under their deployments as drift."""
    said = {(d.host, d.unit, d.kind) for d in plan.drift}  # a kept replica's, found as it was planned
    plan.drift.extend(d for d in weights_drift(state, inventory, facts) if (d.host, d.unit, d.kind) not in said)
    drifted = {(d.deployment, d.host) for d in plan.drift if d.kind == "weights-changed"}
    for change in plan.changes:
        loaded = desired.deployment(change.name)
        model = desired.model(loaded.deployment.model) if loaded else None
        if model is None or model.hf is None or model.name not in checkouts or change.action == ["delete"]:
            continue
        checkout = checkouts[model.name]
        for host in sorted({r.host for r in change.replicas if r.action != ["delete"]}):
            changed = (change.name, host) in drifted  # fetched again: every file verified, a changed one anew
            fetch = _fetch(change, checkout, inventory, facts.get(host), host, state, changed)
            if fetch is not None:
                change.fetches.append(fetch)
    return plan


def _fetch(
    change: DeploymentChange, checkout: Checkout, inventory: Inventory, facts: HostFacts | None, host: str,
    state: State, changed: bool = False,
) -> WeightsFetch | None:  # fmt: skip
    entry = inventory.host(host)
    if entry is None:
        return None
    dest = checkout_dir(entry.models_dir, checkout.repo, checkout.commit)
    in_place = not changed and facts is not None and any(p.startswith(dest + "/") or p == dest for p in facts.models)
    if changed and not inventory.downloads.enabled:
        change.warnings.append(
            f"the checkpoint {checkout.ref} changed on {host} and downloads are off (downloads.enabled: false in the "
            f"inventory): apply fails there until the files at {dest} are put back"
        )
    elif not in_place and not inventory.downloads.enabled:
        change.warnings.append(
            f"downloads are off (downloads.enabled: false in the inventory) and {checkout.ref} is not on {host} "
            f"at {dest}: apply fails there until the files are put in place"
        )
    elif not in_place and facts is not None and "models_dir" in facts.disks:
        why = refusal(checkout.total_bytes, facts.disks["models_dir"].free_bytes, 0, inventory.downloads.cap_bytes)
        if why:
            change.warnings.append(f"{host}: {why}; apply refuses the download there")
    return WeightsFetch(
        host=host, repo=checkout.repo, commit=checkout.commit, dest=dest, files=list(checkout.files),
        total_bytes=checkout.total_bytes, in_place=in_place,
        digest=recorded_digest(state, change.name, host, checkout.commit),
    )  # fmt: skip


def weights_drift(state: State, inventory: Inventory, facts: Mapping[str, HostFacts]) -> list[Drift]:
    """A checkpoint whose digest, measured on its host now, is not the one recorded when its replica was
    applied: the weights changed under the deployment (seed 003: a changed digest is drift)."""
    out = []
    for name, record in sorted(state.deployments.items()):
        for r in record.replicas:
            out += checkpoint_drift(name, r, record.model, inventory.host(r.host), facts.get(r.host))
    return out


def fetch_lines(change: DeploymentChange) -> list[str]:
    """The plan's lines for a change's fetches (the human view)."""
    out = []
    for f in change.fetches:
        what = "in place" if f.in_place else f"fetch {human(f.total_bytes)} ({len(f.files)} file(s))"
        digest = f"checkpoint digest {f.digest[:12]}" if f.digest else "digest pending"
        out.append(f"weights {f.repo}@{f.commit[:12]} on {f.host}: {what} into {f.dest}; {digest}")
    return out
