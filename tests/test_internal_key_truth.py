"""The internal key (gateway -> replicas) is part of "No changes": a replica that refuses the key the gateways send,
a host that holds another one (its engine would load it at its next start), or a gateway whose running map or files
hold another one is drift, named where it is, with a fingerprint of the key and never the key. The facts probe's
half runs against the real llama-server of this machine (its --api-key-file) and real files; the plan's half is the
pure core, given the facts as the probe reports them."""

from __future__ import annotations

import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from engine_ctl.providers import PROVIDERS
from hypothesis import given
from hypothesis import strategies as st

from engine_ctl.cli.views.plan import plan_text
from engine_ctl.core.plan.internalkey import KEY_CHECK_PATH, key_checks, key_files, key_fingerprint
from engine_ctl.core.plan.planner import make_plan
from engine_ctl.core.plan.status import deployment_status
from engine_ctl.core.record.model import State
from engine_ctl.core.render.gateway import REPLICA_KEY, gateway_key_text, internal_key_path, parse_gateway_key
from engine_ctl.shell.remote import facts_probe
from tests.llama import llama_server_dir, tiny_model
from tests.ports import free_port
from tests.test_gateway_core import SHAPE, applied, desired, world

KEY, OTHER = "c" * 64, "d" * 64
SENT, ELSE = key_fingerprint(KEY), key_fingerprint(OTHER)


def test_the_probe_fingerprints_a_key_as_the_core_does_and_never_gives_it_back() -> None:
    assert facts_probe.key_fingerprint(KEY) == SENT and len(SENT) == 16
    assert KEY[:16] not in SENT and SENT != ELSE


def test_the_probe_reads_every_engines_form_of_the_key() -> None:
    forms = [p for p in PROVIDERS.values() if p.takes_internal_key]
    assert {p.name for p in forms} == {"llama.cpp", "vllm", "sglang"}
    for provider in forms:
        text = provider.internal_key_text([KEY, OTHER])
        found = facts_probe.keys_in(text)
        assert found[0] == KEY, (provider.name, text)
        assert (OTHER in found) == provider.internal_key_several, (provider.name, text)
    assert facts_probe.keys_in("not-a-key\n" + "C" * 64 + "\n") == []  # a hand-written word is no key
    assert set(key_files()) == {REPLICA_KEY} | {internal_key_path(p) for p in forms}


@given(st.lists(st.sampled_from(["gateway", "next", "ENGINE_CTL_GATEWAY_KEY=", "", "  ", "x"]), max_size=4),
       st.lists(st.sampled_from([KEY, OTHER, "e" * 63, "f" * 65, "word"]), max_size=4))  # fmt: skip
def test_the_probe_reads_the_key_a_gateway_sends_as_apply_does(names: list[str], values: list[str]) -> None:
    text = "\n".join(f"{n}{'' if n.endswith('=') else ' '}{v}".strip() for n, v in zip(names, values, strict=False))
    assert facts_probe.sent_key(text) == parse_gateway_key(text)[0], text
    assert facts_probe.sent_key(gateway_key_text(KEY, OTHER)) == KEY


def test_the_probe_fingerprints_each_key_file_and_tells_missing_from_unread(tmp_path: Path) -> None:
    (tmp_path / "replica-key").write_text(f"{KEY}\n{OTHER}\n")
    (tmp_path / "vllm.env").write_text(f"VLLM_API_KEY={OTHER}\n")
    (tmp_path / "a-folder").mkdir()  # read as a file it fails: left out (as a file this user may not read)
    paths = [str(tmp_path / n) for n in ("replica-key", "vllm.env", "absent", "a-folder")]
    assert facts_probe.replica_keys(paths) == {paths[0]: [SENT, ELSE], paths[1]: [ELSE], paths[2]: None}


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """The real llama-server behind a gateway as engine-ctl starts it: --api-key-file with the host's key."""
    port, key_file = free_port(), tmp_path / "replica-key"
    key_file.write_text(KEY + "\n")
    argv = [str(llama_server_dir() / "bin" / "llama-server"), "-m", str(tiny_model()), "--host", "127.0.0.1",
            "--port", str(port), "-c", "256", "-t", "1", "--api-key-file", str(key_file)]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
            break
        except OSError:
            assert time.monotonic() < deadline and proc.poll() is None, "llama-server did not start"
            time.sleep(0.2)
    yield port, tmp_path
    proc.terminate()
    proc.wait(timeout=10)


def test_a_replica_answers_the_key_check_200_with_its_key_and_401_with_another(engine: tuple[int, Path]) -> None:
    port, folder = engine
    (folder / "other").write_text(OTHER + "\n")
    (folder / "a-folder").mkdir()
    checks = [{"port": port, "path": KEY_CHECK_PATH, "key_file": str(folder / name)}
              for name in ("replica-key", "other", "absent", "a-folder")]  # fmt: skip
    assert facts_probe.key_checks(checks[:1]) == {str(port): "200"}
    assert facts_probe.key_checks(checks[1:2]) == {str(port): "401"}
    assert facts_probe.key_checks(checks[2:3]) == {str(port): "401"}, "no key file: asked with no key"
    assert facts_probe.key_checks(checks[3:]) == {}, "a key file this user cannot read: not asked"
    assert facts_probe.http_status(port, "/health") == "200", "/health is open: it cannot tell the key"


# --- the plan -------------------------------------------------------------------------------------------------


def served():  # type: ignore[no-untyped-def]
    """A gateway (edge) and one replica (cpu-1) applied, every place holding the key, the replica accepting it."""
    inv, facts = world()
    state, after = applied(make_plan(desired(), State(), inv, facts, SHAPE), facts)
    (replica,) = state.deployments["chat"].replicas
    after["edge"] = after["edge"].model_copy(update={"gateway_key": {"file": SENT, "copy": SENT, "running": SENT}})
    after["cpu-1"] = after["cpu-1"].model_copy(update={"replica_keys": {REPLICA_KEY: (SENT,)},
                                                       "key_checks": {str(replica.port): "200"}})  # fmt: skip
    return inv, state, after, replica


def test_every_place_holding_the_key_is_no_changes_and_the_probe_is_asked_for_the_replica() -> None:
    inv, state, after, replica = served()
    plan = make_plan(desired(), state, inv, after, SHAPE)
    assert not plan.has_changes and not plan.drift, plan_text(plan)
    assert key_checks(state.deployments.values()) == {
        "cpu-1": [{"port": replica.port, "path": KEY_CHECK_PATH, "key_file": REPLICA_KEY, "unit": replica.unit}]
    }


@pytest.mark.parametrize(
    ("update", "said"),
    [
        ({"key_checks": {"PORT": "401"}}, "it refuses the key its host holds (HTTP 401 to GET /v1/models)"),
        ({"replica_keys": {REPLICA_KEY: (ELSE,)}}, f"{REPLICA_KEY} holds another key"),
        ({"replica_keys": {REPLICA_KEY: None}}, f"{REPLICA_KEY} is missing"),
        ({"replica_keys": {REPLICA_KEY: ()}}, f"{REPLICA_KEY} holds another key"),
    ],
)
def test_a_replica_host_without_the_key_is_drift_and_apply_restarts_the_replica(update: dict, said: str) -> None:  # type: ignore[type-arg]
    inv, state, after, replica = served()
    if "key_checks" in update:
        update = {"key_checks": {str(replica.port): update["key_checks"]["PORT"]}}
    after["cpu-1"] = after["cpu-1"].model_copy(update=update)
    plan = make_plan(desired(), state, inv, after, SHAPE)
    (drift,) = plan.drift
    assert (drift.kind, drift.host, drift.unit) == ("internal-key", "cpu-1", replica.unit)
    assert (
        drift.detail == f"internal key: {said}; apply writes the key; a running replica restarts on it, drained first"
    )
    (change,) = plan.changes
    (step,) = change.replicas
    assert step.action == ["update"] and step.role is None, "a restart: the engine loads its key when it starts"
    assert [d.host for d in plan.drift] == ["cpu-1"], "the gateway holds the key: nothing of it is drift"
    text = plan_text(plan)
    assert said in text and KEY not in text and plan.has_changes


@pytest.mark.parametrize(
    ("held", "said"),
    [
        ({"file": SENT, "copy": SENT, "running": ELSE}, "the running gateway's key map holds another key"),
        ({"file": SENT, "copy": None, "running": SENT}, "its run directory's copy is missing"),
        ({"file": SENT, "copy": ELSE, "running": None}, "its run directory's copy holds another key, the running "
         "gateway's key map holds no key"),
    ],
)  # fmt: skip
def test_a_gateway_that_sends_or_would_load_another_key_is_drift(held: dict, said: str) -> None:  # type: ignore[type-arg]
    inv, state, after, _ = served()
    after["edge"] = after["edge"].model_copy(update={"gateway_key": held})
    plan = make_plan(desired(), state, inv, after, SHAPE)
    assert [(d.kind, d.detail) for d in plan.drift] == [
        ("internal-key", f"the internal key on gateway edge: {said}; apply gives it the key (fingerprint {SENT[:8]}…)")
    ]  # fmt: skip
    assert plan.gateways[0].action == ["update"] and not plan.changes[0].replicas, "no replica restarts"


def test_places_not_read_and_a_gateway_with_no_key_yet_are_no_verdict() -> None:
    inv, state, after, replica = served()
    unread = dict(after)
    unread["edge"] = after["edge"].model_copy(update={"gateway_key": {"file": SENT}})  # not running: no map read
    unread["cpu-1"] = after["cpu-1"].model_copy(update={"replica_keys": {}, "key_checks": {}})  # not readable
    assert not make_plan(desired(), state, inv, unread, SHAPE).has_changes
    down = dict(after)
    down["cpu-1"] = after["cpu-1"].model_copy(update={"key_checks": {str(replica.port): "down: timed out"}})
    assert not [d for d in make_plan(desired(), state, inv, down, SHAPE).drift if d.kind == "internal-key"]
    fresh = dict(after)  # no gateway holds a key yet: apply makes one and writes it everywhere
    fresh["edge"] = after["edge"].model_copy(update={"gateway_key": {"file": None}})
    fresh["cpu-1"] = after["cpu-1"].model_copy(update={"replica_keys": {REPLICA_KEY: None}})
    plan = make_plan(desired(), state, inv, fresh, SHAPE)
    assert not [d for d in plan.drift if d.kind == "internal-key" and d.host == "cpu-1"], plan_text(plan)


def test_a_gateway_key_file_deleted_by_hand_is_drift_and_the_running_key_is_the_key() -> None:
    """The running gateway still sends the key (its map is in memory), but it would fail to start: its unit loads
    the file as a credential. The key is then the one it sends, and no replica is touched."""
    inv, state, after, _ = served()
    after["edge"] = after["edge"].model_copy(update={"gateway_key": {"file": None, "copy": SENT, "running": SENT}})
    plan = make_plan(desired(), state, inv, after, SHAPE)
    assert [d.detail for d in plan.drift] == [f"the internal key on gateway edge: its key file is missing; apply gives "
                                              f"it the key (fingerprint {SENT[:8]}…)"]  # fmt: skip
    assert not plan.changes[0].replicas


def test_status_says_a_replica_that_refuses_the_key_serves_nothing() -> None:
    """Its GET /health answers 200 (open to all) while every request of the gateways is refused: not ready."""
    _, state, after, replica = served()
    port = str(replica.port)
    after["cpu-1"] = after["cpu-1"].model_copy(update={"health": {port: "200"}})
    record = state.deployments["chat"]
    assert [i.state for i in deployment_status(record, after, [("edge", "10.0.0.2:8800")]).instances] == ["ready"]
    after["cpu-1"] = after["cpu-1"].model_copy(update={"key_checks": {port: "401"}})
    status = deployment_status(record, after, [("edge", "10.0.0.2:8800")])
    (instance,) = status.instances
    assert instance.state == "failed" and status.state != "Ready", status
    assert instance.last_error == ("it refuses the internal key the gateways send (HTTP 401 to GET /v1/models with its "
                                   "host's key): engine-ctl apply restarts it")  # fmt: skip


def test_status_says_a_replica_on_a_key_no_gateway_sends_serves_nothing() -> None:
    """Its host's key file rotated by hand and the engine restarted on it: it answers its host's key (200), and
    refuses the gateways' (every request through them: 401). Before, status said ready (a probe, session 15)."""
    _, state, after, replica = served()
    port = str(replica.port)
    record = state.deployments["chat"]
    after["cpu-1"] = after["cpu-1"].model_copy(update={"health": {port: "200"}, "replica_keys": {REPLICA_KEY: (ELSE,)}})
    (instance,) = deployment_status(record, after, [("edge", "10.0.0.2:8800")]).instances
    assert instance.state == "failed"
    assert instance.last_error == (f"it accepts its host's internal key ({REPLICA_KEY}), which no running gateway "
                                   "sends: every request through the gateway is refused (HTTP 401); engine-ctl apply "
                                   "gives it the gateways' key and restarts it")  # fmt: skip
    both = after["cpu-1"].model_copy(update={"replica_keys": {REPLICA_KEY: (ELSE, SENT)}})  # a rotation's overlap
    assert [i.state for i in deployment_status(record, {**after, "cpu-1": both}, []).instances] == ["ready"]
    unread = after["edge"].model_copy(update={"gateway_key": {"file": SENT}})  # no running map read: no verdict
    assert [i.state for i in deployment_status(record, {**after, "edge": unread}, []).instances] == ["ready"]


def test_a_stopped_deployments_host_without_the_key_gets_it_written_and_nothing_starts() -> None:
    """Held by an operator, its replica would refuse every request after `engine-ctl start`: the key files are
    written (apply's gateway step writes them on every host of a change) and the replica kept stopped."""
    from engine_ctl.core.record.model import OperatorAction

    inv, state, after, _ = served()
    state.deployments["chat"].operator = OperatorAction(verb="stopped", when="2026-12-05T00:00:00+00:00")
    (unit,) = after["cpu-1"].units
    after["cpu-1"] = after["cpu-1"].model_copy(update={
        "units": (unit.model_copy(update={"active_state": "inactive", "unit_file_state": "disabled"}),),
        "replica_keys": {REPLICA_KEY: (ELSE,)}, "key_checks": {},
    })  # fmt: skip
    plan = make_plan(desired(), state, inv, after, SHAPE)
    assert [d.kind for d in plan.drift] == ["internal-key"]
    (step,) = plan.changes[0].replicas
    said = "holds another key; apply writes the key; a running replica restarts on it, drained first"
    assert step.role == "held" and step.reason.endswith(f"{said}; written again, kept stopped"), step.reason
    assert plan.has_changes


def test_a_key_file_others_may_read_is_drift_on_any_host(tmp_path: Path) -> None:
    """A probe (session 16): `chmod 644` on the replica hosts' and the gateway's key files left the fleet's key
    readable by every local user (and any engine's DynamicUser), beside "No changes". The probe reads each file's
    mode and owner; one others may read is drift on the gateway's change (apply writes the key to every host,
    root-only), listed once."""
    key = tmp_path / "replica-key"
    key.write_text("ek-x\n")
    key.chmod(0o600)
    assert facts_probe.loose_secrets([str(key), str(tmp_path / "absent")]) == {}
    key.chmod(0o644)
    assert facts_probe.loose_secrets([str(key)]) == {str(key): "mode 0644, owner uid 0"}
    inv, state, after, _ = served()
    assert not make_plan(desired(), state, inv, after, SHAPE).has_changes
    after["cpu-1"] = after["cpu-1"].model_copy(update={"loose_secrets": {REPLICA_KEY: "mode 0644, owner uid 0"}})
    plan = make_plan(desired(), state, inv, after, SHAPE)
    (drift,) = plan.drift
    assert drift.host == "cpu-1" and drift.detail == (
        f"{REPLICA_KEY} on cpu-1 holds the internal key with mode 0644, owner uid 0: others may read it (the key "
        "opens every replica); apply writes it again, root-only (0600)"
    )
    assert plan.gateways[0].action == ["update"]
