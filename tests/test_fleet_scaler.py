"""The scaler on the real fleet: HAProxy under engine-ctl's gateway unit on hosts[0], the real llama-server in
units on the other hosts, the real scaler program under its hardened unit, its real SSH key and forced command,
and the official `openai` package as the client (max_retries=0: a failure is a failure).

The inventory's `gateway:` and `scaling:` blocks shorten the timings (hold 20 s, a decision at most every 20 s, a
poll every 2 s);
the defaults stay the seeds' (120 s, 120 s, 15 s).

Everything is what `engine-ctl apply` does: on-demand slots installed and not started, the scaler installed on the
first gateway host by name with its key and the forced command on the replica hosts."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import openai
import pytest

from engine_ctl.core.documents.apikey import key_sha256
from engine_ctl.core.documents.inventory import load_inventory
from engine_ctl.core.plan.scaler import scaler_deployments
from engine_ctl.core.record.model import State
from engine_ctl.core.render.scaler import SCALER_CONFIG, SCALER_KEY, SCALER_STATE, SCALER_UNIT
from tests.fleet import Fleet, FleetHost

KEY = "ak-test-scaler-" + "d4" * 24
HOLD_S, DECIDE_S, POLL_S = 20, 20, 2
pytestmark = pytest.mark.fleet


class ScalerProject:
    def __init__(self, path: Path, fleet: Fleet) -> None:
        self.path, self.fleet = path, fleet
        self.gateway = fleet.hosts[0]
        self.inventory = path / "hosts.yaml"
        text = Path(fleet.inventory).read_text()
        line = f"  - {{name: {self.gateway.name}, address: {self.gateway.address}}}"
        assert line in text
        text = text.replace(line, line[:-1] + ", roles: [gateway]}")
        text += f"gateway: {{hold_s: {HOLD_S}}}\nscaling: {{decide_every_s: {DECIDE_S}, poll_s: {POLL_S}}}\n"
        self.inventory.write_text(text)
        self.docs = path / "docs"
        self.docs.mkdir()
        self.base = f"http://{self.gateway.address}:8800/v1"

    def write(self, deployments: str) -> None:
        model = "kind: Model\nmetadata: {name: tiny}\nspec: {format: gguf, path: tiny/tiny.gguf, parameters: 4170048}\n"
        key = f"kind: ApiKey\nmetadata: {{name: all}}\nspec:\n  sha256: {key_sha256(KEY)}\n"
        (self.docs / "d.yaml").write_text(model + "---\n" + textwrap.dedent(deployments) + "---\n" + key)

    def cli(self, *args: str, check: bool = False, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "engine_ctl", *args]
        if args[0] in ("plan", "apply", "destroy", "status"):
            argv += [str(self.docs), "--inventory", str(self.inventory)]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, cwd=self.path)
        assert "Traceback" not in proc.stderr, proc.stderr
        if check:
            assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc

    def state(self) -> State:
        return State.model_validate_json((self.path / "engine-ctl.state.json").read_text())

    def host_of(self, name: str) -> FleetHost:
        return next(h for h in self.fleet.hosts if h.name == name)

    def client(self, timeout: float = 120) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base, api_key=KEY, max_retries=0, timeout=timeout)

    def on_gateway(self, command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.fleet.ssh(self.gateway, command, check=check)

    def scaler_journal(self) -> str:
        return self.on_gateway(f"journalctl -u {SCALER_UNIT} -n 40 --no-pager", check=False).stdout

    def settled_scaler(self) -> str:
        """The scaler's MainPID once it has held for 3 s (an apply just restarted it; Restart=always would start
        a crashed one again after RestartSec=2, so a pid that holds 3 s is one that runs)."""
        query = f"systemctl show -p MainPID -p NRestarts -p ActiveState {SCALER_UNIT}"
        deadline = time.monotonic() + 30
        last: dict[str, str] = {}
        while True:
            now = dict(line.split("=", 1) for line in self.on_gateway(query).stdout.split())
            if now == last and now["MainPID"] != "0" and now["ActiveState"] == "active":
                return now["MainPID"]
            assert time.monotonic() < deadline, f"the scaler never settled ({now}):\n" + self.scaler_journal()
            last = now
            time.sleep(3)

    def scaler_state(self) -> dict:  # type: ignore[type-arg]
        out = self.on_gateway(f"cat {SCALER_STATE} 2>/dev/null || echo '{{}}'").stdout
        return json.loads(out)

    def decisions(self, name: str) -> list[dict]:  # type: ignore[type-arg]
        return list(self.scaler_state().get("deployments", {}).get(name, {}).get("decisions", []))

    def active(self, name: str, index: int) -> bool:
        rec = self.state().deployments[name]
        r = next(r for r in rec.replicas if r.index == index)
        return (
            self.fleet.ssh(self.host_of(r.host), f"systemctl is-active --quiet {r.unit}", check=False).returncode == 0
        )

    def wait(self, what: str, check: object, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not check():  # type: ignore[operator]
            assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
            time.sleep(1)

    def installed(self) -> None:
        """What apply did for scaling: on-demand slots installed and not started (status standby), and the scaler
        running on the first gateway host by name."""
        state, inv = self.state(), load_inventory(self.inventory)
        assert scaler_deployments(state, {h.name: h for h in inv.hosts}), "no on-demand slot in the state"
        assert all(r.status == "standby" for d in state.deployments.values() for r in d.replicas if r.on_demand)
        assert self.on_gateway(f"systemctl is-active {SCALER_UNIT}").stdout.strip() == "active"

    def stop_scaler(self, within: float = 180) -> None:
        """The scaler stopped and disabled. Under load its stop may wait for a start it runs (a replica's health
        gate): the wait goes on past one SSH command's time, so that the deployments are destroyed after it
        whatever it took (one slow stop once left another module's hosts full of this module's units)."""
        try:
            self.on_gateway(f"systemctl disable --now {SCALER_UNIT}", check=False)
        except subprocess.TimeoutExpired:
            deadline = time.monotonic() + within
            while self.on_gateway(f"systemctl is-active {SCALER_UNIT}", check=False).stdout.strip() in (
                "active", "deactivating"
            ) and time.monotonic() < deadline:  # fmt: skip
                time.sleep(2)

    @contextmanager
    def applied(self) -> Iterator[ScalerProject]:
        """Apply the documents written, check what it did for scaling, and afterwards take it all down: the
        scaler, the deployments, the gateway."""
        self.cli("apply", "--auto-approve", check=True)
        self.installed()
        try:
            yield self
        finally:
            self.stop_scaler()
            if (self.path / "engine-ctl.state.json").exists():
                self.cli("destroy", "--auto-approve")
            self.on_gateway("systemctl disable --now engine-ctl-gateway.service", check=False)


def admin(command: str) -> str:
    """Shell text: one command to the gateway's admin socket, its whole answer (read to the end: `show stat` comes
    in several writes, and one recv() may hold only the frontends' rows)."""
    script = ("import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect('/run/engine-ctl-gateway/admin.sock'); "
              "s.sendall(sys.argv[1].encode()+b'\\n'); out=b''\n"
              "while True:\n    c=s.recv(65536)\n    if not c: break\n    out+=c\n"
              "print(out.decode())")  # fmt: skip
    return f"python3 -c \"{script}\" '{command}'"


def ask(client: openai.OpenAI, model: str) -> str:
    answer = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    return str(answer.model)


@pytest.fixture(scope="module")
def sp(fleet: Fleet, weights: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ScalerProject]:
    p = ScalerProject(tmp_path_factory.mktemp("scaler"), fleet)
    one = fleet.hosts[1].name
    p.write(f"""
        metadata: {{name: zero}}
        spec: {{model: tiny, accelerator: cpu, cpu_cores: 1, context_length: 512, host: {one},
                replicas: {{min: 0, max: 1, idle_minutes: 1}}}}
        """)  # fmt: skip
    with p.applied():
        yield p


def test_the_plan_names_one_scaler_on_the_first_gateway(sp: ScalerProject) -> None:
    out = sp.cli("plan", check=True).stdout
    assert f"# scaler on {sp.gateway.name} (the first gateway host by name): zero" in out
    assert sp.on_gateway(f"systemctl is-active {SCALER_UNIT}").stdout.strip() == "active"


def test_health_checks_alone_do_not_wake_it(sp: ScalerProject) -> None:
    sp.wait("zero stopped", lambda: not sp.active("zero", 0), 30)
    for _ in range(10):
        sp.on_gateway(f"curl -sf http://{sp.gateway.address}:8800/health")
        sp.on_gateway(f"curl -sf -H 'Authorization: Bearer {KEY}' http://{sp.gateway.address}:8800/v1/models")
    time.sleep(3 * POLL_S + 2)
    assert not sp.active("zero", 0)
    assert not any(d["action"] == "up" for d in sp.decisions("zero"))
    assert sp.scaler_state()["deployments"]["zero"]["state"] == "ScaledToZero"


def test_the_first_request_wakes_it_is_held_and_answered(sp: ScalerProject) -> None:
    started = time.monotonic()
    assert ask(sp.client(), "zero") == "zero"
    assert time.monotonic() - started < HOLD_S
    assert sp.active("zero", 0)
    up = [d for d in sp.decisions("zero") if d["action"] == "up"]
    assert len(up) == 1 and up[0]["reason"].startswith("a request at zero")


def test_after_a_minute_idle_it_stops_and_status_says_scaled_to_zero(sp: ScalerProject) -> None:
    sp.wait("zero stopped after idle_minutes 1", lambda: not sp.active("zero", 0), 60 + 30)
    last = sp.decisions("zero")[-1]
    assert last["action"] == "zero" and "idle_minutes 1" in last["reason"] and last["figure"] >= 60
    doc = json.loads(sp.cli("status", "zero", "--json").stdout)
    status = doc["deployments"][0]
    assert status["state"] == "ScaledToZero" and status["ready"] == 0
    assert [d["action"] for d in status["decisions"]][-2:] == ["up", "zero"]
    table = sp.cli("status", "zero", "--decisions").stdout
    assert "scaledtozero" in table.lower() and "the scaler's decisions" in table and "idle_minutes 1" in table


def test_a_gateway_restarted_while_it_sleeps_keeps_its_slot_in_maintenance(sp: ScalerProject) -> None:
    """Issue 24: a gateway killed and restarted by systemd (a fresh HAProxy, from start.state) took the sleeping
    slot's server out of maintenance, UP before any check ("UP/READY (leaving forced maintenance)", then "UP 1/3"):
    the next request went to the stopped engine and got HAProxy's 503 after its retries, 3 s in, while the plan
    said No changes. After the restart the server is in maintenance (held requests wake it; none is sent here, so
    nothing wakes it) and HAProxy never put it UP."""
    assert not sp.active("zero", 0)
    since = sp.on_gateway("date +%s").stdout.strip()
    before = sp.on_gateway("systemctl show -p MainPID --value engine-ctl-gateway.service").stdout.strip()
    decisions = len(sp.decisions("zero"))
    sp.on_gateway(f"kill -9 {before}")  # HAProxy's master; systemd restarts the unit (Restart=always)

    def restarted() -> bool:
        pid = sp.on_gateway("systemctl show -p MainPID --value engine-ctl-gateway.service").stdout.strip()
        return pid not in ("0", before) and "d_zero" in sp.on_gateway(admin("show stat"), check=False).stdout

    try:
        sp.wait("the gateway restarted by systemd", restarted, 30)
    except AssertionError as exc:  # where the time went: the unit's states and what HAProxy and systemd said
        said = sp.on_gateway(f"systemctl status --no-pager -n 0 engine-ctl-gateway.service; journalctl --no-pager "
                             f"-o short-precise --since @{since} -u engine-ctl-gateway.service | tail -n 40; "
                             "ps -eo pid,ppid,stat,etime,args | grep -i [h]aproxy", check=False)  # fmt: skip
        raise AssertionError(f"{exc}\n{said.stdout}{said.stderr}") from None
    row = next(ln.split(",") for ln in sp.on_gateway(admin("show stat")).stdout.splitlines()
               if ln.startswith("d_zero,r0a,"))  # fmt: skip
    log = sp.on_gateway(f"journalctl -u engine-ctl-gateway.service --since @{since} --no-pager").stdout
    assert "d_zero/r0a is UP" not in log, [ln for ln in log.splitlines() if "d_zero/r0a" in ln]
    assert row[17] == "MAINT", f"the sleeping slot's server is {row[17]} after the restart"
    time.sleep(POLL_S + 1)  # the scaler's next look: nothing to start (it records the gateway's absence only)
    assert not sp.active("zero", 0)
    assert [d["action"] for d in sp.decisions("zero")[decisions:] if d["action"] != "gateway"] == []


def test_killed_mid_decision_the_scaler_restarts_and_carries_on(sp: ScalerProject) -> None:
    assert not sp.active("zero", 0)
    before = len(sp.decisions("zero"))
    pid = sp.on_gateway(f"systemctl show -p MainPID --value {SCALER_UNIT}").stdout.strip()
    answers: list[str] = []
    request = threading.Thread(target=lambda: answers.append(ask(sp.client(), "zero")))
    request.start()
    sp.wait("the wake decided", lambda: len(sp.decisions("zero")) > before, 15)
    sp.on_gateway(f"kill -9 {pid}")
    request.join(HOLD_S + 30)
    assert answers == ["zero"]
    sp.wait("the scaler back", lambda: sp.on_gateway(f"systemctl is-active {SCALER_UNIT}", check=False).stdout.strip()
            == "active", 30)  # fmt: skip
    assert sp.on_gateway(f"systemctl show -p MainPID --value {SCALER_UNIT}").stdout.strip() != pid
    time.sleep(3 * POLL_S)
    new = sp.decisions("zero")[before:]
    # one start, carried on; no second start, no stop
    assert [d["action"] for d in new] == ["up"], [(d["action"], d["reason"]) for d in new]
    assert sp.active("zero", 0)


def test_a_replica_stopped_by_hand_while_it_serves_holds_the_next_request_and_wakes(sp: ScalerProject) -> None:
    """Issue 24 (the stateful test, seed 24): a serving replica of a scale-to-zero deployment stopped by hand, and
    a request at once, before the health check sees it down (every 5 s, 3 failures): the plan says No changes (the
    scaler's to start), so the request must be held and answered. It got HAProxy's own 503 "No server is
    available" after 1 s: the hold looked only at the servers' checked state, which still said UP, and the
    connection refused that followed had nowhere to go but the retries."""
    assert ask(sp.client(), "zero") == "zero"  # woken, if it slept
    assert sp.active("zero", 0)
    before = len(sp.decisions("zero"))
    rec = next(r for r in sp.state().deployments["zero"].replicas if r.index == 0)
    sp.fleet.ssh(sp.host_of(rec.host), f"systemctl stop {rec.unit}")
    started = time.monotonic()
    assert ask(sp.client(), "zero") == "zero"
    assert time.monotonic() - started < HOLD_S
    assert sp.active("zero", 0)
    woken = [d for d in sp.decisions("zero")[before:] if d["action"] == "up"]
    assert len(woken) == 1, sp.decisions("zero")[before:]
    assert sp.cli("plan", "--detailed-exitcode").returncode == 0


def test_a_replica_that_cannot_start_gets_503_with_retry_after_at_the_bound(sp: ScalerProject) -> None:
    sp.wait("zero stopped", lambda: not sp.active("zero", 0), 60 + 30)
    host = sp.fleet.hosts[1]
    model = "/var/lib/engine-ctl/models/tiny/tiny.gguf"
    sp.fleet.ssh(host, f"mv {model} {model}.away")
    try:
        started = time.monotonic()
        with pytest.raises(openai.APIStatusError) as raised:
            ask(sp.client(), "zero")
        waited = time.monotonic() - started
        assert raised.value.status_code == 503
        assert raised.value.response.headers.get("retry-after") == "5"
        assert HOLD_S - 1 <= waited < HOLD_S + 10
        sp.wait("the failed start recorded", lambda: any(d["action"] == "failed" for d in sp.decisions("zero")), 30)
    finally:
        sp.fleet.ssh(host, f"mv {model}.away {model}")


def test_the_credential_cannot_run_an_arbitrary_command(sp: ScalerProject) -> None:
    replica = sp.fleet.hosts[1]
    ssh = (f"ssh -F /dev/null -i {SCALER_KEY} -o IdentitiesOnly=yes -o BatchMode=yes -o StrictHostKeyChecking=yes "
           f"-o UserKnownHostsFile=/etc/engine-ctl/scaler/known_hosts root@{replica.address}")  # fmt: skip
    refused = ("id", "cat /etc/shadow", "start sshd.service", "stop engine-ctl-gateway.service",
               "start engine-ctl-zero-0a.service; touch /tmp/owned",
               "systemctl start engine-ctl-zero-0a.service")  # fmt: skip
    for command in refused:
        said = sp.on_gateway(f"{ssh} {json.dumps(command)}", check=False)
        assert said.returncode == 126, (command, said.stdout, said.stderr)
        assert "refused" in said.stderr
    assert sp.fleet.ssh(replica, "test ! -e /tmp/owned", check=False).returncode == 0
    status = json.loads(sp.on_gateway(f"{ssh} status").stdout)
    assert {"active", "gpu_busy", "cores", "mem_total"} <= set(status)
    assert sp.on_gateway(f"{ssh} is-active engine-ctl-zero-0a.service", check=False).returncode in (0, 3)
    # no pty, no forwarding (restrict)
    said = sp.on_gateway(f"{ssh} -tt status", check=False)
    assert "PTY allocation request failed" in said.stderr
    said = sp.on_gateway(f"{ssh} -W 127.0.0.1:22 < /dev/null", check=False)
    assert said.returncode == 255 and "prohibited" in said.stderr, said.stderr
    mode = sp.on_gateway(f"stat -c '%a %U' {SCALER_KEY}").stdout.split()
    assert mode == ["600", "root"]
    private = sp.on_gateway(f"sed -n 2p {SCALER_KEY}").stdout.strip()
    assert private and private not in (sp.path / "engine-ctl.state.json").read_text()
    assert private not in sp.cli("plan").stdout


def test_the_scalers_settings_file_and_unit_are_what_plan_checks(sp: ScalerProject) -> None:
    """The scaler runs what apply wrote, or plan says it does not: the inventory's `scaling.poll_s` changed alone,
    its scaler.json deleted (the scaler restarts again and again: `activating`, which counts as running), a
    drop-in on its unit; and (session 19) its unit edited, restarted on, then put back. Each is a change (exit 2)
    that apply sets right, and the next plan is empty. Before, plan said "No changes" for each. Last in the module:
    it rewrites the scaler."""

    def changed(needle: str) -> None:
        planned = sp.cli("plan", "--detailed-exitcode")
        said = planned.stdout + planned.stderr
        assert planned.returncode == 2 and needle in said, said
        assert "No changes. The hosts match the documents." not in said, said  # never beside a change
        sp.cli("apply", "--auto-approve", check=True)
        again = sp.cli("plan", "--detailed-exitcode")
        assert again.returncode == 0, again.stdout + again.stderr
        assert sp.on_gateway(f"systemctl is-active {SCALER_UNIT}").stdout.strip() == "active"

    other = "it runs with another configuration (deployments, settings)"
    before = sp.inventory.read_text()
    sp.inventory.write_text(before.replace(f"poll_s: {POLL_S}}}", f"poll_s: {POLL_S + 1}}}"))
    try:
        changed(other)
        said = sp.on_gateway(f"cat {SCALER_CONFIG}").stdout
        assert json.loads(said)["poll_s"] == POLL_S + 1
    finally:
        sp.inventory.write_text(before)
    changed(other)
    sp.on_gateway(f"rm {SCALER_CONFIG}")
    changed(other)
    sp.on_gateway(f"systemctl set-property --runtime {SCALER_UNIT} CPUWeight=9")
    changed(f"drop-in files change {SCALER_UNIT} on {sp.gateway.name}")
    assert sp.on_gateway(f"systemctl show -p DropInPaths --value {SCALER_UNIT}").stdout.strip() == ""
    # a probe (session 16): each of these left scale-from-zero dead (or the key a shell) beside "No changes"
    settled_pid = sp.settled_scaler()
    stopped = sp.on_gateway(f"systemctl kill --kill-whom=main -s SIGSTOP {SCALER_UNIT}", check=False)
    assert stopped.returncode == 0, stopped.stderr + sp.scaler_journal()
    assert sp.on_gateway(f"cut -d' ' -f3 /proc/{settled_pid}/stat").stdout.strip() == "T"
    changed("is stopped by a signal (SIGSTOP): it wakes no deployment and scales none")
    pid = sp.on_gateway(f"systemctl show -p MainPID --value {SCALER_UNIT}").stdout.strip()
    assert sp.on_gateway(f"cut -d' ' -f3 /proc/{pid}/stat").stdout.strip() in ("S", "R")
    sp.on_gateway(f"sed -i 's|^ExecStart=.*|ExecStart=/bin/sleep infinity|' /etc/systemd/system/{SCALER_UNIT} && "
                  f"systemctl daemon-reload && systemctl restart {SCALER_UNIT}")  # fmt: skip
    changed(f"{SCALER_UNIT} edited by hand on {sp.gateway.name}")
    sp.on_gateway(f"echo 'raise SystemExit(0)' >> /etc/engine-ctl/scaler/scaler.py && systemctl restart {SCALER_UNIT}")
    changed(f"the scaler's program on {sp.gateway.name} (/etc/engine-ctl/scaler/scaler.py) is not the one")
    replica = sp.fleet.hosts[1]
    sp.fleet.ssh(replica, "sed -i 's|^restrict,command=\"[^\"]*\" ssh-ed25519|ssh-ed25519|' /root/.ssh/authorized_keys"
                 " && echo '# edited' >> /usr/local/lib/engine-ctl/scaler-command")  # fmt: skip
    changed(f"the scalers' key is authorized on {replica.name} without its forced command")
    assert "restrict,command=" in sp.fleet.ssh(replica, "grep engine-ctl-scaler /root/.ssh/authorized_keys").stdout
    # its unit edited, the scaler restarted on it, the file copied back (`cp -p`, daemon-reload): it runs the edit
    unit = f"/etc/systemd/system/{SCALER_UNIT}"
    time.sleep(1.5)  # past the second of slack either side of its start
    sp.on_gateway(f"cp -p {unit} /root/scaler.kept && sed -i 's/^\\[Service\\]$/[Service]\\nNice=19/' {unit} && "
                  f"systemctl daemon-reload && systemctl restart {SCALER_UNIT} && sleep 1.5 && "
                  f"cp -p /root/scaler.kept {unit} && systemctl daemon-reload")  # fmt: skip
    pid = sp.on_gateway(f"systemctl show -p MainPID --value {SCALER_UNIT}").stdout.strip()
    assert sp.on_gateway(f"ps -o ni= -p {pid}").stdout.strip() == "19"
    changed(f"{SCALER_UNIT} on {sp.gateway.name} changed after it started (changed ")
    pid = sp.on_gateway(f"systemctl show -p MainPID --value {SCALER_UNIT}").stdout.strip()
    assert sp.on_gateway(f"ps -o ni= -p {pid}").stdout.strip() == "0"
    # the same with its configuration, which it reads at its start only: it polls every 9 s, not every POLL_S
    time.sleep(1.5)
    sp.on_gateway(f"cp -p {SCALER_CONFIG} /root/scaler.json.kept && "
                  f"sed -i -E 's/\"poll_s\": {POLL_S},/\"poll_s\": 9,/' {SCALER_CONFIG} && "
                  f"grep -q '\"poll_s\": 9,' {SCALER_CONFIG} && systemctl restart {SCALER_UNIT} && sleep 1.5 && "
                  f"cp -p /root/scaler.json.kept {SCALER_CONFIG}")  # fmt: skip
    edited = sp.on_gateway(f"systemctl show -p MainPID --value {SCALER_UNIT}").stdout.strip()
    changed(f"the scaler's configuration or program on {sp.gateway.name} ({SCALER_CONFIG}, ")
    assert sp.on_gateway(f"systemctl show -p MainPID --value {SCALER_UNIT}").stdout.strip() != edited
