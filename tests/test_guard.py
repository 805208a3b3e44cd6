"""The guard of a replica whose engine runs with its sleep controls enabled (issue 13: those controls are never
reachable through the gateway or from another host), the parts that need no fleet: which replicas get one, the
unit and HAProxy configuration rendered (checked by the real `haproxy -c` and `systemd-analyze verify`), the plan's
refusal of a host that cannot run it, apply's shell that writes it beside the replica, and the scaler's forced
`wake` against the test double of vLLM's sleep API (tests/test_park_sleep_double.py names its source: vLLM's
sleep-mode docs and api_server.py). tests/test_fleet_guard.py runs it on the fleet."""

from __future__ import annotations

import ast
import hashlib
import json
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from engine_ctl.providers import PROVIDERS

from engine_ctl.cli.views import plan as planview
from engine_ctl.core.documents.inventory import Host, Inventory
from engine_ctl.core.fit.hostfacts import UnitFact
from engine_ctl.core.model import DesiredState
from engine_ctl.core.plan.adoption import _candidates
from engine_ctl.core.plan.changes import Action, ReplicaChange
from engine_ctl.core.plan.drift import guard_drift, unmanaged_units
from engine_ctl.core.plan.operator import sleep_controls_warning
from engine_ctl.core.plan.pipeline import DeploymentRender, render_deployment
from engine_ctl.core.record.model import DeploymentRecord, ReplicaRecord, State
from engine_ctl.core.render.guard import GUARD_LINE, guard_config, guard_name, guard_note, guard_text
from engine_ctl.core.render.units import RenderedUnit
from engine_ctl.shell.lifecycle.hosts import sleep_job, wake_job
from engine_ctl.shell.remote import scaler_command
from engine_ctl.shell.systemd import guard_upload, remove_argv
from tests.fleetfacts import cpu_host, h100x8
from tests.helpers import load, messages
from tests.ports import free_port
from tests.test_render import MODELS, SHAPES
from tests.vllm_double import VllmDouble

GATEWAY = "198.18.0.10"
ENGINE_HOST = "198.18.0.11"


def desired_with(spec: str, residency: str) -> DesiredState:
    result, diags = load(MODELS, "metadata: {name: chat}\nspec:\n  %s\n" % spec.replace("\n", "\n  "))
    assert messages(diags) == []
    (ld,) = result.desired.deployments
    d = ld.deployment.model_copy(update={"residency": residency})
    return result.desired.model_copy(update={"deployments": (ld.model_copy(update={"deployment": d}),)})


def render(spec: str = "model: qwen3-8b", residency: str = "parked", haproxy: str | None = "2.6.12",
           address: str = ENGINE_HOST) -> DeploymentRender:  # fmt: skip
    facts = h100x8().model_copy(update={"haproxy_version": haproxy})
    engine = Host(name=facts.host, address=address, models_dir="/srv/models")
    gateway = Host(name="gw", address=GATEWAY, roles=("gateway",))
    desired = desired_with(spec, residency)
    model = desired.deployments[0].deployment.model
    gw_facts = facts.model_copy(update={"host": "gw", "gpus": ()})
    return render_deployment(desired, "chat", Inventory(hosts=(engine, gateway)), {facts.host: facts, "gw": gw_facts},
                             SHAPES[model], state=State(lineage="lineage-of-a-test"))  # fmt: skip


def guarded_unit(**kw: object) -> RenderedUnit:
    (unit,) = render(**kw).units  # type: ignore[arg-type]
    return unit


def test_only_a_replica_with_sleep_controls_gets_a_guard_and_its_engine_then_listens_on_loopback() -> None:
    parked = guarded_unit()
    assert parked.argv[parked.argv.index("--host") + 1] == "127.0.0.1" and "--enable-sleep-mode" in parked.argv
    assert "Wants=engine-ctl-chat-0a-guard.service" in parked.text
    assert "IPAddressAllow=localhost\n" in parked.text  # the engine: loopback only
    plain = guarded_unit(residency="restart_only")  # no sleep controls: as before, no guard, no extra hop
    assert plain.argv[plain.argv.index("--host") + 1] == ENGINE_HOST and "--enable-sleep-mode" not in plain.argv
    assert GUARD_LINE not in plain.text and "guard" not in plain.text and "# wake:" not in plain.text
    assert f"IPAddressAllow=localhost {GATEWAY} {ENGINE_HOST}\n" in plain.text
    sglang = guarded_unit(spec="model: qwen3-8b\nengine: sglang")
    assert "--enable-memory-saver" in sglang.argv and guard_note(sglang.text) is not None
    # llama.cpp has no sleep controls: a park restarts it, and it has no guard
    llama = guarded_unit(spec="model: llama-3-2-3b")
    assert "--host" in llama.argv and GUARD_LINE not in llama.text


def test_the_unit_carries_the_wake_calls_of_its_residency_for_the_forced_command() -> None:
    def wake(text: str) -> dict[str, object]:
        line = next(ln for ln in text.splitlines() if ln.startswith("# wake: "))
        return json.loads(line.removeprefix("# wake: "))  # type: ignore[no-any-return]

    one = wake(guarded_unit().text)
    assert one == {"port": 8000, "level": 1, "calls": [{"method": "POST", "path": "/wake_up", "body": None}],
                   "check": {"path": "/is_sleeping", "key": "is_sleeping"}}  # fmt: skip
    deep = wake(guarded_unit(residency="deep").text)
    assert [c["path"] for c in deep["calls"]] == ["/wake_up?tags=weights", "/collective_rpc", "/wake_up?tags=kv_cache"]  # type: ignore[attr-defined]
    assert scaler_command.valid_wake(one) and scaler_command.valid_wake(deep)


def written_beside(unit: RenderedUnit, tmp_path: Path) -> Path:
    """apply's own shell: the replica's file written, then its guard's from the `#|` lines."""
    (tmp_path / unit.name).write_text(unit.text)
    done = subprocess.run(["sh", "-c", guard_upload(unit.name, str(tmp_path))], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return tmp_path / guard_name(unit.name)


def haproxy_config(guard_text: str) -> str:
    """The configuration in the guard's SetCredential= line, as systemd unescapes it."""
    value = next(ln for ln in guard_text.splitlines() if ln.startswith("SetCredential=guard.cfg:"))
    return value.partition(":")[2].encode().decode("unicode_escape")


def test_apply_writes_the_guard_beside_the_replica_and_systemd_and_haproxy_accept_both(tmp_path: Path) -> None:
    unit = guarded_unit()
    guard = written_beside(unit, tmp_path)
    text = guard.read_text()
    assert text == guard_text(unit.text)  # what the plan's drift check expects on the host
    assert text.startswith("# Managed by engine-ctl: the guard of engine-ctl-chat-0a.service")
    for line in ("BindsTo=engine-ctl-chat-0a.service", "PartOf=engine-ctl-chat-0a.service",
                 "After=engine-ctl-chat-0a.service", "DynamicUser=yes", "NoNewPrivileges=yes",
                 f"IPAddressAllow=localhost {GATEWAY} {ENGINE_HOST}",
                 "ExecStart=/usr/sbin/haproxy -Ws -f %d/guard.cfg"):  # fmt: skip
        assert line in text.splitlines(), line
    config = haproxy_config(text)
    assert f"bind {ENGINE_HOST}:8000" in config and "server engine 127.0.0.1:8000" in config
    assert f"{{ src 127.0.0.0/8 ::1 {GATEWAY} {ENGINE_HOST} }}" in config
    cfg = tmp_path / "guard.cfg"
    cfg.write_text(config)
    checked = subprocess.run(["haproxy", "-c", "-f", str(cfg)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    for path in (tmp_path / unit.name, guard):
        proc = subprocess.run(["systemd-analyze", "verify", "--man=no", str(path)], capture_output=True, text=True)
        # (the engine is not installed on this machine; everything else must verify)
        bad = [ln for ln in proc.stderr.splitlines() if "Command /usr/local/bin/vllm is not executable" not in ln]
        assert bad == [], proc.stderr
    # the unit without a guard (sleep controls turned off): the guard's file is removed again
    plain = guarded_unit(residency="restart_only")
    assert not written_beside(plain.model_copy(update={"name": unit.name}), tmp_path).exists()


def test_removing_a_replica_removes_its_guard_too() -> None:
    script = remove_argv("engine-ctl-chat-0a.service")[2]
    assert "systemctl stop engine-ctl-chat-0a-guard.service" in script
    assert (
        "rm -f /etc/systemd/system/engine-ctl-chat-0a.service /etc/systemd/system/engine-ctl-chat-0a-guard.service"
        in script
    )


def test_a_host_without_haproxy_or_with_a_dns_name_is_refused_saying_what_to_do() -> None:
    missing = render(haproxy=None).fit
    assert missing.pending_reason is not None
    assert missing.pending_reason == ("the guard of the engine's sleep controls is HAProxy, which is not installed on "
                                      "gpu-h100: install it (apt install haproxy)")  # fmt: skip
    pinned = render(spec="model: qwen3-8b\nhost: gpu-h100", haproxy=None).fit  # named there: Failed, same words
    assert pinned.failed_reason is not None and "install it (apt install haproxy)" in pinned.failed_reason
    named = render(address="gpu1.example.com").fit
    assert named.pending_reason is not None and "give gpu-h100 its IP address in the inventory" in named.pending_reason
    assert render(residency="restart_only", haproxy=None).fit.pending_reason is None  # no guard, no HAProxy needed


def test_the_plan_shows_the_guard_and_a_guard_beside_its_replica_is_not_unmanaged() -> None:
    unit = guarded_unit()
    change = ReplicaChange(index=0, action=[Action.CREATE], host="gpu-h100", unit=unit.name, slot="a", port=8000,
                           revision=1, argv=list(unit.argv), unit_text=unit.text)  # fmt: skip
    lines = "\n".join(planview._replica_lines(change))
    assert ("    guard: engine-ctl-chat-0a-guard.service on 198.18.0.11:8000 passes on only /v1/, /health, /metrics "
            "to the engine, which listens on 127.0.0.1:8000 with its sleep controls") in lines  # fmt: skip
    state = State(deployments={"chat": DeploymentRecord(name="chat", replicas=[
        ReplicaRecord(index=0, host="h", unit=unit.name, port=8000, unit_sha256="", revision=1)])})  # fmt: skip
    units = (UnitFact(name=unit.name), UnitFact(name=guard_name(unit.name)),
             UnitFact(name="engine-ctl-other-0a-guard.service"))  # fmt: skip
    facts = cpu_host("h").model_copy(update={"units": units})
    assert [d.unit for d in unmanaged_units(state, {"h": facts})] == ["engine-ctl-other-0a-guard.service"]
    # `engine-ctl import` neither adopts a guard nor lists it as skipped: it goes with its replica
    inventory = Inventory(hosts=(Host(name="h", address=ENGINE_HOST),))
    _found, _workers, skipped = _candidates(desired_with("model: qwen3-8b", "parked"), inventory, {"h": facts})
    assert [s.unit for s in skipped] == [unit.name]  # (that fact has no header: skipped, and said)


def test_a_guard_missing_edited_or_stopped_beside_its_running_replica_is_drift_that_apply_repairs() -> None:
    unit = guarded_unit()
    record = ReplicaRecord(index=0, host="h", unit=unit.name, port=8000, unit_sha256=unit.sha256, revision=1)
    text = guard_text(unit.text)
    assert text is not None
    good = hashlib.sha256(text.encode()).hexdigest()
    replica = UnitFact(name=unit.name, sha256=unit.sha256, active_state="active")

    def drift(guard: UnitFact | None) -> list[tuple[str, str]]:
        facts = cpu_host("h").model_copy(update={"units": (replica, *([guard] if guard else []))})
        return [(d.kind, d.unit) for d in guard_drift("chat", record, unit.text, facts)]

    name = guard_name(unit.name)
    assert drift(UnitFact(name=name, sha256=good, active_state="active")) == []
    assert drift(None) == [("missing", name)]
    assert drift(UnitFact(name=name, sha256="0" * 64, active_state="active")) == [("edited", name)]
    assert drift(UnitFact(name=name, sha256=good, active_state="failed", sub_state="failed")) == [("stopped", name)]
    plain = guarded_unit(residency="restart_only")
    assert guard_drift("chat", record, plain.text, cpu_host("h")) == []  # no guard: nothing to miss


# --- the guard itself: real HAProxy in front of the test double of vLLM -----------------------------------------


@pytest.fixture
def double() -> Iterator[VllmDouble]:
    d = VllmDouble(key=KEY)
    yield d
    d.server.shutdown()


KEY = "internal-key-" + "7" * 32


def call(port: int, method: str, path: str, key: str = "") -> tuple[int, str]:
    data = b"{}" if method == "POST" else None
    headers = {"Authorization": "Bearer " + key, "Content-Type": "application/json"} if key else {}
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_haproxy_passes_on_only_the_api_health_and_metrics_and_refuses_the_sleep_controls(
    double: VllmDouble, tmp_path: Path
) -> None:
    """The guard's configuration in a real HAProxy (here on another loopback port, as the fleet cannot share one
    address between two listeners): every sleep control is 404 there and the engine stays awake."""
    port = free_port()
    cfg = tmp_path / "guard.cfg"
    cfg.write_text(guard_config(f"127.0.0.1:{port}", f"127.0.0.1:{double.port}", PROVIDERS["vllm"], ()))
    proxy = subprocess.Popen(["haproxy", "-f", str(cfg)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                if call(port, "GET", "/health")[0] == 200:
                    break
            except OSError:
                assert time.monotonic() < deadline, "the guard did not start"
                time.sleep(0.1)
        for method, path in CONTROLS:
            status, body = call(port, method, path, KEY)
            assert status == 404 and json.loads(body)["error"]["code"] == "unknown_url", (path, status, body)
        assert not double.sleeping and not [w for w, _ in double.log if w != "chat done"], double.log
        assert call(port, "POST", "/v1/chat/completions", KEY)[0] == 200  # the API passes, with the engine's key
        assert call(port, "POST", "/v1/chat/completions")[0] == 401  # and the engine still wants its key
        status, metrics = call(port, "GET", "/metrics")
        assert status == 200 and "vllm:num_requests_running" in metrics
        assert call(double.port, "POST", "/sleep?level=1")[0] == 200 and double.sleeping  # on its own port: yes
    finally:
        proxy.terminate()
        proxy.wait(timeout=10)


CONTROLS = [
    ("POST", "/sleep?level=1"), ("POST", "/sleep?level=2"), ("POST", "/wake_up"), ("POST", "/wake_up?tags=weights"),
    ("POST", "/collective_rpc"), ("GET", "/is_sleeping"), ("POST", "/release_memory_occupation"),
    ("POST", "/resume_memory_occupation"), ("POST", "/v1/../sleep"), ("POST", "/v1/%2e%2e/sleep"),
    ("POST", "//sleep"), ("POST", "/sleep/"), ("POST", "/SLEEP"),
]  # fmt: skip


# --- the scaler's forced command: `wake UNIT`, the unit's own calls on loopback --------------------------------


def installed(tmp_path: Path, port: int, residency: str = "parked") -> str:
    """The rendered unit installed in `tmp_path` as apply writes it, its engine on the double's port."""
    unit = guarded_unit(residency=residency)
    text = unit.text.replace('"port": 8000', f'"port": {port}')
    (tmp_path / unit.name).write_text(text)
    return unit.name


def test_the_forced_command_wakes_the_unit_with_its_own_calls_on_loopback(double: VllmDouble, tmp_path: Path) -> None:
    name = installed(tmp_path, double.port, "deep")
    double.sleeping = True
    assert scaler_command.main(f"wake {name}", unit_dir=str(tmp_path)) == 0
    calls = [(w, d) for w, d in double.log if w != "is_sleeping"]
    assert calls == [("wake_up", "tags=weights"), ("collective_rpc", "reload_weights"), ("wake_up", "tags=kv_cache")]
    assert double.log[-1] == ("is_sleeping", False) and not double.sleeping


@pytest.mark.parametrize(
    "command", ["wake", "wake engine-ctl-chat-0a.service /sleep", "wake engine-ctl-chat-0a.service;id",
                "wake engine-ctl-nothing-0a.service", "wake engine-ctl-chat-0a-guard.service",
                "wake ../engine-ctl-chat-0a.service", "wake engine-ctl-plain-0a.service"],
)  # fmt: skip
def test_the_forced_command_takes_nothing_but_an_installed_unit_with_wake_calls(
    command: str, double: VllmDouble, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    installed(tmp_path, double.port)
    plain = guarded_unit(residency="restart_only")
    (tmp_path / "engine-ctl-plain-0a.service").write_text(plain.text)  # a replica with no sleep controls
    (tmp_path / "engine-ctl-chat-0a-guard.service").write_text("# Managed by engine-ctl\n")
    assert scaler_command.main(command, unit_dir=str(tmp_path)) == scaler_command.REFUSED
    assert "refused" in capsys.readouterr().err and double.log == []


def test_a_wake_call_the_engine_refuses_fails_the_wake_with_its_status(
    double: VllmDouble, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    name = installed(tmp_path, double.port)
    text = (tmp_path / name).read_text().replace('"path": "/wake_up"', '"path": "/no_such_wake"')
    (tmp_path / name).write_text(text)
    assert scaler_command.main(f"wake {name}", unit_dir=str(tmp_path)) == 1
    assert "POST /no_such_wake: HTTP 404" in capsys.readouterr().err


def test_the_forced_command_keeps_python_3_7s_grammar() -> None:
    ast.parse(Path(scaler_command.__file__).read_text(), feature_version=(3, 7))


def test_list_and_status_warn_while_parking_is_on_that_the_controls_listen_on_loopback_only() -> None:
    """Seed 003: "While parking is on, these commands also print a warning that the engine runs with its sleep
    controls enabled. Those controls listen on loopback only." (what the guard now makes true)"""
    fit = render().fit.plan
    parked = desired_with("model: qwen3-8b", "parked").deployments[0].deployment
    rec = DeploymentRecord(name="chat", spec=parked, plan=fit)
    warning = sleep_controls_warning([rec])
    assert warning is not None and warning.startswith(
        "warning: chat run with the engine's sleep controls enabled (parking is on): they listen on loopback only"
    )
    plain = rec.model_copy(update={"spec": parked.model_copy(update={"residency": "restart_only"})})
    assert sleep_controls_warning([plain]) is None


def test_park_and_start_make_their_calls_where_the_engine_listens_loopback_behind_a_guard() -> None:
    vllm, host = PROVIDERS["vllm"], Host(name="h", address=ENGINE_HOST)
    guarded = ReplicaRecord(index=0, host="h", unit="engine-ctl-chat-0a.service", port=8000, unit_sha256="",
                            revision=1, argv=list(guarded_unit().argv))  # fmt: skip
    assert sleep_job(vllm, host, guarded, 1).base == wake_job(vllm, host, guarded, 1).base == "http://127.0.0.1:8000"
    # parked by an engine-ctl without guards (its engine on the host's address until apply rolls the guard in)
    older = guarded.model_copy(update={"argv": ["/usr/local/bin/vllm", "serve", "m", "--host", ENGINE_HOST]})
    assert wake_job(vllm, host, older, 1).base == f"http://{ENGINE_HOST}:8000"
