"""Scale to zero on the real fleet: the real gateway (HAProxy + hold.lua), the real scaler under its unit, the real
llama-server with the tiny model, the `openai` client.

- wake overhead: time from a request at zero to its first token (streamed), minus the engine's own start to
  health measured on the same host in the same round (`systemctl start` there, then GET /health until 200)
  (target: <= 1 s);
- failed requests while scaling: each round wakes the deployment with `clients` requests at once; every one must
  be answered (target: 0).

Run:  ENGINE_CTL_FLEET_ID=<id> .venv/bin/python -m bench.scaling [ROUNDS] [CLIENTS]
(boots the fleet, as the fleet tests do, and tears it down at the end)
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import openai

from tests import fleet as fleet_mod
from tests.fleetproject import MODELS_DIR
from tests.llama import llama_engine, tiny_model
from tests.test_fleet_scaler import ScalerProject, admin


def engine_start_to_health(p: ScalerProject, host: fleet_mod.FleetHost, unit: str, url: str) -> float:
    """On the replica host itself: systemctl start, then /health until 200; the unit is stopped after."""
    script = (f"t0=$(date +%s.%N); systemctl start {unit}; until curl -sf -o /dev/null {url}; do sleep 0.02; done; "
              f"t1=$(date +%s.%N); systemctl stop {unit}; echo \"$t1 - $t0\" | bc")  # fmt: skip
    return float(p.fleet.ssh(host, script).stdout.strip())


def wake(p: ScalerProject, clients: int) -> tuple[float, int]:
    """`clients` streamed requests at zero at once: the first token's time of the first, and failures."""
    firsts: list[float] = []
    failed: list[str] = []
    t0 = time.monotonic()

    def one() -> None:
        try:
            stream = p.client(timeout=180).chat.completions.create(
                model="zero", messages=[{"role": "user", "content": "hi"}], max_tokens=8, stream=True
            )
            for _ in stream:
                firsts.append(time.monotonic() - t0)
                break
            stream.close()
        except openai.OpenAIError as exc:
            failed.append(repr(exc))

    threads = [threading.Thread(target=one) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(240)
    return (min(firsts) if firsts else float("nan")), len(failed)


def to_zero(p: ScalerProject, host: fleet_mod.FleetHost, unit: str) -> None:
    """Back to zero at once, as the scaler does after idle_minutes: the server to maintenance, the unit stopped."""
    p.on_gateway(admin("set server d_zero/r0a state maint"))
    p.fleet.ssh(host, f"systemctl stop {unit}")
    p.wait("at zero", lambda: p.scaler_state()["deployments"]["zero"]["running"] == [], 30)


def main(rounds: int, clients: int) -> None:
    fleet = fleet_mod.up(4, engines={"llama.cpp": llama_engine()})
    try:
        for h in fleet.hosts:
            fleet.ssh(h, f"mkdir -p {MODELS_DIR}/tiny && cp {tiny_model()} {MODELS_DIR}/tiny/tiny.gguf")
        p = ScalerProject(Path(tempfile.mkdtemp(prefix="bench-scaling-")), fleet)
        one = fleet.hosts[1]
        p.write(f"""
            metadata: {{name: zero}}
            spec: {{model: tiny, accelerator: cpu, cpu_cores: 1, context_length: 512, host: {one.name},
                    replicas: {{min: 0, max: 1, idle_minutes: 60}}}}
            """)  # fmt: skip
        p.cli("apply", "--auto-approve", check=True)
        p.installed()
        r = p.state().deployments["zero"].replicas[0]
        url = f"http://{one.address}:{r.port}/health"
        p.wait("at zero", lambda: p.scaler_state().get("deployments", {}).get("zero", {}).get("running") == [], 30)
        overheads, failed, asked = [], 0, 0
        for i in range(rounds):
            floor = engine_start_to_health(p, one, r.unit, url)
            first, lost = wake(p, clients)
            asked, failed = asked + clients, failed + lost
            overheads.append(first - floor)
            print(f"round {i + 1}: first token at zero {first:.3f} s, engine start to health {floor:.3f} s, "
                  f"overhead {first - floor:.3f} s, failed {lost} of {clients}", flush=True)  # fmt: skip
            to_zero(p, one, r.unit)
        print(f"wake overhead: median {statistics.median(overheads):.3f} s, max {max(overheads):.3f} s "
              f"over {rounds} rounds (target <= 1 s)")  # fmt: skip
        print(f"failed requests while scaling: {failed} of {asked} (target 0)")
        p.cli("destroy", "--auto-approve")
    finally:
        fleet_mod.down(fleet)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5, int(sys.argv[2]) if len(sys.argv) > 2 else 6)
