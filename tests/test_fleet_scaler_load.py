"""The scaler under load on the real fleet: a `min: 1, max: 3` deployment with `parallel: 2` and 6 concurrent
`openai` clients (max_retries=0) through the real gateway. Replicas are added one decision at a time, at least the
(test's) decide_every_s apart; when the load stops it scales back to 1; no request fails throughout.
(The project, its timings and the on-demand contract: tests/test_fleet_scaler.py.)"""

from __future__ import annotations

import calendar
import threading
import time
from collections.abc import Iterator

import openai
import pytest

from tests.fleet import Fleet
from tests.test_fleet_scaler import DECIDE_S, ScalerProject

pytestmark = pytest.mark.fleet


class Load:
    """`clients` threads asking in a loop until stopped (or `limit_s`); every failure kept with its error."""

    def __init__(self, p: ScalerProject, model: str, clients: int = 6, limit_s: float = 400) -> None:
        self.p, self.model, self.ok, self.failed = p, model, 0, list[str]()
        self._stop, self._lock = threading.Event(), threading.Lock()
        self._deadline = time.monotonic() + limit_s
        self._threads = [threading.Thread(target=self._loop) for _ in range(clients)]

    def _loop(self) -> None:
        client = self.p.client(timeout=180)
        while not self._stop.is_set() and time.monotonic() < self._deadline:
            try:
                client.chat.completions.create(
                    model=self.model, messages=[{"role": "user", "content": "count"}], max_tokens=48,
                    extra_body={"ignore_eos": True},
                )  # fmt: skip
                with self._lock:
                    self.ok += 1
            except openai.OpenAIError as exc:
                with self._lock:
                    self.failed.append(repr(exc))

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(200)


def at(decision: dict) -> float:  # type: ignore[type-arg]
    return float(calendar.timegm(time.strptime(decision["at"], "%Y-%m-%dT%H:%M:%SZ")))


def running(p: ScalerProject, name: str) -> list[int]:
    return list(p.scaler_state().get("deployments", {}).get(name, {}).get("running", []))


@pytest.fixture(scope="module")
def lp(fleet: Fleet, weights: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ScalerProject]:
    p = ScalerProject(tmp_path_factory.mktemp("scaler-load"), fleet)
    p.write("""
        metadata: {name: burst}
        spec: {model: tiny, accelerator: cpu, cpu_cores: 1, context_length: 512, parallel: 2,
               replicas: {min: 1, max: 3}}
        """)  # fmt: skip
    with p.applied():
        yield p


def test_load_adds_replicas_one_decision_at_a_time_and_scales_back_with_no_failure(lp: ScalerProject) -> None:
    lp.wait("one replica running", lambda: running(lp, "burst") == [0], 30)
    with Load(lp, "burst") as load:
        lp.wait("three replicas", lambda: len(running(lp, "burst")) == 3, 4 * DECIDE_S + 60)
        lp.wait("three serving", lambda: lp.scaler_state()["deployments"]["burst"]["ready"] == 3, 60)
        assert not load.failed, load.failed[:3]
    assert load.ok > 0 and not load.failed, load.failed[:3]
    ups = [d for d in lp.decisions("burst") if d["action"] == "up"]
    assert len(ups) == 2 and {d["slot"] for d in ups} == {1, 2}
    assert at(ups[1]) - at(ups[0]) >= DECIDE_S - 1, ups
    assert all("queued" in d["reason"] or "3/4 of parallel 2" in d["reason"] for d in ups)
    with Load(lp, "burst", clients=1) as light:  # light load: scales back while a client keeps asking
        lp.wait("back to one", lambda: running(lp, "burst") == [0], 4 * DECIDE_S + 60)
    assert light.ok > 0 and not light.failed, light.failed[:3]
    downs = [d for d in lp.decisions("burst") if d["action"] == "down"]
    assert [d["slot"] for d in downs] == [2, 1]
    assert at(downs[1]) - at(downs[0]) >= DECIDE_S - 1 and at(downs[0]) - at(ups[1]) >= DECIDE_S - 1
    assert all(not lp.active("burst", i) for i in (1, 2)) and lp.active("burst", 0)
