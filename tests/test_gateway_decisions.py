"""Decision models behind the gateway, on the real HAProxy 2.6 of this machine and the real llama-server built for
the tests, on loopback: POST /v1/systemone is routed to the deployment named in the body's `model`; a chat
deployment refuses it and a decisions deployment refuses chat; a decisions replica counts as up only when it
answers the readiness decision (a model answering malformed stays down though its GET /health answers 200)."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine_ctl.core.decisions import readiness_request
from engine_ctl.core.documents.apikey import key_sha256
from engine_ctl.core.documents.inventory import Host
from engine_ctl.core.model import ApiKey
from engine_ctl.core.render.gateway import GatewayBackend, GatewayServer, render_gateway
from engine_ctl.shell.gateway.runtime import server_states
from engine_ctl.shell.transport import LocalTransport
from tests.llama import llama_server_dir, tiny_model
from tests.ports import free_port
from tests.tools.make_tiny_decision_model import tiny_decision_model

HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
KEY = "ak-all-" + "1" * 40


def _engine(model: Path, alias: str, port: int) -> subprocess.Popen[bytes]:
    argv = [str(llama_server_dir() / "bin" / "llama-server"), "-m", str(model), "--alias", alias,
            "--host", "127.0.0.1", "--port", str(port), "-c", "512", "-t", "1"]  # fmt: skip
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _wait(url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url, timeout=1)
            return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"{url} did not answer within {timeout} s")


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[dict[str, object]]:
    ports = {"decider": free_port(), "malformed": free_port(), "chat": free_port()}
    models = {"decider": tiny_decision_model(), "malformed": tiny_decision_model(malformed=True), "chat": tiny_model()}
    engines = [_engine(models[d], d, p) for d, p in ports.items()]
    backends = [
        GatewayBackend(deployment=d, api="chat" if d == "chat" else "decisions",
                       servers=(GatewayServer(name="r0a", address="127.0.0.1", port=p, maxconn=2),))
        for d, p in ports.items()
    ]  # fmt: skip
    host = Host(name="edge", address="127.0.0.1", gateway_port=free_port(), transport="local")
    keys = [ApiKey(name="all", sha256=key_sha256(KEY))]
    rendered = render_gateway(host, backends, keys, internal_key=False, hold_s=2, hold_cap=2, run_dir=str(tmp_path))
    for name, text in rendered.files.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "server-state").write_text("")
    check = subprocess.run([HAPROXY, "-c", "-q", "-f", str(tmp_path / "haproxy.cfg")], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    for p in ports.values():
        _wait(f"http://127.0.0.1:{p}/health")
    proc = subprocess.Popen([HAPROXY, "-f", str(tmp_path / "haproxy.cfg")], stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{host.gateway_port}"
    _wait(base + "/health", 10)
    t = LocalTransport(host)
    # the first health checks (inter 5 s, downinter 1 s) mark each server up or down
    deadline = time.monotonic() + 15
    states: dict[tuple[str, str], str] = {}
    while time.monotonic() < deadline:
        states = {k: v.status for k, v in server_states(t, str(tmp_path / "admin.sock")).items()}
        if states.get(("d_decider", "r0a")) == "UP" and states.get(("d_malformed", "r0a")) == "DOWN":
            break
        time.sleep(0.3)
    yield {"base": base, "states": states, "ports": ports}
    proc.terminate()
    proc.wait(timeout=10)
    for e in engines:
        e.terminate()
        e.wait(timeout=10)


def call(base: str, path: str, body: dict[str, object]) -> tuple[int, dict]:  # type: ignore[type-arg]
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"}
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def chat(model: str) -> dict[str, object]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def test_decisions_are_routed_by_model_and_each_api_refuses_the_other(gateway: dict) -> None:  # type: ignore[type-arg]
    base = str(gateway["base"])
    status, body = call(base, "/v1/systemone", readiness_request("decider"))
    assert status == 200, body
    assert set(body["answers"]["route"]["probabilities"]) == {"billing", "shipping", "technical"}

    status, body = call(base, "/v1/chat/completions", chat("decider"))
    assert status == 400 and body["error"]["code"] == "wrong_api"
    assert body["error"]["message"] == "The model `decider` is a decision model: call POST /v1/systemone"

    status, body = call(base, "/v1/systemone", readiness_request("chat"))
    assert status == 400 and body["error"]["code"] == "wrong_api"
    assert body["error"]["message"] == ("The model `chat` is not a decision model: POST /v1/systemone serves "
                                        "decision models only")  # fmt: skip
    status, body = call(base, "/v1/chat/completions", chat("chat"))
    assert status == 200 and body["choices"], body


def test_a_decisions_replica_is_up_only_when_it_answers_the_readiness_decision(gateway: dict) -> None:  # type: ignore[type-arg]
    states = gateway["states"]
    assert states[("d_decider", "r0a")] == "UP" and states[("d_chat", "r0a")] == "UP"
    # its GET /health answers 200, but its decision is malformed (null probabilities): never up, never routed to
    assert states[("d_malformed", "r0a")] == "DOWN", states
    status, body = call(str(gateway["base"]), "/v1/systemone", readiness_request("malformed"))
    assert status == 503 and body["error"]["code"] == "unavailable"


def test_an_input_the_engine_cannot_read_is_502_engine_error_with_its_own_message(gateway: dict) -> None:  # type: ignore[type-arg]
    """Seed 003: a decision input longer than llama.cpp's batch is refused with 502 engine_error and llama.cpp's
    message ("increase the physical batch size"), not the engine's status passed through. This build (0.6.0-dev)
    splits a decision over batches, so what it refuses is the input longer than its context (400
    exceed_context_size_error); the seed's 0.7.0 refuses the same input with its physical batch (500)."""
    long = readiness_request("decider")
    long["state"] = "The ticket says: my card was charged twice. " * 80
    engine = f"http://127.0.0.1:{gateway['ports']['decider']}"
    own_status, own = call(engine, "/v1/systemone", long)
    assert own_status == 400 and "exceeds the available context size (512 tokens)" in own["error"]["message"], own
    status, body = call(str(gateway["base"]), "/v1/systemone", long)
    assert status == 502, body
    assert body["error"]["code"] == body["code"] == "engine_error"
    assert body["error"]["message"] == body["message"] == own["error"]["message"]
    # an input the engine reads is answered as before
    status, body = call(str(gateway["base"]), "/v1/systemone", readiness_request("decider"))
    assert status == 200 and body["answers"]["route"]["choice"] in {"billing", "shipping", "technical"}, body
