"""The apply executor: runs a Plan's steps over SSH, one replica at a time per host and per deployment,
health-gated, recording the state after every step so that a crash or Ctrl-C loses nothing."""

from __future__ import annotations

import shlex
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field

from engine_ctl.inventory import Host
from engine_ctl.plan import DeploymentChange, Plan, ReplicaChange
from engine_ctl.providers import PROVIDERS
from engine_ctl.state.base import StateBackend
from engine_ctl.state.model import DeploymentRecord, ReplicaRecord, State
from engine_ctl.transport import HostFailure, LocalTransport, SSHOptions, SSHTransport, transport_for

UNIT_DIR = "/etc/systemd/system"
Progress = Callable[[str], None]


# --- what to run: argv only (the executor runs them) ----------------------------------------------------
def start_argv(unit: str) -> list[str]:
    """Reload, enable and start; `start` returns once the unit's health-gated ExecStartPost passed."""
    q = shlex.quote(unit)
    return [
        "sh",
        "-c",
        f"systemctl daemon-reload && systemctl reset-failed {q} 2>/dev/null; systemctl enable --now {q}",
    ]


def restart_argv(unit: str) -> list[str]:
    q = shlex.quote(unit)
    return ["sh", "-c", f"systemctl daemon-reload && systemctl reset-failed {q} 2>/dev/null; "
            f"systemctl enable {q} && systemctl restart {q}"]  # fmt: skip


def stop_argv(unit: str) -> list[str]:
    return ["systemctl", "disable", "--now", unit]


def remove_argv(unit: str) -> list[str]:
    q = shlex.quote(unit)
    path = shlex.quote(f"{UNIT_DIR}/{unit}")
    return ["sh", "-c", f"systemctl disable --now {q} 2>/dev/null; rm -f {path}; systemctl daemon-reload; "
            f"systemctl reset-failed {q} 2>/dev/null; true"]  # fmt: skip


def failure_argv(unit: str) -> list[str]:
    q = shlex.quote(unit)
    return ["sh", "-c", f"systemctl show -p Result,ExecMainStatus,ExecMainCode,NRestarts {q}; echo ---; "
            f"journalctl -u {q} -n 12 --no-pager -o cat 2>/dev/null | tail -n 12"]  # fmt: skip


def failure_reason(output: str) -> str:
    """Pure: the systemctl show + journal tail -> one line for LAST ERROR."""
    head, _, log = output.partition("---")
    props = dict(line.split("=", 1) for line in head.splitlines() if "=" in line)
    lines = [
        ln.strip() for ln in log.splitlines() if ln.strip() and not ln.startswith(("Started", "Starting", "Stopped"))
    ]
    interesting = [ln for ln in lines if any(w in ln.lower() for w in ("error", "failed", "invalid", "unable", "exit"))]
    last = (interesting or lines or [""])[-1][:240]
    result = props.get("Result", "unknown")
    status = props.get("ExecMainStatus", "")
    what = {
        "exit-code": f"the engine exited before readiness (exit status {status})",
        "signal": f"the engine was killed by a signal ({status})",
        "timeout": "the engine did not answer its health check within its start-up budget",
        "start-limit-hit": "3 restarts without serving",
        "core-dump": "the engine crashed (core dump)",
    }.get(result, f"the replica did not start ({result})")
    return f"launch_failed: {what}" + (f": {last}" if last else "")


# --- recording ----------------------------------------------------------------------------------------
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
    return state.deployments[name]


def _put_replica(state: State, name: str, replica: ReplicaRecord) -> None:
    rec = _record(state, name)
    rec.replicas = [r for r in rec.replicas if r.unit != replica.unit or r.host != replica.host] + [replica]
    rec.replicas.sort(key=lambda r: (r.index, r.slot))


def _drop_replica(state: State, name: str, host: str, unit: str) -> None:
    rec = state.deployments.get(name)
    if rec is not None:
        rec.replicas = [r for r in rec.replicas if not (r.unit == unit and r.host == host)]


def _forget(state: State, name: str) -> None:
    state.deployments.pop(name, None)


def _set_status(state: State, name: str, host: str, unit: str, status: str, reason: str | None = None) -> None:
    rec = state.deployments.get(name)
    for r in rec.replicas if rec else []:
        if r.unit == unit and r.host == host:
            r.status = status  # type: ignore[assignment]
            r.reason = reason


# --- executing ------------------------------------------------------------------------------------------
@dataclass
class ApplyResult:
    failed: dict[str, str] = field(default_factory=dict)
    applied: list[str] = field(default_factory=list)
    interrupted: bool = False
    host_failures: dict[str, str] = field(default_factory=dict)


class StepFailed(Exception):
    pass


class Interrupted(Exception):
    """Ctrl-C: no further step starts; the state is recorded."""


class Executor:
    def __init__(
        self,
        plan: Plan,
        hosts: Mapping[str, Host],
        recorder: Recorder,
        options: SSHOptions | None = None,
        progress: Progress | None = None,
        stop: threading.Event | None = None,
    ) -> None:
        self.plan = plan
        self.hosts = hosts
        self.recorder = recorder
        self.options = options
        self.progress = progress or (lambda _m: None)
        self.stop = stop or threading.Event()
        self._host_locks: dict[str, threading.Lock] = {name: threading.Lock() for name in hosts}
        self._transports: dict[str, SSHTransport | LocalTransport] = {}
        self.result = ApplyResult()

    @contextmanager
    def _on(self, *names: str) -> Iterator[dict[str, SSHTransport | LocalTransport]]:
        """Hold the hosts (one replica at a time per host) and their one reused connection each."""
        with ExitStack() as stack:
            for name in sorted(set(names)):
                stack.enter_context(self._host_locks[name])
            out = {}
            for name in set(names):
                if name not in self._transports:
                    self._transports[name] = transport_for(self.hosts[name], self.options)
                out[name] = self._transports[name]
            yield out

    def run(self) -> ApplyResult:
        changes = [c for c in self.plan.changes if c.changed or c.failed_reason]
        if changes:
            with ThreadPoolExecutor(max_workers=len(changes)) as pool:
                list(pool.map(self._deployment, changes))
        for t in self._transports.values():
            t.close()
        self.result.interrupted = self.stop.is_set()
        return self.result

    def _deployment(self, change: DeploymentChange) -> None:
        name = change.name
        try:
            if change.failed_reason:
                self.recorder.change(lambda s: self._mark(s, change, "Failed", change.failed_reason))
                self.result.failed[name] = change.failed_reason
                return
            self._steps(change)
            if change.action == ["delete"]:
                self.recorder.change(lambda s: _forget(s, name))
                self.progress(f"{name}: destroyed")
            else:
                state = "Pending" if change.pending_reason else "Ready"
                self.recorder.change(lambda s: self._mark(s, change, state, change.pending_reason, applied=True))
                self.progress(f"{name}: {state.lower()} at revision {change.revision}")
            self.result.applied.append(name)
        except Interrupted:
            return
        except StepFailed as exc:
            reason = str(exc)
            self.recorder.change(lambda s: self._mark(s, change, "Failed", reason))
            self.result.failed[name] = reason
            self.progress(f"{name}: FAILED: {reason}; the roll stopped and the previous replica serves")
        except HostFailure as exc:
            message = exc.message
            self.recorder.change(lambda s: self._mark(s, change, "Failed", message))
            self.result.failed[name] = message
            self.result.host_failures[exc.host] = message
            self.progress(f"{name}: FAILED on {exc.host}: {message}")

    def _steps(self, change: DeploymentChange) -> None:
        """Steps that keep every serving replica (creates, surges) run in parallel across hosts, one at a time
        per host; the others (repairs, stop-then-start, deletes) one at a time, in the plan's order."""
        steps = list(change.replicas)
        leftovers = [s for s in steps if s.cleanup]
        widening = [
            s for s in steps
            if s.action == ["create"] or (s.action == ["delete", "create"] and s.strategy == "surge")
        ]  # fmt: skip
        rest = [s for s in steps if s not in leftovers and s not in widening]
        for step in leftovers:
            self._guarded(change, step)
        by_host: dict[str, list[ReplicaChange]] = {}
        for step in widening:
            by_host.setdefault(step.host, []).append(step)
        failure: list[StepFailed] = []

        def host_steps(items: list[ReplicaChange]) -> None:
            for step in items:
                if failure:
                    return
                try:
                    self._guarded(change, step)
                except StepFailed as exc:
                    failure.append(exc)
                    return

        if by_host:
            with ThreadPoolExecutor(max_workers=len(by_host)) as pool:
                list(pool.map(host_steps, by_host.values()))
        if failure:
            raise failure[0]
        for step in rest:
            self._guarded(change, step)

    def _guarded(self, change: DeploymentChange, step: ReplicaChange) -> None:
        if self.stop.is_set():
            self.progress(f"{change.name}: interrupted before replica {step.index}; state recorded")
            raise Interrupted
        self._step(change, step)

    @staticmethod
    def _mark(state: State, change: DeploymentChange, status: str, reason: str | None, applied: bool = False) -> None:
        if change.action == ["delete"] and change.name not in state.deployments:
            return
        rec = _record(state, change.name)
        rec.state = status  # type: ignore[assignment]
        rec.reason = reason
        if applied:
            rec.revision = change.revision
            rec.spec, rec.model, rec.spec_hash, rec.plan = change.spec, change.model, change.spec_hash, change.fit

    @staticmethod
    def _budget(change: DeploymentChange) -> float:
        """The deployment's engine's start-up budget, plus a margin for systemd and SSH."""
        engine = PROVIDERS.get(str((change.fit or {}).get("engine")))
        budget = engine.startup_budget_s if engine else max(p.startup_budget_s for p in PROVIDERS.values())
        return budget + 60

    def _replica_record(self, step: ReplicaChange, status: str) -> ReplicaRecord:
        return ReplicaRecord(
            index=step.index, slot=step.slot, host=step.host, unit=step.unit, port=step.port, gpus=step.gpus,
            gpu_indexes=step.gpu_indexes, unit_sha256=step.unit_sha256 or "", revision=step.revision,
            argv=step.argv, status=status,  # type: ignore[arg-type]
        )  # fmt: skip

    def _start_new(self, t: SSHTransport | LocalTransport, change: DeploymentChange, step: ReplicaChange) -> None:
        """Record (pending), upload, start behind the health gate; on failure remove it again and raise."""
        name = change.name
        self.recorder.change(lambda s: _put_replica(s, name, self._replica_record(step, "pending")))
        assert step.unit_text is not None
        t.put(f"{UNIT_DIR}/{step.unit}", step.unit_text.encode(), 0o644)
        began = time.monotonic()
        result = t.run(start_argv(step.unit), timeout=self._budget(change))
        if result.exit_code != 0:
            reason = failure_reason(t.run(failure_argv(step.unit)).stdout)
            t.run(remove_argv(step.unit))
            self.recorder.change(lambda s: _drop_replica(s, name, step.host, step.unit))
            raise StepFailed(reason)
        self.recorder.change(lambda s: _set_status(s, name, step.host, step.unit, "serving"))
        self.progress(
            f"{name}: replica {step.index} on {step.host}: {step.unit} serving on port {step.port} "
            f"(healthy after {time.monotonic() - began:.1f}s)"
        )

    def _remove_old(self, t: SSHTransport | LocalTransport, name: str, host: str, unit: str) -> None:
        t.run(remove_argv(unit))
        self.recorder.change(lambda s: _drop_replica(s, name, host, unit))
        self.progress(f"{name}: {unit} on {host} stopped and removed")

    def _step(self, change: DeploymentChange, step: ReplicaChange) -> None:
        name = change.name
        action = tuple(step.action)
        if action == ("create",):
            with self._on(step.host) as t:
                self._start_new(t[step.host], change, step)
        elif action == ("delete",):
            host, unit = step.old_host or step.host, step.old_unit or step.unit
            with self._on(host) as t:
                self._remove_old(t[host], name, host, unit)
        elif action == ("update",):
            with self._on(step.host) as t:
                tr = t[step.host]
                assert step.unit_text is not None
                tr.put(f"{UNIT_DIR}/{step.unit}", step.unit_text.encode(), 0o644)
                result = tr.run(restart_argv(step.unit), timeout=self._budget(change))
                if result.exit_code != 0:
                    reason = failure_reason(tr.run(failure_argv(step.unit)).stdout)
                    self.recorder.change(lambda s: _set_status(s, name, step.host, step.unit, "failed", reason))
                    raise StepFailed(reason)
                self.recorder.change(lambda s: _put_replica(s, name, self._replica_record(step, "serving")))
                self.progress(f"{name}: replica {step.index} on {step.host}: {step.unit} repaired ({step.reason})")
        elif action == ("delete", "create"):
            self._replace(change, step)

    def _replace(self, change: DeploymentChange, step: ReplicaChange) -> None:
        name = change.name
        old_host, old_unit = step.old_host or step.host, step.old_unit or step.unit
        with self._on(step.host, old_host) as t:
            new_t, old_t = t[step.host], t[old_host]
            if step.strategy == "surge":
                self._start_new(new_t, change, step)  # raises StepFailed with the old replica untouched
                self._remove_old(old_t, name, old_host, old_unit)
                return
            # stop-then-start: no room for both; the old unit is kept to be restored if the new one fails
            old_t.run(stop_argv(old_unit))
            self.recorder.change(lambda s: _set_status(s, name, old_host, old_unit, "stopped"))
            self.progress(f"{name}: {old_unit} on {old_host} stopped (no room for a surge)")
            try:
                self._start_new(new_t, change, step)
            except StepFailed:
                restored = old_t.run(start_argv(old_unit), timeout=self._budget(change))
                status = "serving" if restored.exit_code == 0 else "failed"
                self.recorder.change(lambda s: _set_status(s, name, old_host, old_unit, status))
                self.progress(f"{name}: {old_unit} on {old_host} restored ({status})")
                raise
            self._remove_old(old_t, name, old_host, old_unit)
