"""Parking a vLLM replica asleep, against a test double of vLLM's HTTP server (vLLM needs a GPU, which this
machine has not; tests/vllm_double.py). The double speaks vLLM's real sleep-mode API as its documentation and server
give it:

- docs.vllm.ai, Features > Sleep Mode: launched with `--enable-sleep-mode` and VLLM_SERVER_DEV_MODE=1, the server
  has `POST /sleep?level=1|2`, `POST /wake_up` (optionally `?tags=weights` / `?tags=kv_cache`, for level 2 with
  `POST /collective_rpc {"method": "reload_weights"}` between them) and `GET /is_sleeping` answering
  `{"is_sleeping": true|false}`;
- vllm/entrypoints/openai/api_server.py: those dev-mode routes, and the Prometheus gauge
  `vllm:num_requests_running{model_name=...}` at GET /metrics (the provider's in-flight metric).

The park job (engine_ctl.shell.lifecycle.hosts.HOST_JOB, the script a park runs on the replica's host) runs in
place here through the real LocalTransport: it must drain first (a request in flight finishes before /sleep), then
sleep and
see it asleep; a wake must wake it and see it awake, in vLLM's order for each level."""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Iterator

import pytest
from engine_ctl.providers import PROVIDERS

from engine_ctl.core.documents.inventory import Host
from engine_ctl.core.record.model import ReplicaRecord
from engine_ctl.shell.lifecycle.hosts import job_argv, sleep_job, wake_job
from engine_ctl.shell.transport import LocalTransport
from tests.vllm_double import VllmDouble


@pytest.fixture
def double() -> Iterator[VllmDouble]:
    d = VllmDouble()
    yield d
    d.server.shutdown()


HOST = Host(name="localhost", address="127.0.0.1", transport="local")


def replica(port: int) -> ReplicaRecord:
    return ReplicaRecord(index=0, host="localhost", unit="engine-ctl-chat-0a.service", port=port, unit_sha256="",
                         revision=1)  # fmt: skip


def slow_request(port: int) -> threading.Thread:
    def ask() -> None:
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=b'{"model":"chat"}',
                                     headers={"Content-Type": "application/json"})  # fmt: skip
        urllib.request.urlopen(req, timeout=30).read()

    t = threading.Thread(target=ask)
    t.start()
    return t


def test_park_drains_first_then_sleeps_at_level_1_and_start_wakes_it(double: VllmDouble) -> None:
    vllm = PROVIDERS["vllm"]
    t = LocalTransport(HOST)
    asking = slow_request(double.port)
    deadline = time.monotonic() + 5
    while double.running == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert double.running == 1  # a request is in flight when the park begins

    parked = t.run(job_argv(sleep_job(vllm, HOST, replica(double.port), 1)), timeout=60)
    assert parked.exit_code == 0, parked.stderr
    asking.join()
    steps = [what for what, _ in double.log]
    assert steps[:3] == ["chat done", "sleep", "is_sleeping"], double.log  # drained first, then asleep
    assert ("sleep", ("level=1", 0)) in double.log  # level 1, nothing in flight when it slept
    assert double.sleeping

    double.log.clear()
    woken = t.run(job_argv(wake_job(vllm, HOST, replica(double.port), 1)), timeout=60)
    assert woken.exit_code == 0, woken.stderr
    assert double.log[0] == ("wake_up", "") and double.log[-1] == ("is_sleeping", False), double.log
    assert not double.sleeping


def test_deep_sleeps_at_level_2_and_wakes_weights_then_reloads_then_kv_cache(double: VllmDouble) -> None:
    vllm = PROVIDERS["vllm"]
    assert vllm.sleep_controls is not None and vllm.sleep_controls.level("deep") == 2
    t = LocalTransport(HOST)
    assert t.run(job_argv(sleep_job(vllm, HOST, replica(double.port), 2)), timeout=60).exit_code == 0
    assert ("sleep", ("level=2", 0)) in double.log
    double.log.clear()
    assert t.run(job_argv(wake_job(vllm, HOST, replica(double.port), 2)), timeout=60).exit_code == 0
    calls = [(w, d) for w, d in double.log if w != "is_sleeping"]
    assert calls == [("wake_up", "tags=weights"), ("collective_rpc", "reload_weights"), ("wake_up", "tags=kv_cache")]
    assert not double.sleeping


def test_a_sleep_the_engine_refuses_fails_the_job_with_the_engines_words(double: VllmDouble) -> None:
    """An engine launched without its sleep controls answers 404 there: the park fails, saying so."""
    vllm = PROVIDERS["vllm"]
    job = sleep_job(vllm, HOST, replica(double.port), 1)
    wrong = job.__class__(**{**job.__dict__, "calls": (job.calls[0].__class__("POST", "/no_such_sleep"),)})
    result = LocalTransport(HOST).run(job_argv(wrong), timeout=60)
    assert result.exit_code != 0 and "POST /no_such_sleep: HTTP 404" in result.stderr
