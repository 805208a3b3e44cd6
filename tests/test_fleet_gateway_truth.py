"""The gateway tells the truth on the real fleet (HAProxy 2.6 under engine-ctl's unit, the real llama-server): a
tampered saved plan cannot add or widen a key, a key set only in the running gateway's memory is drift that apply
removes, a kill in a roll never wedges the next apply nor is blamed on a person, a deleted deployment is unknown
at once, and destroy leaves nothing of engine-ctl's on any host. Issue 31 point 1; issue 24 points 1, 6, 7, 16."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine_ctl.core.documents.apikey import key_sha256
from tests.fleet import Fleet

pytestmark = pytest.mark.fleet
KEY_ALL = "ak-truth-all-" + "e5" * 24
KEY_ONE = "ak-truth-one-" + "f6" * 24
EVIL = "ak-evil"
SOCKET = "/run/engine-ctl-gateway/admin.sock"


class Truth:
    """Documents (the first host a gateway; `tk`: two replicas pinned to one host with a core each, so a roll is
    stop-then-start; `tb`: one replica elsewhere), keys `all` and `one` (tk only), a state beside them."""

    def __init__(self, path: Path, fleet: Fleet) -> None:
        self.path, self.fleet = path, fleet
        self.gateway, self.pinned, self.other = fleet.hosts[0], fleet.hosts[1], fleet.hosts[2]
        inventory = Path(fleet.inventory).read_text()
        line = f"  - {{name: {self.gateway.name}, address: {self.gateway.address}}}"
        assert line in inventory
        self.inventory = path / "hosts.yaml"
        self.inventory.write_text(inventory.replace(line, line[:-1] + ", roles: [gateway]}"))
        self.docs = path / "docs"
        self.docs.mkdir()
        self.write(512)

    def write(self, context: int, zero: bool = False) -> None:
        """The documents; `zero`: with `tz` too, which scales to zero (so a scaler runs, with its key on a host)."""
        scaled = textwrap.dedent(f"""
            ---
            metadata: {{name: tz}}
            spec: {{model: tiny, accelerator: cpu, host: {self.fleet.hosts[3].name}, cpu_cores: 1,
                    context_length: 512, replicas: {{min: 0, max: 1, idle_minutes: 1}}}}
            """)  # fmt: skip
        if zero:
            (self.docs / "scaled.yaml").write_text(scaled)
        (self.docs / "docs.yaml").write_text(textwrap.dedent(f"""
            kind: Model
            metadata: {{name: tiny}}
            spec: {{format: gguf, path: tiny/tiny.gguf, parameters: 4170048}}
            ---
            metadata: {{name: tk}}
            spec: {{model: tiny, accelerator: cpu, host: {self.pinned.name}, cpu_cores: 1, context_length: {context},
                    replicas: {{min: 2, max: 2}}}}
            ---
            metadata: {{name: tb}}
            spec: {{model: tiny, accelerator: cpu, host: {self.other.name}, cpu_cores: 1, context_length: 512}}
            ---
            kind: ApiKey
            metadata: {{name: all}}
            spec: {{sha256: {key_sha256(KEY_ALL)}}}
            ---
            kind: ApiKey
            metadata: {{name: one}}
            spec: {{sha256: {key_sha256(KEY_ONE)}, deployments: [tk]}}
            """))  # fmt: skip

    def argv(self, *args: str) -> list[str]:
        argv = [sys.executable, "-m", "engine_ctl", *args]
        if args[0] in ("plan", "apply", "destroy", "status", "list"):
            argv.append(str(self.docs))
        return [*argv, "--inventory", str(self.inventory)]

    def cli(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(self.argv(*args), capture_output=True, text=True, timeout=timeout, cwd=self.docs)
        assert "Traceback" not in proc.stderr, proc.stderr
        return proc

    def apply_file(self, plan: Path) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "engine_ctl", "apply", str(plan), "--inventory", str(self.inventory)]
        return subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=self.docs)

    def ask(self, model: str, key: str) -> tuple[int, dict, float]:  # type: ignore[type-arg]
        """One chat request through the gateway: its HTTP status, JSON body and how long it took."""
        body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        req = urllib.request.Request(
            f"http://{self.gateway.address}:8800/v1/chat/completions", data=body.encode(),
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
        )  # fmt: skip
        started = time.monotonic()
        try:
            with urllib.request.urlopen(req, timeout=180) as r:
                return r.status, json.loads(r.read()), time.monotonic() - started
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}"), time.monotonic() - started

    def stats_socket(self, *commands: str) -> str:
        """Commands to the running gateway's stats socket, as anyone with root on the gateway host could send: what
        it answered."""
        script = (
            "import socket,sys\n"
            "for c in sys.argv[1:]:\n"
            f"    s=socket.socket(socket.AF_UNIX); s.connect({SOCKET!r}); s.sendall(c.encode()+b'\\n')\n"
            "    print(s.recv(65536).decode()); s.close()\n"
        )
        quoted = " ".join("'" + c + "'" for c in commands)
        return self.fleet.ssh(self.gateway, f'python3 -c "{script}" {quoted}').stdout


@pytest.fixture(scope="module")
def truth(fleet: Fleet, weights: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Truth]:
    p = Truth(tmp_path_factory.mktemp("truth"), fleet)
    applied = p.cli("apply", "--auto-approve")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    yield p
    (p.path / "engine-ctl.state.json.lock").unlink(missing_ok=True)
    if (p.path / "engine-ctl.state.json").exists():
        p.cli("destroy", "--auto-approve")
    fleet.ssh(p.gateway, "systemctl disable --now engine-ctl-gateway.service", check=False)


def tampered(truth: Truth, edit: str) -> subprocess.CompletedProcess[str]:
    """A plan saved with --out, one of its gateway maps edited (`keys.map` or `scopes.map`), then applied."""
    saved = truth.path / f"{edit}.json"
    made = truth.cli("plan", "--out", str(saved))
    assert made.returncode == 0, made.stdout + made.stderr
    plan = json.loads(saved.read_text())
    maps = plan["gateways"][0]["maps"]
    if edit == "keys.map":
        maps["keys.map"][key_sha256(EVIL)] = "all"  # sha256("ak-evil") -> all: every deployment
    else:
        maps["scopes.map"]["one/tb"] = "1"  # `one` (tk only) may call tb
    saved.write_text(json.dumps(plan))
    return truth.apply_file(saved)


def test_a_saved_plan_cannot_add_a_key_or_widen_a_scope(truth: Truth) -> None:
    assert truth.ask("tk", KEY_ALL)[0] == 200 and truth.ask("tb", KEY_ONE)[0] == 404
    added = tampered(truth, "keys.map")
    assert added.returncode == 1, added.stdout + added.stderr
    assert "the saved plan's gateway is not engine-ctl's" in added.stderr and "keys.map" in added.stderr, added.stderr
    assert truth.ask("tk", EVIL)[0] == 401
    widened = tampered(truth, "scopes.map")
    assert widened.returncode == 1 and "scopes.map" in widened.stderr, widened.stdout + widened.stderr
    assert truth.ask("tb", KEY_ONE)[0] == 404
    assert truth.cli("plan", "--detailed-exitcode").returncode == 0


def test_a_key_only_in_the_running_gateway_is_drift_and_apply_removes_it(truth: Truth) -> None:
    truth.stats_socket(f"add map keys.map {key_sha256(EVIL)} intruder", "add map scopes.map intruder/tb 1",
                       "add map scopes.map one/tb 1")  # fmt: skip
    assert truth.ask("tb", EVIL)[0] == 200 and truth.ask("tb", KEY_ONE)[0] == 200  # the hole is real
    plan = truth.cli("plan", "--detailed-exitcode")
    said = plan.stdout + plan.stderr
    assert plan.returncode == 2, said
    assert "accepts a key that no ApiKey document gives, named 'intruder'" in said, said
    assert "lets key 'one' call 'tb', which no ApiKey document allows" in said, said
    assert key_sha256(EVIL)[:8] not in said  # named, never shown by its hash
    applied = truth.cli("apply", "--auto-approve")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert truth.ask("tb", EVIL)[0] == 401 and truth.ask("tb", KEY_ONE)[0] == 404
    again = truth.cli("plan", "--detailed-exitcode")
    assert again.returncode == 0, again.stdout + again.stderr


def test_a_server_the_running_gateway_sends_elsewhere_is_drift_and_apply_reloads_it(truth: Truth) -> None:
    """HAProxy keeps a server's address from its state file over its configuration's: the file on disk is right,
    the process sends the requests elsewhere (to another deployment's engine). Issue 24, soak seed 7 step 150."""
    state = json.loads((truth.path / "engine-ctl.state.json").read_text())["deployments"]
    (tb,), tk = state["tb"]["replicas"], state["tk"]["replicas"][0]
    hosts = {h.name: h.address for h in truth.fleet.hosts}
    server = f"d_tb/r{tb['index']}{tb['slot']}"
    truth.stats_socket(f"set server {server} addr {hosts[tk['host']]} port {tk['port']}")
    assert truth.ask("tb", KEY_ALL)[0] == 200  # answered, by tk's engine: nothing a client could tell
    plan = truth.cli("plan", "--detailed-exitcode")
    said = plan.stdout + plan.stderr
    assert plan.returncode == 2, said
    assert f"sends {server}'s requests to {hosts[tk['host']]}:{tk['port']}, not to " \
           f"{hosts[tb['host']]}:{tb['port']}" in said, said  # fmt: skip
    applied = truth.cli("apply", "--auto-approve")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    stat = truth.fleet.ssh(truth.gateway, f"echo 'show stat' | python3 -c \"import socket,sys; s=socket.socket("
                           f"socket.AF_UNIX); s.connect('{SOCKET}'); s.sendall(b'show stat\\n'); "
                           "sys.stdout.write(s.makefile().read())\"").stdout  # fmt: skip
    header = stat.splitlines()[0].lstrip("# ").split(",")
    rows = [dict(zip(header, line.split(","), strict=False)) for line in stat.splitlines()[1:]]
    (row,) = [r for r in rows if f"{r.get('pxname')}/{r.get('svname')}" == server]
    assert row["addr"] == f"{hosts[tb['host']]}:{tb['port']}", row
    assert truth.ask("tb", KEY_ALL)[0] == 200
    again = truth.cli("plan", "--detailed-exitcode")
    assert again.returncode == 0, again.stdout + again.stderr


def test_drop_ins_and_a_disabled_unit_are_drift_and_apply_sets_them_right(truth: Truth) -> None:
    """What changes a unit outside its file: a `systemctl edit` drop-in on a replica (an environment variable its
    engine would run with), `systemctl set-property --runtime` on the gateway, and `systemctl disable` of an
    always-on replica (down after the next boot). Each is drift: plan exits 2 naming it, apply removes the
    drop-ins (the replica and the gateway restarted on what their units say) and enables the unit without
    restarting it, and the next plan is empty. Before, plan said "No changes" for all three."""
    state = json.loads((truth.path / "engine-ctl.state.json").read_text())["deployments"]
    (tb,), tk = state["tb"]["replicas"], state["tk"]["replicas"][0]
    hosts = {h.name: h for h in truth.fleet.hosts}
    tb_host, tk_host = hosts[tb["host"]], hosts[tk["host"]]
    edit = f"/etc/systemd/system/{tb['unit']}.d/override.conf"
    truth.fleet.ssh(tb_host, f"mkdir -p {os.path.dirname(edit)} && printf '[Service]\\nEnvironment=ECTL_DROP_IN=1\\n' "
                             f"> {edit} && systemctl daemon-reload && systemctl restart {tb['unit']}")  # fmt: skip
    tb_pid = truth.fleet.ssh(tb_host, f"systemctl show -p MainPID --value {tb['unit']}").stdout.strip()
    assert "ECTL_DROP_IN=1" in truth.fleet.ssh(tb_host, f"tr '\\0' '\\n' < /proc/{tb_pid}/environ").stdout
    truth.fleet.ssh(truth.gateway, "systemctl set-property --runtime engine-ctl-gateway.service CPUWeight=7")
    truth.fleet.ssh(tk_host, f"systemctl disable {tk['unit']}")
    tk_pid = truth.fleet.ssh(tk_host, f"systemctl show -p MainPID --value {tk['unit']}").stdout.strip()

    plan = truth.cli("plan", "--detailed-exitcode")
    said = plan.stdout + plan.stderr
    assert plan.returncode == 2, said
    assert f"drop-in files change {tb['unit']} on {tb_host.name} ({edit})" in said, said
    assert f"drop-in files change engine-ctl-gateway.service on {truth.gateway.name} (/run/systemd/system.control/" \
           "engine-ctl-gateway.service.d/50-CPUWeight.conf)" in said, said  # fmt: skip
    assert f"{tk['unit']} is disabled on {tk_host.name}, not enabled" in said, said

    applied = truth.cli("apply", "--auto-approve")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    shown = "systemctl show -p DropInPaths --value"
    assert truth.fleet.ssh(tb_host, f"{shown} {tb['unit']}").stdout.strip() == ""
    assert truth.fleet.ssh(truth.gateway, f"{shown} engine-ctl-gateway.service").stdout.strip() == ""
    assert truth.fleet.ssh(truth.gateway, "systemctl show -p CPUWeight --value engine-ctl-gateway.service"
                           ).stdout.strip() in ("[not set]", "100")  # fmt: skip
    new_pid = truth.fleet.ssh(tb_host, f"systemctl show -p MainPID --value {tb['unit']}").stdout.strip()
    assert new_pid != tb_pid
    assert "ECTL_DROP_IN" not in truth.fleet.ssh(tb_host, f"tr '\\0' '\\n' < /proc/{new_pid}/environ").stdout
    assert truth.fleet.ssh(tk_host, f"systemctl is-enabled {tk['unit']}").stdout.strip() == "enabled"
    assert truth.fleet.ssh(tk_host, f"systemctl show -p MainPID --value {tk['unit']}").stdout.strip() == tk_pid
    assert truth.ask("tb", KEY_ALL)[0] == 200 and truth.ask("tk", KEY_ALL)[0] == 200
    again = truth.cli("plan", "--detailed-exitcode")
    assert again.returncode == 0, again.stdout + again.stderr
    # a drop-in every service reads (systemd's service.d/): not engine-ctl's to remove, but never passed over
    shared = "/etc/systemd/system/service.d/50-probe.conf"
    for host in (tb_host, truth.gateway):
        truth.fleet.ssh(host, f"mkdir -p {os.path.dirname(shared)} && printf '[Service]\\nNice=5\\n' > {shared} && "
                              "systemctl daemon-reload")  # fmt: skip
    try:
        assert shared in truth.fleet.ssh(tb_host, f"{shown} {tb['unit']}").stdout
        warned = truth.cli("plan", "--detailed-exitcode")
        said = warned.stdout + warned.stderr
        assert warned.returncode == 0, said
        assert f"replica 0 on {tb_host.name}: {shared} changes {tb['unit']} though it is no drop-in of engine-ctl's" \
               in said, said  # fmt: skip
        assert f"the gateway on {truth.gateway.name}: {shared} changes engine-ctl-gateway.service though" in said, said
    finally:
        for host in (tb_host, truth.gateway):
            truth.fleet.ssh(host, f"rm -rf {os.path.dirname(shared)} && systemctl daemon-reload")


def test_an_always_on_replica_set_aside_over_the_admin_socket_is_drift_and_apply_puts_it_back(truth: Truth) -> None:
    """`disable server` (MAINT) and `set server ... state drain` on the admin socket: the files are right, no new
    request reaches the replica, and HAProxy keeps it so across a reload (its server-state file). Before, plan
    said "No changes" while every request for tb was held and then answered 503."""
    state = json.loads((truth.path / "engine-ctl.state.json").read_text())["deployments"]
    (tb,), tk = state["tb"]["replicas"], state["tk"]["replicas"][0]
    tb_server, tk_server = f"d_tb/r{tb['index']}{tb['slot']}", f"d_tk/r{tk['index']}{tk['slot']}"
    truth.stats_socket(f"disable server {tb_server}", f"set server {tk_server} state drain")
    plan = truth.cli("plan", "--detailed-exitcode")
    said = plan.stdout + plan.stderr
    assert plan.returncode == 2, said
    assert f"the gateway on {truth.gateway.name} holds {tb_server} in MAINT (an admin command)" in said, said
    assert f"the gateway on {truth.gateway.name} holds {tk_server} in DRAIN (an admin command)" in said, said
    applied = truth.cli("apply", "--auto-approve")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert f"{tb_server} back in rotation (it was MAINT)" in applied.stdout + applied.stderr
    status, _, took = truth.ask("tb", KEY_ALL)
    assert status == 200 and took < 30, (status, took)
    again = truth.cli("plan", "--detailed-exitcode")
    assert again.returncode == 0, again.stdout + again.stderr


def test_a_route_deleted_and_a_weight_zeroed_in_the_running_gateway_are_drift_that_apply_sets_right(
    truth: Truth,
) -> None:
    """`del map models.map tb` (every request for tb: 404 model_not_found) and `set weight d_tk/… 0` (every request
    for tk: 503) on the admin socket: the files are right, what runs is not. Before, plan and apply said "No
    changes" and both stayed broken (a probe of issue 24's kind, session 15)."""
    state = json.loads((truth.path / "engine-ctl.state.json").read_text())["deployments"]
    tk = state["tk"]["replicas"][0]
    tk_server = f"d_tk/r{tk['index']}{tk['slot']}"
    truth.stats_socket("del map models.map tb", f"set weight {tk_server} 0", "set rate-limit sessions global 1")
    assert truth.ask("tb", KEY_ALL)[0] == 404
    plan = truth.cli("plan", "--detailed-exitcode")
    said = plan.stdout + plan.stderr
    assert plan.returncode == 2, said
    assert f"the running gateway on {truth.gateway.name} (models.map, in memory) lacks 'tb': apply reloads it" in said
    assert f"the gateway on {truth.gateway.name} gives {tk_server} weight 0 (an admin command; its configuration " \
           "gives 1): no request reaches it; apply puts it back" in said, said  # fmt: skip
    assert f"the gateway on {truth.gateway.name} runs with SessRateLimit 1 a second" in said, said
    status = truth.cli("status", "tk")
    behind = len(state["tk"]["replicas"]) - 1  # weight 0: no request reaches that one
    assert f"{behind} of {behind + 1} behind the gateway" in status.stdout, status.stdout
    applied = truth.cli("apply", "--auto-approve")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert f"{tk_server} weight 1 again (it was 0)" in applied.stdout + applied.stderr
    assert truth.ask("tb", KEY_ALL)[0] == 200
    status, _, took = truth.ask("tk", KEY_ALL)
    assert status == 200 and took < 30, (status, took)
    again = truth.cli("plan", "--detailed-exitcode")
    assert again.returncode == 0, again.stdout + again.stderr


def test_a_server_an_acl_a_limit_and_a_key_held_twice_in_the_running_gateway_are_drift_apply_removes(
    truth: Truth,
) -> None:
    """What a probe (session 16) changed over the admin socket beside "No changes": a server added to tb's
    backend (it got tb's requests, and the replicas' internal key with them), the odd-path guard cleared, tk's
    server limited to 1 connection, and key `one` held twice in keys.map with `all` first (a lookup finds the
    first: `one` called every deployment). A reload drops each; apply does it."""
    listed = truth.stats_socket("show acl")
    odd = next(row.split()[0] for row in listed.splitlines() if "'path_sub'" in row)
    tk = json.loads((truth.path / "engine-ctl.state.json").read_text())["deployments"]["tk"]["replicas"][0]
    tk_server = f"d_tk/r{tk['index']}{tk['slot']}"
    one = key_sha256(KEY_ONE)
    tb = json.loads((truth.path / "engine-ctl.state.json").read_text())["deployments"]["tb"]["replicas"][0]
    tb_server = f"d_tb/r{tb['index']}{tb['slot']}"
    truth.stats_socket("add server d_tb/extra 198.18.0.254:9", f"clear acl #{odd}",
                       f"set maxconn server {tk_server} 1", f"del map keys.map {one}", f"add map keys.map {one} all",
                       f"add map keys.map {one} one", f"set server {tb_server} check-port 9")  # fmt: skip
    assert truth.ask("tb", KEY_ONE)[0] == 200  # the hole is real: `one` is tk's only
    plan = truth.cli("plan", "--detailed-exitcode")
    said = plan.stdout + plan.stderr
    assert plan.returncode == 2, said
    g = truth.gateway.name
    assert f"the running gateway on {g} has server d_tb/extra, which its configuration does not" in said, said
    assert "matches path_sub on line" in said and "no more against '//'" in said, said
    assert f"limits server {tk_server} to 1 connections, not its configuration's" in said, said
    assert "lets key 'all' call" in said or "named 'all'" in said, said
    assert f"checks server {tb_server}'s health at 9, not at the server itself" in said, said
    applied = truth.cli("apply", "--auto-approve")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert truth.ask("tb", KEY_ONE)[0] == 404 and truth.ask("tk", KEY_ONE)[0] == 200
    # the reload does not carry the moved check over (it did: the replica stayed DOWN behind the gateway)
    assert truth.stats_socket(f"show servers state {tb_server.split('/')[0]}").count(" 9 - ") == 0
    status, _, took = truth.ask("tb", KEY_ALL)
    assert status == 200 and took < 30, (status, took)
    again = truth.cli("plan", "--detailed-exitcode")
    assert again.returncode == 0, again.stdout + again.stderr


def test_a_second_state_on_the_same_inventory_never_takes_the_gateway_over(
    truth: Truth, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A probe (session 16): a second checkout (its own state, the same inventory) planned "+ gateway" over the
    running one, exit 0, and its apply answered every request of the first state's deployments 401. Its plan is
    now refused, naming the other state's lineage, and the first state's gateway serves on."""
    second = Truth(tmp_path_factory.mktemp("second"), truth.fleet)
    plan = second.cli("plan")
    said = plan.stdout + plan.stderr
    assert plan.returncode == 1, said
    lineage = json.loads((truth.path / "engine-ctl.state.json").read_text())["lineage"]
    assert f"the gateway on {truth.gateway.name} is another state's (lineage {lineage};" in said, said
    applied = second.cli("apply", "--auto-approve")
    assert applied.returncode == 1, applied.stdout + applied.stderr
    assert truth.ask("tk", KEY_ALL)[0] == 200
    again = truth.cli("plan", "--detailed-exitcode")
    assert again.returncode == 0, again.stdout + again.stderr


def test_a_key_file_made_readable_by_others_is_drift_and_apply_writes_it_root_only(truth: Truth) -> None:
    """A probe (session 16): `chmod 644` on a replica host's /etc/engine-ctl/replica-key and on the gateway's
    internal.key, and any local user read the key that opens every replica, beside "No changes"."""
    truth.fleet.ssh(truth.other, "chmod 644 /etc/engine-ctl/replica-key")
    truth.fleet.ssh(truth.gateway, "chmod 640 /etc/engine-ctl/gateway/internal.key")
    plan = truth.cli("plan", "--detailed-exitcode")
    said = plan.stdout + plan.stderr
    assert plan.returncode == 2, said
    assert f"/etc/engine-ctl/replica-key on {truth.other.name} holds the internal key with mode 0644" in said, said
    assert f"/etc/engine-ctl/gateway/internal.key on {truth.gateway.name} holds the internal key with mode 0640" in \
        said, said  # fmt: skip
    applied = truth.cli("apply", "--auto-approve")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert truth.fleet.ssh(truth.other, "stat -c %a /etc/engine-ctl/replica-key").stdout.strip() == "600"
    assert truth.fleet.ssh(truth.gateway, "stat -c %a /etc/engine-ctl/gateway/internal.key").stdout.strip() == "600"
    assert truth.ask("tb", KEY_ALL)[0] == 200
    again = truth.cli("plan", "--detailed-exitcode")
    assert again.returncode == 0, again.stdout + again.stderr


def test_the_endpoint_paused_over_the_admin_socket_is_drift_and_status_says_nothing_is_behind_it(
    truth: Truth,
) -> None:
    """`disable frontend api`: the endpoint takes no connection while the files and the servers are right. Before,
    plan said "No changes" and status "1 of 1 behind the gateway" (a probe, session 15)."""
    truth.stats_socket("disable frontend api")
    plan = truth.cli("plan", "--detailed-exitcode")
    said = plan.stdout + plan.stderr
    assert plan.returncode == 2, said
    assert f"the gateway on {truth.gateway.name} has its frontend api PAUSED (an admin command" in said, said
    status = truth.cli("status", "tb")
    assert "0 of 1 behind the gateway" in status.stdout, status.stdout
    applied = truth.cli("apply", "--auto-approve")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert truth.ask("tb", KEY_ALL)[0] == 200
    again = truth.cli("plan", "--detailed-exitcode")
    assert again.returncode == 0, again.stdout + again.stderr


def test_a_configuration_edited_loaded_and_put_back_is_drift_that_apply_reloads(truth: Truth) -> None:
    """haproxy.cfg edited (every request times out at once), the gateway reloaded on it, then the file put back
    with its old time (`cp -p`): the file is engine-ctl's, what runs is not. Before, plan said "No changes". The
    file's inode change time, after the running worker loaded its configuration, tells (`show info`)."""
    cfg = "/etc/engine-ctl/gateway/haproxy.cfg"
    quiet = truth.cli("plan", "--detailed-exitcode")  # an apply with nothing to change moved no file
    assert quiet.returncode == 0, quiet.stdout + quiet.stderr
    truth.fleet.ssh(truth.gateway, f"cp -p {cfg} /root/haproxy.cfg.kept && "
                                   f"sed -i 's/timeout server 10m/timeout server 1ms/' {cfg} && "
                                   "systemctl reload engine-ctl-gateway.service && sleep 4 && "
                                   f"cp -p /root/haproxy.cfg.kept {cfg}")  # fmt: skip
    assert truth.ask("tb", KEY_ALL)[0] == 504
    plan = truth.cli("plan", "--detailed-exitcode")
    said = plan.stdout + plan.stderr
    assert plan.returncode == 2, said
    assert f"the gateway on {truth.gateway.name} runs a configuration it loaded before haproxy.cfg last changed" in said
    applied = truth.cli("apply", "--auto-approve")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert "(reloaded)" in applied.stdout + applied.stderr, applied.stdout + applied.stderr
    assert truth.ask("tb", KEY_ALL)[0] == 200
    again = truth.cli("plan", "--detailed-exitcode")
    assert again.returncode == 0, again.stdout + again.stderr


def test_an_internal_key_a_replica_or_the_gateway_lacks_is_drift_and_apply_gives_it_back(truth: Truth) -> None:
    """The gateway -> replica key, wrong in the three places engine-ctl never looked: tb's engine restarted on
    another key and its host's file put back (every request for tb is refused now), tk's host's key file replaced
    with no restart (tk serves now, and would refuse every request after its next start), and the running
    gateway's key map set over the admin socket (every request is refused now). Before, plan said "No changes"
    for all three. Now plan exits 2 naming each (a fingerprint of the key, never the key), apply restarts tb and
    tk's replicas and gives the gateway its key back without restarting it, and the next plan is empty."""
    state = json.loads((truth.path / "engine-ctl.state.json").read_text())["deployments"]
    (tb,), tks = state["tb"]["replicas"], state["tk"]["replicas"]
    hosts = {h.name: h for h in truth.fleet.hosts}
    tb_host, tk_host = hosts[tb["host"]], hosts[tks[0]["host"]]
    key_file = "/etc/engine-ctl/replica-key"
    key = truth.fleet.ssh(tb_host, f"head -n1 {key_file}").stdout.strip()
    assert len(key) == 64
    other = "0123456789abcdef" * 4
    truth.fleet.ssh(tb_host, f"cp -p {key_file} /root/replica-key.saved && printf '%s\\n' {other} > {key_file} && "
                             f"systemctl restart {tb['unit']} && cp -p /root/replica-key.saved {key_file}")  # fmt: skip
    truth.fleet.ssh(tk_host, f"printf '%s\\n' {other} > {key_file}")
    deadline = time.monotonic() + 60
    while truth.ask("tk", KEY_ALL)[0] != 200 and time.monotonic() < deadline:  # tk serves: its engine has the key
        time.sleep(1)
    assert truth.ask("tk", KEY_ALL)[0] == 200
    pids = {u: truth.fleet.ssh(tk_host, f"systemctl show -p MainPID --value {u}").stdout.strip()
            for u in (r["unit"] for r in tks)}  # fmt: skip
    gateway_pid = truth.fleet.ssh(truth.gateway, "systemctl show -p MainPID --value engine-ctl-gateway.service")
    truth.stats_socket(f"set map /run/engine-ctl-gateway/internal.map gateway {other}")
    assert truth.ask("tk", KEY_ALL)[0] != 200  # the hole is real: the gateway sends a key no replica takes

    plan = truth.cli("plan", "--detailed-exitcode")
    said = plan.stdout + plan.stderr
    assert plan.returncode == 2, said
    assert f"the internal key on gateway {truth.gateway.name}: the running gateway's key map holds another key" \
           in said, said  # fmt: skip
    assert "internal key: it refuses the key its host holds (HTTP 401 to GET /v1/models)" in said, said
    assert f"; {key_file} holds another key; apply writes the key" in said, said
    assert key not in said and other not in said, "fingerprints only"

    applied = truth.cli("apply", "--auto-approve")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert key not in applied.stdout + applied.stderr
    assert truth.fleet.ssh(tk_host, f"head -n1 {key_file}").stdout.strip() == key
    for unit, pid in pids.items():
        assert truth.fleet.ssh(tk_host, f"systemctl show -p MainPID --value {unit}").stdout.strip() != pid, unit
    assert truth.fleet.ssh(truth.gateway, "systemctl show -p MainPID --value engine-ctl-gateway.service"
                           ).stdout == gateway_pid.stdout  # fmt: skip
    assert truth.ask("tb", KEY_ALL)[0] == 200 and truth.ask("tk", KEY_ALL)[0] == 200
    again = truth.cli("plan", "--detailed-exitcode")
    assert again.returncode == 0, again.stdout + again.stderr


def test_a_gateway_without_its_admin_socket_is_drift_and_apply_restarts_it(truth: Truth) -> None:
    """The socket file removed (by hand, or a cleaner of /run): the gateway serves on, but nothing can check its keys
    in memory or drain a replica through it. Before, plan said "No changes" and the next roll failed on it."""
    truth.fleet.ssh(truth.gateway, f"rm -f {SOCKET}")
    assert truth.ask("tb", KEY_ALL)[0] == 200
    plan = truth.cli("plan", "--detailed-exitcode")
    said = plan.stdout + plan.stderr
    assert plan.returncode == 2, said
    assert f"the gateway on {truth.gateway.name} runs but does not answer on its admin socket ({SOCKET})" in said, said
    applied = truth.cli("apply", "--auto-approve")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert truth.fleet.ssh(truth.gateway, f"test -S {SOCKET}", check=False).returncode == 0
    assert truth.ask("tb", KEY_ALL)[0] == 200
    again = truth.cli("plan", "--detailed-exitcode")
    assert again.returncode == 0, again.stdout + again.stderr


def test_a_gateway_without_a_held_socket_is_drift_and_apply_restarts_it(truth: Truth) -> None:
    """tb's hold socket removed (a cleaner of /run): the gateway serves on, but a request it holds for tb (no
    replica up, or scaled to zero) is answered 503 at once instead of held, and wakes nothing. A reload would take
    the old listener over, file-less; apply restarts the gateway. Before, plan said "No changes"."""
    held = "/run/engine-ctl-gateway/held-tb.sock"
    assert truth.fleet.ssh(truth.gateway, f"test -S {held} && rm {held}", check=False).returncode == 0
    assert truth.ask("tb", KEY_ALL)[0] == 200
    plan = truth.cli("plan", "--detailed-exitcode")
    said = plan.stdout + plan.stderr
    assert plan.returncode == 2, said
    assert f"the gateway on {truth.gateway.name} runs without its socket held-tb.sock (deleted under it)" in said, said
    assert "No changes" not in said, said
    applied = truth.cli("apply", "--auto-approve")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert f"gateway {truth.gateway.name}: restarted" in applied.stdout, applied.stdout + applied.stderr
    assert truth.fleet.ssh(truth.gateway, f"test -S {held}", check=False).returncode == 0
    assert truth.ask("tb", KEY_ALL)[0] == 200
    again = truth.cli("plan", "--detailed-exitcode")
    assert again.returncode == 0, again.stdout + again.stderr


def test_status_says_a_stopped_gateway_answers_nothing_and_apply_starts_it(truth: Truth) -> None:
    """The gateway stopped (`systemctl stop`): the replicas serve, the endpoint answers nothing. Before, status said
    "ready" with only "0 of 1 behind the gateway" to hint at it (a probe, session 17)."""
    truth.fleet.ssh(truth.gateway, "systemctl stop engine-ctl-gateway.service")
    status = truth.cli("status", "tb")
    said = (
        f"but the gateway on {truth.gateway.name} is inactive: its endpoint answers nothing; engine-ctl apply starts it"
    )
    assert said in status.stdout, status.stdout
    plan = truth.cli("plan", "--detailed-exitcode")
    assert plan.returncode == 2, plan.stdout + plan.stderr
    assert truth.cli("apply", "--auto-approve").returncode == 0
    assert truth.ask("tb", KEY_ALL)[0] == 200
    assert "answers nothing" not in truth.cli("status", "tb").stdout


def test_a_wrapper_at_haproxys_path_is_drift_until_it_is_removed(truth: Truth) -> None:
    """A script at /usr/sbin/haproxy that runs the real one with a configuration of its own added (a frontend that
    answers on another port, past every key check). Before, plan said "No changes" (a probe, session 17). Now the
    running master's executable and command line are drift: apply restarts the gateway, and while the wrapper
    stays, the plan never says "No changes"; once it is gone, one apply and the plan is empty."""
    real, extra = "/usr/sbin/haproxy.real", "/etc/extra-gateway.cfg"
    wrapper = f'#!/bin/sh\nexec {real} "$@" -f {extra}\n'
    frontend = "frontend sneaky\n    bind 127.0.0.1:8899\n    mode http\n    http-request return status 200\n"
    truth.fleet.ssh(truth.gateway, f"cp -a /usr/sbin/haproxy {real} && printf '{frontend}' > {extra} && "
                    f"printf '{wrapper}' > /usr/sbin/haproxy.new && chmod 755 /usr/sbin/haproxy.new && "
                    "mv /usr/sbin/haproxy.new /usr/sbin/haproxy && "
                    "systemctl restart engine-ctl-gateway.service")  # fmt: skip
    try:
        assert truth.fleet.ssh(truth.gateway, "curl -s -o /dev/null -w '%{http_code}' 127.0.0.1:8899/").stdout == "200"
        for _ in range(2):  # apply restarts it, and the wrapper runs again: still drift
            plan = truth.cli("plan", "--detailed-exitcode")
            said = plan.stdout + plan.stderr
            assert plan.returncode == 2 and "No changes" not in said, said
            assert f"the gateway on {truth.gateway.name} runs {real}, not /usr/sbin/haproxy" in said, said
            assert "has frontend sneaky, which its configuration does not" in said, said
            applied = truth.cli("apply", "--auto-approve")
            assert applied.returncode == 0 and f"gateway {truth.gateway.name}: serving" in applied.stdout, said
    finally:
        truth.fleet.ssh(truth.gateway, f"mv {real} /usr/sbin/haproxy; rm -f {extra}")
    applied = truth.cli("apply", "--auto-approve")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert truth.fleet.ssh(truth.gateway, "curl -s -o /dev/null -w '%{http_code}' 127.0.0.1:8899/",
                           check=False).stdout == "000"  # fmt: skip
    assert truth.ask("tb", KEY_ALL)[0] == 200
    again = truth.cli("plan", "--detailed-exitcode")
    assert again.returncode == 0, again.stdout + again.stderr


def test_a_gateway_unit_edited_restarted_then_put_back_is_drift_and_apply_restarts_it(truth: Truth) -> None:
    """The gateway's unit edited (an environment variable; as well its sandbox or its credentials), the gateway
    restarted on it, the file copied back with `cp -p` and daemon-reload: the file is engine-ctl's, the gateway runs
    the edit, and a reload keeps it. The unit's change after the master's start is drift: apply restarts the
    gateway (not a reload), and the next plan is empty. Before, plan said "No changes"."""
    unit, g = "/etc/systemd/system/engine-ctl-gateway.service", truth.gateway
    time.sleep(1.5)  # past the second of slack either side of the gateway's start
    edit = f"sed -i 's/^\\[Service\\]$/[Service]\\nEnvironment=ECTL_GATEWAY_EDIT=1/' {unit}"
    truth.fleet.ssh(g, f"cp -p {unit} /root/gateway.kept && {edit} && systemctl daemon-reload && systemctl restart "
                       f"engine-ctl-gateway.service && sleep 1.5 && cp -p /root/gateway.kept {unit} && "
                       "systemctl daemon-reload")  # fmt: skip
    main = "systemctl show -p MainPID --value engine-ctl-gateway.service"
    pid = truth.fleet.ssh(g, main).stdout.strip()
    assert "ECTL_GATEWAY_EDIT=1" in truth.fleet.ssh(g, f"tr '\\0' '\\n' < /proc/{pid}/environ").stdout
    plan = truth.cli("plan", "--detailed-exitcode")
    said = plan.stdout + plan.stderr
    assert plan.returncode == 2 and "No changes" not in said, said
    assert f"the gateway on {g.name}: engine-ctl-gateway.service changed after it started (changed " in said, said
    applied = truth.cli("apply", "--auto-approve")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    now = truth.fleet.ssh(g, main).stdout.strip()
    assert now != pid and "ECTL_GATEWAY_EDIT" not in truth.fleet.ssh(g, f"tr '\\0' '\\n' < /proc/{now}/environ").stdout
    assert truth.ask("tb", KEY_ALL)[0] == 200
    again = truth.cli("plan", "--detailed-exitcode")
    assert again.returncode == 0, again.stdout + again.stderr


def test_a_gateway_of_this_state_on_no_gateway_host_is_removed_by_apply(truth: Truth) -> None:
    """The gateway host's role taken out of the inventory while the state had lost its record of that gateway (an
    older copy of the state put back): the gateway runs on, with this state's lineage and the keys it had. Before,
    no plan named it (a probe, session 17); now the plan removes it, and with the role back apply starts it again."""
    state_file = truth.path / "engine-ctl.state.json"
    kept_state, kept_inventory = state_file.read_text(), truth.inventory.read_text()
    doc = json.loads(kept_state)
    doc["gateways"] = {}
    state_file.write_text(json.dumps(doc))
    truth.inventory.write_text(kept_inventory.replace(", roles: [gateway]}", "}"))
    try:
        plan = truth.cli("plan", "--detailed-exitcode")
        said = plan.stdout + plan.stderr
        assert plan.returncode == 2, said
        assert f"{truth.gateway.name} runs a gateway of this state (lineage {doc['lineage']}) though it is no " \
               "gateway host in the inventory, nor recorded" in said, said  # fmt: skip
        applied = truth.cli("apply", "--auto-approve")
        assert applied.returncode == 0, applied.stdout + applied.stderr
        gone = truth.fleet.ssh(truth.gateway, "systemctl is-active engine-ctl-gateway.service", check=False)
        assert gone.stdout.strip() != "active"
        assert truth.cli("plan", "--detailed-exitcode").returncode == 0
    finally:
        truth.inventory.write_text(kept_inventory)
    assert truth.cli("apply", "--auto-approve").returncode == 0
    assert truth.ask("tb", KEY_ALL)[0] == 200
    assert truth.cli("plan", "--detailed-exitcode").returncode == 0


def killed_in_the_roll(truth: Truth, needle: str = "no room for a surge", nth: int = 2) -> str:
    """apply, killed with SIGKILL right after its `nth` line that says `needle`; what it printed."""
    proc = subprocess.Popen(truth.argv("apply", "--auto-approve"), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=truth.docs)  # fmt: skip
    said, seen = [], 0
    assert proc.stdout is not None
    for line in proc.stdout:
        said.append(line)
        seen += needle in line
        if seen == nth:
            os.kill(proc.pid, signal.SIGKILL)
            break
    proc.wait(timeout=60)
    assert seen == nth, "".join(said)
    return "".join(said)


def test_a_kill_in_a_roll_is_recovered_by_the_next_apply_and_blamed_on_no_one(truth: Truth) -> None:
    truth.write(1024)
    killed_in_the_roll(truth)
    # the killed apply's lock: the kernel freed it with its process; the next command clears what it left
    assert (truth.path / "engine-ctl.state.json.lock").exists()
    plan = truth.cli("plan", "--detailed-exitcode")
    said = plan.stdout + plan.stderr
    assert plan.returncode == 2, said
    assert "by hand" not in said, said  # engine-ctl's own interim configuration, recorded as such
    applied = truth.cli("apply", "--auto-approve")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    again = truth.cli("plan", "--detailed-exitcode")
    assert again.returncode == 0, again.stdout + again.stderr
    assert truth.ask("tk", KEY_ALL)[0] == 200


def test_a_deleted_deployment_is_unknown_at_once(truth: Truth) -> None:
    assert truth.ask("tb", KEY_ALL)[0] == 200
    deleted = truth.cli("delete", "deployment", "tb", "--stop")
    assert deleted.returncode == 0, deleted.stdout + deleted.stderr
    status, body, took = truth.ask("tb", KEY_ALL)
    assert (status, body["error"]["code"]) == (404, "model_not_found") and took < 5, (status, body, took)
    plan = truth.cli("plan", "--detailed-exitcode")
    assert plan.returncode == 0, plan.stdout + plan.stderr
    assert truth.ask("tk", KEY_ALL)[0] == 200
    started = truth.cli("start", "deployment", "tb")
    assert started.returncode == 0, started.stdout + started.stderr
    applied = truth.cli("apply", "--auto-approve")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert truth.ask("tb", KEY_ALL)[0] == 200


def test_a_refused_configuration_says_haproxys_own_words(truth: Truth) -> None:
    """`haproxy -c` refusing a configuration: the error carries HAProxy's alert (file, line, what), not a bare
    exit status. The shell's own install, on the real gateway host, with a configuration that names a server
    twice (what a kill in a roll once made)."""
    from engine_ctl.core.documents.inventory import load_inventory
    from engine_ctl.shell.gateway import runtime
    from engine_ctl.shell.transport import transport_for

    host = load_inventory(truth.inventory).host(truth.gateway.name)
    assert host is not None
    t = transport_for(host, None)
    try:
        t.run(["sh", "-c", "rm -rf /tmp/twice && cp -r /etc/engine-ctl/gateway /tmp/twice"])
        config = t.run(["cat", "/tmp/twice/haproxy.cfg"]).stdout
        line = next(ln for ln in config.splitlines() if ln.strip().startswith("server r0"))
        t.put("/tmp/twice/haproxy.cfg", config.replace(line, line + "\n" + line).encode(), 0o644)
        with pytest.raises(runtime.GatewayFailure) as refused:
            runtime.check_config(t, "/tmp/twice/haproxy.cfg", host.name)
        t.run(["rm", "-rf", "/tmp/twice"])
    finally:
        t.close()
    assert re.search(r"ALERT.*haproxy\.cfg:\d+.*r0", str(refused.value)), str(refused.value)


LEFT = (
    "ls -d /etc/engine-ctl /usr/local/lib/engine-ctl /run/engine-ctl-* /var/lib/engine-ctl/* "
    "/etc/systemd/system/engine-ctl* 2>/dev/null; grep -h engine-ctl-scaler /root/.ssh/authorized_keys; "
    "systemctl list-units --all --no-legend --plain 'engine-ctl*' | grep -v ' not-found '; true"
)
"""What of engine-ctl's is on a host: its folders, units (files, and loaded ones that exist), and the scaler's
authorized key."""


SECRETS_SCAN = r"""
import glob, os, sys
tokens = [t.encode() for t in sys.argv[1:]]
tops = ["/etc/engine-ctl", "/etc/systemd/system", "/run", "/usr/local/lib/engine-ctl", "/root/.ssh", "/home",
        "/tmp", "/var/lib/private", *glob.glob("/var/lib/engine-ctl*")]
for top in tops:
    for folder, dirs, files in os.walk(top):
        if folder.startswith(("/var/lib/engine-ctl/models", "/run/systemd", "/etc/ssh")):
            dirs[:] = []
            continue
        for name in files:
            path = os.path.join(folder, name)
            try:
                st = os.lstat(path)
                if not os.path.isfile(path) or os.path.islink(path) or st.st_size > 4_000_000:
                    continue
                data = open(path, "rb").read()
            except OSError:
                continue
            found = [i for i, t in enumerate(tokens) if t in data]
            if found:
                print("%o %d %s %s" % (st.st_mode & 0o777, st.st_uid, ",".join(map(str, found)), path))
"""


def test_every_file_holding_a_secret_is_root_only_and_no_key_is_written_anywhere(truth: Truth) -> None:
    """Issue 29 point 8, on the hosts: every file that holds the gateway's internal key or the scaler's private key
    is 0600 (or 0400) and root's, and is one of the files the docs name; an API key is never written anywhere.
    The scan covers where engine-ctl writes (its folders, units, /run, the SSH folders, /tmp and the dynamic users'
    state), not the whole image the fleet's hosts share with this machine."""
    truth.write(1024, zero=True)  # with a scale-to-zero deployment: a scaler and its key exist
    applied = truth.cli("apply", "--auto-approve")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    internal = truth.fleet.ssh(truth.gateway, "cat /etc/engine-ctl/gateway/internal.key").stdout.split()[1]
    tokens = [internal, "PRIVATE KEY-----", KEY_ALL, KEY_ONE]
    seen: dict[str, list[tuple[str, str, str]]] = {}
    for h in truth.fleet.hosts:
        out = truth.fleet.ssh(h, f"python3 -c '{SECRETS_SCAN}' " + " ".join(f"'{t}'" for t in tokens)).stdout
        seen[h.name] = [tuple(line.split(" ", 3)) for line in out.splitlines() if line.strip()]  # type: ignore[misc]
    for host, files in seen.items():
        for mode, uid, which, path in files:
            assert "2" not in which.split(",") and "3" not in which.split(","), (host, path)  # an API key: never
            if path == "/etc/ssh/ssh_host_ed25519_key" or path.startswith("/etc/ssh/"):
                continue
            dynamic = 61184 <= int(uid) <= 65519  # systemd's DynamicUser range: the unit's own runtime copy
            assert mode in ("600", "400") and (uid == "0" or dynamic), (host, path, mode, uid)
    gateway = {path for _, _, which, path in seen[truth.gateway.name] if "0" in which.split(",")}
    assert "/etc/engine-ctl/gateway/internal.key" in gateway, gateway
    replicas = {path for h in (truth.pinned, truth.other) for _, _, which, path in seen[h.name]
                if "0" in which.split(",")}  # fmt: skip
    # the key files apply writes, and systemd's copies for each unit (LoadCredential=), nothing else
    assert replicas and all(p.startswith(("/etc/engine-ctl/replica-key", "/run/credentials/engine-ctl-"))
                            for p in replicas), replicas  # fmt: skip
    private = {path for _, _, which, path in seen[truth.gateway.name] if "1" in which.split(",")}
    assert private, "the scaler's private key is on the gateway host, root-only"
    print({h: [f[3] for f in files] for h, files in seen.items()})


def test_destroy_leaves_only_models_and_caches_even_for_a_gateway_out_of_the_inventory(truth: Truth) -> None:
    truth.write(1024, zero=True)
    applied = truth.cli("apply", "--auto-approve")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    slot_host = truth.fleet.hosts[3]
    before = truth.fleet.ssh(slot_host, LEFT).stdout
    assert "engine-ctl-scaler" in before and "/usr/local/lib/engine-ctl" in before, before  # the scaler reaches it
    assert "engine-ctl-gateway" in truth.fleet.ssh(truth.gateway, LEFT).stdout
    truth.inventory.write_text(Path(truth.fleet.inventory).read_text())  # the gateway role removed
    destroyed = truth.cli("destroy", "--auto-approve")
    said = destroyed.stdout + destroyed.stderr
    assert destroyed.returncode == 0, said
    assert f"gateway {truth.gateway.name}: removed" in said, said
    for h in truth.fleet.hosts:
        left = [ln for ln in truth.fleet.ssh(h, LEFT).stdout.splitlines() if ln.strip()]
        assert left == ["/var/lib/engine-ctl/models"], (h.name, left)
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://{truth.gateway.address}:8800/health", timeout=5)


def test_after_destroy_the_next_apply_starts_the_gateway_again(truth: Truth) -> None:
    """A destroy removes the gateway's run directory with the private folder systemd keeps for its dynamic user;
    the next apply's gateway starts (a run directory left half, or made by apply beside the unit's private one,
    kept it failing with RUNTIME_DIRECTORY "File exists" for good)."""
    inventory = Path(truth.fleet.inventory).read_text()
    line = f"  - {{name: {truth.gateway.name}, address: {truth.gateway.address}}}"
    truth.inventory.write_text(inventory.replace(line, line[:-1] + ", roles: [gateway]}"))
    applied = truth.cli("apply", "--auto-approve")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    active = truth.fleet.ssh(truth.gateway, "systemctl is-active engine-ctl-gateway.service", check=False)
    assert active.stdout.strip() == "active", active.stdout + active.stderr
    assert truth.ask("tb", KEY_ALL)[0] == 200
    destroyed = truth.cli("destroy", "--auto-approve")
    assert destroyed.returncode == 0, destroyed.stdout + destroyed.stderr
    assert truth.fleet.ssh(truth.gateway, "ls /run/private", check=False).stdout.strip() == ""
