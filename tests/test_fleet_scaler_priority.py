"""Two `min: 0` deployments whose on-demand slots share one host's capacity (each takes all its cores), on the
real fleet with the real scaler: they never run at once there, and the higher priority one wins: waking it
drains and stops the lower one (running above its min of 0); the lower one, woken while the higher one runs,
waits and gets 503 + Retry-After at the hold bound, with the scaler's reason recorded.
(The project and its short timings: tests/test_fleet_scaler.py.)"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator

import openai
import pytest

from tests.fleet import Fleet
from tests.test_fleet_scaler import ScalerProject, ask

pytestmark = pytest.mark.fleet


class Watch:
    """Samples both units on the shared host every half second: were they ever active together?"""

    def __init__(self, p: ScalerProject, units: list[str]) -> None:
        self.p, self.units, self.together, self.samples = p, units, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop)

    def _loop(self) -> None:
        host = self.p.fleet.hosts[2]
        while not self._stop.wait(0.5):
            out = self.p.fleet.ssh(host, "systemctl is-active " + " ".join(self.units), check=False).stdout.split()
            self.samples += 1
            self.together += out.count("active") + out.count("activating") >= 2

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(30)


@pytest.fixture(scope="module")
def pp(fleet: Fleet, weights: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ScalerProject]:
    p = ScalerProject(tmp_path_factory.mktemp("scaler-priority"), fleet)
    shared, cores = fleet.hosts[2].name, os.cpu_count() or 2
    p.write("---\n".join(f"""
        metadata: {{name: {name}}}
        spec: {{model: tiny, accelerator: cpu, cpu_cores: {cores}, context_length: 512, host: {shared},
                priority: {priority}, replicas: {{min: 0, max: 1, idle_minutes: 30}}}}
        """ for name, priority in (("hi", 10), ("lo", 0))))  # fmt: skip
    with p.applied():
        yield p


def test_sharing_deployments_never_run_at_once_and_the_higher_priority_wins(pp: ScalerProject) -> None:
    units = [f"engine-ctl-{n}-0a.service" for n in ("hi", "lo")]
    pp.wait("both at zero", lambda: not pp.active("hi", 0) and not pp.active("lo", 0), 60)
    with Watch(pp, units) as watch:
        assert ask(pp.client(), "lo") == "lo"  # the lower one wakes: the host is free
        assert pp.active("lo", 0)
        assert ask(pp.client(), "hi") == "hi"  # the higher one takes the host: lo drained and stopped first
        assert pp.active("hi", 0) and not pp.active("lo", 0)
        preempted = [d for d in pp.decisions("lo") if d["action"] == "preempt"]
        assert len(preempted) == 1 and preempted[0]["reason"] == "preempted by hi (priority 10 > 0)"
        with pytest.raises(openai.APIStatusError) as raised:  # lo again: it may not preempt hi
            ask(pp.client(), "lo")
        assert raised.value.status_code == 503 and raised.value.response.headers.get("retry-after") == "5"
        assert pp.active("hi", 0) and not pp.active("lo", 0)
    assert watch.samples >= 10 and watch.together == 0, (watch.samples, watch.together)
    held = [d for d in pp.decisions("lo") if d["action"] == "hold"]
    assert held and held[-1]["reason"].startswith("no slot free: slot 0: ") and "cores in use" in held[-1]["reason"]
