"""Drift: what changed on the hosts outside engine-ctl, against what the state records. Pure."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from engine_ctl.core.documents.inventory import Host
from engine_ctl.core.fit.hostfacts import BUSY_BYTES, HostFacts, UnitFact
from engine_ctl.core.model import Model
from engine_ctl.core.names import UNIT_PREFIX
from engine_ctl.core.plan.changes import Drift
from engine_ctl.core.plan.engines import engine_drift_detail
from engine_ctl.core.plan.internalkey import KEY_CHECK_PATH, REFUSED, internal_key_file, key_forms
from engine_ctl.core.plan.unitage import changed_after_start, written_after_start
from engine_ctl.core.plan.unitdiff import ENV_ASSIGNMENT, hide_argv
from engine_ctl.core.record.model import ReplicaRecord, State
from engine_ctl.core.render.guard import guard_name, guard_text, guarded_by
from engine_ctl.core.render.units import model_path_on_host
from engine_ctl.core.unitsetup import drop_ins_detail, not_enabled_detail
from engine_ctl.core.weights import checkout_dir
from engine_ctl.providers import Provider


def replica_drift(name: str, record: ReplicaRecord, fact: UnitFact | None, host: HostFacts) -> list[Drift]:
    """How the recorded replica's unit differs on its host: missing, edited by hand, stopped or crash-looping
    (and the GPUs another process holds meanwhile). An on-demand replica's unit being active or not is the
    scaler's doing, never drift: only its file (and its engine) are checked, and whether it can start at all (a
    failed start leaves it in systemd's start limit: apply resets it)."""
    if fact is None or fact.sha256 is None:
        return [Drift(host=record.host, unit=record.unit, deployment=name, kind="missing",
                      detail=f"unit file {record.unit} is missing on {record.host}")]  # fmt: skip
    out = []
    engine = engine_drift_detail(record, host)
    if engine:
        out.append(Drift(host=record.host, unit=record.unit, deployment=name, kind="engine-changed", detail=engine))
    if fact.sha256 != record.unit_sha256:
        detail = f"unit file edited by hand (sha256 {fact.sha256[:12]}… ≠ {record.unit_sha256[:12]}…)"
        out.append(Drift(host=record.host, unit=record.unit, deployment=name, kind="edited", detail=detail))
    if fact.drop_ins:
        out.append(Drift(host=record.host, unit=record.unit, deployment=name, kind="drop-in",
                         detail=drop_ins_detail(record.unit, record.host, fact.drop_ins)))  # fmt: skip
    if not record.on_demand and fact.unit_file_state not in (None, "enabled"):
        out.append(not_enabled(record.host, record.unit, fact.unit_file_state, name))
    if record.on_demand and fact.active_state == "failed":
        out.append(_cannot_start(name, record, fact))
    if fact.stopped_by_signal:
        out.append(Drift(host=record.host, unit=record.unit, deployment=name, kind="stopped",
                         detail=f"{record.unit} runs on {record.host} but its engine (PID {fact.main_pid}) is stopped "
                         "by a signal (SIGSTOP): it answers nothing; apply restarts it"))  # fmt: skip
    taken = port_taken(name, record, fact, host)
    if taken is not None:
        out.append(taken)
    if fact.active_state != "active" and not record.on_demand:
        out.append(_not_running(name, record, fact))
        held = [g for g in host.gpus if g.uuid in record.gpus and (g.memory_used_bytes or 0) > BUSY_BYTES]
        for g in held:
            out.append(Drift(host=record.host, unit=record.unit, deployment=name, kind="gpu-held",
                             detail=f"GPU {g.index} ({g.uuid}) is held by another process"))  # fmt: skip
    return out


def launch_drift(name: str, provider: Provider, record: ReplicaRecord, fact: UnitFact | None) -> list[Drift]:
    """What the replica's running engine was started with, against what its unit gives: its command line (an
    engine that keeps it, provider.keeps_argv: other words there mean a wrapper at its executable's path added
    them) and its environment's settings (provider.env_prefixes: one its unit does not set came from systemd's
    manager environment). apply restarts it, with the manager's such settings unset first."""
    if fact is None or fact.active_state != "active":
        return []
    said = []
    want = hide_argv(record.argv)[1:]
    got = fact.proc_argv
    if provider.keeps_argv and got and want:
        same = len(got) - len(want) in (1, 2) and tuple(got[len(got) - len(want) :]) == want
        if not same:
            known = {w.partition("=")[0] for w in want}
            added = sorted({w.partition("=")[0] for w in got[1:] if w.startswith("--")} - known)
            said.append(f"its engine (PID {fact.main_pid}) runs with other arguments than its unit gives"
                        + (f" ({', '.join(added)} added)" if added else "")
                        + " (a wrapper at its executable's path?)")  # fmt: skip
    text = fact.text or ""
    if provider.env_prefixes and fact.proc_env is not None and "\nEnvironmentFile=" not in text:
        own = {m.group("quoted") or m.group("name") for line in text.splitlines() if line.startswith("Environment=")
               for m in ENV_ASSIGNMENT.finditer(line.partition("=")[2])}  # fmt: skip
        foreign = [n for n in fact.proc_env if n.startswith(provider.env_prefixes) and n not in own]
        if foreign:
            said.append(f"its engine's environment sets {', '.join(foreign)}, which its unit does not (systemd's "
                        "manager environment: `systemctl set-environment`); each changes how it serves")  # fmt: skip
    if not said:
        return []
    detail = f"{record.unit} on {record.host}: {'; '.join(said)}; apply restarts it on what its unit gives"
    return [Drift(host=record.host, unit=record.unit, deployment=name, kind="launch", detail=detail)]


def replica_key_drift(
    name: str, provider: Provider, record: ReplicaRecord, hf: HostFacts | None, sent: str | None
) -> list[Drift]:
    """Where a replica behind a gateway refuses the key its host holds, or its host holds another key than the
    gateways send (its engine loads that one at its next start): apply writes the key and restarts it."""
    key_file = internal_key_file(record.argv)
    if hf is None or key_file is None:
        return []
    said = []
    answer = hf.key_checks.get(str(record.port))
    if answer in REFUSED:
        said.append(f"it refuses the key its host holds (HTTP {answer} to GET {KEY_CHECK_PATH})")
    if sent is not None:
        for path in key_forms(provider):
            if path not in hf.replica_keys:  # not read (the probe's user may not read it): no verdict
                continue
            held = hf.replica_keys[path]
            if held is None or sent not in held:
                said.append(f"{path} is missing" if held is None else f"{path} holds another key")
    if not said:
        return []
    detail = f"internal key: {'; '.join(said)}; apply writes the key; a running replica restarts on it, drained first"
    return [Drift(host=record.host, unit=record.unit, deployment=name, kind="internal-key", detail=detail)]


def checkpoint_drift(name: str, record: ReplicaRecord, model: Model | None, entry: Host | None,
                     host: HostFacts | None) -> list[Drift]:  # fmt: skip
    """The replica's hf: checkpoint, measured on its host now, against the digest recorded when it was applied:
    the weights changed under the deployment (seed 003: a changed digest is drift). Apply repairs it: the fetch
    verifies every file again and fetches a changed one anew, then the replica restarts on them."""
    hf = model.hf if model is not None else None
    if hf is None or not hf.commit or not record.checkpoint_digest or entry is None or host is None:
        return []
    dest = checkout_dir(entry.models_dir, hf.repo, hf.commit)
    now = host.checkpoints.get(dest)
    if now is None or now == record.checkpoint_digest:
        return []
    detail = (f"the checkpoint digest of {hf.repo}@{hf.commit[:12]} at {dest} changed: recorded "
              f"{record.checkpoint_digest[:12]}, measured {now[:12]}")  # fmt: skip
    return [Drift(host=record.host, unit=record.unit, deployment=name, kind="weights-changed", detail=detail)]


def weights_written_drift(name: str, record: ReplicaRecord, model: Model | None, entry: Host | None,
                          host: HostFacts | None, fact: UnitFact | None) -> list[Drift]:  # fmt: skip
    """Weights written at the model's path after the replica's engine started (a file replaced in place, a
    checkpoint updated): the engine serves what it loaded, not what the path holds now. Apply restarts it. A file
    time ahead of its host's clock is not reported by the probe (a file server's skew, not a change)."""
    if model is None or entry is None or host is None:
        return []
    if model.hf is not None and model.hf.commit and record.checkpoint_digest:  # its digest says (checkpoint_drift):
        return []  # its files' inode times move when engine-ctl links or prunes checkouts, which changes no byte
    path = model_path_on_host(model, entry)
    when = changed_after_start(fact, host.model_mtimes.get(path), "written")
    if when is None:
        return []
    detail = (f"the weights at {path} were written after the replica started ({when}): it serves what it loaded; "
              "apply restarts it on them")  # fmt: skip
    return [Drift(host=record.host, unit=record.unit, deployment=name, kind="weights-changed", detail=detail)]


def unit_written_drift(name: str, record: ReplicaRecord, fact: UnitFact | None) -> list[Drift]:
    """The replica's unit file changed after its engine started, its content now as recorded: the engine runs
    what the file said when it started (a unit edited, restarted, then put back with `cp -p`: other limits, another
    user, an address filter gone), not what it says now. Apply restarts it on its file. An edit the file still
    holds is `edited` drift already; a parked deployment's units, which apply writes while their engines sleep on,
    are not asked (deployment.keep_replica)."""
    if fact is None or fact.sha256 != record.unit_sha256:
        return []
    when = written_after_start(fact)
    if when is None:
        return []
    detail = (f"{record.unit} on {record.host}: its unit file changed after its engine started ({when}: edited, "
              "restarted, then put back?), so the engine may run settings its file does not give; apply restarts it "
              "on what its unit gives")  # fmt: skip
    return [Drift(host=record.host, unit=record.unit, deployment=name, kind="launch", detail=detail)]


def guard_drift(name: str, record: ReplicaRecord, unit_text: str, host: HostFacts, parked: bool = False) -> list[Drift]:
    """The replica's guard (engine_ctl.core.render.guard) as its host has it, against what its unit carries:
    missing, edited by hand, not running beside its running replica, or running what its file said before it last
    changed (edited, restarted, put back: an address filter gone; not asked while `parked`, whose held rewrites
    write the guard too). Named after the guard's unit; the repair rewrites and restarts the replica, which writes
    the guard again and restarts it with it (PartOf=)."""
    expected = guard_text(unit_text)
    if expected is None:
        return []
    guard = guard_name(record.unit)
    units = {u.name: u for u in host.units}
    fact = units.get(guard)
    if fact is None or fact.sha256 is None:
        return [Drift(host=record.host, unit=guard, deployment=name, kind="missing",
                      detail=f"the guard's unit file {guard} is missing on {record.host}")]  # fmt: skip
    if fact.sha256 != hashlib.sha256(expected.encode()).hexdigest():
        return [Drift(host=record.host, unit=guard, deployment=name, kind="edited",
                      detail=f"the guard's unit file {guard} was edited by hand")]  # fmt: skip
    if fact.drop_ins:
        return [Drift(host=record.host, unit=guard, deployment=name, kind="drop-in",
                      detail=drop_ins_detail(guard, record.host, fact.drop_ins))]  # fmt: skip
    replica = units.get(record.unit)
    if replica is not None and replica.active_state == "active" and fact.active_state != "active":
        detail = f"{guard} is {fact.active_state}/{fact.sub_state} beside its running replica"
        return [Drift(host=record.host, unit=guard, deployment=name, kind="stopped", detail=detail)]
    when = None if parked else written_after_start(fact)
    if when is not None:
        detail = (f"the guard {guard} on {record.host}: its unit file changed after it started ({when}: edited, "
                  "restarted, then put back?), so it may let through what its file does not; apply restarts the "
                  "replica, and its guard with it")  # fmt: skip
        return [Drift(host=record.host, unit=guard, deployment=name, kind="launch", detail=detail)]
    return []


def not_enabled(host: str, unit: str, unit_file_state: str | None, deployment: str | None = None) -> Drift:
    """A unit engine-ctl enables (an always-on replica, a gateway, the scaler) that is not: it does not start at
    the next boot (`systemctl disable`, or enabled for this boot only: enabled-runtime). Apply enables it."""
    return Drift(host=host, unit=unit, deployment=deployment, kind="disabled",
                 detail=not_enabled_detail(host, unit, unit_file_state))  # fmt: skip


def _cannot_start(name: str, record: ReplicaRecord, fact: UnitFact) -> Drift:
    """An on-demand slot whose last start failed: systemd refuses to start it again within its start limit, so
    the scaler's next start of it would fail too (the scaler resets a failed slot first; apply resets it now)."""
    detail = f"on-demand replica {record.index}: {record.unit} is {fact.active_state}/{fact.sub_state}"
    if fact.exec_main_status:
        detail += f" (exit status {fact.exec_main_status})"
    detail += ": its last start failed and systemd will not start it again until it is reset; apply resets it"
    return Drift(host=record.host, unit=record.unit, deployment=name, kind="start-failed", detail=detail)


def port_taken(name: str, record: ReplicaRecord, fact: UnitFact, host: HostFacts) -> Drift | None:
    """A replica whose engine does not run (stopped by an operator, on demand, crashed) while something listens on
    its port: not its engine, nor its guard (engine_ctl.core.render.guard), so another process. Its start then
    fails, or its health gate reaches that process; apply cannot free the port, so the plan names it."""
    if fact.active_state not in ("inactive", "failed") and fact.sub_state != "auto-restart":
        return None
    if record.port not in host.ports_in_use:
        return None
    guard = next((u for u in host.units if u.name == guard_name(record.unit)), None)
    if guard is not None and guard.active_state == "active":
        return None
    return Drift(host=record.host, unit=record.unit, deployment=name, kind="port-taken",
                 detail=f"port {record.port} on {record.host} is taken by another process while {record.unit} does "
                 "not run: its start fails (or its health gate reaches that process) until the port is free (`ss "
                 f"-ltnp 'sport = :{record.port}'` on {record.host} names the process)")  # fmt: skip


def _not_running(name: str, record: ReplicaRecord, fact: UnitFact) -> Drift:
    looping = (fact.n_restarts or 0) >= 3 or fact.active_state == "failed"
    detail = f"{record.unit} is {fact.active_state}/{fact.sub_state}"
    if fact.exec_main_status:
        detail += f" (exit status {fact.exec_main_status})"
    if (fact.n_restarts or 0) > 0:
        detail += f" after {fact.n_restarts} restart(s)"
    return Drift(host=record.host, unit=record.unit, deployment=name,
                 kind="crash-looping" if looping else "stopped", detail=detail)  # fmt: skip


def unmanaged_units(
    state: State,
    facts: Mapping[str, HostFacts],
    elsewhere: set[tuple[str, str]] | frozenset[tuple[str, str]] = frozenset(),
) -> list[Drift]:
    """Units named like engine-ctl's on the hosts that this state does not record (nor another state owns,
    `elsewhere`: (host, unit)): left alone, and said."""
    managed = {r.unit for rec in state.deployments.values() for r in rec.replicas}
    managed |= {m.unit for rec in state.deployments.values() for r in rec.replicas for m in r.members}
    out = []
    for host, f in sorted(facts.items()):
        for u in f.units:
            mine = u.name in managed or guarded_by(u.name) in managed  # a replica's guard goes with it
            if u.name.startswith(UNIT_PREFIX) and not mine and (host, u.name) not in elsewhere:
                detail = f"{u.name} on {host} is not in this state; engine-ctl leaves it alone"
                out.append(Drift(host=host, unit=u.name, kind="unmanaged", detail=detail))
    return out
