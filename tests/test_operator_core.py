"""Operator verbs in the pure core: a stopped, parked or deleted deployment is held by every plan (nothing on its
hosts changes, the plan says why, its stopped units are not drift), the gateway's stopped.map, the sleep
controls each provider declares, a park refused for want of host RAM, and the deployment's ID in the state."""

from __future__ import annotations

import json

from engine_ctl.providers import PROVIDERS

from engine_ctl.cli.views.plan import plan_markdown, plan_text
from engine_ctl.core.documents.inventory import Host
from engine_ctl.core.fit.hostfacts import HostFacts
from engine_ctl.core.plan.gateway import stopped_map
from engine_ctl.core.plan.operator import hold, park_refusal, parking_phase, stop_phase
from engine_ctl.core.plan.planner import make_plan
from engine_ctl.core.record.model import OperatorAction, State, derived_id, parse_state
from engine_ctl.core.render.gateway import GatewayBackend, render_gateway
from tests.fleetfacts import h100x8
from tests.test_plan_core import SHAPE, applied, desired, plan_for, world

LINEAGE = "00000000-0000-4000-8000-0000000000aa"
ULID = derived_id("deployment", LINEAGE, "chat", "0")
"""The ID running()'s plan names for `chat` (and its first apply records): its units' headers carry it."""


def running(spec: str = "gpus: 1") -> tuple[State, dict[str, HostFacts]]:
    h = h100x8()
    state, facts = applied(plan_for(spec, State(lineage=LINEAGE), h), State(), {h.host: h})
    assert state.deployments["chat"].id == ULID  # the ID the plan named, which its units' headers carry
    return state, facts


def with_units(facts: dict[str, HostFacts], active: str) -> dict[str, HostFacts]:
    def stopped(f: HostFacts) -> HostFacts:
        units = tuple(u.model_copy(update={"active_state": active, "sub_state": "dead"}) for u in f.units)
        return f.model_copy(update={"units": units})

    return {h: stopped(f) for h, f in facts.items()}


def held(state: State, verb: str) -> State:
    out = state.model_copy(deep=True)
    out.deployments["chat"].operator = OperatorAction(
        verb=verb, when="2026-12-03T11:00:00+00:00", who="ops", operation=ULID
    )  # type: ignore[arg-type]
    return out


def test_a_stopped_deployment_is_held_by_the_plan_and_its_stopped_units_are_not_drift() -> None:
    state, facts = running()
    stopped = with_units(facts, "inactive")
    plain = make_plan(desired("gpus: 1"), state, world(*stopped.values())[0], stopped, {"m": SHAPE})
    assert plain.has_changes and plain.drift  # without the verb: stopped units are drift, and repaired
    plan = make_plan(desired("gpus: 1"), held(state, "stopped"), world(*stopped.values())[0], stopped, {"m": SHAPE})
    (c,) = plan.changes
    assert not plan.has_changes and c.replicas == [] and plan.drift == []
    assert c.operator and "stopped by an operator by ops" in c.operator
    text = plan_text(plan)
    assert "Held: chat was stopped by an operator" in text and "`engine-ctl start deployment chat`" in text
    assert "**Held:** `chat` was stopped" in plan_markdown(plan)
    assert json.loads(plan.model_dump_json())["changes"][0]["operator"] == c.operator


def test_a_stopped_deployments_unit_file_edited_or_gone_is_written_again_and_kept_stopped() -> None:
    """`engine-ctl start` starts the units as they are: a hand edit made while it was stopped would run. Before,
    plan listed the edit and said "No changes"; now apply writes the file back and starts nothing."""
    state, facts = running()
    stopped = with_units(facts, "inactive")
    (unit,) = stopped["gpu-h100"].units
    for change, said in (({"sha256": "0" * 64}, "unit file edited by hand"),
                         ({"drop_ins": (f"/etc/systemd/system/{unit.name}.d/x.conf",)}, "drop-in files change"),
                         ({"sha256": None}, "is missing on gpu-h100")):  # fmt: skip
        now = {"gpu-h100": stopped["gpu-h100"].model_copy(update={"units": (unit.model_copy(update=change),)})}
        plan = make_plan(desired("gpus: 1"), held(state, "stopped"), world(*now.values())[0], now, {"m": SHAPE})
        (c,) = plan.changes
        (step,) = c.replicas
        assert step.role == "held" and step.action == ["update"] and plan.has_changes, said
        assert said in step.reason and step.reason.endswith("; written again, kept stopped"), step.reason
        assert "not enabled" not in step.reason and "inactive" not in step.reason, "its stop is the operator's"
        assert c.operator and "stopped by an operator" in c.operator
        assert "Replicas: 1 to repair." in plan_text(plan)
    edited = unit.model_copy(update={"sha256": "0" * 64})
    parked = {"gpu-h100": stopped["gpu-h100"].model_copy(update={"units": (edited,)})}
    at_zero = make_plan(desired("gpus: 1"), held(state, "parked"), world(*parked.values())[0], parked, {"m": SHAPE})
    assert [s.role for s in at_zero.changes[0].replicas] == ["held"], "a park at level 0 stops its units as a stop"
    asleep = held(state, "parked")
    asleep.deployments["chat"].operator.level = 1  # type: ignore[union-attr]
    awake = {"gpu-h100": facts["gpu-h100"].model_copy(update={"units": (edited.model_copy(update={
        "active_state": "active"}),)})}  # fmt: skip
    plan = make_plan(desired("gpus: 1"), asleep, world(*awake.values())[0], awake, {"m": SHAPE})
    (step,) = plan.changes[0].replicas  # before, "No changes" beside the edit: the unit's next start would run it
    assert step.role == "held" and plan.has_changes
    assert step.reason.startswith("unit file edited by hand")
    assert step.reason.endswith("its engine sleeps on as it runs")
    assert "Replicas: 1 to repair." in plan_text(plan)
    drift = {(d.host, d.unit): d.detail for d in plan.drift}
    record = asleep.deployments["chat"]
    repair = plan.changes[0].model_copy(update={"replicas": [step.model_copy(update={"role": None})]})
    woken = hold(repair, record, "2026-12-03T12:00:00+00:00", drift)
    (fixed,) = woken.replicas  # a woken one serves: repaired as a serving replica is (drained, restarted)
    assert fixed.role is None and fixed.action == ["update"] and woken.changed
    assert woken.operator and "woken by a request" in woken.operator
    assert hold(repair, record, "2026-12-03T12:00:00+00:00", {}).replicas == [], "no file drift: left serving"
    tomb = held(state, "deleted")
    plan = make_plan(desired("gpus: 1"), tomb, world(*now.values())[0], now, {"m": SHAPE})
    assert plan.changes[0].replicas == [] and not plan.has_changes, "a deleted one's units are gone: none written"


def test_a_stopped_deployments_unit_started_by_hand_is_stopped_again_once_its_stop_had_its_time() -> None:
    """`systemctl start` of a stopped deployment's unit: before, plan said "Held … apply keeps it stopped" and "No
    changes" while it ran, status said `stopping` for good and `start --wait` never started (a probe, session 15).
    While the stop is under way (its job on the host drains, then stops the unit; at most STOP_WAIT_S) an active
    unit is the stop's; once its job is gone, or after STOP_WAIT_S, the unit was started outside engine-ctl: apply
    stops it again, and status says so (before, only the 160 s told: a probe, session 17)."""
    from engine_ctl.core.plan.status import deployment_status

    state, facts = running()  # its unit active
    stopped = held(state, "stopped")  # at 11:00:00
    busy = {h: f.model_copy(update={"units": tuple(u.model_copy(update={"stop_job": True}) for u in f.units)})
            for h, f in facts.items()}  # fmt: skip
    during = make_plan(desired("gpus: 1"), stopped, world(*busy.values())[0], busy, {"m": SHAPE},
                       created_at="2026-12-03T11:01:00+00:00")  # fmt: skip
    assert not during.has_changes and during.changes[0].replicas == []
    assert deployment_status(stopped.deployments["chat"], busy, now="2026-12-03T11:01:00+00:00").state == "stopping"
    just = make_plan(desired("gpus: 1"), stopped, world(*facts.values())[0], facts, {"m": SHAPE},
                     created_at="2026-12-03T11:00:05+00:00")  # fmt: skip
    assert not just.has_changes  # its job may not have started yet
    done = make_plan(desired("gpus: 1"), stopped, world(*facts.values())[0], facts, {"m": SHAPE},
                     created_at="2026-12-03T11:01:00+00:00")  # fmt: skip
    assert [d.kind for d in done.drift] == ["unstopped"] and done.has_changes  # no job: the stop is over
    after = make_plan(desired("gpus: 1"), stopped, world(*facts.values())[0], facts, {"m": SHAPE},
                      created_at="2026-12-03T11:10:00Z")  # fmt: skip
    (step,) = after.changes[0].replicas
    (unit,) = facts["gpu-h100"].units
    assert step.role == "held" and after.has_changes and [d.kind for d in after.drift] == ["unstopped"]
    assert step.reason == (f"{unit.name} runs on gpu-h100 though chat is stopped by an operator (started outside "
                           "engine-ctl): apply stops it again; written again, kept stopped")  # fmt: skip
    record = stopped.deployments["chat"]
    assert deployment_status(record, facts, now="2026-12-03T11:00:05+00:00").state == "stopping"
    late = deployment_status(record, facts, now="2026-12-03T11:10:00+00:00")
    assert late.state == "stopped" and late.reason is not None and "runs again (started outside engine-ctl)" in \
        late.reason  # fmt: skip


def test_a_stopped_deployments_unit_enabled_by_hand_is_disabled_again() -> None:
    """`systemctl enable` of a stopped deployment's unit: it would start at the next boot. Before, plan said "No
    changes" (a probe, session 17); the opposite edit on a serving deployment was drift already."""
    state, facts = running()
    stopped = held(state, "stopped")
    off = {h: f.model_copy(update={"units": tuple(u.model_copy(update={"active_state": "inactive", "sub_state": "dead",
                                                                         "unit_file_state": "disabled"})
                                                  for u in f.units)}) for h, f in facts.items()}  # fmt: skip
    quiet = make_plan(desired("gpus: 1"), stopped, world(*off.values())[0], off, {"m": SHAPE},
                      created_at="2026-12-03T11:10:00+00:00")  # fmt: skip
    assert not quiet.has_changes and quiet.drift == []
    on = {h: f.model_copy(update={"units": tuple(u.model_copy(update={"unit_file_state": "enabled"}) for u in f.units)})
          for h, f in off.items()}  # fmt: skip
    plan = make_plan(desired("gpus: 1"), stopped, world(*on.values())[0], on, {"m": SHAPE},
                     created_at="2026-12-03T11:10:00+00:00")  # fmt: skip
    (d,) = plan.drift
    (unit,) = on["gpu-h100"].units
    assert (d.kind, d.detail) == ("unstopped", f"{unit.name} is enabled on gpu-h100 though chat is stopped by an "
                                  "operator: it would start at the next boot; apply disables it again")  # fmt: skip
    (step,) = plan.changes[0].replicas
    assert step.role == "held" and plan.has_changes


def test_a_document_change_while_stopped_is_shown_and_not_applied() -> None:
    state, facts = running("gpus: 1, context_length: 4096")
    plan = make_plan(desired("gpus: 1, context_length: 8192"), held(state, "stopped"), world(*facts.values())[0],
                     facts, {"m": SHAPE})  # fmt: skip
    (c,) = plan.changes
    assert c.action == ["no-op"] and c.replicas == [] and [f.path for f in c.field_changes]
    assert any("rolls in with the first apply after `engine-ctl start deployment chat`" in w for w in c.warnings)


def test_a_deleted_deployment_is_not_re_created_while_its_document_is_there_and_forgotten_once_it_is_gone() -> None:
    state, facts = running()
    tomb = held(state, "deleted")
    tomb.deployments["chat"].replicas = []
    gone = with_units(facts, "inactive")
    gone = {h: f.model_copy(update={"units": ()}) for h, f in gone.items()}
    inv = world(*gone.values())[0]
    plan = make_plan(desired("gpus: 1"), tomb, inv, gone, {"m": SHAPE})
    (c,) = plan.changes
    assert c.action == ["no-op"] and c.replicas == [] and not plan.has_changes
    assert "deleted by an operator" in (c.operator or "") and "not re-created" in (c.operator or "")
    empty = desired("gpus: 1").model_copy(update={"deployments": ()})
    removal = make_plan(empty, tomb, inv, gone, {"m": SHAPE})
    assert [x.action for x in removal.changes] == [["delete"]] and removal.changes[0].replicas == []


def test_the_gateway_answers_a_stopped_deployment_with_its_id_and_never_holds_it() -> None:
    state, _ = running()
    assert stopped_map(state.deployments) == {}
    assert stopped_map(held(state, "stopped").deployments) == {"chat": ULID}
    assert stopped_map(held(state, "parked").deployments) == {}  # parked: requests are held, not refused
    g = render_gateway(Host(name="gw", address="198.18.0.11", roles=("gateway",)), [GatewayBackend(deployment="chat")],
                       [], stopped={"chat": ULID})  # fmt: skip
    assert g.files["stopped.map"] == f"chat {ULID}\n"
    config = g.files["haproxy.cfg"]
    rule = config.index("map(stopped.map)")
    assert rule < config.index("http-request lua.hold")  # answered before any request is held
    said = ("deployment %[var(txn.stopped)] was stopped by an operator; inference does not start it; start it with "
            "`engine-ctl start deployment %[var(txn.stopped)]`")  # fmt: skip
    assert f'"code":"deployment_stopped","message":"{said}"}}' in config  # the seed's keys
    assert f'{{"error":{{"message":"{said}","type":"invalid_request_error"' in config  # inside the OpenAI envelope


def test_phases_of_a_stop_and_a_park() -> None:
    assert stop_phase(["deactivating", "inactive"]) == "stopping"
    assert stop_phase(["inactive", "failed", "inactive"]) == "stopped"
    assert parking_phase("parked", ["active"]) == "parking"
    assert parking_phase("parked", ["inactive"]) == "parked"
    assert parking_phase(None, ["active"]) is None


def test_a_park_at_level_1_is_refused_when_host_ram_cannot_hold_the_weights() -> None:
    gib = 1024**3
    refusal = park_refusal(16 * gib, 4 * gib, "gpu-box", "chat")
    assert refusal is not None and "16.0 GiB" in refusal and "4.0 GiB free" in refusal and "residency: deep" in refusal
    assert park_refusal(16 * gib, 32 * gib, "gpu-box", "chat") is None


def test_sleep_controls_come_from_the_providers() -> None:
    vllm, sglang, llamacpp = PROVIDERS["vllm"], PROVIDERS["sglang"], PROVIDERS["llama.cpp"]
    assert llamacpp.sleep_controls is None and not llamacpp.parks_asleep("parked")
    v = vllm.sleep_controls
    assert v is not None and [c.path for c in v.sleep(1)] == ["/sleep?level=1"] and v.level("deep") == 2
    assert [c.path for c in v.wake(2)] == ["/wake_up?tags=weights", "/collective_rpc", "/wake_up?tags=kv_cache"]
    assert v.launch_argv == ("--enable-sleep-mode",) and v.launch_env == {"VLLM_SERVER_DEV_MODE": "1"}
    s = sglang.sleep_controls
    assert s is not None and "--enable-weights-cpu-backup" in s.launch_argv
    assert [c.path for c in s.sleep(1)] == ["/release_memory_occupation"]
    assert not vllm.parks_asleep("restart_only") and vllm.parks_asleep("parked")


def test_the_id_and_the_verb_are_read_back_and_refused_when_malformed() -> None:
    state, _ = running()
    doc = json.loads(held(state, "stopped").model_dump_json())
    back = parse_state(doc, "state.json")
    assert back.deployments["chat"].id == ULID and back.deployments["chat"].operator is not None
    older = json.loads(State().model_dump_json())
    assert "id" not in json.dumps(older)  # a state with no deployment reads (and writes) as before
    doc["deployments"]["chat"]["id"] = "not a ulid"
    try:
        parse_state(doc, "state.json")
    except Exception as exc:  # StateError, naming the field
        assert "deployments.chat.id" in str(exc)
    else:
        raise AssertionError("a malformed ID was read")


def test_a_held_deployment_on_an_unreachable_host_gives_apply_nothing_to_record() -> None:
    """Apply records a change it runs (a blocked one too, at its revision): a held one must carry none, so a
    document edited while stopped is never recorded without being rolled."""
    state, facts = running("gpus: 1, context_length: 4096")
    inv = world(*facts.values())[0]
    plan = make_plan(desired("gpus: 1, context_length: 8192"), held(state, "stopped"), inv, {}, {"m": SHAPE})
    (c,) = plan.changes
    assert not c.changed and not c.blocked and c.failed_reason is None and c.replicas == []
    assert any("could not be reached" in w for w in c.warnings), c.warnings


# --- seed 003's rows of a held deployment, and a start without --wait (follow-up) ----------------------------
def _rows(state: State, facts: dict[str, HostFacts]) -> list[str]:
    from engine_ctl.cli.views.status import deployment_table, instance_table, list_table
    from engine_ctl.core.plan.status import deployment_status
    from tests.test_records import render

    s = deployment_status(state.deployments["chat"], facts)
    text = render(list_table([s]), deployment_table(s), instance_table(s), width=160)
    return [" ".join(line.split()) for line in text.splitlines() if line.strip()]


def test_a_parked_deployment_shows_the_seeds_rows_parked_with_park_succeeded() -> None:
    state, facts = running()
    rows = _rows(held(state, "parked"), with_units(facts, "inactive"))
    assert rows == [
        "NAME STATE READY REVISION HOSTS",
        "chat parked 0/1 1 gpu-h100",
        "NAME STATE READY REVISION STARTUP INITIALIZE LAST OPERATION",
        "chat parked 0/1 1 9.4 GiB (+6.7 GiB RAM) - park succeeded",
        "INSTANCE HOST STATE LIFECYCLE DEVICES LAST ERROR",
        "0 gpu-h100 parked active gpu0 -",
    ]
    asleep = held(state, "parked")
    asleep.deployments["chat"].operator.level = 1  # type: ignore[union-attr]
    rows = _rows(asleep, facts)  # an engine asleep stays active and may answer its health check: it serves nothing
    assert rows[3] == "chat parked 0/1 1 9.4 GiB (+6.7 GiB RAM) - park succeeded" and rows[5].split()[2] == "parked"


def test_a_stop_shows_stopping_then_stopped_with_no_error() -> None:
    state, facts = running()
    stopped = held(state, "stopped")
    for r in stopped.deployments["chat"].replicas:
        r.status = "stopped"
    going = _rows(stopped, with_units(facts, "deactivating"))
    assert going[3].endswith("stop requested") and going[5] == "0 gpu-h100 stopping stopped gpu0 -", going
    done = _rows(stopped, with_units(facts, "inactive"))
    assert done[3].startswith("chat stopped 0/1") and done[3].endswith("stop succeeded"), done
    assert done[5] == "0 gpu-h100 stopped stopped gpu0 -", done


def test_a_start_without_wait_is_starting_until_its_engine_answers_and_the_next_apply_adopts_it() -> None:
    from engine_ctl.core.plan.status import deployment_status, recorded_verdict

    state, facts = running()
    for r in state.deployments["chat"].replicas:
        r.status = "starting"  # what `engine-ctl start deployment chat` without --wait records
    rec = state.deployments["chat"]
    assert recorded_verdict(rec.replicas, 1, rec.revision).state == "Starting"
    loading = with_units(facts, "activating")
    assert deployment_status(rec, loading).state == "Starting"
    port = str(rec.replicas[0].port)
    answers = {h: f.model_copy(update={"health": {port: "200"}}) for h, f in facts.items()}
    assert deployment_status(rec, answers).state == "Ready"  # live health: it answers
    plan = make_plan(desired("gpus: 1"), state, world(*facts.values())[0], facts, {"m": SHAPE})
    assert plan.changes[0].adopt == [rec.replicas[0].unit]  # apply proves it and records it serving
    still = make_plan(desired("gpus: 1"), state, world(*loading.values())[0], loading, {"m": SHAPE})
    assert still.changes[0].adopt == [] and all(r.action != ["delete"] for r in still.changes[0].replicas)
    assert stopped_map(state.deployments) == {}
