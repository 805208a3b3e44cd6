"""The scaler's pure parts: scaler.json from the recorded deployments, the decision, the choice of a slot, the
reading of HAProxy's and llama-server's own output (recorded from the real programs: tests/recordings/), the
forced command's refusals, and state that survives a restart."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine_ctl.core.documents.inventory import Host, Inventory
from engine_ctl.core.plan.scaler import ScalerView, running_line, scaler_views
from engine_ctl.core.render.scaler import (
    ScalerDeployment,
    SlotInput,
    render_config,
    render_unit,
    scaler_host,
    scaler_slot,
)
from engine_ctl.shell.remote import scaler, scaler_command

RECORDINGS = Path(__file__).parent / "recordings"
EVERY = 120.0


def dep(**over: object) -> dict[str, object]:
    base: dict[str, object] = {"name": "chat", "min": 1, "max": 3, "parallel": 2, "idle_minutes": None, "priority": 0,
                               "backend": "d_chat", "metric": "llamacpp:requests_processing", "stopped": False,
                               "slots": [slot(0, always_on=True), slot(1), slot(2)]}  # fmt: skip
    base.update(over)
    return base


def slot(index: int, host: str = "h1", devices: tuple[str, ...] = (), always_on: bool = False, cores: int = 0):
    return {"index": index, "host": host, "unit": f"engine-ctl-chat-{index}a.service", "server": f"r{index}a",
            "devices": list(devices), "always_on": always_on, "cpu_cores": cores, "ram_bytes": 0}  # fmt: skip


def obs(running=(0,), ready=None, in_flight=0.0, queued=0, held=0, idle_s=0.0):
    return {"running": list(running), "ready": list(running if ready is None else ready), "in_flight": in_flight,
            "queued": queued, "held": held, "idle_s": idle_s}  # fmt: skip


# --- the decision ----------------------------------------------------------------------------------------------
def test_up_when_in_flight_per_replica_is_above_three_quarters_of_parallel() -> None:
    choice = scaler.decide(dep(), obs(in_flight=1.6), {"last_decision_at": 0}, 1000.0, EVERY)
    assert choice == {"action": "up", "reason": "in flight 1.6/replica > 3/4 of parallel 2", "figure": 1.6}
    assert scaler.decide(dep(), obs(in_flight=1.5), {}, 1000.0, EVERY) is None  # 1.5 is not above 1.5


def test_up_at_most_once_per_interval_and_never_above_max() -> None:
    assert scaler.decide(dep(), obs(in_flight=4), {"last_decision_at": 950}, 1000.0, EVERY) is None
    assert scaler.decide(dep(), obs(in_flight=4), {"last_decision_at": 880}, 1000.0, EVERY)["action"] == "up"
    assert scaler.decide(dep(), obs(running=(0, 1, 2), in_flight=12), {}, 1000.0, EVERY) is None


def test_queued_requests_scale_up() -> None:
    choice = scaler.decide(dep(), obs(queued=3), {}, 1000.0, EVERY)
    assert choice is not None and choice["reason"] == "3 requests queued"


def test_a_request_at_zero_wakes_at_once_whatever_the_interval() -> None:
    zero = dep(min=0, idle_minutes=1)
    assert scaler.decide(zero, obs(running=(), held=1), {"last_decision_at": 999}, 1000.0, EVERY)["action"] == "up"
    assert scaler.decide(zero, obs(running=()), {}, 1000.0, EVERY) is None  # no request: stays at zero
    no_room = {"last_decision_at": 990, "hold_reason": "no slot free: slot 0: GPU GPU-a in use by x"}
    assert scaler.decide(zero, obs(running=(), held=1), no_room, 1000.0, EVERY) is None  # tried again in time
    assert scaler.decide(zero, obs(running=(), held=1), no_room, 1110.0, EVERY)["action"] == "up"


def test_down_only_after_load_stayed_low_for_the_interval() -> None:
    mem: dict[str, object] = {"last_decision_at": 0}
    low = obs(running=(0, 1), in_flight=0.5)
    scaler.observe_low(dep(), low, mem, 1000.0)
    assert mem["low_since"] == 1000.0
    assert scaler.decide(dep(), low, mem, 1060.0, EVERY) is None  # low for 60 s only
    scaler.observe_low(dep(), obs(running=(0, 1), in_flight=3), mem, 1070.0)  # a burst: the clock starts again
    assert mem["low_since"] is None
    scaler.observe_low(dep(), low, mem, 1080.0)
    assert scaler.decide(dep(), low, mem, 1150.0, EVERY) is None
    choice = scaler.decide(dep(), low, mem, 1200.0, EVERY)
    assert choice is not None and choice["action"] == "down" and choice["figure"] == 0.5


def test_never_below_min() -> None:
    mem = {"last_decision_at": 0, "low_since": 0}
    assert scaler.decide(dep(min=2), obs(running=(0, 1)), mem, 1000.0, EVERY) is None


def test_to_zero_after_idle_minutes_only_with_min_zero() -> None:
    zero = dep(min=0, idle_minutes=1)
    assert scaler.decide(zero, obs(idle_s=59), {}, 1000.0, EVERY) is None
    choice = scaler.decide(zero, obs(idle_s=61), {}, 1000.0, EVERY)
    assert choice is not None and choice["action"] == "zero" and "idle_minutes 1" in choice["reason"]
    assert scaler.decide(dep(min=1, idle_minutes=1), obs(idle_s=3600), {}, 1000.0, EVERY) is None


def test_stopped_or_busy_deployments_are_left_alone() -> None:
    assert scaler.decide(dep(stopped=True), obs(in_flight=9), {}, 1000.0, EVERY) is None
    assert scaler.decide(dep(), obs(in_flight=9), {"busy": {"action": "up", "slot": 1}}, 1000.0, EVERY) is None


# --- choosing a slot -------------------------------------------------------------------------------------------
def test_a_slot_whose_gpus_another_unit_uses_is_skipped_for_the_next() -> None:
    d = dep(slots=[slot(0, always_on=True), slot(1, devices=("GPU-a",)), slot(2, host="h2", devices=("GPU-b",))])
    hosts = {"h1": {"active": [{"unit": "engine-ctl-other-0a.service", "devices": ["GPU-a"]}]}, "h2": {"active": []}}
    chosen, _ = scaler.choose_slot(d, [0], hosts, {})
    assert chosen is not None and chosen["index"] == 2
    hosts["h2"]["gpu_busy"] = ["GPU-b"]
    chosen, why = scaler.choose_slot(d, [0], hosts, {})
    assert chosen is None
    assert why == ("slot 1: GPU GPU-a in use by engine-ctl-other-0a.service; slot 2: GPU GPU-b in use by another "
                   "process")  # fmt: skip


def test_cpu_slots_count_the_cores_of_running_units() -> None:
    d = dep(min=0, slots=[slot(0, cores=2)])
    known = {"engine-ctl-other-0a.service": {"cpu_cores": 2, "ram_bytes": 0}}
    busy = {"h1": {"active": [{"unit": "engine-ctl-other-0a.service", "devices": []}], "cores": 2}}
    chosen, why = scaler.choose_slot(d, [], busy, known)
    assert chosen is None and why == "slot 0: 2 cores in use on h1 of 2"
    assert scaler.choose_slot(d, [], {"h1": {"active": [], "cores": 2}}, known)[0] is not None


def test_preemption_only_of_lower_priority_above_its_min() -> None:
    high, low = dep(name="high", priority=10, min=0), dep(name="low", priority=1, min=0, slots=[slot(0)])
    assert [s["index"] for _, s in scaler.preemptable(high, [high, low], {"low": [0]})] == [0]
    assert scaler.preemptable(high, [high, dict(low, min=1)], {"low": [0]}) == []  # at its min
    assert scaler.preemptable(low, [high, low], {"high": [0]}) == []  # higher priority is never preempted


# --- reading the real programs' output -------------------------------------------------------------------------
def test_show_stat_of_haproxy_26() -> None:
    stat = scaler.parse_stat((RECORDINGS / "haproxy-2.6-show-stat.csv").read_text())
    b = stat["d_chat"]
    assert b["requests"] == 2 and b["queued"] == 0
    assert b["servers"]["r0a"]["status"] == "UP" and b["servers"]["r1a"]["status"] == "MAINT"


def test_in_flight_from_llama_server_metrics() -> None:
    text = (RECORDINGS / "llama-server-metrics.txt").read_text()
    assert scaler.metric_sum(text, "llamacpp:requests_processing") == 0.0
    assert scaler.metric_sum(text, "llamacpp:requests") is None  # a prefix of a name is not the name
    assert scaler.metric_sum('vllm:num_requests_running{model_name="m"} 3.0\n', "vllm:num_requests_running") == 3.0


# --- state across a restart ------------------------------------------------------------------------------------
def test_a_restarted_scaler_keeps_its_decision_times(tmp_path: Path) -> None:
    config = {"deployments": [dep()], "gateway_socket": str(tmp_path / "none.sock"), "decide_every_s": 120}
    path = str(tmp_path / "state.json")
    first = scaler.Scaler(config, path, lambda _m: None)
    first.mem("chat")["last_decision_at"] = 1000.0
    first.record("chat", "up", "in flight 1.6/replica > 3/4 of parallel 2", 1.6, slot(1))
    again = scaler.Scaler(config, path, lambda _m: None)
    assert again.mem("chat")["last_decision_at"] == 1000.0
    assert scaler.decide(dep(), obs(in_flight=4), again.mem("chat"), 1060.0, EVERY) is None
    saved = json.loads(Path(path).read_text())
    assert saved["deployments"]["chat"]["decisions"][-1]["figure"] == 1.6
    assert not Path(path + ".new").exists()


def test_the_last_stop_to_zero_says_scaled_to_zero_at_once_not_at_the_next_cycle(tmp_path: Path) -> None:
    """status reads the scaler's state.json: between the stop of the last slot and the next cycle it must not say
    Ready (status would then show no unit serving beside a scaler that says Ready, and call it Failed)."""
    config = {"deployments": [dep(min=0)], "gateway_socket": str(tmp_path / "none.sock"), "decide_every_s": 120}
    path = str(tmp_path / "state.json")
    s = scaler.Scaler(config, path, lambda _m: None)
    s.summarise(dep(min=0), obs(running=[0], ready=[0]))
    assert s.mem("chat")["state"] == "Ready"
    s.stopped(dep(min=0), slot(0))
    s.save()
    view = scaler_views(json.loads(Path(path).read_text()))["chat"]
    assert view.state == "ScaledToZero" and view.running == [] and view.wanted == 0 and view.ready == 0
    config = {"deployments": [dep(min=1)], "gateway_socket": "", "decide_every_s": 120}
    kept = scaler.Scaler(config, str(tmp_path / "b"), lambda _m: None)
    kept.summarise(dep(min=1), obs(running=[0, 1], ready=[0, 1]))
    kept.stopped(dep(min=1), slot(1))
    assert kept.mem("chat")["state"] == "Ready" and kept.mem("chat")["running"] == [0]


def test_a_deployment_made_again_under_its_name_keeps_none_of_the_old_ones_decisions(tmp_path: Path) -> None:
    """The scaler's state outlives a deployment (destroy removes the scaler, not its state): one deleted and made
    again under the same name has a new ID, and the old one's decisions and times are not its."""
    path = str(tmp_path / "state.json")
    config = {"deployments": [dep(id="01OLD")], "gateway_socket": str(tmp_path / "none.sock"), "decide_every_s": 120}
    old = scaler.Scaler(config, path, lambda _m: None)
    old.mem("chat")["last_decision_at"] = 1000.0
    old.record("chat", "up", "a request at zero", 1.0, slot(1))
    assert scaler.Scaler(config, path, lambda _m: None).mem("chat")["decisions"]  # same ID: kept across a restart
    config["deployments"] = [dep(id="01NEW")]
    new = scaler.Scaler(config, path, lambda _m: None)
    assert new.mem("chat")["decisions"] == [] and "last_decision_at" not in new.mem("chat")
    assert new.mem("chat")["id"] == "01NEW"


# --- the forced command ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "command",
    ["sh -c id", "start sshd.service", "stop engine-ctl-gateway.service", "start engine-ctl-chat-0a.service; id",
     "start ../../etc/passwd", "", "is-active", "status now", "reset-failed sshd.service",
     "reset-failed engine-ctl-gateway.service", "reset-failed engine-ctl-scaler.service", "reset-failed",
     "reset-failed engine-ctl-chat-0a.service extra"],
)  # fmt: skip
def test_the_forced_command_refuses_anything_else(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert scaler_command.main(command) == scaler_command.REFUSED
    assert "refused" in capsys.readouterr().err


# --- rendering -------------------------------------------------------------------------------------------------
def test_scaler_json_has_the_contract_fields() -> None:
    hosts = {"h1": Host(name="h1", address="198.18.0.12", user="root")}
    s = scaler_slot(SlotInput(index=1, host="h1", port=8001, unit="engine-ctl-chat-1a.service", gpus=("GPU-a",),
                              on_demand=True), hosts, "/health")  # fmt: skip
    assert s is not None
    d = ScalerDeployment(name="chat", id="chat", min=0, max=2, parallel=4, idle_minutes=5, slots=(s,),
                         metric="llamacpp:requests_processing")  # fmt: skip
    doc = json.loads(render_config([d], decide_every_s=5, hold_s=10))
    assert (doc["format"], doc["poll_s"], doc["decide_every_s"], doc["hold_s"]) == (1, 15, 5, 10)
    assert doc["gateway_socket"] == "/run/engine-ctl-gateway/admin.sock"
    entry = doc["deployments"][0]
    assert entry["backend"] == "d_chat" and entry["stopped"] is False and entry["idle_minutes"] == 5
    assert entry["slots"][0] == entry["slots"][0] | {
        "index": 1, "host": "h1", "ssh_host": "root@198.18.0.12", "address": "198.18.0.12", "port": 8001,
        "unit": "engine-ctl-chat-1a.service", "server": "r1a", "devices": ["GPU-a"], "always_on": False,
        "health_path": "/health",
    }  # fmt: skip


def test_one_scaler_on_the_first_gateway_by_name() -> None:
    inv = Inventory(hosts=(Host(name="zeta", address="a", roles=("gateway",)), Host(name="alpha", address="b"),
                           Host(name="beta", address="c", roles=("gateway",))))  # fmt: skip
    host = scaler_host(inv)
    assert host is not None and host.name == "beta"
    assert scaler_host(Inventory(hosts=(Host(name="x", address="a"),))) is None


def test_the_unit_is_hardened() -> None:
    unit = render_unit("gw", "ab" * 32)
    for line in ("NoNewPrivileges=yes", "ProtectSystem=strict", "ProtectHome=yes", "Restart=always",
                 "CapabilityBoundingSet=CAP_DAC_OVERRIDE", "StateDirectory=engine-ctl/scaler"):  # fmt: skip
        assert line in unit.splitlines()


def test_the_plan_line_says_what_runs_and_why() -> None:
    views = scaler_views({"deployments": {"chat": {"running": [0, 1, 2], "decisions": [
        {"at": "2026-12-03T14:02:10Z", "action": "up", "reason": "in flight 7.0/replica > 3/4 of parallel 4",
         "figure": 7.0}]}}})  # fmt: skip
    assert running_line(views["chat"], 1, 4) == (
        "3 running of 1..4, by the scaler, 14:02:10: in flight 7.0/replica > 3/4 of parallel 4"
    )
    assert running_line(ScalerView(), 0, 2) == "0 running of 0..2"
    assert scaler_views("not json") == {}


def test_status_says_scaled_to_zero_when_the_scaler_stopped_the_last_replica() -> None:
    from engine_ctl.core.plan.scaler import with_scaler
    from engine_ctl.core.plan.status import DeploymentStatus, InstanceStatus

    stopped = InstanceStatus(index=0, host="h1", unit="engine-ctl-chat-0a.service", port=8001, state="stopped", gpus=[])
    status = DeploymentStatus(name="chat", state="Failed", reason="no replica serves", ready=0, replicas=1,
                              revision=1, hosts=["h1"], instances=[stopped])  # fmt: skip
    view = ScalerView(state="ScaledToZero", reason="no request for 1 min: it holds no GPU", wanted=0)
    shown = with_scaler(status, view)
    assert (shown.state, shown.reason, shown.replicas) == ("ScaledToZero", view.reason, 0)
    failed = status.model_copy(update={"instances": [stopped.model_copy(update={"state": "failed"})]})
    assert with_scaler(failed, view).state == "Failed"


def test_a_deployment_that_scales_without_a_gateway_host_is_warned() -> None:
    from types import SimpleNamespace

    from engine_ctl.core.plan.scaler import without_scaler

    spec = SimpleNamespace(replicas_min=0, replicas_max=2)
    change = SimpleNamespace(name="chat", action=["create"], spec=spec)
    fixed = SimpleNamespace(name="fixed", action=["create"], spec=SimpleNamespace(replicas_min=2, replicas_max=2))
    alone = without_scaler([change, fixed], Inventory(hosts=(Host(name="x", address="a"),)))
    assert list(alone) == ["chat"] and "roles: [gateway]" in alone["chat"]
    with_gateway = Inventory(hosts=(Host(name="x", address="a", roles=("gateway",)),))
    assert without_scaler([change], with_gateway) == {}


def test_status_of_a_min_zero_deployment_an_operator_holds_says_the_verb_not_scaled_to_zero() -> None:
    """Issue 24 (stateful rules stop, delete): a stopped or deleted min-0 deployment showed ScaledToZero, the
    scaler's view, in place of the operator's verb."""
    from engine_ctl.core.plan.scaler import with_scaler
    from engine_ctl.core.plan.status import DeploymentStatus, InstanceStatus

    idle = InstanceStatus(index=0, host="h1", unit="engine-ctl-chat-0a.service", port=8001, state="stopped", gpus=[])
    view = ScalerView(state="ScaledToZero", reason="no request for 1 min: it holds no GPU", wanted=0)
    for verb in ("stopped", "stopping", "parked", "deleted"):
        held = DeploymentStatus(name="chat", state=verb, reason=f"{verb} by an operator", ready=0, replicas=1,
                                revision=3, hosts=["h1"], instances=[idle])  # fmt: skip
        shown = with_scaler(held, view)
        assert (shown.state, shown.reason, shown.replicas) == (verb, f"{verb} by an operator", 1), verb


def test_ready_never_exceeds_the_replicas_when_the_scaler_wants_fewer_than_serve() -> None:
    """Issue 24 (stateful rule kill_gateway): a woken min-0 deployment read READY 1/0 after its gateway was killed
    (the scaler's count went to 0 while the replica still served)."""
    from engine_ctl.core.plan.scaler import with_scaler
    from engine_ctl.core.plan.status import DeploymentStatus, InstanceStatus

    up = InstanceStatus(index=0, host="h1", unit="engine-ctl-chat-0b.service", port=8001, state="ready", gpus=[])
    status = DeploymentStatus(name="chat", state="Ready", ready=1, replicas=1, revision=2, hosts=["h1"],
                              instances=[up])  # fmt: skip
    shown = with_scaler(status, ScalerView(state="ScaledToZero", reason="the gateway does not answer", wanted=0))
    assert (shown.ready, shown.replicas) == (1, 1)
    assert with_scaler(status, ScalerView(state="Ready", reason="", wanted=2)).replicas == 2
