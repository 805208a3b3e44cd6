"""The gateway on the real fleet: HAProxy 2.6 running in a fleet host under engine-ctl's own unit, the real
llama-server behind it, and the official `openai` package as the client (max_retries=0: a failure is a failure).

One project for the module (applies are the slow part): two deployments, `gw-a` (2 replicas) and `gw-b` (1
replica pinned to one host with all its cores, so it rolls stop-then-start), and API keys given as documents."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from engine_ctl.core.documents.apikey import key_sha256
from tests.fleet import Fleet, FleetHost
from tests.fleetproject import ROOT

KEY_ALL = "ak-test-all-" + "a1" * 24
KEY_A = "ak-test-a-only-" + "b2" * 24
KEY_NEW = "ak-test-rotated-" + "c3" * 24
pytestmark = pytest.mark.fleet


class GatewayProject:
    """Documents, an inventory with a gateway host, a state file; the real CLI in a subprocess."""

    def __init__(self, path: Path, fleet: Fleet) -> None:
        self.path, self.fleet = path, fleet
        self.gateway, self.pinned, self.outsider = fleet.hosts[0], fleet.hosts[2], fleet.hosts[3]
        self.inventory = path / "hosts.yaml"
        inventory = Path(fleet.inventory).read_text()
        gateway_line = f"  - {{name: {self.gateway.name}, address: {self.gateway.address}}}"
        assert gateway_line in inventory
        inventory = inventory.replace(
            gateway_line, f"  - {{name: {self.gateway.name}, address: {self.gateway.address}, roles: [gateway]}}"
        )
        self.inventory.write_text(inventory)
        self.docs = path / "docs"
        self.docs.mkdir()
        self.base = f"http://{self.gateway.address}:8800/v1"
        self.said: list[str] = []
        """Everything the CLI printed: the internal key must never be in it."""

    def write(
        self,
        a_context: int | None = None,
        keys: dict[str, tuple[str, list[str] | None]] | None = None,
        b_args: str | None = None,
        limits: dict[str, int] | None = None,
    ) -> None:
        """The documents; what is not given stays as the last write left it (`limits`: key name -> its
        requests_per_minute)."""
        self.a_context = a_context or getattr(self, "a_context", 512)
        self.b_args = b_args if b_args is not None else getattr(self, "b_args", "")
        self.keys = keys or getattr(self, "keys", {"all": (KEY_ALL, None), "a-only": (KEY_A, ["gw-a"])})
        self.limits = limits if limits is not None else getattr(self, "limits", {})
        cores = os.cpu_count() or 2
        (self.docs / "deployments.yaml").write_text(
            textwrap.dedent(
                f"""
                kind: Model
                metadata: {{name: tiny}}
                spec: {{format: gguf, path: tiny/tiny.gguf, parameters: 4170048}}
                ---
                metadata: {{name: gw-a}}
                spec: {{model: tiny, accelerator: cpu, cpu_cores: 1, context_length: {self.a_context},
                        replicas: {{min: 2, max: 2}}}}
                ---
                metadata: {{name: gw-b}}
                spec: {{model: tiny, accelerator: cpu, host: {self.pinned.name}, cpu_cores: {cores}, {self.b_args}
                        context_length: 512}}
                """
            )
        )
        docs = []
        for name, (key, scope) in self.keys.items():
            lines = ["kind: ApiKey", f"metadata: {{name: {name}}}", "spec:", f"  sha256: {key_sha256(key)}"]
            lines += [f"  deployments: [{', '.join(scope)}]"] if scope else []
            lines += [f"  requests_per_minute: {self.limits[name]}"] if name in self.limits else []
            docs.append("\n".join(lines) + "\n")
        (self.docs / "keys.yaml").write_text("---\n".join(docs))

    def cli(self, *args: str, check: bool = False, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "engine_ctl", *args]
        if args[0] in ("plan", "apply", "destroy", "status"):
            argv += [str(self.docs), "--inventory", str(self.inventory)]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, cwd=self.path)
        self.said.append(proc.stdout + proc.stderr)
        assert "Traceback" not in proc.stderr, proc.stderr
        if check:
            assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc

    def state(self) -> dict:  # type: ignore[type-arg]
        return json.loads((self.path / "engine-ctl.state.json").read_text())

    def replicas(self, name: str) -> list[dict]:  # type: ignore[type-arg]
        return self.state()["deployments"][name]["replicas"]

    def host(self, name: str) -> FleetHost:
        return next(h for h in self.fleet.hosts if h.name == name)

    def client(self, key: str = KEY_ALL) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base, api_key=key, max_retries=0, timeout=180)


@pytest.fixture(scope="module")
def gw(fleet: Fleet, weights: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProject]:
    p = GatewayProject(tmp_path_factory.mktemp("gateway"), fleet)
    yield p
    if (p.path / "engine-ctl.state.json").exists():
        p.cli("destroy", "--auto-approve")
    fleet.ssh(p.gateway, "systemctl disable --now engine-ctl-gateway.service", check=False)


def ask(client: openai.OpenAI, model: str, stream: bool = False, content: str = "hi") -> str:
    messages = [{"role": "user", "content": content}]
    if not stream:
        answer = client.chat.completions.create(model=model, messages=messages, max_tokens=4)  # type: ignore[arg-type]
        return str(answer.model)
    chunks = list(client.chat.completions.create(model=model, messages=messages, max_tokens=4, stream=True))  # type: ignore[arg-type]
    assert chunks, "a stream with no chunk"
    return str(chunks[0].model)


class Load:
    """A bounded load through the gateway: `clients` threads (half of them streaming) asking one deployment in a
    loop until stopped, or for `limit_s` at most; every failure is kept with its error."""

    def __init__(self, gw: GatewayProject, model: str, clients: int = 4, limit_s: float = 400) -> None:
        self.gw, self.model, self.key = gw, model, KEY_ALL
        self.ok, self.failed = 0, list[str]()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._deadline = time.monotonic() + limit_s
        self._threads = [threading.Thread(target=self._loop, args=(i % 2 == 1,)) for i in range(clients)]

    def _loop(self, stream: bool) -> None:
        while not self._stop.is_set() and time.monotonic() < self._deadline:
            try:
                ask(self.gw.client(self.key), self.model, stream=stream)
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
            t.join(timeout=200)


def test_plan_shows_the_gateway_and_apply_serves_both_deployments(gw: GatewayProject) -> None:
    gw.write()
    planned = gw.cli("plan", "--detailed-exitcode")
    assert planned.returncode == 2, planned.stdout + planned.stderr
    assert f'+ gateway "{gw.gateway.name}"' in planned.stdout
    assert f"endpoint: {gw.base}" in planned.stdout and "routes:   gw-a, gw-b" in planned.stdout
    assert "balance leastconn" not in planned.stdout, "a new gateway is a summary; its configuration with --verbose"
    verbose = gw.cli("plan", "--verbose").stdout
    assert "+    balance leastconn" in verbose and "+    tune.bufsize 262144" in verbose
    assert KEY_ALL not in planned.stdout and key_sha256(KEY_ALL) not in planned.stdout
    gw.cli("apply", "--auto-approve", check=True)
    again = gw.cli("plan", "--detailed-exitcode")
    assert again.returncode == 0, again.stdout + again.stderr
    client = gw.client()
    for model in ("gw-a", "gw-b"):
        assert ask(client, model) == model
        assert ask(client, model, stream=True) == model
    state_text = (gw.path / "engine-ctl.state.json").read_text()
    assert KEY_ALL not in state_text and KEY_A not in state_text
    hosts = {r["host"] for r in gw.replicas("gw-a")}
    assert len(hosts) == 2 and gw.pinned.name not in hosts


def test_keys_models_and_body_limits(gw: GatewayProject) -> None:
    with pytest.raises(openai.NotFoundError) as unknown:
        ask(gw.client(), "no-such-model")
    assert unknown.value.code == "model_not_found"
    with pytest.raises(openai.AuthenticationError):
        ask(gw.client("ak-wrong"), "gw-a")
    with pytest.raises(openai.NotFoundError) as scoped:
        ask(gw.client(KEY_A), "gw-b")
    assert scoped.value.code == "model_not_found"
    assert sorted(m.id for m in gw.client().models.list()) == ["gw-a", "gw-b"]
    assert [m.id for m in gw.client(KEY_A).models.list()] == ["gw-a"]
    # messages-first (the SDK writes messages before model): 200 KB routes on its model ...
    big = "hello " * 34_000
    with pytest.raises(openai.BadRequestError) as too_long_for_the_model:
        ask(gw.client(), "gw-a", content=big)  # routed: the tiny model's context is what refuses it
    assert too_long_for_the_model.value.status_code == 400
    assert "must provide a model" not in str(too_long_for_the_model.value)
    # ... and a body over the limit is 413, naming it
    with pytest.raises(openai.APIStatusError) as over:
        ask(gw.client(), "gw-a", content="x" * 250_000)
    assert over.value.status_code == 413 and "245760" in str(over.value)


def test_a_replica_refuses_a_host_that_is_not_a_gateway(gw: GatewayProject) -> None:
    replica = gw.replicas("gw-a")[0]
    address = gw.host(replica["host"]).address
    body = json.dumps({"model": "gw-a", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    curl = (f"curl -s -o /dev/null -w '%{{http_code}}' --max-time 10 -H 'Content-Type: application/json' "
            f"-d '{body}' http://{address}:{replica['port']}/v1/chat/completions")  # fmt: skip
    outsider = gw.fleet.ssh(gw.outsider, curl, check=False).stdout.strip()
    assert outsider == "401", f"a non-gateway host was answered {outsider}"
    with_key = gw.fleet.ssh(gw.outsider, curl.replace("-d ", f"-H 'Authorization: Bearer {KEY_ALL}' -d "), check=False)
    assert with_key.stdout.strip() == "401", "a client's key is not the replicas' key"
    unit = gw.fleet.ssh(gw.host(replica["host"]), f"cat /etc/systemd/system/{replica['unit']}").stdout
    assert f'--host" "{address}"' in unit and "0.0.0.0" not in unit
    assert f"IPAddressAllow=localhost {gw.gateway.address}" in unit or gw.gateway.address in unit
    assert "IPAddressDeny=any" in unit and "LoadCredential=replica-key:/etc/engine-ctl/replica-key" in unit


def test_a_gateway_configuration_edited_by_hand_is_drift(gw: GatewayProject) -> None:
    gw.fleet.ssh(gw.gateway, "echo '# edited' >> /etc/engine-ctl/gateway/haproxy.cfg")
    planned = gw.cli("plan", "--detailed-exitcode")
    assert planned.returncode == 2, planned.stdout + planned.stderr
    assert "gateway file haproxy.cfg edited by hand" in planned.stdout
    assert f'~ gateway "{gw.gateway.name}"' in planned.stdout
    gw.cli("apply", "--auto-approve", check=True)
    assert gw.cli("plan", "--detailed-exitcode").returncode == 0


def test_a_2_replica_roll_under_load_fails_no_request(gw: GatewayProject) -> None:
    for context in (1024, 512, 1024):  # 3 runs out of 3
        gw.write(a_context=context)
        with Load(gw, "gw-a") as load:
            applied = gw.cli("apply", "--auto-approve")
        assert applied.returncode == 0, applied.stdout + applied.stderr
        assert "drained" in applied.stdout and "is behind the gateway" in applied.stdout
        assert load.ok > 4 and not load.failed, f"{len(load.failed)} failed of {load.ok + len(load.failed)}: " + (
            "; ".join(load.failed[:3])
        )


def test_a_1_replica_stop_then_start_roll_holds_requests_and_fails_none(gw: GatewayProject) -> None:
    gw.write(b_args="engine_args: ['--temp', '0.5'], ")  # gw-b's unit changes
    planned = gw.cli("plan")
    assert "stop-then-start" in planned.stdout, planned.stdout
    with Load(gw, "gw-b") as load:
        applied = gw.cli("apply", "--auto-approve")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert load.ok > 4 and not load.failed, "; ".join(load.failed[:3])


def test_kill_9_of_an_engine_and_requests_keep_succeeding(gw: GatewayProject) -> None:
    replica = gw.replicas("gw-a")[0]
    host = gw.host(replica["host"])
    pid = gw.fleet.ssh(host, f"systemctl show -p MainPID --value {replica['unit']}").stdout.strip()
    gw.fleet.ssh(host, f"kill -9 {pid}")
    client = gw.client()
    answers = [ask(client, "gw-a", stream=i % 2 == 1) for i in range(12)]
    assert answers == ["gw-a"] * 12


def test_a_replica_repaired_under_load_is_drained_first_and_fails_no_request(gw: GatewayProject) -> None:
    """A replica whose unit was edited by hand (or found down, as after the kill above) is restarted by apply's
    repair: it leaves the gateway first (drained: those in flight finish) and enters again once healthy, so no
    request meets the restart. The replica serves when apply begins, as a killed one systemd brought back does."""
    deadline = time.monotonic() + 120
    while gw.cli("plan", "--detailed-exitcode").returncode != 0:  # the killed engine back, and served again
        assert time.monotonic() < deadline, "the killed replica did not come back"
        gw.cli("apply", "--auto-approve", check=True)
    for replica in gw.replicas("gw-a"):
        gw.fleet.ssh(gw.host(replica["host"]), f"echo '# edited by hand' >> /etc/systemd/system/{replica['unit']}")
    planned = gw.cli("plan", "--detailed-exitcode")
    assert planned.returncode == 2 and planned.stdout.count("rewritten and restarted") == 2, planned.stdout
    with Load(gw, "gw-a") as load:
        applied = gw.cli("apply", "--auto-approve")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert load.ok > 4 and not load.failed, f"{len(load.failed)} failed of {load.ok + len(load.failed)}: " + (
        "; ".join(load.failed[:3])
    )
    assert applied.stdout.count("repaired") == 2 and "is behind the gateway" in applied.stdout, applied.stdout
    assert gw.cli("plan", "--detailed-exitcode").returncode == 0


def test_a_key_rotated_under_load_fails_no_request(gw: GatewayProject) -> None:
    both = {"all": (KEY_ALL, None), "rotated": (KEY_NEW, None), "a-only": (KEY_A, ["gw-a"])}
    with Load(gw, "gw-a") as load:
        gw.write(keys=both)
        applied = gw.cli("apply", "--auto-approve")
        assert applied.returncode == 0, applied.stdout + applied.stderr
        load.key = KEY_NEW
        time.sleep(2)
        gw.write(keys={"rotated": (KEY_NEW, None), "a-only": (KEY_A, ["gw-a"])})
        applied = gw.cli("apply", "--auto-approve")
        assert applied.returncode == 0, applied.stdout + applied.stderr
    assert load.ok > 4 and not load.failed, "; ".join(load.failed[:3])
    assert "reloaded" not in applied.stdout, "a key change needs no reload"
    with pytest.raises(openai.AuthenticationError):
        ask(gw.client(KEY_ALL), "gw-a")
    assert ask(gw.client(KEY_NEW), "gw-a") == "gw-a"


def internal_keys(gw: GatewayProject) -> dict[str, str]:
    """path on host -> content, of every internal key file (each must be root's, 0600)."""
    out = {}
    hosts = {gw.gateway.name, *(r["host"] for name in ("gw-a", "gw-b") for r in gw.replicas(name))}
    for name in sorted(hosts):
        for path in ("/etc/engine-ctl/gateway/internal.key", "/etc/engine-ctl/replica-key",
                     "/etc/engine-ctl/replica-key.yaml", "/etc/engine-ctl/replica-key.vllm.env"):  # fmt: skip
            found = gw.fleet.ssh(gw.host(name), f"stat -c '%U %a' {path} && cat {path}", check=False)
            if found.returncode == 0:
                owner, _, text = found.stdout.partition("\n")
                assert owner == "root 600", f"{name}:{path} is {owner}"
                out[f"{name}:{path}"] = text
    return out


def test_the_internal_key_is_on_the_hosts_only(gw: GatewayProject) -> None:
    keys = internal_keys(gw)
    (gateway_map,) = [t for p, t in keys.items() if p.endswith("internal.key")]
    key = gateway_map.split()[1]
    assert gateway_map == f"gateway {key}\n" and len(key) == 64
    assert {t for p, t in keys.items() if p.endswith("/replica-key")} == {key + "\n"}
    assert any(p.endswith("replica-key.vllm.env") and t == f"VLLM_API_KEY={key}\n" for p, t in keys.items())
    state_text = (gw.path / "engine-ctl.state.json").read_text()
    assert key not in state_text and not any(key in said for said in gw.said)
    assert key not in gw.cli("plan", "--json").stdout


def test_the_internal_key_rotates_under_load_and_fails_no_request(gw: GatewayProject) -> None:
    old = next(t for p, t in internal_keys(gw).items() if p.endswith("internal.key")).split()[1]
    client_key = KEY_NEW if "rotated" in gw.keys else KEY_ALL  # a client key the documents hold now
    load_a, load_b = Load(gw, "gw-a"), Load(gw, "gw-b", clients=2)
    load_a.key = load_b.key = client_key
    with load_a, load_b:
        rotated = gw.cli("key", "rotate-internal", str(gw.docs), "--inventory", str(gw.inventory), "--auto-approve")
    assert rotated.returncode == 0, rotated.stdout + rotated.stderr
    assert "now send the new internal key" in rotated.stdout + rotated.stderr
    for load in (load_a, load_b):
        assert load.ok > 4 and not load.failed, f"{len(load.failed)} failed: " + "; ".join(load.failed[:3])
    keys = internal_keys(gw)
    new = next(t for p, t in keys.items() if p.endswith("internal.key")).split()[1]
    assert new != old and next(t for p, t in keys.items() if p.endswith("internal.key")) == f"gateway {new}\n"
    assert {t for p, t in keys.items() if p.endswith("/replica-key")} == {new + "\n"}, "the old key is dropped"
    assert not any(old in said or new in said for said in gw.said)
    assert ask(gw.client(client_key), "gw-a") == "gw-a" and ask(gw.client(client_key), "gw-b") == "gw-b"
    assert gw.cli("plan", "--detailed-exitcode").returncode == 0, "a rotation leaves nothing to apply"


def test_status_shows_the_endpoint(gw: GatewayProject) -> None:
    deadline = time.monotonic() + 60  # a replica killed by an earlier test is back once the gateway checks it
    while True:
        status = gw.cli("status", "gw-a", "--json", check=True)
        (dep,) = json.loads(status.stdout)["deployments"]
        if all(m["ready"] for m in dep["members"]) or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert dep["gateways"] == [f"http://{gw.gateway.address}:8800"]
    assert dep["served_model_name"] == "gw-a" and dep["kind"] == "chat"
    assert dep["endpoint"]["external"] == f"{gw.gateway.address}:8800"
    assert [m["ready"] for m in dep["members"]] == [True, True]
    # seed 000: endpoint.name is deploy-<name>; endpoint.internal serves callers inside the fleet without a key
    internal = f"{gw.gateway.address}:8801"
    assert dep["endpoint"]["name"] == "deploy-gw-a" and dep["endpoint"]["internal"] == internal
    body = json.dumps({"model": "gw-a", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    said = gw.fleet.ssh(gw.outsider, f"curl -s -w '\\n%{{http_code}}' http://{internal}/v1/chat/completions "
                                     f"-H 'Content-Type: application/json' -d '{body}'").stdout  # fmt: skip
    answer, code = said.rsplit("\n", 1)
    assert code == "200" and json.loads(answer)["model"] == "gw-a", said  # an inventory host, no key
    request = urllib.request.Request(f"http://{internal}/v1/chat/completions", data=body.encode(),
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    with pytest.raises(OSError) as refused:  # this machine is no inventory host: refused as it connects
        urllib.request.urlopen(request, timeout=10)
    assert not isinstance(refused.value, urllib.error.HTTPError), refused.value


def test_a_gateway_start_systemd_fails_to_set_up_is_waited_for(gw: GatewayProject) -> None:
    """systemd's own set-up of HAProxy's process can fail once (219/CGROUP was seen on a fleet host, a stopped
    gateway's cgroup still being removed), and systemd starts the gateway again by itself (Restart=always). apply
    waits for that start instead of failing. Here the set-up fails (200/CHDIR) until a directory appears, which a
    watcher makes once systemd has recorded the failed start (not after a fixed delay: on a loaded machine apply may
    reach the start later than any delay); a failure of HAProxy's own is still reported at once (the configuration
    test above). The set-up's failure comes from a drop-in named for the prefix `engine-`: apply removes the
    drop-ins of engine-ctl's own names (the unit's, `engine-ctl-`), and leaves this one, which could serve other
    units."""
    unit, later = "engine-ctl-gateway.service", "/var/lib/ectl-late"
    dropin = "/etc/systemd/system/engine-.service.d"
    failed = f"systemctl show -p Result --value {unit} | grep -qvx success"
    gw.fleet.ssh(gw.gateway, f"systemctl stop {unit} && systemctl reset-failed {unit}; rm -rf {later} && "
                             f"mkdir -p {dropin} && printf '[Service]\\nWorkingDirectory={later}\\n' > "
                             f"{dropin}/late.conf && systemctl daemon-reload && systemd-run --unit=ectl-late-$$ sh -c "
                             f"'timeout 99 sh -c \"until {failed}; do sleep .2; done\"; mkdir -p {later}'")  # fmt: skip
    try:
        applied = gw.cli("apply", "--auto-approve")
        journal = gw.fleet.ssh(gw.gateway, f"journalctl -u {unit} --no-pager -o cat -n 200").stdout
    finally:
        gw.fleet.ssh(gw.gateway, f"rm -rf {dropin} && systemctl daemon-reload")
    assert "status=200/CHDIR" in journal, journal[-2000:]
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert "gateway " + gw.gateway.name + ": started" in applied.stdout, applied.stdout
    client_key = KEY_NEW if "rotated" in gw.keys else KEY_ALL
    assert ask(gw.client(client_key), "gw-a") == "gw-a"


assert ROOT.exists()
