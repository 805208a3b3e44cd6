"""A unit engine-ctl writes, edited, restarted on the edit, then put back (`cp -p`, daemon-reload): its file is what
engine-ctl wrote, but its process runs what the edit said (another user, its limits, an address filter gone), and
systemd applies a unit's settings at a start only. Each such unit's file changed after its process started, which
the probe reports (UnitFact.file_changed_at, started_at): the replica's (session 18), and now its guard's, a group
worker's, the gateway's and the scaler's. Before, plan said "No changes" beside each of those four."""

from __future__ import annotations

import hashlib

from engine_ctl.core.fit.hostfacts import HostFacts, UnitFact
from engine_ctl.core.plan.drift import guard_drift
from engine_ctl.core.plan.gateway import _drift as gateway_drift
from engine_ctl.core.plan.scaler import scaler_unit_drift
from engine_ctl.core.plan.unitage import written_after_start
from engine_ctl.core.record.model import OperatorAction, ReplicaRecord, State
from engine_ctl.core.render.guard import guard_name, guard_text
from engine_ctl.core.render.scaler import SCALER_UNIT
from tests.fleetfacts import cpu_host, h100x8
from tests.test_guard import guarded_unit
from tests.test_multinode import _applied, _plan, _world

STARTED, CHANGED = 1_796_400_000.0, 1_796_500_000.0  # 2026-12-04 16:00:00 and 2026-12-05 19:46:40 UTC
WHEN = "changed 2026-12-05 19:46:40 UTC, started 2026-12-04 16:00:00 UTC"


def test_a_running_units_file_changed_after_its_start_is_said_with_both_times_and_a_second_of_slack() -> None:
    unit = UnitFact(name="engine-ctl-x.service", active_state="active")

    def said(changed: float | None, started: float | None, state: str = "active") -> str | None:
        return written_after_start(unit.model_copy(update={"file_changed_at": changed, "started_at": started,
                                                           "active_state": state}))  # fmt: skip

    assert said(CHANGED, STARTED) == WHEN
    assert said(STARTED + 1.0, STARTED) is None and said(STARTED + 1.01, STARTED) is not None  # the slack
    assert said(STARTED - 50, STARTED) is None  # written, then started: what it runs is its file
    assert said(None, STARTED) is None and said(CHANGED, None) is None  # a time not known: nothing claimed
    assert said(CHANGED, STARTED, "inactive") is None and said(CHANGED, STARTED, "activating") is None
    assert written_after_start(None) is None


def test_a_guard_started_before_its_file_changed_is_drift_unless_its_deployment_is_parked() -> None:
    """The guard lets only /v1/, the health check and the metrics through, and (on a host with gateways) only from
    loopback and the gateways: an edit that dropped IPAddressDeny, restarted on, then put back left the engine's
    sleep controls open beside "No changes". The repair restarts the replica, and the guard with it (PartOf=). A
    parked deployment's held rewrites write the guard while it runs on: not drift then."""
    unit = guarded_unit()
    record = ReplicaRecord(index=0, host="h", unit=unit.name, port=8000, unit_sha256=unit.sha256, revision=1)
    text = guard_text(unit.text)
    assert text is not None
    name = guard_name(unit.name)
    replica = UnitFact(name=unit.name, sha256=unit.sha256, active_state="active")
    guard = UnitFact(name=name, sha256=hashlib.sha256(text.encode()).hexdigest(), active_state="active",
                     started_at=STARTED, file_changed_at=CHANGED)  # fmt: skip
    facts = cpu_host("h").model_copy(update={"units": (replica, guard)})
    (d,) = guard_drift("chat", record, unit.text, facts)
    assert (d.kind, d.unit, d.host) == ("launch", name, "h")
    assert d.detail == (f"the guard {name} on h: its unit file changed after it started ({WHEN}: edited, restarted, "
                        "then put back?), so it may let through what its file does not; apply restarts the replica, "
                        "and its guard with it")  # fmt: skip
    assert guard_drift("chat", record, unit.text, facts, parked=True) == []
    fresh = guard.model_copy(update={"file_changed_at": STARTED - 5})
    assert guard_drift("chat", record, unit.text, cpu_host("h").model_copy(update={"units": (replica, fresh)})) == []
    edited = guard.model_copy(update={"sha256": "0" * 64})
    both = guard_drift("chat", record, unit.text, cpu_host("h").model_copy(update={"units": (replica, edited)}))
    assert [x.kind for x in both] == ["edited"], "an edit still in the file is named once"


def test_a_group_worker_started_before_its_file_changed_is_drift_of_the_replica_and_restarts_the_group() -> None:
    inv, facts = _world(cpu_host("c1"), cpu_host("c2"))
    state, facts = _applied(_plan(State(), inv, facts), facts)
    (m,) = state.deployments["chat"].replicas[0].members

    def times(changed: float) -> dict[str, HostFacts]:
        units = tuple(u.model_copy(update={"started_at": STARTED, "file_changed_at": changed}) if u.name == m.unit
                      else u for u in facts[m.host].units)  # fmt: skip
        return {**facts, m.host: facts[m.host].model_copy(update={"units": units})}

    assert not _plan(state, inv, times(STARTED - 5)).has_changes
    plan = _plan(state, inv, times(CHANGED))
    (d,) = plan.drift
    assert (d.kind, d.unit, d.host) == ("launch", m.unit, m.host)
    assert d.detail.startswith(f"group member 1: {m.unit} on {m.host}: its unit file changed after its engine "
                               f"started ({WHEN}: edited, restarted, then put back?)")  # fmt: skip
    (rc,) = plan.changes[0].replicas
    assert rc.action == ["update"] and plan.has_changes and rc.reason == d.detail
    parked = state.model_copy(deep=True)
    parked.deployments["chat"].operator = OperatorAction(verb="parked", when="2026-12-06T02:00:00+00:00", who="ops",
                                                         operation="01KBJ0Q7ZP0000000000000000", level=1)  # fmt: skip
    assert "launch" not in [x.kind for x in _plan(parked, inv, times(CHANGED)).drift]


def test_the_gateway_started_before_its_unit_file_changed_is_drift_that_apply_restarts() -> None:
    """A reload keeps the master's environment, credentials and sandbox: what restarts it is the unit's change,
    which apply now does itself when it writes a changed unit (shell.gateway.runtime.install)."""
    h = h100x8()
    unit = UnitFact(name="engine-ctl-gateway.service", sha256="a" * 64, active_state="active",
                    unit_file_state="enabled", started_at=STARTED, file_changed_at=CHANGED)  # fmt: skip
    (d,) = gateway_drift("g1", {}, "a" * 64, h.model_copy(update={"units": (unit,), "gateway_maps": {}}))
    assert d == {"host": "g1", "kind": "launch", "detail": f"the gateway on g1: engine-ctl-gateway.service changed "
                 f"after it started ({WHEN}: edited, restarted, then put back?), so it may run settings its unit does "
                 "not give (a reload keeps them); apply restarts it"}  # fmt: skip
    fresh = unit.model_copy(update={"file_changed_at": STARTED - 1})
    assert gateway_drift("g1", {}, "a" * 64, h.model_copy(update={"units": (fresh,), "gateway_maps": {}})) == []
    edited = unit.model_copy(update={"sha256": "e" * 64})
    found = gateway_drift("g1", {}, "a" * 64, h.model_copy(update={"units": (edited,), "gateway_maps": {}}))
    assert [x["kind"] for x in found] == ["edited"], "an edit still in the file is named once"


def test_the_scaler_started_before_its_unit_file_changed_is_drift_that_apply_restarts() -> None:
    h = h100x8()
    scaler = UnitFact(name=SCALER_UNIT, sha256="b" * 64, active_state="active", unit_file_state="enabled",
                      started_at=STARTED, file_changed_at=CHANGED)  # fmt: skip
    said = scaler_unit_drift("g1", h.model_copy(update={"units": (scaler,)}))
    assert said == (f"{SCALER_UNIT} on g1 changed after it started ({WHEN}: edited, restarted, then put back?), so it "
                    "may run settings its unit does not give: apply restarts it")  # fmt: skip
    fresh = scaler.model_copy(update={"file_changed_at": STARTED})
    assert scaler_unit_drift("g1", h.model_copy(update={"units": (fresh,)})) is None


def test_the_scaler_started_before_its_configuration_or_program_changed_is_drift_that_apply_restarts() -> None:
    """scaler.json (its deployments, settings, who may wake) and scaler.py are read at the scaler's start only: one
    edited, the scaler restarted on it, the file put back, and the scaler runs the edit beside "No changes"."""
    h = h100x8()
    scaler = UnitFact(name=SCALER_UNIT, sha256="b" * 64, active_state="active", unit_file_state="enabled",
                      started_at=STARTED, file_changed_at=STARTED - 60)  # fmt: skip
    facts = h.model_copy(update={"units": (scaler,), "scaler_files_changed_at": CHANGED})
    assert scaler_unit_drift("g1", facts) == (
        "the scaler's configuration or program on g1 (/etc/engine-ctl/scaler/scaler.json, "
        f"/etc/engine-ctl/scaler/scaler.py) changed after it started ({WHEN}: edited, restarted, then put back?), so "
        "it may run what they do not say: apply restarts it"
    )
    written_first = h.model_copy(update={"units": (scaler,), "scaler_files_changed_at": STARTED - 30})
    assert scaler_unit_drift("g1", written_first) is None
    stopped = scaler.model_copy(update={"active_state": "inactive"})
    assert scaler_unit_drift("g1", facts.model_copy(update={"units": (stopped,)})) is None
