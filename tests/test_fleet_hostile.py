"""Hostile callers on the real fleet (issue 31), and the keep-alive race (issue 24 point 12): the real HAProxy
gateway in a fleet host under engine-ctl's unit, the real llama-server behind it.

- JSON nested 120,000 levels deep crashes llama-server (SIGSEGV in its JSON parser): the gateway refuses it.
- A replica that crashes anyway (a signal) comes back every time, never locked out by its start limit, and the
  crash shows in `facts` and `status` with its signal.
- A soak with 16 clients (half streaming, max_retries=0) fails no request (bench/gateway_soak.py).
- 1,100 slow connections from one address (slowloris) do not keep a keyed client waiting.
- Only exactly one `Authorization: Bearer <key>` header is a key, and odd paths and models never reach a replica.
- A key over its requests a minute gets 429 with Retry-After, while another key passes.

The project is test_fleet_gateway's: `gw-a` (2 replicas) and `gw-b` (1 replica pinned to one host)."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import time
from collections.abc import Iterator

import openai
import pytest

from tests.fleet import Fleet
from tests.fleetproject import ROOT
from tests.test_fleet_gateway import KEY_A, KEY_ALL, GatewayProject, ask

pytestmark = pytest.mark.fleet


@pytest.fixture(scope="module")
def hg(fleet: Fleet, weights: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProject]:
    p = GatewayProject(tmp_path_factory.mktemp("hostile"), fleet)
    p.write()
    p.cli("apply", "--auto-approve", check=True)
    yield p
    if (p.path / "engine-ctl.state.json").exists():
        p.cli("destroy", "--auto-approve")
    fleet.ssh(p.gateway, "systemctl disable --now engine-ctl-gateway.service", check=False)


def post(p: GatewayProject, body: bytes, auth: list[str] | None = None, path: str = "/v1/chat/completions",
         timeout: float = 60) -> tuple[int, dict]:  # type: ignore[type-arg]  # fmt: skip
    """One request with exactly these Authorization headers, over a fresh connection."""
    conn = http.client.HTTPConnection(p.gateway.address, 8800, timeout=timeout)
    conn.putrequest("POST", path, skip_accept_encoding=True)
    for value in [f"Bearer {KEY_ALL}"] if auth is None else auth:
        conn.putheader("Authorization", value)
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Content-Length", str(len(body)))
    conn.endheaders(body)
    answer = conn.getresponse()
    text = answer.read()
    conn.close()
    return answer.status, json.loads(text) if text.startswith(b"{") else {"raw": text[:300]}


def main_pid(p: GatewayProject, name: str) -> tuple[int, str]:
    (r,) = p.replicas(name)
    host = p.host(r["host"])
    return int(p.fleet.ssh(host, f"systemctl show -p MainPID --value {r['unit']}").stdout), r["unit"]


def deep(depth: int, model: str = "gw-b") -> bytes:
    """A chat request 240,066 bytes long, its `stop` 120,000 levels deep (under the gateway's 245,760-byte limit):
    llama-server parses it, then crashes with SIGSEGV."""
    head = b'{"model":"' + model.encode() + b'","messages":[{"role":"user","content":"hi"}],"stop":'
    return head + b"[" * depth + b"]" * depth + b"}"


def test_deeply_nested_json_never_reaches_a_replica(hg: GatewayProject) -> None:
    before = main_pid(hg, "gw-b")
    for _ in range(5):  # five were enough to keep a replica down
        status, body = post(hg, deep(120_000))
        assert status == 400, (status, body)
        assert body["error"]["code"] == "json_too_deep" and body["error"]["type"] == "invalid_request_error"
    time.sleep(2)
    assert main_pid(hg, "gw-b") == before, "the replica crashed"
    assert ask(hg.client(), "gw-b") == "gw-b"
    assert ask(hg.client(), "gw-b", stream=True) == "gw-b"


def serving_again(p: GatewayProject, name: str, old_pid: int, limit_s: float = 90) -> int:
    """Wait until the replica runs a new process and answers through the gateway; its pid."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        pid, _ = main_pid(p, name)
        if pid and pid != old_pid:
            try:
                if ask(p.client(), name) == name:
                    return pid
            except Exception:  # still starting: the gateway holds or the replica loads
                pass
        time.sleep(1)
    (r,) = p.replicas(name)
    shown = p.fleet.ssh(p.host(r["host"]), f"systemctl status --no-pager {r['unit']} | head -20", check=False)
    raise AssertionError(f"{name} did not come back within {limit_s} s: {shown.stdout}")


def test_a_replica_that_crashes_again_and_again_comes_back_and_the_crash_shows(hg: GatewayProject) -> None:
    pid, unit = main_pid(hg, "gw-b")
    host = hg.host(hg.replicas("gw-b")[0]["host"])
    for _ in range(6):  # the first start and 3 restarts used to lock it out: the 5th start was refused
        hg.fleet.ssh(host, f"kill -SEGV {pid}")
        pid = serving_again(hg, "gw-b", pid)
    assert hg.fleet.ssh(host, f"systemctl is-active {unit}", check=False).stdout.strip() == "active"
    facts = hg.cli("facts", host.name, "--inventory", str(hg.inventory), "--json", check=True)
    (found,) = [u for u in json.loads(facts.stdout)["hosts"][host.name]["units"] if u["name"] == unit]
    assert len(found["exits"]) == 6 and all("SEGV" in e for e in found["exits"]), found["exits"]
    plain = hg.cli("facts", host.name, "--inventory", str(hg.inventory), check=True).stdout
    assert "6 crash(es), last killed by signal" in plain and "SEGV" in plain, plain
    status = hg.cli("status", "gw-b", "--json", check=True)
    (dep,) = json.loads(status.stdout)["deployments"]
    (member,) = dep["members"]
    assert "crashed 6 time(s)" in member["last_error"] and "SEGV" in member["last_error"], member


def test_a_soak_of_16_clients_fails_no_request(hg: GatewayProject) -> None:
    """The keep-alive race: llama-server closes a connection right after a streamed answer; the gateway never
    pools a stream's connection, so no request is sent on one it is closing (half the clients stream)."""
    argv = [sys.executable, "-m", "bench.gateway_soak", "--base", hg.base, "--key", KEY_ALL, "--model", "gw-a",
            "--clients", "16", "--seconds", "20", "--json"]  # fmt: skip
    run = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=ROOT, check=False)
    (level,) = json.loads(run.stdout)["levels"]
    print("soak:", level)
    assert level["requests"] >= 32, level  # (2 cores shared by the fleet: a few requests a second)
    assert level["failures"] == 0 and run.returncode == 0, level


SLOWLORIS = r"""
import socket, sys, time
address, count = sys.argv[1], int(sys.argv[2])
held = []
for _ in range(count):
    try:
        s = socket.create_connection((address, 8800), timeout=2)
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\n")
        held.append(s)
    except OSError:
        pass
print("opened", len(held), flush=True)
end = time.monotonic() + float(sys.argv[3])
while time.monotonic() < end:
    for s in list(held):
        try:
            s.sendall(b"x")
        except OSError:
            held.remove(s)
    time.sleep(5)
"""


def test_a_slowloris_from_one_address_does_not_keep_a_keyed_client_waiting(hg: GatewayProject) -> None:
    attacker = hg.outsider
    hg.fleet.ssh(attacker, f"cat > /tmp/slowloris.py <<'EOF'\n{SLOWLORIS}\nEOF")
    cmd = f"ulimit -n 4096; timeout 120 python3 /tmp/slowloris.py {hg.gateway.address} 1100 60"
    attack = subprocess.Popen([*hg.fleet.ssh_argv(attacker), cmd], stdout=subprocess.PIPE, text=True)
    try:
        assert attack.stdout is not None
        assert attack.stdout.readline().startswith("opened")
        time.sleep(3)
        for _ in range(5):  # GET /v1/models: keyed, answered by the gateway itself (no engine's time in it)
            started = time.monotonic()
            assert "gw-a" in [m.id for m in hg.client().models.list()]
            took = time.monotonic() - started
            assert took < 1.0, f"a keyed request took {took:.1f} s during the slowloris"
            time.sleep(1)
    finally:
        attack.kill()
        attack.wait()


AUTHS = [[f"Basic {KEY_ALL}"], [f"bearer {KEY_ALL}"], [f"Bearer {KEY_ALL} junk"], ["Bearer ak-no", f"Bearer {KEY_ALL}"]]


@pytest.mark.parametrize("auth", AUTHS)
def test_only_exactly_one_bearer_header_is_a_key(hg: GatewayProject, auth: list[str]) -> None:
    body = json.dumps({"model": "gw-a", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    status, answer = post(hg, body.encode(), auth=auth)
    assert status == 401 and answer["error"]["code"] == "invalid_api_key", (status, answer)


@pytest.mark.parametrize("path", ["/v1/../slots", "/v1/%2e%2e/props", "/v1//chat/completions", "/v1/./models"])
def test_odd_paths_and_models_never_reach_a_replica(hg: GatewayProject, path: str) -> None:
    body = {"model": "gw-a", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    status, answer = post(hg, json.dumps(body).encode(), path=path)
    assert status == 404 and answer["error"]["code"] == "unknown_url", (path, status, answer)
    status, answer = post(hg, json.dumps({**body, "model": "gw-a\u0000x"}).encode())
    assert status == 404 and answer["error"]["code"] == "model_not_found", (status, answer)


def test_a_key_over_its_requests_a_minute_gets_429_and_another_key_still_passes(hg: GatewayProject) -> None:
    """Issue 31 point 3, once a key is known: `requests_per_minute` in a key's document. The key over it is
    answered 429 rate_limit_exceeded with Retry-After; the official client, which honours Retry-After, then gets
    through; another key passes throughout. A map change only: the gateway is not reloaded."""
    hg.write(limits={"a-only": 3})
    planned = hg.cli("plan")
    assert "limits.map" in planned.stdout and "haproxy.cfg" not in planned.stdout, planned.stdout
    hg.cli("apply", "--auto-approve", check=True)
    assert hg.cli("plan", "--detailed-exitcode").returncode == 0, "the running maps are the documents'"
    limited = hg.client(KEY_A)
    answer = limited.chat.completions.with_raw_response.create(
        model="gw-a", messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    assert answer.headers["x-ratelimit-limit-requests"] == "3"
    for _ in range(2):  # answered by the gateway itself: quick, so no token comes back (one each 20 s) meanwhile
        assert limited.models.with_raw_response.list().headers["x-ratelimit-limit-requests"] == "3"
    with pytest.raises(openai.RateLimitError) as refused:
        limited.models.list()
    error = refused.value
    assert error.status_code == 429 and error.code == "rate_limit_exceeded", error.body
    assert 19 <= int(error.response.headers["retry-after"]) <= 20, error.response.headers
    for _ in range(5):  # another key is not limited
        assert ask(hg.client(), "gw-a") == "gw-a"
    started = time.monotonic()
    patient = openai.OpenAI(base_url=hg.base, api_key=KEY_A, max_retries=2, timeout=60)
    assert "gw-a" in [m.id for m in patient.models.list()], "Retry-After honoured: the next request passes"
    assert 15 < time.monotonic() - started < 45
    hg.write(limits={})
    hg.cli("apply", "--auto-approve", check=True)
    assert all(limited.models.list() for _ in range(5)), "the limit is gone with the document's field"


def test_models_carry_each_deployments_creation_time(hg: GatewayProject) -> None:
    """Issue 26: `created` in /v1/models entries is the deployment's creation time (its ID's), not 0."""
    from engine_ctl.core.render.gateway import created_of

    recorded = {name: created_of(d["id"]) for name, d in hg.state()["deployments"].items()}
    assert set(recorded) == {"gw-a", "gw-b"} and all(abs(t - time.time()) < 86400 for t in recorded.values())
    assert {m.id: m.created for m in hg.client().models.list()} == recorded
    assert hg.client().models.retrieve("gw-b").created == recorded["gw-b"]
