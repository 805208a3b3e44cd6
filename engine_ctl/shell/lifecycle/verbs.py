"""The operator verbs' shell: stop, start, park, delete one deployment, recorded in the state (under its lock),
on its hosts (engine_ctl.shell.lifecycle.hosts) and on the gateways (stopped.map, the servers' states).

What each verb means in a declarative tool is in engine_ctl.core.plan.operator."""

from __future__ import annotations

import getpass
import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from engine_ctl.core.diagnostics import EXIT_STATUSES, InputError
from engine_ctl.core.documents.inventory import Host, Inventory
from engine_ctl.core.plan.deploy import SAVED, is_saved
from engine_ctl.core.plan.gateway import backends_from_state, stopped_map
from engine_ctl.core.plan.operator import STOP_WAIT_S, park_refusal, parking_phase, stop_phase
from engine_ctl.core.plan.wake import parked, woken_at
from engine_ctl.core.record.model import DeploymentRecord, GatewayRecord, Operation, OperatorAction, State, StateError
from engine_ctl.core.render.gateway import (
    CONFIG_FILE,
    GATEWAY_DIR,
    RUNTIME_MAPS,
    backend_name,
    internal_sources,
    map_text,
    render_gateway,
    server_name,
    sha256,
    wake_addresses_for,
)
from engine_ctl.core.render.scalerlock import ScalerLock, scaler_lock
from engine_ctl.core.render.units import model_path_on_host
from engine_ctl.shell.apply import new_id
from engine_ctl.shell.fetch import measure_checkpoint
from engine_ctl.shell.gateway import runtime as remote
from engine_ctl.shell.lifecycle.hosts import (
    OperatorFailure,
    job_argv,
    job_unit,
    member_stop_job,
    provider_of,
    run_checked,
    said,
    sleep_job,
    stop_job,
    unit_states,
    wake_job,
)
from engine_ctl.shell.systemd import UNIT_DIR, remove_argv, start_unit_argv
from engine_ctl.shell.transport import HostFailure, LocalTransport, SSHOptions, SSHTransport, transport_for
from engine_ctl.state import StateBackend
from engine_ctl.state.base import now, who

Transport = SSHTransport | LocalTransport
KEY_MAPS = tuple(n for n in RUNTIME_MAPS if n != "stopped.map")
"""The gateway's key maps: rendered from the ApiKey documents, which the verbs do not read, so left as they are."""
STILL_STOPPING = EXIT_STATUSES["still_stopping"]
STOP_JOB = "/" + job_unit("stop", "")
"""What names a stop job among unit_states' keys (`host/stop-<unit>`)."""


def started_again(states: dict[str, str]) -> bool:
    """From one read of unit_states: no stop job runs, and a unit of the stopped deployment runs (started outside
    engine-ctl)."""
    jobs = [s for k, s in states.items() if STOP_JOB in k]
    units = [s for k, s in states.items() if STOP_JOB not in k]
    return stop_phase(jobs) == "stopped" and any(s in ("active", "activating", "reloading") for s in units)


"""Seed 003: the exit status of a start (or a delete) refused while the stop is still under way."""


class Refused(Exception):
    """A verb refused (nothing was changed): its code and the seed's words."""

    def __init__(self, message: str, *, code: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message

    @property
    def exit_status(self) -> int:
        return EXIT_STATUSES.get(self.code, 1)


@dataclass
class Outcome:
    """What a verb did, for the CLI to print."""

    operation: str
    ready: int = 0
    replicas: int = 0
    hosts: list[str] = field(default_factory=list)
    note: str = ""


@dataclass
class Verbs:
    backend: StateBackend
    inventory: Inventory
    options: SSHOptions | None = None
    progress: Callable[[str], None] = lambda _m: None
    lock_timeout: float = 0.0
    _transports: dict[str, Transport] = field(default_factory=dict)

    # --- plumbing ---------------------------------------------------------------------------------------------
    def _t(self, host: str) -> Transport:
        if host not in self._transports:
            h = self.inventory.host(host)
            if h is None:
                raise OperatorFailure(f"host {host} is not in the inventory")
            self._transports[host] = transport_for(h, self.options)
        return self._transports[host]

    def close(self) -> None:
        for t in self._transports.values():
            t.close()

    def _host(self, name: str) -> Host:
        h = self.inventory.host(name)
        if h is None:
            raise OperatorFailure(f"host {name} is not in the inventory")
        return h

    @contextmanager
    def _locked(self, verb: str) -> Iterator[State]:
        with self.backend.lock(f"{verb} deployment", timeout=self.lock_timeout):
            yield self.backend.read()

    def _write(self, state: State) -> State:
        return self.backend.write(state)

    def name_of(self, name_or_id: str) -> str:
        """The deployment a verb names: by its name, or by its ID (the gateway's deployment_stopped answer names the
        ID, as the seed's message does: `start it with engine-ctl start deployment <ID>`)."""
        state = self.backend.read()
        if name_or_id in state.deployments:
            return name_or_id
        return next((n for n, rec in state.deployments.items() if rec.id and rec.id == name_or_id), name_or_id)

    def record(self, name: str) -> DeploymentRecord:
        state = self.backend.read()
        rec = state.deployments.get(name)
        if rec is None:
            known = ", ".join(sorted(state.deployments)) or "none"
            raise Refused(f"no deployment named {name!r} in the state (deployments: {known})",
                          code="unknown_deployment")  # fmt: skip
        return rec

    @staticmethod
    def _log(state: State, command: str, operation: str, result: str) -> None:
        state.operations.append(Operation(id=operation, who=who(), when=now(), command=command, result=result))
        del state.operations[:-200]

    # --- what the hosts say -----------------------------------------------------------------------------------
    def unit_states(self, rec: DeploymentRecord, verb: str = "stop") -> dict[str, str]:
        """(host/unit) -> ActiveState of each replica's unit and of its `verb` job."""
        on: dict[str, list[str]] = {}
        for r in rec.replicas:  # a replica group's workers with their head: stopped once every one is
            for host, unit in ((r.host, r.unit), *((m.host, m.unit) for m in r.members)):
                on.setdefault(host, []).extend((unit, job_unit(verb, unit)))
        out: dict[str, str] = {}
        for host in sorted(on):
            out.update({f"{host}/{u}": s for u, s in unit_states(self._t(host), on[host]).items()})
        return out

    def stop_phase(self, rec: DeploymentRecord) -> str:
        """`stopping` while a stop job runs (it drains, then stops the unit); `stopped` once none does, even where a
        unit runs again (started outside engine-ctl: `start` takes it back, `stop` stops it again, apply stops it):
        before, such a unit kept the deployment `stopping` for good, and `start --wait` never started."""
        return stop_phase(s for k, s in self.unit_states(rec).items() if STOP_JOB in k)

    def phase(self, rec: DeploymentRecord) -> str | None:
        """`stopping`/`stopped` for a stopped deployment, `parking`/`parked` for a parked one, else None."""
        if rec.operator is None:
            return None
        if rec.operator.verb == "parked":
            asleep = rec.operator.level > 0  # its engine stays active: only the park job tells
            jobs = self.unit_states(rec, "park" if asleep else "stop")
            return parking_phase("parked", [s for k, s in jobs.items() if "/park-" in k or "/stop-" in k])
        return self.stop_phase(rec) if rec.operator.verb == "stopped" else "deleted"

    def wait_stopped(self, rec: DeploymentRecord, within: float = STOP_WAIT_S) -> bool:
        deadline = time.monotonic() + within
        while self.stop_phase(rec) == "stopping":
            if time.monotonic() >= deadline:
                return False
            time.sleep(1)
        return True

    # --- the gateways -----------------------------------------------------------------------------------------
    def _gateways(self, state: State) -> list[Host]:
        """The gateway hosts an apply has set up (recorded in the state)."""
        return [h for h in self.inventory.gateways() if h.name in state.gateways]

    def publish_stopped(self, state: State) -> None:
        """stopped.map on every gateway, at once over its stats socket and in its file (a reload keeps it), and
        its sha256 recorded (so the next plan sees no drift)."""
        entries = stopped_map(state.deployments)
        text = map_text(entries)
        for g in self._gateways(state):
            t = self._t(g.name)
            remote.set_maps(t, {"stopped.map": entries}, wait_s=remote.RESTART_WAIT_S)
            t.put(f"{GATEWAY_DIR}/stopped.map", text.encode(), 0o644)
            state.gateways[g.name].files_sha256["stopped.map"] = sha256(text)

    def reconfigure(self, state: State) -> None:
        """Each gateway's configuration from the state (a deleted deployment's servers gone), installed as apply
        installs it (checked, then reloaded without dropping a connection); its key maps are left as they are."""
        hosts = {h.name: h for h in self.inventory.hosts}
        for g in self._gateways(state):
            t = self._t(g.name)
            settings = self.inventory.gateway
            rendered = render_gateway(
                g, backends_from_state(state, hosts), [], stopped=stopped_map(state.deployments),
                hold_s=settings.hold_s, hold_cap=settings.hold_cap, threads=settings.threads,
                wake_addresses=wake_addresses_for(g, hosts.values()),
                metrics_port=settings.metrics_port, metrics_allow=settings.metrics_allow,
                internal_allow=internal_sources(hosts.values()), lineage=state.lineage,
            )  # fmt: skip
            kept = {n: t.run(["cat", f"{GATEWAY_DIR}/{n}"]).stdout for n in KEY_MAPS}
            files = {**rendered.files, **kept}
            maps = {"stopped.map": rendered.maps["stopped.map"]}
            remote.install(t, rendered.model_copy(update={"files": files, "maps": maps}))
            state.gateways[g.name] = GatewayRecord(
                endpoint=rendered.endpoint, files_sha256={n: sha256(x) for n, x in sorted(files.items())},
                unit_sha256=rendered.unit_sha256, config=rendered.files[CONFIG_FILE],
            )  # fmt: skip

    def refresh_scaler(self, state: State, name: str, parking: bool = False) -> None:
        """The scaler's configuration (scaler.json) again, where the deployment scales or is parked (`parking`:
        it is, or was until this verb): `stopped` for a held one, so the scaler never starts its slots as it
        scales, and `parked` with its wake steps for a parked one, so a request wakes it (core.plan.wake); the
        scaler is removed once nothing is left for it. A failure is said, never fatal: the next apply writes it."""
        from engine_ctl.core.plan.scaler import ScalerPlan, plan_scaler, scales
        from engine_ctl.core.render.scaler import scaler_host
        from engine_ctl.shell.scaler.apply import ScalerApply, ScalerFailure
        from engine_ctl.shell.scaler.lock import operator_dsn

        rec = state.deployments.get(name)
        if rec is None or not (parking or scales(rec.spec)):
            return
        lock = self._scaler_lock()
        plan = plan_scaler([], state, self.inventory, {}, lock)
        host = scaler_host(self.inventory)
        if plan is None and host is not None and parking:  # nothing left for it: removed
            s = self.inventory.scaling
            plan = ScalerPlan(host=host.name, poll_s=s.poll_s, decide_every_s=s.decide_every_s,
                              hold_s=self.inventory.gateway.hold_s, lock=lock)  # fmt: skip
        if plan is None:
            return
        hosts = {h.name: h for h in self.inventory.hosts}
        try:
            ScalerApply(plan, hosts, lambda: state, self.options, self.progress, operator_dsn(self.backend)).run()
        except (ScalerFailure, HostFailure, OSError) as exc:
            self.progress(f"warning: the scaler's configuration was not updated: {exc}; `engine-ctl apply` does it")

    def woken(self, state: State, rec: DeploymentRecord) -> str | None:
        """When a request through the gateway woke this park of `rec` (the scaler's state.json on its host), or
        None."""
        from engine_ctl.core.plan.scaler import leads, scaler_views
        from engine_ctl.core.render.scaler import SCALER_STATE, scaler_host

        host = scaler_host(self.inventory)
        if not parked(rec) or host is None or host.name not in state.gateways:
            return None
        lock = self._scaler_lock()
        names = list(lock.hosts) if lock is not None else [host.name]
        docs = []
        for name in names:  # with several scalers, the one that acts says (a host out of reach: not known)
            try:
                docs.append(json.loads(self._t(name).run(["cat", SCALER_STATE], timeout=30).stdout))
            except (HostFailure, OSError, ValueError):
                continue
        if not docs:
            return None
        view = scaler_views(max(docs, key=leads)).get(rec.name)
        return woken_at(rec, view.woken if view is not None else None)

    def _scaler_lock(self) -> ScalerLock | None:
        """With PostgreSQL state, the scalers' lock (one on every gateway host); None: one scaler. A lock that
        could not be (a local socket with several gateway hosts) is None here: plan and apply say why."""
        try:
            return scaler_lock(self.backend.location, self.inventory)
        except InputError:
            return None

    def servers(self, state: State, rec: DeploymentRecord, to: str) -> None:
        """Each replica's server on every gateway: `maint` (nothing routed to it) or `ready`."""
        for g in self._gateways(state):
            t = self._t(g.name)
            known = remote.server_states(t, wait_s=remote.RESTART_WAIT_S)
            for r in rec.replicas:
                where = (backend_name(rec.name), server_name(r.index, r.slot))
                if where in known:
                    remote.set_state(t, *where, to)

    # --- stop -------------------------------------------------------------------------------------------------
    def stop(self, name: str) -> Outcome:
        """Recorded stopped, the gateways answer deployment_stopped, and each replica's stop job accepted."""
        with self._locked("stop") as state:
            rec = self._held(state, name, allowed=("stopped", "parked"))
            operation = new_id()
            if rec.operator is not None and rec.operator.verb == "stopped":
                if started_again(self.unit_states(rec)):  # its stop done (no stop job runs), a unit runs again
                    self._detach(rec, "stop", lambda p, h, r: stop_job(p, h, r))
                    return Outcome(operation=rec.operator.operation, note=f"{name} was stopped, and a unit of it "
                                   "ran again (started outside engine-ctl): stopped again")  # fmt: skip
                return Outcome(operation=rec.operator.operation, note=f"{name} is already stopped")
            was_parked = parked(rec)
            rec.operator = OperatorAction(verb="stopped", when=now(), who=getpass.getuser(), operation=operation)
            for r in rec.replicas:
                r.status = "stopped"
            self._log(state, f"stop deployment {name}", operation, "stop requested")
            state = self._write(state)
            self.publish_stopped(state)
            self.servers(state, rec, "maint")
            state = self._write(state)
            self.refresh_scaler(state, name, parking=was_parked)
            self._detach(rec, "stop", lambda p, h, r: stop_job(p, h, r))
        return Outcome(operation=operation)

    def _held(self, state: State, name: str, allowed: tuple[str, ...]) -> DeploymentRecord:
        rec = state.deployments.get(name)
        if rec is None:
            self.record(name)  # raises unknown_deployment
            raise AssertionError
        if rec.operator is not None and rec.operator.verb not in allowed:
            raise Refused(f"{name} was {rec.operator.verb} by an operator; `engine-ctl start deployment {name}` "
                          "first", code="deployment_held")  # fmt: skip
        return rec

    def _detach(self, rec: DeploymentRecord, verb: str, make: Callable[..., object]) -> None:
        provider = provider_of(rec)
        for r in rec.replicas:
            job = make(provider, self._host(r.host), r)
            t = self._t(r.host)
            result = t.run(job_argv(job, detached_as=job_unit(verb, r.unit)), timeout=60)  # type: ignore[arg-type]
            if result.exit_code != 0:
                raise OperatorFailure(f"{verb} of {r.unit} on {r.host} was not accepted: {said(result)}")
            self.progress(f"{rec.name}: {verb} of {r.unit} on {r.host} accepted ({job_unit(verb, r.unit)})")
            for m in r.members:  # a group's workers stop once their head has (a group is never parked asleep)
                member = job_argv(member_stop_job(self._host(r.host), r, m), detached_as=job_unit(verb, m.unit))
                result = self._t(m.host).run(member, timeout=60)
                if result.exit_code != 0:
                    raise OperatorFailure(f"{verb} of {m.unit} on {m.host} was not accepted: {said(result)}")
                self.progress(f"{rec.name}: {verb} of group member {m.rank} ({m.unit}) on {m.host} accepted, once "
                              "its head has stopped")  # fmt: skip

    # --- start ------------------------------------------------------------------------------------------------
    def start(self, name: str, wait: bool, on_wait: Callable[[str], None] = lambda _verb: None) -> Outcome:
        """Start (or wake) a held deployment. `on_wait(verb)` is told, with --wait, what it waits for: `stop` (the
        seed's words) or `park` (a wake)."""
        rec = self.record(name)
        if rec.operator is None:
            return Outcome(operation="", note=f"{name} is not stopped or parked; nothing to start")
        if rec.operator.verb == "deleted":
            return self._undelete(name)
        if parked(rec) and self.woken(self.backend.read(), rec) is not None:
            return self._start(name, wait, serving=True)  # a request woke it: it serves; the park record is cleared
        if is_saved(rec) and any(not r.checkpoint_digest for r in rec.replicas):
            if wait:  # seed 003: a first start fingerprints the checkpoint, and --wait waits for it
                on_wait("digest")
            self.fingerprint(name)
        elif wait:  # seed 003: --wait says it waits for the stop, however long that is
            on_wait("park" if parked(rec) else "stop")
            if not self._wait_phase(rec):
                raise Refused(f"the {'park' if parked(rec) else 'stop'} of {name} did not finish within "
                              f"{STOP_WAIT_S}s; nothing was started", code="still_stopping")  # fmt: skip
        elif self.phase(rec) in ("stopping", "parking"):
            raise Refused(
                f"{name} is still stopping; nothing was started. Retry in a moment, or run "
                f"`engine-ctl start deployment {name} --wait`, which waits for the stop to finish and then starts",
                code="still_stopping",
            )
        return self._start(name, wait)

    def fingerprint(self, name: str) -> None:
        """The checkpoint digest of a saved deployment's model, measured on each host of its replicas (at most
        DIGEST_WAIT_S) and recorded with them (core.plan.deploy)."""
        with self._locked("start") as state:
            rec = state.deployments[name]
            if rec.model is None:
                return
            for host in sorted({r.host for r in rec.replicas if not r.checkpoint_digest}):
                path = model_path_on_host(rec.model, self._host(host))
                digest, result = measure_checkpoint(self._t(host), path)
                if digest is None:
                    raise OperatorFailure(f"the checkpoint digest of {name} could not be measured on {host} ({path}): "
                                          f"{said(result)}; nothing was started")  # fmt: skip
                for r in rec.replicas:
                    if r.host == host:
                        r.checkpoint_digest = digest
                self.progress(f"{name}: checkpoint {path} on {host}: fingerprinted, checkpoint digest {digest[:12]}")
            self._write(state)

    def hold_saved(self, state: State, names: Sequence[str], operation: str,
                   held: Mapping[str, OperatorAction | None]) -> State:  # fmt: skip
        """`engine-ctl deploy` without --activate, once its units are written (under its state lock, given `state`):
        each deployment held stopped (its operator hold before the deploy kept, else a new one under the deploy's
        operation), LAST OPERATION `saved, not started`; the gateways answer its requests with deployment_stopped
        and route nothing to it."""
        saved = [state.deployments[n] for n in names if n in state.deployments]
        for rec in saved:
            rec.operator = held.get(rec.name) or OperatorAction(verb="stopped", when=now(), who=getpass.getuser(),
                                                                  operation=operation)  # fmt: skip
            rec.last_operation = SAVED
            for r in rec.replicas:
                r.status = "stopped"
        state = self._write(state)
        self.publish_stopped(state)
        for rec in saved:
            self.servers(state, rec, "maint")
        state = self._write(state)
        for rec in saved:
            self.refresh_scaler(state, rec.name)
        return state

    def release(self, state: State, names: Sequence[str]) -> State:
        """`engine-ctl deploy --activate` of a held deployment, once it started (under its state lock): its hold
        lifted, and the gateways route to it again."""
        for name in names:
            if name in state.deployments:
                rec = state.deployments[name]
                rec.operator = None
                if rec.last_operation == SAVED and any(r.status == "serving" for r in rec.replicas):
                    rec.last_operation = "initialize succeeded"  # its first start, health-gated by the apply
        state = self._write(state)
        self.publish_stopped(state)
        for name in names:
            if name in state.deployments:
                self.servers(state, state.deployments[name], "ready")  # the health check routes to each that answers
        return self._write(state)

    def _wait_phase(self, rec: DeploymentRecord) -> bool:
        deadline = time.monotonic() + STOP_WAIT_S
        while self.phase(rec) in ("stopping", "parking"):
            if time.monotonic() >= deadline:
                return False
            time.sleep(1)
        return True

    def _start(self, name: str, wait: bool, serving: bool = False) -> Outcome:
        """`serving`: a request woke it (the scaler's health gate passed): recorded serving, as with --wait."""
        with self._locked("start") as state:
            rec = state.deployments[name]
            held = rec.operator
            assert held is not None
            operation = new_id()
            rec.operator = None
            self._log(state, f"start deployment {name}", operation, "start requested")
            state = self._write(state)
            self.publish_stopped(state)
            state = self._write(state)
            self.refresh_scaler(state, name, parking=held.verb == "parked")
        asleep = held.verb == "parked" and held.level > 0
        provider = provider_of(rec)
        # an on-demand replica stopped with the deployment is left installed and not started: the scaler starts it
        started = [r for r in rec.replicas if asleep or not r.on_demand]
        for r in started:
            t = self._t(r.host)
            if asleep and provider is not None:
                run_checked(t, job_argv(wake_job(provider, self._host(r.host), r, held.level)),
                            f"waking {r.unit} on {r.host}", timeout=600)  # fmt: skip
            else:
                for m in r.members:  # a group's workers first, each up before its head dials or awaits it
                    run_checked(self._t(m.host), start_unit_argv(m.unit, True), f"starting {m.unit} on {m.host}",
                                timeout=900)  # fmt: skip
                run_checked(t, start_unit_argv(r.unit, wait or asleep), f"starting {r.unit} on {r.host}", timeout=900)
            self.progress(f"{name}: {r.unit} on {r.host} {'answers' if wait or asleep else 'start accepted'}")
        answered = wait or asleep or serving  # without --wait the engines were only started: starting until they answer
        units = {r.unit for r in started}
        with self._locked("start") as state:
            now_rec = state.deployments[name]
            for r in now_rec.replicas:
                r.status = ("serving" if answered else "starting") if r.unit in units else "standby"
            now_rec.last_operation = "initialize succeeded" if answered else "start requested"
            ours = now_rec.model_copy(update={"replicas": [r for r in now_rec.replicas if r.unit in units]})
            self.servers(state, ours, "ready")  # the gateway's health check routes to each once it answers
            self._write(state)
        return Outcome(operation=operation, ready=len(started) if answered else 0, replicas=len(started),
                       hosts=sorted({r.host for r in started}))  # fmt: skip

    def _undelete(self, name: str) -> Outcome:
        with self._locked("start") as state:
            operation = new_id()
            state.deployments[name].operator = None
            self._log(state, f"start deployment {name}", operation, "tombstone lifted")
            self._write(state)
        return Outcome(operation=operation, note=f"{name} is no longer deleted: the next apply creates it")

    # --- park -------------------------------------------------------------------------------------------------
    def park(self, name: str) -> Outcome:
        with self._locked("park") as state:
            rec = self._held(state, name, allowed=("parked",))
            if rec.operator is not None and self.woken(state, rec) is None:
                return Outcome(operation=rec.operator.operation, note=f"{name} is already parked")
            if any(r.members for r in rec.replicas):
                raise Refused(f"{name} is a replica group (spec.nodes): a group is not parked (a request could not "
                              f"wake it whole); nothing was changed. Stop it instead: `engine-ctl stop deployment "
                              f"{name}`", code="park_refused")  # fmt: skip
            provider = provider_of(rec)
            residency = rec.spec.residency if rec.spec and rec.spec.api == "chat" else "restart_only"
            controls = provider.sleep_controls if provider is not None else None
            asleep = provider is not None and provider.parks_asleep(residency)
            level = controls.level(residency) if asleep and controls is not None else 0
            if level == 1:
                self._room_for_weights(rec)
            operation = new_id()
            rec.operator = OperatorAction(verb="parked", when=now(), who=getpass.getuser(), operation=operation,
                                          level=level)  # fmt: skip
            self._log(state, f"park deployment {name}", operation, "park requested")
            state = self._write(state)
            self.servers(state, rec, "maint")
            if asleep:
                self._detach(rec, "park", lambda p, h, r: sleep_job(p, h, r, level))
            else:
                self._detach(rec, "stop", lambda p, h, r: stop_job(p, h, r))
            # the scaler learns of the park once its jobs run: a wake on a request waits for them to finish
            self.refresh_scaler(state, name, parking=True)
        return Outcome(operation=operation)

    def _room_for_weights(self, rec: DeploymentRecord) -> None:
        """Level 1 keeps the weights in host RAM: refused where the host's free memory cannot hold them."""
        keeps = rec.plan.weights_bytes if rec.plan else 0
        for host in sorted({r.host for r in rec.replicas}):
            out = self._t(host).run(["sh", "-c", "awk '/^MemAvailable:/ {print $2 * 1024}' /proc/meminfo"]).stdout
            free = int(out.strip()) if out.strip().isdigit() else None
            on_host = sum(1 for r in rec.replicas if r.host == host)
            refusal = park_refusal(keeps * on_host, free, host, rec.name)
            if refusal:
                raise Refused(refusal, code="park_refused")

    # --- delete -----------------------------------------------------------------------------------------------
    def delete(self, name: str, stop: bool, on_wait: Callable[[], None] = lambda: None) -> Outcome:
        rec = self.record(name)
        if rec.operator is not None and rec.operator.verb == "deleted":
            return Outcome(operation=rec.operator.operation, note=f"{name} is already deleted")
        stopped = rec.operator is not None and rec.operator.verb == "stopped"
        if not stop and (not stopped or self.stop_phase(rec) == "stopping"):
            what = "is still stopping" if stopped else "is not stopped"
            raise Refused(
                f"{name} {what}; nothing was deleted. Run `engine-ctl delete deployment {name} --stop`, which stops "
                "it, waits for the stop to finish and then deletes it",
                code="delete_requires_cleanup",
            )
        if not stopped:
            self.stop(name)
            rec = self.record(name)
        if self.stop_phase(rec) == "stopping":
            on_wait()
            if not self.wait_stopped(rec):
                raise Refused(f"the stop of {name} did not finish within {STOP_WAIT_S}s; nothing was deleted",
                              code="delete_requires_cleanup")  # fmt: skip
        return self._delete(name)

    def _delete(self, name: str) -> Outcome:
        """Each unit removed (never the model's files); the record kept as a tombstone (core.plan.operator)."""
        with self._locked("delete") as state:
            rec = state.deployments[name]
            for r in list(rec.replicas):
                for m in r.members:  # a group's workers go with their head
                    run_checked(self._t(m.host), remove_argv(m.unit), f"removing {UNIT_DIR}/{m.unit} on {m.host}")
                run_checked(self._t(r.host), remove_argv(r.unit), f"removing {UNIT_DIR}/{r.unit} on {r.host}")
                rec.replicas = [x for x in rec.replicas if x is not r]
                state = self._write(state)
                rec = state.deployments[name]
                self.progress(f"{name}: {r.unit} on {r.host} removed")
            operation = new_id()
            rec.operator = OperatorAction(verb="deleted", when=now(), who=getpass.getuser(), operation=operation)
            rec.state, rec.reason = "Pending", "deleted by an operator"
            self._log(state, f"delete deployment {name}", operation, "deleted")
            state = self._write(state)
            self.reconfigure(state)
            state = self._write(state)
            self.refresh_scaler(state, name)
        return Outcome(operation=operation)


__all__ = ["STILL_STOPPING", "HostFailure", "OperatorFailure", "Outcome", "Refused", "StateError", "Verbs"]
