"""The guard of a replica whose engine runs with its sleep controls (issue 13: those controls are never reachable
through the gateway or from another host), on the real fleet: the replica's unit as engine-ctl renders it for a
vLLM deployment with `residency: parked`, written and started on the second host by apply's own shell (its guard
written beside it from the unit's `#|` lines), real systemd, the real HAProxy guard, the real gateway (HAProxy,
rendered and installed by engine-ctl's gateway code) on the first host, real SSH with the scaler's forced
command, and the real scaler there (installed by engine-ctl's scaler apply).

vLLM needs a GPU, which the fleet has not: its engine is the test double of vLLM's HTTP server (tests/vllm_double.py,
which names its source: vLLM's sleep-mode docs and api_server.py), installed on the host as the engine's default
executable (/usr/local/bin/vllm) and launched by the unit with vLLM's own argv. The replica's placement (no GPUs)
is given here rather than fitted, since the fleet's hosts have none."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from engine_ctl.providers import PROVIDERS

from engine_ctl.core.documents.apikey import key_sha256
from engine_ctl.core.documents.inventory import Host, Inventory
from engine_ctl.core.fit.runspec import Placement
from engine_ctl.core.model import ApiKey
from engine_ctl.core.plan.drift import guard_drift
from engine_ctl.core.plan.scaler import ScalerPlan, scaler_deployments
from engine_ctl.core.record.model import DeploymentRecord, OperatorAction, ReplicaRecord, State
from engine_ctl.core.render.gateway import (
    GATEWAY_UNIT,
    REPLICA_KEY,
    GatewayBackend,
    GatewayServer,
    render_gateway,
    replica_key_files,
)
from engine_ctl.core.render.guard import guard_name
from engine_ctl.core.render.scaler import COMMAND_PATH, SCALER_UNIT, ssh_target
from engine_ctl.core.render.units import render_unit, replica_run
from engine_ctl.shell.gateway import runtime as gateway_shell
from engine_ctl.shell.gather import gather
from engine_ctl.shell.lifecycle.hosts import job_argv, sleep_job
from engine_ctl.shell.remote.scaler import Scaler
from engine_ctl.shell.scaler.apply import (
    AUTHORIZE,
    KEY_COMMENT,
    ScalerApply,
    authorized_line,
    command_text,
    known_hosts_line,
)
from engine_ctl.shell.systemd import remove_argv, restart_argv, rewrite_argv, start_argv
from engine_ctl.shell.transport import SSHTransport
from tests.fleet import Fleet, FleetHost
from tests.test_guard import desired_with, render

pytestmark = pytest.mark.fleet
PORT = 8461
UNIT = "engine-ctl-chat-0a.service"
GUARD = guard_name(UNIT)
INTERNAL = "5e" * 32
"""The gateway's internal key (64 hex digits), which the engine requires on /v1."""
CLIENT = "ak-test-guard-" + "c3" * 24
DOUBLE = Path(__file__).parent / "vllm_double.py"
CONTROLS = [("POST", "/sleep?level=1"), ("POST", "/wake_up"), ("POST", "/collective_rpc"), ("GET", "/is_sleeping"),
            ("POST", "/release_memory_occupation"), ("POST", "/v1/../sleep")]  # fmt: skip


@dataclass
class Guarded:
    fleet: Fleet
    gateway: FleetHost
    engine: FleetHost
    engine_host: Host
    t: SSHTransport

    def on(self, host: FleetHost, command: str) -> str:
        return self.fleet.ssh(host, command, check=False).stdout

    def curl(self, host: FleetHost, method: str, url: str, key: str = INTERNAL) -> tuple[int, str]:
        """One request made on `host` (curl there): its status and body."""
        out = self.on(host, f"curl -s -X {method} -H 'Authorization: Bearer {key}' -H 'Content-Type: application/json' "
                            f"-d '{{}}' -w '\\n%{{http_code}}' --max-time 20 '{url}'")  # fmt: skip
        body, _, status = out.rpartition("\n")
        return int(status or 0), body

    def asleep(self) -> bool:
        status, body = self.curl(self.engine, "GET", f"http://127.0.0.1:{PORT}/is_sleeping")
        assert status == 200, body
        return bool(json.loads(body)["is_sleeping"])

    def state(self, unit: str) -> str:
        return self.on(self.engine, f"systemctl is-active {unit}").strip()


def the_unit(engine: Host, gateway: Host) -> str:
    """The replica's unit as a plan renders it (test_guard's `render`: a vLLM deployment, residency parked), at
    a placement with no GPUs on the fleet's engine host."""
    fitted = render().fit.plan
    assert fitted is not None
    desired = desired_with("model: qwen3-8b", "parked")
    d = desired.deployments[0].deployment
    model = desired.model(d.model)
    assert model is not None
    p = Placement(index=0, host=engine.name, port=PORT)
    run = replica_run(d, model, PROVIDERS["vllm"], fitted, p, engine, gateways=(gateway.address,))
    return render_unit(run, PROVIDERS["vllm"], engine).text


def gateway_up(g: Guarded, gateway: Host) -> None:
    """engine-ctl's gateway on the first host: one backend, its one server the replica's address and port."""
    t = SSHTransport(gateway)
    try:
        gateway_shell.set_internal_key(t, INTERNAL, None)  # as apply does, before the gateway's configuration
        server = GatewayServer(name="r0a", address=g.engine_host.address, port=PORT, maxconn=256)
        rendered = render_gateway(gateway, [GatewayBackend(deployment="chat", servers=(server,))],
                                  [ApiKey(name="all", sha256=key_sha256(CLIENT))])  # fmt: skip
        assert gateway_shell.install(t, rendered) in ("started", "reloaded", "restarted")
    finally:
        t.close()


@pytest.fixture(scope="module")
def guarded(fleet: Fleet, fleet_inventory: Inventory) -> Iterator[Guarded]:
    gateway = fleet_inventory.hosts[0].model_copy(update={"roles": ("gateway",)})
    engine = fleet_inventory.hosts[1]
    t = SSHTransport(engine)
    g = Guarded(fleet, fleet.host(gateway.name), fleet.host(engine.name), engine, t)
    try:
        gateway_shell.write_secrets(t, {REPLICA_KEY: INTERNAL + "\n", **replica_key_files([INTERNAL])})
        t.put("/usr/local/bin/vllm", DOUBLE.read_bytes(), 0o755)  # the engine's default executable
        text = the_unit(engine, gateway)
        weights = next(ln for ln in text.splitlines() if ln.startswith("ReadOnlyPaths="))
        assert t.run(["mkdir", "-p", weights.partition("=")[2]]).exit_code == 0
        started = t.run(start_argv(UNIT, upload=True), stdin=text, timeout=120)  # apply's own step
        journal = t.run(["journalctl", "-u", UNIT, "-u", GUARD, "--no-pager", "-n", "40"]).stdout
        assert started.exit_code == 0, started.stderr + journal
        gateway_up(g, gateway)
        yield g
    finally:
        t.run(remove_argv(UNIT))
        fleet.ssh(g.gateway, f"systemctl disable --now {GATEWAY_UNIT}", check=False)
        t.close()


def wait_for(check: object, within: float = 30) -> None:
    deadline = time.monotonic() + within
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.5)


def test_the_guard_runs_beside_the_replica_and_the_engine_listens_on_loopback_only(guarded: Guarded) -> None:
    wait_for(lambda: guarded.state(GUARD) == "active")
    listening = guarded.on(guarded.engine, f"ss -Hltn 'sport = :{PORT}'")
    addresses = sorted(line.split()[3] for line in listening.splitlines())
    assert addresses == sorted([f"127.0.0.1:{PORT}", f"{guarded.engine.address}:{PORT}"]), listening
    guard_pid = guarded.on(guarded.engine, f"systemctl show -p MainPID --value {GUARD}").strip()
    assert guard_pid != "0" and "haproxy" in guarded.on(guarded.engine, f"cat /proc/{guard_pid}/comm")


def test_from_another_host_every_sleep_control_is_refused_and_the_engine_stays_awake(guarded: Guarded) -> None:
    wait_for(lambda: guarded.state(GUARD) == "active")
    replica = f"http://{guarded.engine.address}:{PORT}"
    for method, path in CONTROLS:
        status, body = guarded.curl(guarded.gateway, method, replica + path)
        assert status == 404 and json.loads(body)["error"]["code"] == "unknown_url", (path, status, body)
    assert not guarded.asleep()
    assert guarded.curl(guarded.gateway, "GET", replica + "/health")[0] == 200  # what the gateway checks passes
    status, metrics = guarded.curl(guarded.gateway, "GET", replica + "/metrics")  # what the scaler reads passes
    assert status == 200 and "vllm:num_requests_running" in metrics
    # the same controls on the replica's own host, on loopback, reach the engine
    assert guarded.curl(guarded.engine, "POST", f"http://127.0.0.1:{PORT}/sleep?level=1")[0] == 200
    assert guarded.asleep()
    assert guarded.curl(guarded.engine, "POST", f"http://127.0.0.1:{PORT}/wake_up")[0] == 200
    assert not guarded.asleep()


def test_through_the_gateway_the_api_is_answered_via_the_guard_and_the_controls_are_404(guarded: Guarded) -> None:
    endpoint = f"http://{guarded.gateway.address}:8800"
    body = json.dumps({"model": "chat", "messages": [{"role": "user", "content": "hi"}]})

    def answered() -> bool:
        out = guarded.on(guarded.gateway, f"curl -s -o /dev/null -w '%{{http_code}}' -H 'Authorization: Bearer "
                                          f"{CLIENT}' -H 'Content-Type: application/json' -d '{body}' "
                                          f"{endpoint}/v1/chat/completions")  # fmt: skip
        return out == "200"

    wait_for(answered, within=60)  # the gateway's check of the replica (through the guard) passed: it serves
    for method, path in CONTROLS[:4]:
        status, said = guarded.curl(guarded.gateway, method, endpoint + path, key=CLIENT)
        assert status == 404 and json.loads(said)["error"]["code"] == "unknown_url", (path, status, said)
    assert not guarded.asleep()


def scaler_for(guarded: Guarded, tmp: Path) -> Scaler:
    """The scaler's key, authorized on the engine host with its forced command (as apply does), and a Scaler that
    uses it."""
    key = tmp / "scaler-key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", KEY_COMMENT, "-f", str(key)], check=True)
    t = guarded.t
    assert t.run(["mkdir", "-p", os.path.dirname(COMMAND_PATH)]).exit_code == 0
    t.put(COMMAND_PATH, command_text().encode(), 0o755)
    out = t.run(
        ["sh", "-c", AUTHORIZE % {"comment": KEY_COMMENT}],
        stdin=authorized_line(key.with_suffix(".pub").read_text()) + "\n",
    )
    assert out.exit_code == 0, out.stderr
    (tmp / "known_hosts").write_text(known_hosts_line(guarded.engine_host, out.stdout.strip()) + "\n")
    config = {"deployments": [], "key": str(key), "known_hosts": str(tmp / "known_hosts"),
              "gateway_socket": str(tmp / "none"), "internal_env": str(tmp / "none")}  # fmt: skip
    return Scaler(config, str(tmp / "state.json"), lambda _m: None)


def test_a_park_sleeps_on_loopback_and_the_scalers_wake_goes_through_the_forced_command(
    guarded: Guarded, tmp_path: Path
) -> None:
    record = ReplicaRecord(index=0, host=guarded.engine.name, unit=UNIT, port=PORT, unit_sha256="", revision=1)
    parked = guarded.t.run(job_argv(sleep_job(PROVIDERS["vllm"], guarded.engine_host, record, 1)), timeout=120)
    assert parked.exit_code == 0, parked.stderr  # engine-ctl park's job, on the replica's host
    assert guarded.asleep()

    scaler = scaler_for(guarded, tmp_path)
    slot = {"unit": UNIT, "host": guarded.engine.name, "ssh_host": ssh_target(guarded.engine_host),
            "ssh_port": guarded.engine_host.port, "address": guarded.engine.address, "port": PORT}  # fmt: skip
    park = {"level": 1, "calls": [{"method": "POST", "path": "/wake_up", "body": None}], "check": None}
    scaler.wake_calls(slot, park)
    assert not guarded.asleep()
    # the key asks for nothing else: another unit, or a path of the caller's, is refused
    for command in (f"wake {GUARD}", f"wake {UNIT} /sleep", f"wake {UNIT}; id"):
        assert scaler.ssh(slot, command)[0] == 126, command
    assert not guarded.asleep()
    log = guarded.on(guarded.engine, f"journalctl -u {UNIT} --no-pager -o cat")
    assert '["wake_up", ""]' in log  # the wake call reached the engine, on loopback


def parked_state(guarded: Guarded) -> State:
    """What `engine-ctl park` records for the deployment (its replica on the engine host, asleep at level 1)."""
    desired = desired_with("model: qwen3-8b", "parked")
    replica = ReplicaRecord(index=0, host=guarded.engine.name, unit=UNIT, port=PORT, unit_sha256="", revision=1,
                            status="serving")  # fmt: skip
    parked = OperatorAction(verb="parked", when="2026-12-03T17:00:00+00:00", who="ops", operation=PARK, level=1)
    rec = DeploymentRecord(name="chat", revision=1, spec=desired.deployments[0].deployment, plan=render().fit.plan,
                           state="Ready", replicas=[replica], id=DEPLOYMENT_ID, operator=parked)  # fmt: skip
    return State(deployments={"chat": rec})


PARK = "01KBJ0Q7ZP0000000000000000"
DEPLOYMENT_ID = "01KBJ0Q7ZP0000000000000001"


def test_a_request_through_the_gateway_wakes_the_parked_engine_through_the_scalers_forced_command(
    guarded: Guarded, fleet_inventory: Inventory
) -> None:
    """The real scaler on the gateway host (installed by engine-ctl's scaler apply, for the parked deployment as
    the state records it), the park's job on the replica's host, then one request through the gateway."""
    gateway = fleet_inventory.hosts[0].model_copy(update={"roles": ("gateway",)})
    hosts = {gateway.name: gateway, guarded.engine_host.name: guarded.engine_host}
    state = parked_state(guarded)
    plan = ScalerPlan(host=gateway.name, poll_s=15, decide_every_s=15, hold_s=120, deployments=["chat"])
    ScalerApply(plan, hosts, lambda: state, None, lambda _m: None).install([gateway], scaler_deployments(state, hosts))
    gt = SSHTransport(gateway)
    try:
        gateway_shell.set_state(gt, "d_chat", "r0a", "maint")  # as the park does: new requests are held
        record = state.deployments["chat"].replicas[0]
        parked = guarded.t.run(job_argv(sleep_job(PROVIDERS["vllm"], guarded.engine_host, record, 1)), timeout=120)
        assert parked.exit_code == 0, parked.stderr
        assert guarded.asleep()
        body = json.dumps({"model": "chat", "messages": [{"role": "user", "content": "hi"}]})
        curl = (f"curl -s -w '\\n%{{http_code}}' --max-time 110 -H 'Authorization: Bearer {CLIENT}' "
                f"-H 'Content-Type: application/json' -d '{body}' "
                f"http://{guarded.gateway.address}:8800/v1/chat/completions")  # fmt: skip
        ask = [*guarded.fleet.ssh_argv(guarded.gateway), curl]
        answer = subprocess.run(ask, capture_output=True, text=True, timeout=130, check=False).stdout
        scaler_log = guarded.on(guarded.gateway, f"journalctl -u {SCALER_UNIT} --no-pager -o cat | tail -20")
        assert answer.endswith("\n200"), answer + scaler_log
        assert not guarded.asleep()
        assert f"{UNIT}: woken on {guarded.engine.name}" in scaler_log, scaler_log  # the forced command's wake
        log = guarded.on(guarded.engine, f"journalctl -u {UNIT} --no-pager -o cat")
        assert log.rindex('["wake_up", ""]') < log.rindex('["chat done", false]')  # woken, then answered
    finally:
        gt.run(["sh", "-c", f"systemctl disable --now {SCALER_UNIT}"])
        gt.close()


def test_an_asleep_replicas_hand_edited_unit_is_written_back_without_a_restart_and_it_sleeps_on(
    guarded: Guarded, fleet_inventory: Inventory
) -> None:
    """A deployment parked asleep keeps its unit active; a hand edit of the unit file (and a drop-in) would run at
    the unit's next start. Apply's held rewrite (engine_ctl.shell.systemd.rewrite_argv, what it runs for a step of
    role `held` of a deployment parked at level 1 or 2) writes the file back, removes the drop-in and reloads:
    the engine is not restarted and not woken, its guard runs on, and the unit stays enabled."""
    record = ReplicaRecord(index=0, host=guarded.engine.name, unit=UNIT, port=PORT, unit_sha256="", revision=1)
    slept = guarded.t.run(job_argv(sleep_job(PROVIDERS["vllm"], guarded.engine_host, record, 1)), timeout=120)
    assert slept.exit_code == 0, slept.stderr
    assert guarded.asleep()
    path, drop_in = f"/etc/systemd/system/{UNIT}", f"/etc/systemd/system/{UNIT}.d/ectl-edit.conf"
    text = the_unit(guarded.engine_host, fleet_inventory.hosts[0].model_copy(update={"roles": ("gateway",)}))
    pids = {u: guarded.on(guarded.engine, f"systemctl show -p MainPID --value {u}").strip() for u in (UNIT, GUARD)}
    guarded.on(guarded.engine, f"sed -i 's/^\\[Service\\]$/[Service]\\nEnvironment=ECTL_ASLEEP_EDIT=1/' {path} && "
                               f"mkdir -p {os.path.dirname(drop_in)} && printf '[Service]\\nNice=5\\n' > {drop_in} && "
                               "systemctl daemon-reload")  # fmt: skip
    assert "ECTL_ASLEEP_EDIT" in guarded.on(guarded.engine, f"cat {path}")
    written = guarded.t.run(rewrite_argv(UNIT), stdin=text, timeout=60)
    assert written.exit_code == 0, written.stderr
    assert guarded.on(guarded.engine, f"cat {path}") == text
    assert guarded.on(guarded.engine, f"test -e {drop_in} && echo there || echo gone").strip() == "gone"
    for u, pid in pids.items():  # neither the engine nor its guard restarted
        assert guarded.on(guarded.engine, f"systemctl show -p MainPID --value {u}").strip() == pid, u
        assert guarded.state(u) == "active"
    assert guarded.on(guarded.engine, f"systemctl show -p NeedDaemonReload --value {UNIT}").strip() == "no"
    assert guarded.on(guarded.engine, f"systemctl is-enabled {UNIT}").strip() == "enabled"
    assert guarded.asleep()  # not woken
    assert guarded.curl(guarded.engine, "POST", f"http://127.0.0.1:{PORT}/wake_up")[0] == 200
    assert not guarded.asleep()


def guard_said(guarded: Guarded, text: str) -> list[tuple[str, str]]:
    """What the plan's guard check says of the engine host's guard, from the real probe's facts."""
    found, failures = gather([guarded.engine_host])
    assert not failures, failures
    facts = found[guarded.engine_host.name]
    record = ReplicaRecord(index=0, host=guarded.engine_host.name, unit=UNIT, port=PORT,
                           unit_sha256=hashlib.sha256(text.encode()).hexdigest(), revision=1)  # fmt: skip
    return [(d.kind, d.detail) for d in guard_drift("chat", record, text, facts)]


def test_a_guard_edited_restarted_then_put_back_is_drift_until_its_replica_restarts(
    guarded: Guarded, fleet_inventory: Inventory
) -> None:
    """The guard's file edited (here an environment variable; as well an address filter dropped), the guard
    restarted on it, the file copied back with `cp -p` and daemon-reload: the file is engine-ctl's, the guard runs
    the edit. The real probe's times say so (drift.guard_drift: `launch`); apply's repair, the replica's restart
    with its unit written again, restarts the guard with it (PartOf=), after which nothing is said."""
    text = the_unit(guarded.engine_host, fleet_inventory.hosts[0].model_copy(update={"roles": ("gateway",)}))
    restarted = guarded.t.run(restart_argv(UNIT, upload=True), stdin=text, timeout=120)  # apply's repair step
    assert restarted.exit_code == 0, restarted.stderr
    wait_for(lambda: guarded.state(GUARD) == "active")
    assert guard_said(guarded, text) == []
    path = f"/etc/systemd/system/{GUARD}"
    time.sleep(1.5)  # past the second of slack either side of the guard's start
    edit = f"sed -i 's/^\\[Service\\]$/[Service]\\nEnvironment=ECTL_GUARD_EDIT=1/' {path}"
    guarded.on(guarded.engine, f"cp -p {path} /root/guard.kept && {edit} && systemctl daemon-reload && "
                               f"systemctl restart {GUARD} && sleep 1.5 && cp -p /root/guard.kept {path} && "
                               "systemctl daemon-reload")  # fmt: skip
    pid = guarded.on(guarded.engine, f"systemctl show -p MainPID --value {GUARD}").strip()
    assert "ECTL_GUARD_EDIT=1" in guarded.on(guarded.engine, f"tr '\\0' '\\n' < /proc/{pid}/environ")
    ((kind, detail),) = guard_said(guarded, text)
    assert kind == "launch" and detail.startswith(f"the guard {GUARD} on {guarded.engine_host.name}: its unit file "
                                                  "changed after it started (changed "), detail  # fmt: skip
    repaired = guarded.t.run(restart_argv(UNIT, upload=True), stdin=text, timeout=120)
    assert repaired.exit_code == 0, repaired.stderr
    wait_for(lambda: guarded.state(GUARD) == "active")
    now = guarded.on(guarded.engine, f"systemctl show -p MainPID --value {GUARD}").strip()
    assert now != pid and "ECTL_GUARD_EDIT" not in guarded.on(guarded.engine, f"tr '\\0' '\\n' < /proc/{now}/environ")
    assert guard_said(guarded, text) == []


def test_the_guard_goes_with_its_replica(guarded: Guarded) -> None:
    assert guarded.t.run(["systemctl", "stop", UNIT]).exit_code == 0
    wait_for(lambda: guarded.state(GUARD) == "inactive")
    assert guarded.t.run(["systemctl", "start", UNIT], timeout=120).exit_code == 0
    wait_for(lambda: guarded.state(GUARD) == "active")
    assert guarded.t.run(remove_argv(UNIT)).exit_code == 0
    assert guarded.state(GUARD) != "active" and guarded.state(UNIT) != "active"
    assert guarded.on(guarded.engine, "ls /etc/systemd/system/ | grep -c engine-ctl-chat-0a || true").strip() == "0"
