"""The scaler's envelope from the recorded deployments, and reading the scaler's own state back (for `status` and
the plan's "N running of min..max, by the scaler, <time>: <reason>"). Pure."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

from engine_ctl.core.documents.inventory import Host, Inventory
from engine_ctl.core.plan.unitage import changed_after_start, written_after_start
from engine_ctl.core.plan.wake import Woken, parked, wake_steps
from engine_ctl.core.record.model import DeploymentRecord, State
from engine_ctl.core.render.scaler import (
    COMMAND_PATH,
    SCALER_CONFIG,
    SCALER_PROGRAM,
    SCALER_UNIT,
    ScalerDeployment,
    SlotInput,
    deployments_digest,
    scaler_host,
    scaler_slot,
)
from engine_ctl.core.render.scalerlock import ScalerLock, scaler_lock
from engine_ctl.core.unitsetup import drop_ins_detail, not_enabled_detail
from engine_ctl.providers import PROVIDERS


def slot_inputs(rec: DeploymentRecord) -> list[SlotInput]:
    """Every placed replica of a record (slot a; a surge's b exists only during an apply)."""
    cpu = rec.plan is not None and rec.plan.accelerator == "cpu"
    ram = rec.plan.memory_bytes if rec.plan is not None and cpu else 0
    cores = rec.plan.cpu_cores if rec.plan is not None and cpu else 0
    return [
        SlotInput(
            index=r.index,
            slot=r.slot,
            host=r.host,
            port=r.port,
            unit=r.unit,
            gpus=tuple(r.gpus),
            ram_bytes=ram,
            cpu_cores=cores,
            on_demand=bool(getattr(r, "on_demand", False)),
        )
        for r in sorted(rec.replicas, key=lambda r: (r.index, r.slot))
        if r.status != "removing"
    ]


def scaler_deployment(rec: DeploymentRecord, hosts: Mapping[str, Host]) -> ScalerDeployment | None:
    if rec.spec is None or rec.plan is None:
        return None
    provider = PROVIDERS.get(rec.plan.engine)
    health = provider.health_path if provider else "/health"
    slots = [s for s in (scaler_slot(i, hosts, health) for i in slot_inputs(rec)) if s is not None]
    held = rec.operator is not None  # stopped, parked or deleted by an operator: the scaler never starts a slot
    return ScalerDeployment(
        name=rec.name, id=rec.id or rec.name, revision=rec.revision, min=rec.spec.replicas_min,
        max=rec.spec.replicas_max,
        parallel=max(rec.plan.parallel, 1), idle_minutes=rec.spec.idle_minutes, priority=rec.spec.priority,
        metric=provider.in_flight_metric if provider else "", stopped=held, slots=tuple(slots),
        parked=wake_steps(rec, provider),
    )  # fmt: skip


def scaler_deployments(state: State, hosts: Mapping[str, Host]) -> list[ScalerDeployment]:
    """The deployments the scaler acts on: those with an on-demand slot, and those parked (a request wakes them)."""
    found = (scaler_deployment(rec, hosts) for _, rec in sorted(state.deployments.items()))
    return [d for d in found if d is not None and d.acts]


KEEP_DECISIONS = 20
"""The decisions status shows (the scaler keeps as many)."""


class Decision(BaseModel):
    """One decision of the scaler, as its state.json records it."""

    model_config = ConfigDict(extra="ignore")

    at: str
    action: str
    """up, down, zero, wake, woken (a parked deployment a request woke), preempt, hold (nothing free), failed,
    reset (a slot whose last start failed, reset before a new start), gateway (one did not answer, or answers again)."""
    slot: int | None = None
    host: str | None = None
    reason: str
    figure: float | None = None
    """The figure it acted on (in flight per replica, idle seconds)."""
    scaler: str | None = None
    """The gateway host whose scaler decided (with several, the one that held the PostgreSQL lock)."""


class ScalerView(BaseModel):
    """What the scaler says of one deployment (its state.json's entry)."""

    model_config = ConfigDict(extra="ignore")

    state: str = "Ready"
    reason: str | None = None
    wanted: int = 0
    ready: int = 0
    running: list[int] = []
    decisions: list[Decision] = []
    woken: Woken | None = None
    """A parked deployment a request woke (engine_ctl.core.plan.wake)."""


def scaler_views(document: Any, host: str | None = None) -> dict[str, ScalerView]:
    """The scaler's state.json (as the gateway host's facts carry it) -> deployment -> what it says; {} for
    anything else (no scaler, an unreadable file). `host`: the gateway host it is from (each decision says so)."""
    if not isinstance(document, dict) or not isinstance(document.get("deployments"), dict):
        return {}
    out = {}
    for name, entry in document["deployments"].items():
        try:
            view = ScalerView.model_validate(entry)
        except ValueError:
            continue
        if host is not None:
            view.decisions = [d if d.scaler else d.model_copy(update={"scaler": host}) for d in view.decisions]
        out[str(name)] = view
    return out


def leads(document: Any) -> tuple[bool, str]:
    """How a scaler's state.json ranks (the higher, the more it is to be believed): one that acts (no lock, or
    it holds the lock) above one that watches, then the more recently written."""
    lock = document.get("lock") if isinstance(document, dict) else None
    acting = not isinstance(lock, dict) or bool(lock.get("leader"))
    return acting, str(document.get("updated") or "") if isinstance(document, dict) else ""


def running_line(view: ScalerView, lo: int, hi: int) -> str:
    """The plan's line: "3 running of 1..4, by the scaler, 14:02:10: in flight 7.0/replica > 3/4 of parallel 4"."""
    line = f"{len(view.running)} running of {lo}..{hi}"
    last = next((d for d in reversed(view.decisions) if d.action not in NOT_SCALING), None)  # what it did
    if last is None:
        return line
    clock = last.at[11:19] if len(last.at) >= 19 else last.at
    return f"{line}, by the scaler, {clock}: {last.reason}"


NOT_SCALING = ("gateway", "lead", "follow")
"""Decisions that start or stop nothing: a gateway not answering, the PostgreSQL lock taken or lost."""


def decision_rows(views: Mapping[str, ScalerView], names: Iterable[str]) -> list[dict[str, object]]:
    return [{"deployment": n, **d.model_dump(mode="json")} for n in names if n in views for d in views[n].decisions]


class ScalerPlan(BaseModel):
    """Where the scaler runs and with what timings, and what it says runs now: the plan shows it."""

    model_config = ConfigDict(extra="forbid")

    host: str
    poll_s: int
    decide_every_s: int
    hold_s: int
    lock: ScalerLock | None = None
    """With PostgreSQL state: a scaler on every gateway host (lock.hosts), and the one that holds this lock acts."""
    deployments: list[str] = []
    """The deployments it acts on (max above min, or min 0), and those parked (a request wakes them)."""
    running: dict[str, str] = {}
    """Deployment -> "N running of min..max, by the scaler, <time>: <reason>" (from the scaler's state.json)."""
    stopped: list[str] = []
    """Hosts it should run on where its unit does not run (never installed, stopped, failed): a change, apply
    starts it there. Without it a deployment at zero never wakes (issue 24's soak, seed 7, step 198: an apply
    killed before its scaler step left "No changes" and every request 503 after the hold)."""
    stale: list[str] = []
    unit_drift: dict[str, str] = {}
    """Host -> how its running scaler's unit differs from what apply leaves (drop-ins, not enabled): a change."""
    """Hosts whose scaler runs with deployments other than the recorded ones give (scaler.json's, by digest): a
    change, apply rewrites its configuration. Issue 24's soak (seed 7, step 198): `start` of a deleted min-0
    deployment, then an apply killed before its scaler step: the replica was installed and routed, the scaler
    knew nothing of it, the plan said No changes, and every request 503 after the hold."""


def scales(spec: Any) -> bool:
    return spec is not None and (spec.replicas_max > spec.replicas_min or spec.replicas_min == 0)


def plan_scaler(
    changes: Iterable[Any], state: State, inventory: Inventory, facts: Mapping[str, Any],
    lock: ScalerLock | None = None,
) -> ScalerPlan | None:  # fmt: skip
    """The scaler of this plan: on the first gateway host by name (exactly one), or with `lock` (PostgreSQL
    state) on every gateway host, one acting; None without a gateway or a deployment that scales."""
    host = scaler_host(inventory)
    specs = {c.name: c.spec for c in changes if c.action != ["delete"]}
    for name, rec in state.deployments.items():
        specs.setdefault(name, rec.spec)
    asleep = {n for n, rec in state.deployments.items() if parked(rec) and specs.get(n) is not None}
    hosts = {h.name: h for h in inventory.hosts}
    names = sorted(n for n, spec in specs.items() if n in asleep or (scales(spec) and configured(state, n, hosts)))
    if host is None or not names:
        return None
    runs_on = lock.hosts if lock is not None else (host.name,)
    views = scaler_views_of(facts[n] for n in runs_on if n in facts)
    running = {n: running_line(views[n], specs[n].replicas_min, specs[n].replicas_max) for n in names if n in views}
    stopped = [n for n in runs_on if n in facts and not scaler_runs(facts[n])]
    expected = deployments_digest(scaler_deployments(state, hosts))
    s = inventory.scaling
    settings = {"poll_s": s.poll_s, "decide_every_s": s.decide_every_s, "hold_s": inventory.gateway.hold_s}
    stale = [n for n in runs_on if n in facts and n not in stopped and config_stale(facts[n], expected, settings)]
    unit_drift = {
        n: d for n in runs_on if n in facts and n not in stopped for d in [scaler_unit_drift(n, facts[n])] if d
    }
    loose = authorization_drift(facts)
    if loose:  # apply authorizes the scalers' key on every host it reaches again (its install)
        unit_drift[host.name] = "; ".join([*([unit_drift[host.name]] if host.name in unit_drift else []), *loose])
    return ScalerPlan(host=host.name, poll_s=s.poll_s, decide_every_s=s.decide_every_s, hold_s=inventory.gateway.hold_s,
                      deployments=names, running=running, lock=lock, stopped=stopped, stale=stale,
                      unit_drift=unit_drift)  # fmt: skip


def config_stale(host_facts: Any, deployments_sha256: str, settings: Mapping[str, int]) -> bool:
    """Whether the scaler.json of a host whose scaler runs is not what apply writes: other deployments than the
    recorded ones give (by digest), other settings than the inventory's (poll_s, decide_every_s, hold_s), a file
    that is not its JSON, or none at all beside its unit (the scaler then restarts again and again)."""
    if getattr(host_facts, "scaler_config_unreadable", False):
        return True
    found = getattr(host_facts, "scaler_config_sha256", None)
    if found is None:
        unit = next((u for u in getattr(host_facts, "units", ()) if u.name == SCALER_UNIT), None)
        return unit is not None and unit.sha256 is not None
    if found != deployments_sha256:
        return True
    now = getattr(host_facts, "scaler_settings", None)
    return now is not None and any(now.get(key) != value for key, value in settings.items())


def authorization_drift(facts: Mapping[str, Any]) -> list[str]:
    """Hosts whose authorization of the scalers' key is not what apply writes: a line without the forced command
    (the key is then a shell there), or a forced command that is not engine-ctl's program."""
    out = []
    for name, hf in sorted(facts.items()):
        found = getattr(hf, "scaler_authorization", None) or {}
        if found.get("loose"):
            out.append(f"the scalers' key is authorized on {name} without its forced command (authorized_keys: "
                       f"{', '.join(repr(o) for o in found['loose'][:2])}): it opens a shell there; apply writes "
                       "its line again")  # fmt: skip
        if found.get("command") in ("changed", "missing"):
            out.append(f"the scalers' forced command on {name} ({COMMAND_PATH}) is {found['command']}: apply writes "
                       "it again")  # fmt: skip
    return out


def scaler_unit_drift(host: str, host_facts: Any) -> str | None:
    """How a host's running scaler unit differs from what apply leaves: drop-ins change it, it is not enabled (it
    would not start at boot), its file or its program was edited (the file's content-sha256 and program-sha256
    header lines say what engine-ctl wrote), its process started before its unit, configuration or program last
    changed (edited, restarted, then put back), or its process is stopped by a signal (it wakes and scales nothing).
    Apply removes the drop-ins, writes its files again, enables it and restarts it."""
    unit = next((u for u in getattr(host_facts, "units", ()) if u.name == SCALER_UNIT), None)
    if unit is None:
        return None
    said = []
    claimed = re.search(r"(?m)^# content-sha256: ([0-9a-f]{64})$", unit.text or "")
    if claimed and unit.body_sha256 and claimed.group(1) != unit.body_sha256:
        said.append(f"{SCALER_UNIT} edited by hand on {host} (its content-sha256 is not its text's): apply writes it "
                    "again and restarts it")  # fmt: skip
    program = re.search(r"(?m)^# program-sha256: ([0-9a-f]{64})$", unit.text or "")
    found = getattr(host_facts, "scaler_program_sha256", None)
    if program and found and found != program.group(1):
        wanted = program.group(1)
        said.append(f"the scaler's program on {host} ({SCALER_PROGRAM}) is not the one its unit was written for "
                    f"(sha256 {found[:12]}… ≠ {wanted[:12]}…): apply writes it again and restarts it")  # fmt: skip
    when = written_after_start(unit)
    if when is not None and not said:
        said.append(f"{SCALER_UNIT} on {host} changed after it started ({when}: edited, restarted, then put back?), "
                    "so it may run settings its unit does not give: apply restarts it")  # fmt: skip
    files = changed_after_start(unit, getattr(host_facts, "scaler_files_changed_at", None))
    if files is not None and not said:
        said.append(f"the scaler's configuration or program on {host} ({SCALER_CONFIG}, {SCALER_PROGRAM}) changed "
                    f"after it started ({files}: edited, restarted, then put back?), so it may run what they do not "
                    "say: apply restarts it")  # fmt: skip
    if unit.stopped_by_signal:
        said.append(f"{SCALER_UNIT} runs on {host} but its process (PID {unit.main_pid}) is stopped by a signal "
                    "(SIGSTOP): it wakes no deployment and scales none; apply restarts it")  # fmt: skip
    if unit.drop_ins:
        said.append(drop_ins_detail(SCALER_UNIT, host, unit.drop_ins))
    if unit.sha256 is not None and unit.unit_file_state not in (None, "enabled"):
        said.append(not_enabled_detail(host, SCALER_UNIT, unit.unit_file_state))
    return "; ".join(said) or None


def configured(state: State, name: str, hosts: Mapping[str, Host]) -> bool:
    """Whether apply gives the scaler a deployment whose documents scale: always, unless an operator stopped or
    deleted it. apply leaves such a deployment's replicas as they are (its start rolls the documents in), and the
    scaler's configuration is made from what is recorded (scaler_deployments): the deployment is there only if a
    recorded slot is on demand. The plan must expect the same scaler apply leaves running, or none."""
    rec = state.deployments.get(name)
    if rec is None or rec.operator is None:
        return True
    found = scaler_deployment(rec, hosts)
    return found is not None and found.acts


def scaler_runs(host_facts: Any) -> bool:
    """Whether a host's scaler unit runs, or systemd is bringing it back (activating: auto-restart)."""
    unit = next((u for u in getattr(host_facts, "units", ()) if u.name == SCALER_UNIT), None)
    return unit is not None and unit.active_state in ("active", "activating", "reloading")


def lock_refusals(scaler: ScalerPlan | None, facts: Mapping[str, Any]) -> list[str]:
    """With the PostgreSQL lock, each gateway host's scaler holds its session through psql: a host without it
    refuses the plan (one reached and known to lack it)."""
    if scaler is None or scaler.lock is None:
        return []
    lacking = [h for h in scaler.lock.hosts if h in facts and getattr(facts[h], "psql", "") is None]
    return [
        f"gateway host {h} has no psql, which its scaler needs for the PostgreSQL lock (the state is in PostgreSQL): "
        "install the PostgreSQL client there (Debian, Ubuntu: apt install postgresql-client; RHEL, Fedora: dnf "
        "install postgresql)"
        for h in lacking
    ]


def scaler_views_of(facts: Iterable[Any]) -> dict[str, ScalerView]:
    """What the scalers say, from the facts of the gateway hosts (each that runs one has its state.json): each
    deployment as the acting scaler sees it (the lock's holder, with several), with the decisions of every
    scaler, in time order, each naming the host that decided."""
    docs = sorted(((hf.host, hf.scaler_state) for hf in facts if getattr(hf, "scaler_state", None)),
                  key=lambda hd: leads(hd[1]))  # fmt: skip
    out: dict[str, ScalerView] = {}
    decisions: dict[str, list[Decision]] = {}
    for host, doc in docs:  # the most believed last: its view wins
        for name, view in scaler_views(doc, host).items():
            out[name] = view
            decisions.setdefault(name, []).extend(view.decisions)
    for name, view in out.items():
        merged = sorted({(d.at, d.scaler, d.action, d.reason): d for d in decisions[name]}.values(), key=lambda d: d.at)
        view.decisions = merged[-KEEP_DECISIONS:]
    return out


OPERATOR_HELD = ("stopping", "stopped", "parking", "parked", "deleted")
"""A deployment's phases under an operator's verb (status.HeldState): the scaler's view never replaces them (a
parked one a request woke shows as it serves: status_cmd drops the verb before it asks)."""


def with_scaler(status: Any, view: ScalerView | None) -> Any:
    """A deployment's status as the scaler sees it too: ScaledToZero or Starting (with the scaler's reason) when
    nothing serves, `replicas` wanted now, and its decisions."""
    if view is None:
        return status
    if status.state in OPERATOR_HELD:  # an operator's verb holds it: the scaler starts nothing, its phase is the verb's
        return status.model_copy(update={"decisions": view.decisions})
    # READY never exceeds REPLICAS: a replica the scaler no longer wants (it is stopping it, or it lost count when
    # the gateway it reads went away) still serves until it stops
    update: dict[str, Any] = {"decisions": view.decisions, "replicas": max(view.wanted, status.ready)}
    failed = any(i.state == "failed" for i in status.instances)  # a unit that failed says so, whoever started it
    if status.ready == 0 and view.state in ("ScaledToZero", "Starting") and not failed:
        update.update(state=view.state, reason=view.reason)
    if status.ready > 0 and status.state != "Failed" and view.state == "Ready":
        update["state"] = "Ready"
        update["reason"] = view.reason
    return status.model_copy(update=update)


def without_scaler(changes: Iterable[Any], inventory: Inventory) -> dict[str, str]:
    """Deployment -> a warning, for those that scale when the inventory has no gateway host (so no scaler)."""
    if scaler_host(inventory) is not None:
        return {}
    return {
        c.name: f"{c.name}: replicas above min ({c.spec.replicas_min}) are on demand and only the scaler starts "
        "them; it runs on a gateway host (roles: [gateway]) and the inventory has none: "
        f"{c.spec.replicas_min} replica{'' if c.spec.replicas_min == 1 else 's'} will run"
        for c in changes
        if c.action != ["delete"] and scales(c.spec)
    }


def lock_tampering(saved: ScalerPlan | None, location: str, inventory: Inventory) -> list[str]:
    """A saved plan's scaler lock against the one this state (at `location`) and inventory give: apply hands the
    scalers' password to where the lock says, so a plan file edited to name another database or role is refused
    (empty: it is the same)."""
    if saved is None or saved.lock == scaler_lock(location, inventory):
        return []
    return ["the saved plan's scaler lock (where the scalers take it, as which role) is not the one this state and "
            "inventory give"]  # fmt: skip
