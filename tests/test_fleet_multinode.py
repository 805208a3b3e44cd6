"""A replica bigger than one machine on the real fleet (issue 30): a CPU llama.cpp deployment with `nodes: 2` is one
replica group, llama-server (built with llama.cpp's RPC backend, -DGGML_RPC=ON) on its head and rpc-server on its
worker (tools/rpc/README.md of llama.cpp), behind the real HAProxy gateway, asked with the official `openai` package
(max_retries=0: a failure is a failure).

One project for the module (applies are the slow part): serve, roll under load, kill the worker and repair, lose
the state and import it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from engine_ctl.core.documents.apikey import key_sha256
from tests.fleet import Fleet, FleetHost
from tests.llama import llama_rpc_dir, llama_server_dir

pytestmark = pytest.mark.fleet
NAME = "mn"
KEY = "ak-test-multinode-" + "d4" * 24


class GroupProject:
    """Documents, an inventory (a gateway host; every host's llama.cpp the RPC build), a state file."""

    def __init__(self, path: Path, fleet: Fleet) -> None:
        self.path, self.fleet = path, fleet
        self.gateway = fleet.hosts[0]
        inventory = Path(fleet.inventory).read_text()
        line = f"  - {{name: {self.gateway.name}, address: {self.gateway.address}}}"
        assert line in inventory
        inventory = inventory.replace(line, line[:-1] + ", roles: [gateway]}")
        plain, rpc = str(llama_server_dir() / "bin" / "llama-server"), str(llama_rpc_dir() / "bin" / "llama-server")
        assert plain in inventory
        self.inventory = path / "hosts.yaml"
        self.inventory.write_text(inventory.replace(plain, rpc))
        self.docs = path / "docs"
        self.docs.mkdir()
        self.base = f"http://{self.gateway.address}:8800/v1"

    def write(self, context: int) -> None:
        (self.docs / "d.yaml").write_text(
            textwrap.dedent(
                f"""
                kind: Model
                metadata: {{name: tiny}}
                spec: {{format: gguf, path: tiny/tiny.gguf, parameters: 4170048}}
                ---
                metadata: {{name: {NAME}}}
                spec: {{model: tiny, accelerator: cpu, cpu_cores: 1, context_length: {context}, nodes: 2}}
                ---
                kind: ApiKey
                metadata: {{name: all}}
                spec: {{sha256: {key_sha256(KEY)}}}
                """
            )
        )

    def cli(self, *args: str, check: bool = False, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "engine_ctl", *args]
        if args[0] in ("plan", "apply", "destroy", "status"):
            argv += [str(self.docs), "--inventory", str(self.inventory)]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, cwd=self.path)
        assert "Traceback" not in proc.stderr, proc.stderr
        if check:
            assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc

    def replica(self) -> dict:  # type: ignore[type-arg]
        (only,) = json.loads((self.path / "engine-ctl.state.json").read_text())["deployments"][NAME]["replicas"]
        return only  # type: ignore[no-any-return]

    def host(self, name: str) -> FleetHost:
        return next(h for h in self.fleet.hosts if h.name == name)

    def ssh(self, host: str, command: str) -> str:
        return self.fleet.ssh(self.host(host), command).stdout

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base, api_key=KEY, max_retries=0, timeout=120)

    def ask(self) -> str:
        answer = self.client().chat.completions.create(
            model=NAME, messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        return str(answer.model)


@pytest.fixture(scope="module")
def group(fleet: Fleet, weights: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GroupProject]:
    p = GroupProject(tmp_path_factory.mktemp("multinode"), fleet)
    p.write(512)
    yield p
    if (p.path / "engine-ctl.state.json").exists():
        p.cli("destroy", "--auto-approve")
    fleet.ssh(p.gateway, "systemctl disable --now engine-ctl-gateway.service", check=False)


class Load:
    """`clients` threads asking through the gateway in a loop until stopped; every failure is kept."""

    def __init__(self, p: GroupProject, clients: int = 3) -> None:
        self.p, self.ok, self.failed = p, 0, list[str]()
        self._stop, self._lock = threading.Event(), threading.Lock()
        self._threads = [threading.Thread(target=self._loop) for _ in range(clients)]

    def _loop(self) -> None:
        deadline = time.monotonic() + 300
        while not self._stop.is_set() and time.monotonic() < deadline:
            try:
                self.p.ask()
                with self._lock:
                    self.ok += 1
            except Exception as exc:  # every failure of the client counts, whatever it is
                with self._lock:
                    self.failed.append(f"{type(exc).__name__}: {exc}"[:300])

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        time.sleep(1.0)
        return self

    def __exit__(self, *exc: object) -> None:
        time.sleep(1.0)
        self._stop.set()
        for t in self._threads:
            t.join(timeout=150)


def _rss_kib(p: GroupProject, host: str, pid: str) -> int:
    status = p.ssh(host, f"cat /proc/{pid}/status")
    return int(re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE).group(1))  # type: ignore[union-attr]


def _worker_holds_tensors(p: GroupProject, replica: dict) -> None:  # type: ignore[type-arg]
    """The worker's ggml-rpc-server holds the layers the head offloaded to it: the head connected to it (its log),
    and it holds several MiB more than the same ggml-rpc-server idle on the same host (the tiny model's layers are
    about 10 MiB; its token embeddings stay on the head)."""
    (m,) = replica["members"]
    journal = p.ssh(m["host"], f"journalctl _SYSTEMD_UNIT={m['unit']} --no-pager -o cat")
    assert "Accepted client connection" in journal, journal[-2000:]
    pid = p.ssh(m["host"], f"systemctl show -p MainPID --value {m['unit']}").strip()
    serving = _rss_kib(p, m["host"], pid)
    idle = p.ssh(m["host"], f"{m['argv'][0]} --host 127.0.0.1 --port 50999 >/dev/null 2>&1 & x=$!; sleep 1; "
                            "grep VmRSS /proc/$x/status; kill $x")  # fmt: skip
    idle_kib = int(re.search(r"VmRSS:\s+(\d+) kB", idle).group(1))  # type: ignore[union-attr]
    assert serving - idle_kib > 5 * 1024, (serving, idle_kib)


def test_a_group_of_two_serves_through_the_gateway_with_the_layers_on_the_worker(group: GroupProject) -> None:
    p = group
    applied = p.cli("apply", "--auto-approve", check=True)  # the plan it shows: one replica, with its members
    assert "group of 2 machines: head on " in applied.stdout and "ggml-rpc-server --host " in applied.stdout
    r = p.replica()
    (m,) = r["members"]
    assert m["host"] != r["host"]
    assert r["argv"][r["argv"].index("--rpc") + 1] == f"{p.host(m['host']).address}:{m['port']}"
    assert p.ask() == NAME
    _worker_holds_tensors(p, r)  # the layers are on the worker
    # the gateway sees only the head; the worker accepts only the group's hosts
    config = p.ssh(p.gateway.name, "cat /etc/engine-ctl/gateway/haproxy.cfg")
    assert f"{p.host(r['host']).address}:{r['port']}" in config, config
    assert f"{p.host(m['host']).address}:{m['port']}" not in config, config
    unit = p.ssh(m["host"], f"cat /etc/systemd/system/{m['unit']}")
    allowed = sorted([p.host(r["host"]).address, p.host(m["host"]).address])
    assert f"IPAddressAllow=localhost {' '.join(allowed)}\n" in unit
    again = p.cli("plan", "--detailed-exitcode")
    assert again.returncode == 0, again.stdout + again.stderr


def test_a_group_rolls_as_one_replica_under_load_without_a_failed_request(group: GroupProject) -> None:
    p = group
    old = p.replica()
    p.write(640)
    with Load(p) as load:
        applied = p.cli("apply", "--auto-approve")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert load.ok > 3 and not load.failed, f"{len(load.failed)} failed: " + "; ".join(load.failed[:3])
    new = p.replica()
    assert new["unit"] != old["unit"] and new["members"][0]["unit"] != old["members"][0]["unit"]
    out = applied.stdout
    assert out.index("group member 1 on") < out.index(f"{new['unit']} serving on port"), out  # workers, then head
    for unit, host in [(old["unit"], old["host"]), (old["members"][0]["unit"], old["members"][0]["host"])]:
        assert p.ssh(host, f"systemctl is-active {unit} || true").strip() in ("inactive", "unknown")
    again = p.cli("plan", "--detailed-exitcode")
    assert again.returncode == 0, again.stdout + again.stderr


def test_a_killed_worker_is_named_by_status_and_apply_restarts_the_group(group: GroupProject) -> None:
    p = group
    r = p.replica()
    (m,) = r["members"]
    p.ssh(m["host"], f"systemctl kill -s KILL {m['unit']}")
    deadline = time.monotonic() + 30
    while p.ssh(m["host"], f"systemctl is-active {m['unit']} || true").strip() == "active":
        assert time.monotonic() < deadline, "the killed worker still runs"
        time.sleep(0.2)
    shown = json.loads(p.cli("status", NAME, "--json").stdout)
    (dep,) = shown["deployments"]
    text = json.dumps(dep)
    assert f"group member 1 ({m['unit']}) on {m['host']} is failed" in text, text
    assert dep["state"] != "Ready" or dep.get("ready", 0) == 0, dep
    planned = p.cli("plan", "--detailed-exitcode")
    assert planned.returncode == 2, planned.stdout + planned.stderr
    assert f"group member 1: {m['unit']} is failed" in planned.stdout, planned.stdout
    p.cli("apply", "--auto-approve", check=True)
    assert p.ssh(m["host"], f"systemctl is-active {m['unit']} || true").strip() == "active"
    assert p.ask() == NAME
    again = p.cli("plan", "--detailed-exitcode")
    assert again.returncode == 0, again.stdout + again.stderr


def test_a_frozen_worker_puts_the_group_out_of_service_in_status_and_apply_restarts_it(group: GroupProject) -> None:
    """SIGSTOP of the worker (what a hung worker looks like): the head's /health still answers 200, while its
    requests hang on the worker. Status said "ready 1/1" beside a plan naming the worker (a probe, session 17)."""
    p = group
    (m,) = p.replica()["members"]
    p.ssh(m["host"], f"systemctl kill --kill-whom=main -s STOP {m['unit']}")
    shown = json.loads(p.cli("status", NAME, "--json").stdout)
    (dep,) = shown["deployments"]
    text = json.dumps(dep)
    assert f"group member 1 ({m['unit']}) on {m['host']}: its process" in text and "SIGSTOP" in text, text
    assert dep["state"] != "Ready", dep
    planned = p.cli("plan", "--detailed-exitcode")
    assert planned.returncode == 2, planned.stdout + planned.stderr
    p.cli("apply", "--auto-approve", check=True)
    pid = p.ssh(m["host"], f"systemctl show -p MainPID --value {m['unit']}").strip()
    assert p.ssh(m["host"], f"cut -d' ' -f3 /proc/{pid}/stat").strip() in ("S", "R")
    assert p.ask() == NAME
    again = p.cli("plan", "--detailed-exitcode")
    assert again.returncode == 0, again.stdout + again.stderr


def test_a_worker_its_head_cannot_reach_puts_the_group_out_of_service_in_status(group: GroupProject) -> None:
    """The network between head and worker cut (a blackhole route in the head's namespace; SSH reaches both):
    llama-server's /health still answers 200, while its requests wait on the worker. Before, status said "ready
    1/1" and plan "No changes" (a probe, session 17). The facts probe opens a connection from the head's host to
    the worker's port: status says the group is out of service, and the plan warns (apply cannot mend a network)."""
    p = group
    r = p.replica()
    (m,) = r["members"]
    worker = p.host(m["host"]).address
    route = ["ip", "netns", "exec", r["host"], "ip", "route"]
    subprocess.run([*route, "add", "blackhole", f"{worker}/32"], check=True)
    try:
        shown = json.loads(p.cli("status", NAME, "--json").stdout)
        (dep,) = shown["deployments"]
        text = json.dumps(dep)
        assert f"group member 1 ({m['unit']}) on {m['host']} cannot be reached from its head on {r['host']}" in text
        assert dep["state"] != "Ready", dep
        planned = p.cli("plan", "--detailed-exitcode")
        assert "it serves nothing until the network between them is back" in planned.stdout + planned.stderr
    finally:
        subprocess.run([*route, "del", "blackhole", f"{worker}/32"], check=True)
    assert json.loads(p.cli("status", NAME, "--json").stdout)["deployments"][0]["state"] == "Ready"
    assert p.ask() == NAME


def test_a_workers_binary_changed_under_the_group_is_drift_and_apply_restarts_the_group(group: GroupProject) -> None:
    """Another ggml-rpc-server at the worker's recorded path, installed as package managers do (a new file renamed
    over it): the plan names the member, apply restarts the group onto it, and the worker runs the new file."""
    p = group
    r = p.replica()
    (m,) = r["members"]
    server = m["argv"][0]

    def sha() -> str:
        return p.ssh(m["host"], f"sha256sum {server}").split()[0]

    first = sha()
    assert m["engine_sha256"] == first  # recorded by apply, per member
    p.ssh(m["host"], f"cp -p {server} {server}.orig")
    try:
        p.ssh(m["host"], f"cp -p {server} {server}.new && printf '\\0' >> {server}.new && mv {server}.new {server}")
        second = sha()
        assert second != first
        planned = p.cli("plan", "--detailed-exitcode", "--json")
        assert planned.returncode == 2, planned.stdout + planned.stderr
        (drift,) = [d for d in json.loads(planned.stdout)["drift"] if d["kind"] == "engine-changed"]
        assert (drift["host"], drift["unit"]) == (m["host"], m["unit"])
        assert drift["detail"].startswith(
            f"the engine at {server} on {m['host']} (worker 1 of {NAME} replica {r['index']}) changed: "
        ) and drift["detail"].endswith(f"(sha256 {second[:12]}…); the group restarts onto it"), drift
        head_pid = p.ssh(r["host"], f"systemctl show -p MainPID --value {r['unit']}").strip()
        out = p.cli("apply", "--auto-approve", check=True).stdout
        assert out.index(f"group member 1 on {m['host']}") < out.index(f"{r['unit']} repaired"), out  # workers first
        assert p.ssh(r["host"], f"systemctl show -p MainPID --value {r['unit']}").strip() != head_pid  # then the head
        after = p.replica()
        assert after["unit"] == r["unit"] and after["members"][0]["engine_sha256"] == second  # restarted in place
        pid = p.ssh(m["host"], f"systemctl show -p MainPID --value {m['unit']}").strip()
        assert p.ssh(m["host"], f"readlink /proc/{pid}/exe").strip() == server  # the new file, not the deleted one
        assert p.ask() == NAME
        again = p.cli("plan", "--detailed-exitcode")
        assert again.returncode == 0, again.stdout + again.stderr
    finally:
        p.ssh(m["host"], f"mv {server}.orig {server}")


def _record(state: dict) -> dict:  # type: ignore[type-arg]
    """What import must give back of the group: the deployment's ID, revision and specification hash, its replica
    (unit, host, ports, argv, sha256) and each member as apply recorded it, but the build each was applied with
    (engine_version, engine_sha256: no host says it; the adoption's docstring)."""
    d = state["deployments"][NAME]
    (r,) = d["replicas"]
    unknown = ("engine_version", "engine_sha256")
    keys = ("index", "slot", "host", "unit", "port", "group_port", "unit_sha256", "revision", "argv", "status")
    return {
        "deployment": (d.get("id"), d["revision"], d["spec_hash"]),
        "replica": {k: r.get(k) for k in keys},
        "members": [{k: v for k, v in m.items() if k not in unknown} for m in r["members"]],
    }


def test_import_after_a_lost_state_adopts_the_group_whole_and_the_plan_is_empty(group: GroupProject) -> None:
    """The head's unit and the worker's on its own host adopt as one replica with its member: the next plan is
    empty, with the ID and revision kept, and the group still serves through the gateway."""
    p = group
    p.cli("apply", "--auto-approve", check=True)  # what the tests before left (a binary put back under a worker)
    before = p.cli("plan", "--detailed-exitcode")
    assert before.returncode == 0, before.stdout + before.stderr
    state_file = p.path / "engine-ctl.state.json"
    lost = json.loads(state_file.read_text())
    (m,) = lost["deployments"][NAME]["replicas"][0]["members"]
    state_file.unlink()
    state_file.with_name(state_file.name + ".backup").unlink(missing_ok=True)
    imported = p.cli("import", str(p.docs), "--inventory", str(p.inventory), check=True)
    assert f"group member 1 on {m['host']}: {m['unit']} (port {m['port']}, serving)" in imported.stdout, imported.stdout
    assert "Left as they are" not in imported.stdout, imported.stdout  # the worker's unit (nor the gateway's)
    rebuilt = json.loads(state_file.read_text())
    assert rebuilt["lineage"] == lost["lineage"] and _record(rebuilt) == _record(lost)
    after = p.cli("plan", "--detailed-exitcode")
    assert after.returncode == 0 and "No changes." in after.stdout, after.stdout + after.stderr
    assert p.ask() == NAME


def test_a_stopped_groups_hand_edited_worker_is_written_back_and_start_runs_engine_ctls_unit(
    group: GroupProject,
) -> None:
    """`engine-ctl start` starts a stopped group's units as they are: a worker's file edited meanwhile would run.
    Before, plan said "No changes" beside it (only the head's file was written back); now apply writes the worker's
    file back, starts nothing, and the start then runs what engine-ctl wrote."""
    p = group
    r = p.replica()
    (m,) = r["members"]
    path = f"/etc/systemd/system/{m['unit']}"
    parked = p.cli("park", "deployment", NAME, "--inventory", str(p.inventory))
    assert parked.returncode == 1 and "[park_refused]" in parked.stderr, parked.stdout + parked.stderr
    assert "is a replica group (spec.nodes): a group is not parked" in parked.stderr, parked.stderr
    assert "operator" not in json.loads((p.path / "engine-ctl.state.json").read_text())["deployments"][NAME]
    stopped = p.cli("stop", "deployment", NAME, "--inventory", str(p.inventory))
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert f"stop of group member 1 ({m['unit']}) on {m['host']} accepted, once its head has stopped" in stopped.stderr
    deadline = time.monotonic() + 180
    while p.ssh(m["host"], f"systemctl is-active {m['unit']} || true").strip() != "inactive":
        assert time.monotonic() < deadline, "the worker still runs after the stop"
        time.sleep(1)
    head_stopped = int(p.ssh(r["host"], f"systemctl show -p InactiveEnterTimestampMonotonic --value {r['unit']}"))
    worker_stopped = int(p.ssh(m["host"], f"systemctl show -p InactiveEnterTimestampMonotonic --value {m['unit']}"))
    assert 0 < head_stopped < worker_stopped  # the worker after its head (one kernel clock for every fleet host)
    status = p.cli("status", NAME)
    assert re.search(rf"^{NAME}\s+stopped\s", status.stdout, re.MULTILINE), status.stdout
    written = p.ssh(m["host"], f"sha256sum {path}").split()[0]
    assert written == m["unit_sha256"]
    p.ssh(m["host"], f"sed -i 's/^\\[Service\\]$/[Service]\\nEnvironment=ECTL_HELD_EDIT=1/' {path} && "
                     "systemctl daemon-reload")  # fmt: skip
    planned = p.cli("plan", "--detailed-exitcode")
    said = planned.stdout + planned.stderr
    assert planned.returncode == 2, said
    assert "group member 1: unit file edited by hand" in said and "written again, kept stopped" in said, said
    assert "Replicas: 1 to repair." in said, said
    applied = p.cli("apply", "--auto-approve", check=True)
    assert "written again" in applied.stdout, applied.stdout
    assert p.ssh(m["host"], f"sha256sum {path}").split()[0] == written
    for host, unit in ((m["host"], m["unit"]), (r["host"], r["unit"])):
        assert p.ssh(host, f"systemctl is-active {unit} || true").strip() == "inactive"
        assert p.ssh(host, f"systemctl is-enabled {unit} || true").strip() == "disabled"
    again = p.cli("plan", "--detailed-exitcode")
    assert again.returncode == 0, again.stdout + again.stderr
    started = p.cli("start", "deployment", NAME, "--wait", "--inventory", str(p.inventory))
    assert started.returncode == 0, started.stdout + started.stderr
    pid = p.ssh(m["host"], f"systemctl show -p MainPID --value {m['unit']}").strip()
    assert "ECTL_HELD_EDIT" not in p.ssh(m["host"], f"tr '\\0' '\\n' < /proc/{pid}/environ")
    assert p.ask() == NAME
    after = p.cli("plan", "--detailed-exitcode")
    assert after.returncode == 0, after.stdout + after.stderr
