"""Waking a parked deployment on a request (engine_ctl.core.plan.wake), the parts that need no fleet: the wake
steps each provider gives the scaler (rendered into scaler.json; the scaler has them made on the replica's host by
its forced command's `wake`, tested in tests/test_guard.py against the test double of vLLM's sleep API), and what
engine-ctl says of a parked deployment the scaler woke: status's seed rows, the plan's
words (held, nothing for apply to do, no drift), and `start --wait`'s line for a wake."""

from __future__ import annotations

import json

import pytest
from engine_ctl.providers import PROVIDERS

from engine_ctl.cli.lifecycle_cmd import waiting_line
from engine_ctl.core.documents.inventory import Host
from engine_ctl.core.fit.hostfacts import HostFacts
from engine_ctl.core.plan.planner import make_plan
from engine_ctl.core.plan.scaler import scaler_deployments
from engine_ctl.core.plan.wake import WOKEN_OPERATION, Woken, wake_steps, woken_at
from engine_ctl.core.record.model import OperatorAction, State
from engine_ctl.core.render.scaler import render_config
from tests.test_operator_core import ULID, held, running
from tests.test_plan_core import SHAPE, desired, world

WHEN = "2026-12-03T12:00:05Z"


def parked(state: State, engine: str, level: int) -> State:
    out = held(state, "parked")
    rec = out.deployments["chat"]
    assert rec.plan is not None and rec.operator is not None
    rec.plan = rec.plan.model_copy(update={"engine": engine})
    rec.operator.level = level
    return out


def steps(engine: str, level: int) -> dict[str, object]:
    state, _ = running()
    rec = parked(state, engine, level).deployments["chat"]
    found = wake_steps(rec, PROVIDERS[engine])
    assert found is not None
    return found.model_dump(mode="json")


def test_each_provider_gives_its_wake_steps_in_order() -> None:
    assert steps("llama.cpp", 0) == {"operation": ULID, "level": 0, "calls": [], "check": None}  # the start is it
    vllm = steps("vllm", 1)
    assert vllm["calls"] == [{"method": "POST", "path": "/wake_up", "body": None}]
    assert vllm["check"] == {"path": "/is_sleeping", "key": "is_sleeping"}
    deep = steps("vllm", 2)
    assert [(c["method"], c["path"], c["body"]) for c in deep["calls"]] == [  # type: ignore[attr-defined]
        ("POST", "/wake_up?tags=weights", None),
        ("POST", "/collective_rpc", '{"method": "reload_weights"}'),
        ("POST", "/wake_up?tags=kv_cache", None),
    ]
    sglang = steps("sglang", 1)
    assert sglang["calls"] == [{"method": "POST", "path": "/resume_memory_occupation", "body": "{}"}]
    assert sglang["check"] is None


def test_scaler_json_carries_a_parked_deployment_and_says_nothing_of_the_others() -> None:
    state, _ = running()
    hosts = {h: Host(name=h, address="198.18.0.12") for h in {r.host for r in state.deployments["chat"].replicas}}
    assert scaler_deployments(state, hosts) == []  # one fixed replica: nothing for the scaler
    (dep,) = scaler_deployments(parked(state, "vllm", 1), hosts)
    body = json.loads(render_config([dep]))["deployments"][0]
    assert body["stopped"] is True  # never started as it scales
    assert body["parked"]["operation"] == ULID and body["parked"]["calls"][0]["path"] == "/wake_up"
    assert "parked" not in json.loads(render_config([dep.model_copy(update={"parked": None})]))["deployments"][0]


def test_a_wake_belongs_to_its_park() -> None:
    state, _ = running()
    rec = parked(state, "llama.cpp", 0).deployments["chat"]
    assert woken_at(rec, Woken(at=WHEN, park=ULID)) == WHEN
    assert woken_at(rec, Woken(at=WHEN, park="01M3R7A6YJW402N962HH17A000")) is None  # an earlier park's wake
    assert woken_at(state.deployments["chat"], Woken(at=WHEN, park=ULID)) is None  # not parked


ID = ULID
"""The deployment's ID in running()'s state: the scaler writes it in each entry, and status reads only its own."""


def woken_facts(facts: dict[str, HostFacts], park: str) -> dict[str, HostFacts]:
    """The facts as a gateway host that runs the scaler has them: its state.json says it woke `chat`."""
    decision = {"at": WHEN, "action": "woken", "reason": "woken by a request"}
    entry = {"id": ID, "state": "Ready", "wanted": 1, "running": [0], "ready": 1, "woken": {"at": WHEN, "park": park},
             "decisions": [decision]}  # fmt: skip
    scaler = {"deployments": {"chat": entry}}
    return {h: f.model_copy(update={"scaler_state": scaler}) for h, f in facts.items()}


def test_status_shows_a_parked_deployment_a_request_woke_as_serving_with_the_seeds_columns() -> None:
    from engine_ctl.cli.status_cmd import _statuses
    from engine_ctl.cli.views.status import deployment_table, instance_table, list_table
    from tests.test_records import render

    state, facts = running()
    asleep = parked(state, "llama.cpp", 0)
    port = str(asleep.deployments["chat"].replicas[0].port)
    facts = {h: f.model_copy(update={"health": {port: "200"}}) for h, f in facts.items()}  # it answers again
    host = next(iter(facts))
    (s,) = _statuses(asleep, ["chat"], woken_facts(facts, ULID), [(host, "198.18.0.1:8800")])
    text = render(list_table([s]), deployment_table(s), instance_table(s), width=160)
    rows = [" ".join(line.split()) for line in text.splitlines() if line.strip()]
    assert rows[0] == "NAME STATE READY REVISION HOSTS" and rows[1].startswith("chat ready 1/1 1 ")
    assert rows[2] == "NAME STATE READY REVISION STARTUP INITIALIZE LAST OPERATION"
    assert rows[3].startswith("chat ready 1/1 1 ") and rows[3].endswith(WOKEN_OPERATION), rows
    assert rows[4] == "INSTANCE HOST STATE LIFECYCLE DEVICES LAST ERROR" and rows[5].split()[2] == "ready"
    (earlier,) = _statuses(asleep, ["chat"], woken_facts(facts, "01M3R7A6YJW402N962HH17A000"), [(host, "g:8800")])
    assert earlier.state != "ready" and earlier.last_operation != WOKEN_OPERATION  # another park's wake


def test_the_plan_says_a_woken_park_serves_and_gives_apply_nothing_to_do() -> None:
    state, facts = running()
    asleep = parked(state, "vllm", 1)
    asleep.deployments["chat"].operator = OperatorAction(verb="parked", when="2026-12-03T11:00:00+00:00", who="ops",
                                                         operation=ULID, level=1)  # fmt: skip
    found = woken_facts(facts, ULID)
    plan = make_plan(desired("gpus: 1"), asleep, world(*found.values())[0], found, {"m": SHAPE})
    (c,) = plan.changes
    assert not plan.has_changes and c.replicas == [] and plan.drift == []
    assert c.operator is not None and "parked by an operator by ops" in c.operator
    assert f"woken by a request through the gateway at {WHEN}: serving; apply leaves it serving" in c.operator
    plain = make_plan(desired("gpus: 1"), asleep, world(*facts.values())[0], facts, {"m": SHAPE})
    assert "woken" not in (plain.changes[0].operator or "")
    # parked at level 0 (its units stopped) long ago, then woken: its running unit is the wake's, never "unstopped"
    asleep.deployments["chat"].operator.level = 0  # type: ignore[union-attr]
    later = make_plan(desired("gpus: 1"), asleep, world(*found.values())[0], found, {"m": SHAPE},
                      created_at="2026-12-04T11:00:00+00:00")  # fmt: skip
    assert not later.has_changes and later.drift == [], later.drift
    unwoken = make_plan(desired("gpus: 1"), asleep, world(*facts.values())[0], facts, {"m": SHAPE},
                        created_at="2026-12-04T11:00:00+00:00")  # fmt: skip
    assert [d.kind for d in unwoken.drift] == ["unstopped"]  # the same unit, no wake: started outside engine-ctl


def test_a_parked_units_file_written_while_its_engine_sleeps_is_not_drift() -> None:
    """Apply writes a parked deployment's drifted unit files again while their engines sleep on (held rewrites):
    a file newer than its engine is then engine-ctl's own doing, so the plan after such a rewrite is empty (not
    a restart of a sleeping engine, drift.unit_written_drift). The same replica not parked is restarted."""
    state, facts = running()
    asleep = parked(state, "vllm", 1)
    asleep.deployments["chat"].operator = OperatorAction(verb="parked", when="2026-12-03T11:00:00+00:00", who="ops",
                                                         operation=ULID, level=1)  # fmt: skip
    newer = {h: f.model_copy(update={"units": tuple(u.model_copy(update={"started_at": 1_796_400_000.0,
                                                                          "file_changed_at": 1_796_500_000.0})
                                                    for u in f.units)}) for h, f in facts.items()}  # fmt: skip
    held = make_plan(desired("gpus: 1"), asleep, world(*newer.values())[0], newer, {"m": SHAPE})
    assert "launch" not in [d.kind for d in held.drift] and not held.has_changes, held.drift
    serving = make_plan(desired("gpus: 1"), state, world(*newer.values())[0], newer, {"m": SHAPE})
    assert [d.kind for d in serving.drift] == ["launch"] and serving.has_changes, serving.drift


def test_start_wait_says_it_wakes_a_parked_deployment_and_keeps_the_seeds_words_for_a_stop() -> None:
    assert waiting_line("stop", "my-model") == "Waiting for the stop of my-model to finish (at most 160s)"
    line = waiting_line("park", "my-model")
    assert line.startswith("Waking my-model from its park") and "stop" not in line


def test_a_wake_brings_back_the_always_on_slots_or_the_lowest_for_min_0() -> None:
    from engine_ctl.shell.remote.scaler import wake_slots

    def slot(index: int, always_on: bool) -> dict[str, object]:
        return {"index": index, "always_on": always_on}

    fixed = {"slots": [slot(1, True), slot(0, True), slot(2, False)]}
    assert [s["index"] for s in wake_slots(fixed)] == [0, 1]  # not the on-demand slot above min
    at_zero = {"slots": [slot(1, False), slot(0, False)]}
    assert [s["index"] for s in wake_slots(at_zero)] == [0]


@pytest.mark.parametrize(
    "command", ["is-active stop-sshd.service", "is-active park-engine-ctl-gateway.service", "start stop-x.service",
                "is-active stop-engine-ctl-chat-0a.service; id", "is-active wake-engine-ctl-chat-0a.service"],
)  # fmt: skip
def test_the_forced_command_asks_only_of_a_park_job_on_an_installed_replica_unit(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """On this machine no replica unit is installed: a park job's name on none is refused like anything else."""
    from engine_ctl.shell.remote import scaler_command

    assert scaler_command.main(command) == scaler_command.REFUSED
    assert "refused" in capsys.readouterr().err
