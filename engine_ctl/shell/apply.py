"""The apply executor: runs a Plan's steps over SSH, one replica at a time per host and per deployment,
health-gated, recording the state after every step so that a crash or Ctrl-C loses nothing."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field

from engine_ctl.core.decisions import DecisionAnswer, comparable_reference
from engine_ctl.core.documents.inventory import Host
from engine_ctl.core.fit.startup import parse_measurement, same_engine
from engine_ctl.core.names import UNIT_FORM, parse_unit_name
from engine_ctl.core.plan.changes import (
    CREATE,
    DELETE,
    SURGE,
    UPDATE,
    DeploymentChange,
    MemberStep,
    Plan,
    ReplicaChange,
)
from engine_ctl.core.plan.internalkey import internal_key_file
from engine_ctl.core.plan.status import recorded_verdict, size_text
from engine_ctl.core.record.model import (
    DeploymentRecord,
    FailedStart,
    MemberRecord,
    ReplicaRecord,
    StartupRecord,
    State,
)
from engine_ctl.core.record.requests import done_steps, step_done
from engine_ctl.core.render.units import bind_address, local_address, member_name, member_of, model_path_on_host
from engine_ctl.core.weights import WeightsFetch, human, is_checkout, waiting_reason
from engine_ctl.providers import PROVIDERS
from engine_ctl.shell.decisions import prove_ready
from engine_ctl.shell.fetch import FetchFailed, FetchProgress, HubAccess, fetch_weights, measure_checkpoint
from engine_ctl.shell.gateway.apply import GatewayApply
from engine_ctl.shell.gateway.runtime import GatewayFailure
from engine_ctl.shell.scaler.apply import ScalerApply, ScalerFailure
from engine_ctl.shell.scaler.lock import operator_dsn
from engine_ctl.shell.systemd import (
    NOT_THERE,
    PRUNE_NAMED,
    UNIT_DIR,
    UPLOAD_FAILED,
    disable_argv,
    failure_argv,
    held_stop_argv,
    install_argv,
    is_active,
    measured_argv,
    measurement,
    on_demand_argv,
    prune_checkout,
    remove_argv,
    restart_argv,
    rewrite_argv,
    start_argv,
    stop_argv,
    unset_manager_env_argv,
)
from engine_ctl.shell.transport import (
    CommandResult,
    HostFailure,
    SSHOptions,
    Transport,
    transport_for,
)
from engine_ctl.state.base import StateBackend

Progress = Callable[[str], None]


@dataclass(frozen=True)
class ApplyEvent:
    """One step of an apply, for pipelines and dashboards (`apply --json` prints each as a JSON line).

    event: started (a replica's step begins), healthy (a unit passed its health gate), installed (an on-demand
    replica's unit written and loaded, not started; or one that became on demand), removed (an old unit is
    stopped and deleted), failed (a step or a deployment failed; the reason says why), recorded (the deployment's
    outcome is written to the state)."""

    event: str
    deployment: str
    timestamp: str
    replica: int | None = None
    host: str | None = None
    unit: str | None = None
    action: str | None = None
    port: int | None = None
    revision: int | None = None
    state: str | None = None
    reason: str | None = None
    elapsed_s: float | None = None

    def as_json(self) -> dict[str, object]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


Observer = Callable[[ApplyEvent], None]


def utc_now() -> str:
    from datetime import UTC, datetime

    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


# Lines the health gate itself writes: a fallback only, the engine's own words come first.
GATE_LINES = ("the engine exited before readiness", "no healthy answer within")
ERROR_WORDS = ("error", "failed", "invalid", "unable", "cannot", "exception", "abort", "fatal")


def failure_reason(output: str, log_prefix: str = "") -> str:
    """Pure: the systemctl show + journal tail -> one line for LAST ERROR, in the engine's own words (without
    what the engine writes before each line: its provider's log_prefix)."""
    head, _, log = output.partition("---")
    props = dict(line.split("=", 1) for line in head.splitlines() if "=" in line)
    prefix = re.compile(log_prefix or "(?!)")
    lines = [prefix.sub("", ln.strip()) for ln in log.splitlines() if ln.strip()]
    engine = [ln for ln in lines if not ln.startswith(GATE_LINES)]
    interesting = [ln for ln in engine if any(w in ln.lower() for w in ERROR_WORDS)]
    # the first error is the cause (invalid magic …), the last what the engine made of it (exiting …)
    cause, final = (interesting[0], interesting[-1]) if interesting else ("", (engine or lines or [""])[-1])
    last = (f"{cause} … {final}" if cause and cause != final else final)[:400]
    result = props.get("Result", "unknown")
    status = props.get("ExecMainStatus", "")
    what = {
        "exit-code": f"the engine exited before readiness (exit status {status})",
        "signal": f"the engine was killed by a signal ({status})",
        "timeout": "the engine did not answer its health check within its start-up budget",
        "start-limit-hit": "3 restarts without serving",
        "core-dump": "the engine crashed (core dump)",
    }.get(result, f"the replica did not start ({result})")
    return f"launch_failed: launch failed: engine launch failed: {what}" + (f": {last}" if last else "")


# --- recording ----------------------------------------------------------------------------------------
def step_key(deployment: str, step: ReplicaChange) -> str:
    """A step as its request records it: what it does to which unit on which host, at which revision (a step the
    same request would run again is the same key)."""
    old = f" replacing {step.old_unit}@{step.old_host or step.host}" if step.old_unit else ""
    return f"{deployment}: {'/'.join(step.action)} {step.unit}@{step.host} revision {step.revision}{old}"


class Recorder:
    """The state in memory; every change is written at once, atomically, under one lock."""

    def __init__(self, backend: StateBackend, state: State) -> None:
        self.backend = backend
        self.state = state
        self._lock = threading.Lock()

    def change(self, fn: Callable[[State], None]) -> None:
        with self._lock:
            fn(self.state)
            self.state = self.backend.write(self.state)


def _record(state: State, name: str) -> DeploymentRecord:
    if name not in state.deployments:
        state.deployments[name] = DeploymentRecord(name=name)
    rec = state.deployments[name]
    if not rec.id:  # its stable ID, given once, when it is first created (or first recorded by this engine-ctl)
        rec.id = new_id()
    return rec


def new_id() -> str:
    """A deployment's (or an operation's) ID: a ULID."""
    from ulid import ULID

    return str(ULID())


def _put_replica(state: State, name: str, replica: ReplicaRecord) -> None:
    rec = _record(state, name)
    rec.replicas = [r for r in rec.replicas if r.unit != replica.unit or r.host != replica.host] + [replica]
    rec.replicas.sort(key=lambda r: (r.index, r.slot))


def _drop_replica(state: State, name: str, host: str, unit: str) -> None:
    rec = state.deployments.get(name)
    if rec is not None:
        rec.replicas = [r for r in rec.replicas if not (r.unit == unit and r.host == host)]


def _adopt(state: State, name: str, unit: str) -> None:
    rec = state.deployments.get(name)
    for r in rec.replicas if rec else []:
        if r.unit == unit and r.status in ("pending", "starting"):
            r.status = "serving"


def _reference(state: State, name: str, answer: DecisionAnswer) -> None:
    """The first answer to the readiness decision, kept for the wake check (one of an older check is replaced)."""
    rec = _record(state, name)
    if comparable_reference(rec.decision_reference) is None:
        rec.decision_reference = answer.as_record()


def _waiting(state: State, name: str, reason: str) -> None:
    rec = _record(state, name)
    if not any(r.status == "serving" for r in rec.replicas):
        rec.state = "Pending"
    rec.reason = reason


class Throttle:
    """True at most once every `every_s` seconds (and always when forced)."""

    def __init__(self, every_s: float) -> None:
        self.every_s, self.last = every_s, float("-inf")

    def due(self, force: bool) -> bool:
        now = time.monotonic()
        if force or now - self.last >= self.every_s:
            self.last = now
            return True
        return False


class FanOut:
    """--fanout for apply: at most `limit` hosts worked on at once across all deployments (a step that needs two
    hosts, a move, takes two of them, or all when the limit is below two)."""

    def __init__(self, limit: int) -> None:
        self.limit = max(1, limit)
        self.free = self.limit
        self.busiest = 0
        """The most hosts worked on at once during this apply (what the tests check)."""
        self._cond = threading.Condition()

    @contextmanager
    def hosts(self, n: int) -> Iterator[None]:
        n = min(max(1, n), self.limit)
        with self._cond:
            while self.free < n:
                self._cond.wait()
            self.free -= n
            self.busiest = max(self.busiest, self.limit - self.free)
        try:
            yield
        finally:
            with self._cond:
                self.free += n
                self._cond.notify_all()


def _still_named_after(rec: DeploymentRecord) -> list[str]:
    """The names a record had before `state mv` that some of its replicas' units still bear: once a roll has
    replaced them all, the old name is dropped, and nothing may act on units of that name for this record."""
    named = {parsed.deployment for r in rec.replicas if (parsed := parse_unit_name(r.unit)) is not None}
    return [n for n in rec.moved_from if n in named]


def _initialized(state: State, name: str, startup: StartupRecord | None, elapsed: float, failure: str | None) -> None:
    """The seed's LAST OPERATION of a first start (initialize succeeded, or failed with its error's code) and, once
    measured, the revision's start-up record."""
    rec = _record(state, name)
    if failure is not None:
        rec.last_operation = f"initialize failed ({failure.split(':', 1)[0]})"
        return
    rec.last_operation = "initialize succeeded"
    if startup is not None:
        rec.startup = startup


def carry_startup(rec: DeploymentRecord, change: DeploymentChange) -> None:
    """A new revision that changes only the instance count keeps the engine, and so its measured start-up."""
    s = rec.startup
    kept = s is not None and s.revision == rec.revision != change.revision
    if s is not None and kept and same_engine(rec.spec, rec.model, change.spec, change.model):
        rec.startup = s.model_copy(update={"revision": change.revision})


def _saved(state: State, name: str) -> None:
    """A deployment saved without starting it (`engine-ctl deploy`): Pending until `engine-ctl start`."""
    rec = _record(state, name)
    rec.state, rec.reason = "Pending", f"saved, not started: `engine-ctl start deployment {name}` starts it"


def _forget(state: State, name: str) -> None:
    state.deployments.pop(name, None)


def _set_status(state: State, name: str, host: str, unit: str, status: str, reason: str | None = None) -> None:
    rec = state.deployments.get(name)
    for r in rec.replicas if rec else []:
        if r.unit == unit and r.host == host:
            r.status = status  # type: ignore[assignment]
            r.reason = reason
    if rec is not None and status == "serving":  # the replica serves: its failed start's row goes (not a newer
        # revision's: the old replica a failed roll put back leaves the new one's row)
        served = {(r.index, r.revision) for r in rec.replicas if r.unit == unit and r.host == host}
        rec.failed_starts = [f for f in rec.failed_starts
                             if not any(i == f.index and v >= f.revision for i, v in served)]  # fmt: skip


def _start_failed(state: State, name: str, step: ReplicaChange, error: str) -> None:
    """A start that failed, its unit removed again: the instance keeps its row, with the error (seed 003)."""
    rec = _record(state, name)
    row = FailedStart(index=step.index, slot=step.slot, host=step.host, unit=step.unit, port=step.port,
                      gpu_indexes=step.gpu_indexes, revision=step.revision, error=error)  # fmt: skip
    rec.failed_starts = sorted([f for f in rec.failed_starts if f.index != step.index] + [row], key=lambda f: f.index)


# --- executing ------------------------------------------------------------------------------------------
def _uploaded(result: CommandResult, step: ReplicaChange | MemberStep) -> None:
    """A unit file that could not be written is the host's failure (as an upload that broke off), not the
    engine's: nothing was started."""
    if result.exit_code == UPLOAD_FAILED:
        said = result.stderr.strip().splitlines()
        raise HostFailure(step.host, "command", said[-1] if said else f"writing {UNIT_DIR}/{step.unit} failed")


@dataclass
class ApplyResult:
    failed: dict[str, str] = field(default_factory=dict)
    applied: list[str] = field(default_factory=list)
    interrupted: bool = False
    host_failures: dict[str, str] = field(default_factory=dict)
    unrecorded: list[str] = field(default_factory=list)
    """What happened on a host but could not be written to the state (its backend failed)."""


class StepFailed(Exception):
    pass


class Interrupted(Exception):
    """Ctrl-C: no further step starts; the state is recorded."""


class Executor:
    """Deployments roll in parallel; within one deployment, one replica at a time, in the plan's order: the next
    replica is touched only once the previous one is replaced and serving, and a failure halts that deployment."""

    def __init__(
        self,
        plan: Plan,
        hosts: Mapping[str, Host],
        recorder: Recorder,
        options: SSHOptions | None = None,
        progress: Progress | None = None,
        stop: threading.Event | None = None,
        observer: Observer | None = None,
        hub: HubAccess | None = None,
        request_id: str | None = None,
        fanout: int = 32,
        transports: Mapping[str, Transport] | None = None,
        save_only: frozenset[str] = frozenset(),
        fingerprint: frozenset[str] = frozenset(),
    ) -> None:
        """`save_only`: deployments whose new units are written and loaded, never started (`engine-ctl deploy`
        without --activate: core.plan.deploy). `fingerprint`: deployments whose checkpoint digest is measured on
        each host before a replica starts there, where no fetch measured it (a first start fingerprints the
        checkpoint). `request_id`: the request identity this apply records its completed steps under; a step it already
        recorded as done (an earlier run of the same request, cut off) is not run again. `transports`: hosts'
        connections already open (the plan's gathering left them, transport.fan_out), used instead of new ones and
        closed with the others when the run ends."""
        self.plan = plan
        self.save_only, self.fingerprint = save_only, fingerprint
        self.fanout = FanOut(fanout)
        self.request_id = request_id
        self.done = done_steps(recorder.state, request_id)
        self.hosts = hosts
        self.recorder = recorder
        self.options = options
        self.progress = progress or (lambda _m: None)
        self.stop = stop or threading.Event()
        self.observer = observer or (lambda _e: None)
        self._host_locks: dict[str, threading.Lock] = {name: threading.Lock() for name in hosts}
        self._held = threading.local()
        """The hosts this thread holds (_on): a replica group's step takes all of them at once."""
        self._transports: dict[str, Transport] = dict(transports or {})
        self._transports_lock = threading.Lock()
        self.result = ApplyResult()
        self.hub = hub or HubAccess()
        self._digests: dict[tuple[str, str], str] = {}
        """(deployment, host) -> the checkpoint digest measured there by this apply's fetch."""
        self.gateway = (
            GatewayApply(plan, hosts, self._record, lambda: self.recorder.state, options, self.progress)
            if plan.gateways
            else None
        )

    @contextmanager
    def _on(self, *names: str) -> Iterator[dict[str, Transport]]:
        """Hold the hosts (one step at a time per host) and their one reused connection each."""
        missing = [n for n in names if n not in self.hosts]
        if missing:
            raise StepFailed(f"host {missing[0]} is not in the inventory")
        held: frozenset[str] = getattr(self._held, "names", frozenset())
        new = sorted(set(names) - held)  # a replica group's step holds all its hosts first (_step): none new
        with ExitStack() as stack:
            for name in new:
                stack.enter_context(self._host_locks[name])
            if new:
                stack.enter_context(self.fanout.hosts(len(new)))  # taken last: no slot held while waiting
            self._held.names = held | set(new)
            try:
                out = {}
                for name in set(names):
                    with self._transports_lock:
                        if name not in self._transports:
                            self._transports[name] = transport_for(self.hosts[name], self.options)
                    out[name] = self._transports[name]
                yield out
            finally:
                self._held.names = held

    def _event(self, event: str, deployment: str, **fields: object) -> None:
        self.observer(ApplyEvent(event=event, deployment=deployment, timestamp=utc_now(), **fields))  # type: ignore[arg-type]

    def run(self) -> ApplyResult:
        changes = [c for c in self.plan.changes if c.changed or c.failed_reason or c.blocked]
        if self.gateway is not None and not self._gateway_step(self.gateway.before, "before the roll"):
            changes = []  # without the gateway's interim configuration and key, no replica is touched
        if changes:
            # one thread a deployment, no more than --fanout: each holds at most one step's hosts at a time
            with ThreadPoolExecutor(max_workers=min(len(changes), self.fanout.limit)) as pool:
                list(pool.map(self._deployment, changes))
        if self.gateway is not None:
            self._gateway_step(self.gateway.after, "after the roll")
            self.gateway.close()
        self._scaler()
        self._prune()
        for t in self._transports.values():
            t.close()
        self.result.interrupted = self.stop.is_set()
        return self.result

    def _gateway_step(self, step: Callable[[], None], when: str) -> bool:
        try:
            step()
        except (GatewayFailure, StepFailed, HostFailure, OSError) as exc:
            reason = f"the gateway {when}: {exc}"
            self.result.failed.setdefault("gateway", reason)
            self.progress(f"gateway: FAILED: {reason}")
            return False
        return True

    def _scaler(self) -> None:
        """The scaler after everything else: its configuration is what this apply recorded (shell/scaler_apply)."""
        if self.plan.scaler is None or self.stop.is_set():
            return
        scaler = ScalerApply(self.plan.scaler, self.hosts, lambda: self.recorder.state, self.options, self.progress,
                             operator_dsn(self.recorder.backend))  # fmt: skip
        try:
            scaler.run()
        except (ScalerFailure, HostFailure, OSError) as exc:
            self.result.failed.setdefault("scaler", f"the scaler on {self.plan.scaler.host}: {exc}")
            self.progress(f"scaler: FAILED: {exc}")

    def _prune(self) -> None:
        """The checkouts no deployment uses any more, last, and only when everything else succeeded (an old
        replica left serving by a failed roll still reads its weights); each checked against the host's models
        folder first: a plan file is untrusted input, and this deletes."""
        if not self.plan.prunes or self.result.failed or self.result.unrecorded or self.stop.is_set():
            return
        for p in self.plan.prunes:
            host = self.hosts.get(p.host)
            if host is None or not is_checkout(p.repo, p.commit, p.path, host.models_dir):
                self.result.failed.setdefault("prune", f"{p.host}: {p.path} is not a checkout of {p.repo}; kept")
                continue
            try:
                with self._on(p.host) as ts:
                    result = ts[p.host].run(prune_checkout(p.path), timeout=300)
            except (HostFailure, StepFailed, OSError) as exc:
                self.result.failed.setdefault("prune", f"pruning {p.line}: {exc}")
                continue
            if result.exit_code == PRUNE_NAMED:
                self.progress(f"weights {p.host}: kept {p.repo}@{p.commit[:12]}: {result.stderr.strip()}")
            elif result.exit_code != 0:
                self.result.failed.setdefault("prune", f"pruning {p.line}: {result.stderr.strip()}")
            else:
                self.progress(f"weights {p.host}: pruned {p.repo}@{p.commit[:12]} ({p.path})")

    def _gateway(self, step: Callable[[str, str], None], name: str, unit: str) -> None:
        """A gateway step of a roll (a new replica enters, an old one drains); its failure halts the roll."""
        if self.gateway is None:
            return
        try:
            step(name, unit)
        except GatewayFailure as exc:
            raise StepFailed(str(exc)) from exc

    def _record(self, fn: Callable[[State], None], what: str) -> None:
        """Write the state; a backend that fails is reported (apply exits 1), never an internal error. A deployment
        recorded without an ID gets the one the plan named (its units' headers carry it)."""
        ids = {c.name: c.deployment_id for c in self.plan.changes if c.deployment_id}

        def with_ids(s: State) -> None:
            unset = [n for n in ids if n not in s.deployments or not s.deployments[n].id]
            fn(s)
            for n in unset:
                if n in s.deployments:
                    s.deployments[n].id = ids[n]

        try:
            self.recorder.change(with_ids)
        except Exception as exc:  # the backend's own errors: disk full, database gone, permission
            self.result.unrecorded.append(f"{what}: {exc}")
            raise StepFailed(f"the state could not be written ({what}): {exc}") from exc

    def _deployment(self, change: DeploymentChange) -> None:
        name = change.name
        try:
            if change.failed_reason:
                self._record(lambda s: self._conclude(s, change, change.failed_reason, fit_failed=True), name)
                self.result.failed[name] = change.failed_reason
                self.progress(f"{name}: FAILED: {change.failed_reason}")
                self._event("failed", name, reason=change.failed_reason)
                self._event("recorded", name, state="Failed", revision=change.revision)
                return
            for fetch in change.fetches:
                self._fetch(change, fetch)
            if name in self.fingerprint:
                self._fingerprint(change)
            for unit in change.adopt:
                self._prove_adopted(change, unit)
                self._record(lambda s, u=unit: _adopt(s, name, u), name)  # type: ignore[misc]
                self.progress(f"{name}: {unit} runs and passed its health gate: recorded serving")
                self._event("recorded", name, unit=unit, state="serving")
            for step in self._ordered(change):
                self._guarded(change, step)
            if change.replicas and all(step.role == "held" for step in change.replicas):
                self.result.applied.append(name)  # its files written back; its record (held) stays
                kept = "its engine sleeps on" if self._asleep(name) else "kept stopped"
                self.progress(f"{name}: its unit files written again; {kept}")
                return
            if change.actions == DELETE:
                self._record(lambda s: _forget(s, name), name)
                self.progress(f"{name}: destroyed")
                self._event("recorded", name, state="destroyed", revision=change.revision)
                self.result.applied.append(name)
                return
            self._record(lambda s: self._conclude(s, change, None, applied=True), name)
            if name in self.save_only:
                self._record(lambda s: _saved(s, name), name)
            self._report_concluded(change)
        except Interrupted:
            return
        except StepFailed as exc:
            self._halted(change, str(exc))
        except HostFailure as exc:
            self.result.host_failures[exc.host] = exc.message
            self._halted(change, f"host {exc.host}: {exc.message}")

    def _report_concluded(self, change: DeploymentChange) -> None:
        name = change.name
        rec = self.recorder.state.deployments.get(name)
        state = rec.state if rec else "Pending"
        problems = [*change.blocked]
        if change.pending_reason:
            problems.append(change.pending_reason)
        self._event("recorded", name, state=state, revision=change.revision, reason="; ".join(problems) or None)
        if problems:
            self.result.failed[name] = "; ".join(problems)
            self.progress(f"{name}: {state} at revision {change.revision}, not complete: {'; '.join(problems)}")
        else:
            self.result.applied.append(name)
            said = "saved, not started," if name in self.save_only else state.lower()
            self.progress(f"{name}: {said} at revision {change.revision}")

    def _halted(self, change: DeploymentChange, reason: str) -> None:
        name = change.name
        self.result.failed[name] = reason
        try:
            self.recorder.change(lambda s: self._conclude(s, change, reason))
        except Exception as exc:
            self.result.unrecorded.append(f"{name}: {exc}")
        rec = self.recorder.state.deployments.get(name)
        serving = [r for r in rec.replicas if r.status == "serving"] if rec else []
        if serving:
            at = sorted({r.revision for r in serving})
            tail = f"{len(serving)} replica(s) still serve (revision {', '.join(map(str, at))})"
        else:
            tail = "no replica serves"
        self.progress(f"{name}: FAILED: {reason}; the roll stopped: {tail}")
        self._event("failed", name, reason=reason)
        state = rec.state if rec else None
        self._event("recorded", name, state=state, revision=rec.revision if rec else None, reason=tail)

    @staticmethod
    def _ordered(change: DeploymentChange) -> list[ReplicaChange]:
        """Leftovers of an interrupted apply first, then the plan's order."""
        return [s for s in change.replicas if s.cleanup] + [s for s in change.replicas if not s.cleanup]

    def _guarded(self, change: DeploymentChange, step: ReplicaChange) -> None:
        if self.stop.is_set():
            self.progress(f"{change.name}: interrupted before replica {step.index}; state recorded")
            raise Interrupted
        key = step_key(change.name, step)
        if key in self.done:
            self.progress(f"{change.name}: replica {step.index}: done before by request {self.request_id}: {key}")
            self._event(
                "skipped", change.name, replica=step.index, host=step.host, unit=step.unit,
                action="/".join(step.action), revision=step.revision, reason="done by this request before",
            )  # fmt: skip
            return
        self._guarded_step(change, step)
        if self.request_id is not None:
            rid = self.request_id
            self._record(lambda s: step_done(s, rid, key), change.name)

    def _guarded_step(self, change: DeploymentChange, step: ReplicaChange) -> None:
        self._event(
            "started", change.name, replica=step.index, host=step.host, unit=step.unit, action="/".join(step.action),
            revision=step.revision, reason=step.reason or None,
        )  # fmt: skip
        try:
            self._step(change, step)
        except (StepFailed, Interrupted):
            raise
        except HostFailure as exc:
            self.result.host_failures[exc.host] = exc.message
            raise StepFailed(f"replica {step.index} on {exc.host}: {exc.message}") from exc
        except (OSError, EOFError, ValueError) as exc:  # an upload or a command that broke off
            raise StepFailed(f"replica {step.index} on {step.host}: {type(exc).__name__}: {exc}") from exc

    @staticmethod
    def _conclude(
        state: State, change: DeploymentChange, failure: str | None, applied: bool = False, fit_failed: bool = False
    ) -> None:
        """The deployment's recorded state from its replicas' recorded ones (the rule status uses too)."""
        if change.actions == DELETE and change.name not in state.deployments:
            return
        rec = _record(state, change.name)
        if applied:
            carry_startup(rec, change)
            rec.whole_host = change.whole_host
            rec.revision = change.revision
            rec.spec, rec.model, rec.spec_hash, rec.plan = change.spec, change.model, change.spec_hash, change.fit
            rec.chosen = dict(change.chosen)
            rec.moved_from = _still_named_after(rec)
            limit = change.spec.replicas_max if change.spec else 0  # rows of replicas no longer asked for go
            rec.failed_starts = [f for f in rec.failed_starts if f.index < limit]
        wanted = change.spec.replicas_min if change.spec else len(rec.replicas)
        target = change.revision if applied else rec.revision
        pending = "; ".join([*([change.pending_reason] if change.pending_reason else []), *change.blocked]) or None
        rec.last_error = failure if failure else (None if applied else rec.last_error)
        found = recorded_verdict(
            rec.replicas, wanted, target, failure=rec.last_error, pending=pending, fit_failed=fit_failed
        )
        rec.state, rec.reason = found.state, found.reason

    @staticmethod
    def _budget(change: DeploymentChange) -> float:
        """The deployment's engine's start-up budget, plus a margin for systemd and SSH."""
        engine = PROVIDERS.get(change.fit.engine) if change.fit else None
        budget = engine.startup_budget_s if engine else max(p.startup_budget_s for p in PROVIDERS.values())
        own = change.spec.startup_timeout_s if change.spec is not None else None
        return (own or budget) + 60

    @staticmethod
    def _reason(t: Transport, change: DeploymentChange, unit: str) -> str:
        """Why `unit` failed, in its engine's own words."""
        engine = PROVIDERS.get(change.fit.engine) if change.fit else None
        return failure_reason(t.run(failure_argv(unit)).stdout, engine.log_prefix if engine else "")

    def _replica_record(self, step: ReplicaChange, status: str, digest: str = "") -> ReplicaRecord:
        members = [MemberRecord(rank=m.rank, host=m.host, unit=m.unit, port=m.port, gpus=m.gpus,
                                unit_sha256=m.unit_sha256, argv=m.argv, engine_version=m.engine_version,
                                engine_sha256=m.engine_sha256) for m in step.members]  # fmt: skip
        group_port = step.placement.group_port if step.placement is not None and members else None
        return ReplicaRecord(
            checkpoint_digest=digest, engine_version=step.engine_version, engine_sha256=step.engine_sha256,
            index=step.index, slot=step.slot, host=step.host, unit=step.unit, port=step.port, gpus=step.gpus,
            gpu_indexes=step.gpu_indexes, unit_sha256=step.unit_sha256 or "", revision=step.revision,
            argv=step.argv, status=status, on_demand=step.on_demand, group_port=group_port, members=members,
        )  # fmt: skip

    # --- a replica group (spec.nodes > 1): its workers start before its head and go with it -----------------
    def _start_members(self, change: DeploymentChange, step: ReplicaChange, verb: str = "start") -> None:
        """Write and start (or restart) each worker of the group, in rank order, each gated on its runtime
        listening where it listens before its head runs (provider.worker_listens_before_head); on a failure, the
        workers started so far are removed again and the step fails."""
        started: list[MemberStep] = []
        for m in step.members:
            assert m.unit_text is not None
            argv = start_argv(m.unit, True) if verb == "start" else restart_argv(m.unit, True)
            with self._on(m.host) as t:
                result = t[m.host].run(argv, stdin=m.unit_text, timeout=self._budget(change))
                reason = self._reason(t[m.host], change, m.unit) if result.exit_code != 0 else None
            if reason is not None or result.exit_code != 0:
                self._remove_members([*started, m])
                raise StepFailed(f"group member {m.rank} ({m.unit}) on {m.host}: "
                                 f"{reason or 'its start failed'}")  # fmt: skip
            started.append(m)
            engine = PROVIDERS.get(change.fit.engine) if change.fit else None
            gated = engine is None or engine.worker_listens_before_head
            state = f"listening on port {m.port}" if gated else "started"
            self.progress(f"{change.name}: replica {step.index}: group member {m.rank} on {m.host}: {m.unit} {state}")

    def _remove_members(self, members: Sequence[MemberStep]) -> None:
        """Stop and remove a group's workers (what fails here is said, never raised: the head's fate decides)."""
        for m in members:
            try:
                with self._on(m.host) as t:
                    result = t[m.host].run(remove_argv(m.unit), timeout=120)
                if result.exit_code != 0:
                    self.progress(f"removing group member {m.unit} on {m.host} failed: {result.stderr.strip()}")
            except (HostFailure, StepFailed, OSError) as exc:
                self.progress(f"removing group member {m.unit} on {m.host} failed: {exc}")

    def _members_of(self, name: str, host: str, unit: str) -> list[MemberStep]:
        """The recorded workers of the replica `unit` on `host` (none: a replica on one machine)."""
        rec = self.recorder.state.deployments.get(name)
        found = next((r for r in rec.replicas if r.unit == unit and r.host == host), None) if rec else None
        return [MemberStep(rank=m.rank, host=m.host, unit=m.unit, port=m.port) for m in found.members] if found else []

    def _run(self, t: Transport, argv: list[str], what: str, timeout: float = 120) -> str:
        """A command that must succeed (its output); its failure, with its own stderr, halts the deployment."""
        result = t.run(argv, timeout=timeout)
        if result.exit_code != 0:
            said = (result.stderr or result.stdout).strip().splitlines()
            raise StepFailed(f"{what} failed (exit status {result.exit_code})" + (f": {said[-1]}" if said else ""))
        return result.stdout

    def _install(self, t: Transport, change: DeploymentChange, step: ReplicaChange) -> None:
        """An on-demand replica: record (pending), write its unit and load it, record it standby. Not started. A
        replica of a deployment saved without starting it (save_only) is recorded stopped."""
        name = change.name
        saved = name in self.save_only
        digest = self._digests.get((name, step.host), "")
        self._record(lambda s: _put_replica(s, name, self._replica_record(step, "pending", digest)), name)
        assert step.unit_text is not None
        result = t.run(install_argv(step.unit), stdin=step.unit_text)
        _uploaded(result, step)
        if result.exit_code != 0:
            said = (result.stderr or result.stdout).strip().splitlines()
            self._record(lambda s: _drop_replica(s, name, step.host, step.unit), name)
            raise StepFailed(f"installing {step.unit} on {step.host} failed" + (f": {said[-1]}" if said else ""))
        self._record(lambda s: _set_status(s, name, step.host, step.unit, "stopped" if saved else "standby"), name)
        self._event("installed", name, replica=step.index, host=step.host, unit=step.unit, port=step.port,
                    revision=step.revision)  # fmt: skip
        how = "saved" if saved else "on demand"
        self.progress(f"{name}: replica {step.index} on {step.host}: {step.unit} installed, {how} (not started)")

    def _start_new(self, t: Transport, change: DeploymentChange, step: ReplicaChange) -> None:
        """Record (pending), upload, start behind the health gate; on failure remove it again and raise. An
        on-demand replica's unit is started without being enabled (the scaler stops it)."""
        name = change.name
        digest = self._digests.get((name, step.host), "")
        self._record(lambda s: _put_replica(s, name, self._replica_record(step, "pending", digest)), name)
        assert step.unit_text is not None
        began = time.monotonic()
        measure = self._first_start(name, step.revision)
        start = on_demand_argv("start", step.unit, upload=True) if step.on_demand else start_argv(step.unit, True)
        argv = measured_argv(start, step.unit) if measure else start
        if step.members:  # a replica group: its workers first, then its head
            try:
                self._start_members(change, step)
            except StepFailed as exc:
                said = str(exc)
                self._record(lambda s: _drop_replica(s, name, step.host, step.unit), name)
                self._record(lambda s: _start_failed(s, name, step, said), name)
                raise
        result = t.run(argv, stdin=step.unit_text, timeout=self._budget(change))
        _uploaded(result, step)
        if result.exit_code != 0:
            reason = self._reason(t, change, step.unit)
            self._remove_members(step.members)  # the new group goes whole; an old one serves on
            self._run(t, remove_argv(step.unit), f"removing the failed {step.unit} on {step.host}")
            self._record(lambda s: _drop_replica(s, name, step.host, step.unit), name)
            self._record(lambda s: _initialized(s, name, None, time.monotonic() - began, reason), name)
            self._record(lambda s: _start_failed(s, name, step, reason), name)
            raise StepFailed(reason)
        why = self._not_ready(t, change, step.host, step.port, step.argv)
        if why:  # a decisions replica that does not answer the readiness decision never serves
            self._remove_members(step.members)
            self._run(t, remove_argv(step.unit), f"removing the unready {step.unit} on {step.host}")
            self._record(lambda s: _drop_replica(s, name, step.host, step.unit), name)
            self._record(lambda s: _initialized(s, name, None, time.monotonic() - began, why), name)
            self._record(lambda s: _start_failed(s, name, step, why), name)
            raise StepFailed(why)
        if measure:
            self._measure(measurement(result.stdout), name, step, time.monotonic() - began)
        self._record(lambda s: _set_status(s, name, step.host, step.unit, "serving"), name)
        if self.gateway is not None:
            self._gateway(self.gateway.enter, name, step.unit)
        elapsed = round(time.monotonic() - began, 1)
        self._event("healthy", name, replica=step.index, host=step.host, unit=step.unit, port=step.port,
                    revision=step.revision, elapsed_s=elapsed)  # fmt: skip
        self.progress(
            f"{name}: replica {step.index} on {step.host}: {step.unit} serving on port {step.port} "
            f"(healthy after {time.monotonic() - began:.1f}s)"
        )

    def _fingerprint(self, change: DeploymentChange) -> None:
        """A first start fingerprints the checkpoint: its digest measured on each host a replica starts on, where
        no fetch measured it (core.plan.deploy), and recorded with the replica."""
        name = change.name
        model = change.model
        rec = self.recorder.state.deployments.get(name)
        if model is None:
            return
        if rec is not None and rec.model == model:  # the checkpoint seen before: its files are not read again
            for r in rec.replicas:
                if r.checkpoint_digest:
                    self._digests.setdefault((name, r.host), r.checkpoint_digest)
        for host in sorted({s.host for s in change.replicas if s.unit_text is not None}):
            if (name, host) in self._digests:
                continue
            path = model_path_on_host(model, self.hosts[host])
            with self._on(host) as t:
                digest, result = measure_checkpoint(t[host], path)
            if digest is None:
                said = (result.stderr or result.stdout).strip().splitlines()
                raise StepFailed(f"the checkpoint digest of {name} could not be measured on {host} ({path})"
                                 + (f": {said[-1]}" if said else ""))  # fmt: skip
            self._digests[(name, host)] = digest
            self.progress(f"{name}: checkpoint {path} on {host}: fingerprinted, checkpoint digest {digest[:12]}")

    def _first_start(self, name: str, revision: int) -> bool:
        """Whether no start of this revision has been measured yet (the first start measures its peak)."""
        rec = self.recorder.state.deployments.get(name)
        return rec is None or rec.startup is None or rec.startup.revision != revision

    def _measure(self, measured: str, name: str, step: ReplicaChange, elapsed: float) -> None:
        """Record the start-up peak the host measured (its cgroup, nvidia-smi's samples: `measured`, the output of
        measured_argv's measurement) and the time to ready."""
        found = parse_measurement(measured)
        devices = {u: n for u, n in found.device_peak_bytes.items() if u in step.gpus}
        record = StartupRecord(
            revision=step.revision, host=step.host, host_peak_bytes=found.host_peak_bytes,
            host_source=found.host_source, device_peak_bytes=devices, device_source=found.device_source if devices
            else "", initialize_s=round(elapsed, 1), measured_at=utc_now(),
        )  # fmt: skip
        self._record(lambda s: _initialized(s, name, record, elapsed, None), name)
        self.progress(f"{name}: start-up of revision {step.revision} measured on {step.host}: "
                      f"{size_text(found.host_peak_bytes or 0)} host RAM ({found.host_source or 'no figure'})"
                      + "".join(f", {size_text(n)} on {u}" for u, n in devices.items()))  # fmt: skip

    def _fetch(self, change: DeploymentChange, fetch: WeightsFetch) -> None:
        """Put the deployment's hf: weights in place on one host before any replica starts there; meanwhile the
        deployment is Pending, its reason the bytes in place ("Waiting for the weights: 3.1 of 8.0 GB")."""
        name = change.name
        shown = Throttle(self.hub.every_s)
        recorded = Throttle(self.hub.record_every_s)

        def on_progress(p: FetchProgress) -> None:
            if self.hub.display is not None:
                self.hub.display(name, fetch.host, p)
            elif p.file and shown.due(p.file_done >= p.file_size):
                self.progress(f"{name}: weights on {fetch.host}: {p.file} {human(p.file_done)} of {human(p.file_size)} "
                              f"({human(p.done)} of {human(p.total)} in all)")  # fmt: skip
            if recorded.due(False) and not fetch.in_place:
                self._record(lambda s: _waiting(s, name, waiting_reason(p.done, p.total)), name)

        with self._on(fetch.host) as t:
            if not fetch.in_place:
                self._record(lambda s: _waiting(s, name, waiting_reason(0, fetch.total_bytes)), name)
            try:
                got = fetch_weights(t[fetch.host], fetch, self.hosts[fetch.host], self.hub.downloads,
                                    self.hub.endpoint, self.hub.token, on_progress)  # fmt: skip
            except FetchFailed as exc:
                raise StepFailed(str(exc)) from None
        self._digests[(name, fetch.host)] = got.digest
        what = f"fetched {human(got.fetched_bytes)}" if got.fetched_bytes else "in place"
        self.progress(f"{name}: weights {fetch.repo}@{fetch.commit[:12]} on {fetch.host}: {what}, checkpoint "
                      f"digest {got.digest[:12]}")  # fmt: skip

    def _remove_old(self, t: Transport, name: str, host: str, unit: str) -> None:
        if self.gateway is not None:
            self._gateway(self.gateway.drain, name, unit)
        members = self._members_of(name, host, unit)
        self._record(lambda s: _set_status(s, name, host, unit, "removing"), name)
        said = self._run(t, remove_argv(unit), f"removing {unit} on {host}")
        self._remove_members(members)  # a replica group's workers go with its head
        self._record(lambda s: _drop_replica(s, name, host, unit), name)
        if NOT_THERE in said:  # never "stopped" where nothing ran: the machine at this address is not the one
            self.progress(f"{name}: {unit} was not on {host} (nothing there to stop: is {host} the machine the "
                          "state recorded?); forgotten")  # fmt: skip
        else:
            self.progress(f"{name}: {unit} on {host} stopped and removed")
        self._event("removed", name, host=host, unit=unit)

    def _check_names(self, change: DeploymentChange, step: ReplicaChange) -> None:
        """The last guard before anything runs as root: every unit named is one engine-ctl names, of this
        deployment (whatever the state or a plan file says); a unit being replaced or removed may also bear a
        name the state records this deployment had before `engine-ctl state mv`."""
        record = self.recorder.state.deployments.get(change.name)
        before = {change.name, *(record.moved_from if record else ())}
        written = before if step.action == ["delete"] else {change.name}  # a delete only removes
        for unit, names in ((step.unit, written), (step.old_unit, before)):
            if unit is None:
                continue
            parsed = parse_unit_name(str(unit))
            if parsed is None or parsed.deployment not in names:
                raise StepFailed(f"refused to act on {unit!r}: not a unit engine-ctl names for {change.name} "
                                 f"({UNIT_FORM})")  # fmt: skip
        for m in step.members:  # a replica group's workers: named after their head
            if m.unit != member_name(step.unit, m.rank):
                raise StepFailed(f"refused to act on {m.unit!r}: not the unit of group member {m.rank} of {step.unit}")
        for m in step.old_members:
            if member_of(m.unit) != (step.old_unit or step.unit):
                raise StepFailed(f"refused to act on {m.unit!r}: not a group member of {step.old_unit or step.unit}")

    def _step(self, change: DeploymentChange, step: ReplicaChange) -> None:
        self._check_names(change, step)
        group = {m.host for m in (*step.members, *step.old_members)}
        if group:  # a replica group: every machine it (and the group it replaces) runs on, held at once
            with self._on(step.host, *([step.old_host] if step.old_host else []), *group):
                self._one_step(change, step)
            return
        self._one_step(change, step)

    def _one_step(self, change: DeploymentChange, step: ReplicaChange) -> None:
        name = change.name
        if step.actions == CREATE:
            with self._on(step.host) as t:
                saved = name in self.save_only
                (self._install if step.on_demand or saved else self._start_new)(t[step.host], change, step)
        elif step.actions == DELETE:
            host, unit = step.old_host or step.host, step.old_unit or step.unit
            with self._on(host) as t:
                self._remove_old(t[host], name, host, unit)
        elif step.actions == UPDATE:
            self._repair(change, step)
        elif step.replaces:
            self._replace(change, step)

    def _repair(self, change: DeploymentChange, step: ReplicaChange) -> None:
        """Rewrite and restart a drifted replica (an on-demand one only if it runs), or change its role only."""
        if step.role == "held":
            self._rewrite_held(change, step)
            return
        if step.role is not None:
            self._role(change, step)
            return
        name = change.name
        if name in self.save_only:  # a saved deployment's unit is written again, not started
            with self._on(step.host) as t:
                self._install(t[step.host], change, step)
            return
        if self.gateway is not None:  # no request reaches it while it restarts; those in flight end first
            with self._on(step.host) as t:  # an on-demand replica the scaler does not run is not behind it
                idle = step.on_demand and t[step.host].run(is_active(step.unit)).exit_code != 0
            if not idle:
                self._gateway(self.gateway.drain, name, step.unit)
        if step.members:  # a replica group restarts whole: its workers (written again), then its head
            self._start_members(change, step, verb="restart")
        self._unset_manager_settings(change, step)
        with self._on(step.host) as t:
            tr = t[step.host]
            assert step.unit_text is not None
            argv = on_demand_argv("try-restart", step.unit, True) if step.on_demand else restart_argv(step.unit, True)
            result = tr.run(argv, stdin=step.unit_text, timeout=self._budget(change))
            _uploaded(result, step)
            reason = self._reason(tr, change, step.unit) if result.exit_code != 0 else None
            reason = reason or self._not_ready(tr, change, step.host, step.port, step.argv)
            if reason:
                self._record(lambda s: _set_status(s, name, step.host, step.unit, "failed", reason), name)
                # seed 003: when a start fails, LAST OPERATION says so (a probe, session 17: "initialize succeeded")
                self._record(lambda s: _initialized(s, name, None, 0.0, reason), name)
                raise StepFailed(reason)
            digest = self._digests.get((name, step.host), "")
            status = "standby" if step.on_demand and tr.run(is_active(step.unit)).exit_code != 0 else "serving"
            self._record(lambda s: _put_replica(s, name, self._replica_record(step, status, digest)), name)
            if status == "serving" and self.gateway is not None:  # back behind the gateway once it sees it healthy
                self._gateway(self.gateway.enter, name, step.unit)
            self.progress(f"{name}: replica {step.index} on {step.host}: {step.unit} repaired ({step.reason})")
            self._event("healthy", name, replica=step.index, host=step.host, unit=step.unit, port=step.port,
                        revision=step.revision)  # fmt: skip

    def _unset_manager_settings(self, change: DeploymentChange, step: ReplicaChange) -> None:
        """Where the plan found the replica's engine running with settings from systemd's manager environment
        (`launch` drift), those the engine reads (provider.env_prefixes) are unset there before its restart: else
        the restart would start it on them again."""
        engine = PROVIDERS.get(change.fit.engine) if change.fit else None
        found = any(d.kind == "launch" and (d.host, d.unit) == (step.host, step.unit) for d in self.plan.drift)
        if engine is None or not engine.env_prefixes or not found:
            return
        with self._on(step.host) as t:
            self._run(t[step.host], unset_manager_env_argv(engine.env_prefixes), f"unsetting {step.host}'s systemd "
                      "manager environment")  # fmt: skip

    def _rewrite_held(self, change: DeploymentChange, step: ReplicaChange) -> None:
        """A held deployment's replica whose unit files drifted (its head's or a group worker's): each written
        again (drop-ins removed); a stopped one's kept disabled and stopped, a parked one's engine left asleep
        as it runs (the unit is reloaded, never restarted). Its record does not change (the files are the
        recorded ones again)."""
        asleep = self._asleep(change.name)
        units: list[MemberStep | ReplicaChange] = [*step.members, step]
        running = {(d.host, d.unit) for d in self.plan.drift if d.kind == "unstopped"}  # started outside engine-ctl
        for unit in (*units[-1:], *units[:-1]) if running else units:  # the head first: it stops before its workers
            assert unit.unit_text is not None
            with self._on(unit.host) as t:
                argv = rewrite_argv(unit.unit) if asleep else install_argv(unit.unit)
                argv = held_stop_argv(unit.unit) if (unit.host, unit.unit) in running else argv
                result = t[unit.host].run(argv, stdin=unit.unit_text)
            _uploaded(result, unit)
            if result.exit_code != 0:
                said = (result.stderr or result.stdout).strip().splitlines()
                raise StepFailed(f"writing {unit.unit} on {unit.host} failed" + (f": {said[-1]}" if said else ""))
        kept = "its engine sleeps on" if asleep else "kept stopped"
        self.progress(f"{change.name}: replica {step.index} on {step.host}: {step.unit} written again, {kept} "
                      f"({step.reason})")  # fmt: skip

    def _asleep(self, name: str) -> bool:
        """The deployment is parked with its engine asleep (its units active): held rewrites reload, never stop."""
        rec = self.recorder.state.deployments.get(name)
        held = rec.operator if rec is not None else None
        return held is not None and held.verb == "parked" and held.level > 0

    def _role(self, change: DeploymentChange, step: ReplicaChange) -> None:
        """`min` moved past the replica: always on (enable; start unless it runs: a no-op then) or on demand
        (disable; it runs on if it runs). Nothing is rewritten or restarted."""
        name = change.name
        with self._on(step.host) as t:
            tr = t[step.host]
            if step.role == "always-on":
                result = tr.run(start_argv(step.unit), timeout=self._budget(change))
                if result.exit_code != 0:
                    reason = self._reason(tr, change, step.unit)
                    self._record(lambda s: _set_status(s, name, step.host, step.unit, "failed", reason), name)
                    raise StepFailed(reason)
                status = "serving"
            else:
                self._run(tr, disable_argv(step.unit), f"disabling {step.unit} on {step.host}")
                status = "serving" if tr.run(is_active(step.unit)).exit_code == 0 else "standby"
            digest = self._digests.get((name, step.host), "")
            self._record(lambda s: _put_replica(s, name, self._replica_record(step, status, digest)), name)
        if status == "serving" and self.gateway is not None:
            self._gateway(self.gateway.enter, name, step.unit)
        self.progress(f"{name}: replica {step.index} on {step.host}: {step.unit} {step.reason}")
        self._event("healthy" if status == "serving" else "installed", name, replica=step.index, host=step.host,
                    unit=step.unit, port=step.port, revision=step.revision)  # fmt: skip

    def _replace(self, change: DeploymentChange, step: ReplicaChange) -> None:
        name = change.name
        old_host, old_unit = step.old_host or step.host, step.old_unit or step.unit
        with self._on(step.host, old_host) as t:
            new_t, old_t = t[step.host], t[old_host]
            if name in self.save_only or (step.on_demand and old_t.run(is_active(old_unit)).exit_code != 0):
                # an on-demand replica the scaler does not run: its new unit installed, the old one removed
                self._install(new_t, change, step)
                self._remove_old(old_t, name, old_host, old_unit)
                return
            if step.actions == SURGE:  # create before destroy: the old replica serves until the new one does
                self._start_new(new_t, change, step)  # raises StepFailed with the old replica untouched
                self._remove_old(old_t, name, old_host, old_unit)
                return
            # stop-then-start: no room for both; the old unit is kept to be restored if the new one fails
            if self.gateway is not None:
                self._gateway(self.gateway.drain, name, old_unit)
            self._record(lambda s: _set_status(s, name, old_host, old_unit, "stopped"), name)
            self._run(old_t, stop_argv(old_unit), f"stopping {old_unit} on {old_host}")
            for m in self._members_of(name, old_host, old_unit):  # the old group's workers hold its ports
                with self._on(m.host) as mt:
                    self._run(mt[m.host], stop_argv(m.unit), f"stopping {m.unit} on {m.host}")
            self.progress(f"{name}: {old_unit} on {old_host} stopped (no room for a surge)")
            try:
                self._start_new(new_t, change, step)
            except StepFailed:
                self._restore(old_t, change, old_host, old_unit, step.on_demand)
                raise
            self._remove_old(old_t, name, old_host, old_unit)

    def _restore(self, t: Transport, change: DeploymentChange, host: str, unit: str, on_demand: bool = False) -> None:
        """Bring the previous unit back after its replacement failed; its outcome is recorded either way. An
        on-demand one is started, not enabled."""
        argv = on_demand_argv("start", unit) if on_demand else start_argv(unit)
        for m in self._members_of(change.name, host, unit):  # a group's workers first, then its head
            with self._on(m.host) as mt:
                mt[m.host].run(start_argv(m.unit), timeout=self._budget(change))
        restored = t.run(argv, timeout=self._budget(change))
        reason = self._reason(t, change, unit) if restored.exit_code != 0 else None
        if reason is None and (rec := self.recorder.state.deployments.get(change.name)) is not None:
            found = next((r for r in rec.replicas if r.unit == unit and r.host == host), None)
            reason = self._not_ready(t, change, host, found.port, found.argv) if found is not None else None
        status = "serving" if reason is None else "failed"
        self._record(lambda s: _set_status(s, change.name, host, unit, status, reason), change.name)
        if status == "serving" and self.gateway is not None:
            try:
                self.gateway.enter(change.name, unit)
            except GatewayFailure as exc:
                self.progress(f"{change.name}: the previous {unit} is back, but not behind the gateway: {exc}")
        self.progress(f"{change.name}: the previous {unit} on {host} restored ({status})")
        self._event("healthy" if status == "serving" else "failed", change.name, host=host, unit=unit, reason=reason
                    or "the previous unit restored after its replacement failed")  # fmt: skip

    # --- decisions (seed 003): a decisions replica is ready once it answers the readiness decision ---------------
    def _not_ready(
        self, t: Transport, change: DeploymentChange, host: str, port: int, argv: Sequence[str] | None
    ) -> str | None:
        """None when the replica is proven ready: not a decisions deployment, or it answered the readiness
        question completely (its first answer is recorded for the wake check); otherwise why not."""
        if change.spec is None or change.spec.api != "decisions":
            return None
        key_file = internal_key_file(argv)  # behind a gateway the replica requires the internal key
        found = prove_ready(t, local_address(bind_address(self.hosts[host])), port, change.name, key_file)
        if isinstance(found, str):
            return f"launch_failed: not ready: the readiness decision failed: {found}"
        self._record(lambda s: _reference(s, change.name, found), change.name)
        shown = ", ".join(f"{k} {v:.3f}" for k, v in found.probabilities.items())
        self.progress(f"{change.name}: {host}:{port} answered the readiness decision: {found.choice} ({shown})")
        return None

    def _prove_adopted(self, change: DeploymentChange, unit: str) -> None:
        """The same readiness decision for a unit found already running (apply restarted, the host came back)."""
        rec = self.recorder.state.deployments.get(change.name)
        replica = next((r for r in rec.replicas if r.unit == unit), None) if rec else None
        if replica is None or change.spec is None or change.spec.api != "decisions":
            return
        with self._on(replica.host) as t:
            why = self._not_ready(t[replica.host], change, replica.host, replica.port, replica.argv)
        if why:
            raise StepFailed(f"{unit} on {replica.host} runs but is not ready: {why}")
