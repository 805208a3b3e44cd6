"""plan and apply on the fleet. Prints figures and ratios (issue 5's targets):

- a no-op plan on 16 hosts <= 1.5x the parallel `ssh true` floor on the same hosts;
- apply's overhead per replica beyond the engine's own time to health <= 1 s;
- planning 200 deployments <= 1.5x planning 1 on the same hosts.

Run as root:  .venv/bin/python -m bench.plan
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from engine_ctl.state import LocalState

from bench.facts import median, ssh_true
from bench.startup import ENV
from engine_ctl.core.documents.inventory import load_inventory
from engine_ctl.core.documents.loader import load_paths
from engine_ctl.shell.transport import SSHOptions
from engine_ctl.shell.world import plan_world
from tests import fleet as fleet_mod
from tests.llama import llama_server_dir, tiny_model

HOSTS = 16
MODELS_DIR = "/var/lib/engine-ctl/models"
MODEL = "kind: Model\nmetadata: {name: tiny}\nspec: {format: gguf, path: tiny/tiny.gguf, parameters: 4170048}\n"


def deployment(name: str, replicas: int = 1) -> str:
    return (
        f"---\nmetadata: {{name: {name}}}\nspec: {{model: tiny, accelerator: cpu, context_length: 256, "
        f"replicas: {{min: {replicas}, max: {replicas}}}}}\n"
    )


def plan_seconds(docs: Path, inventory: Path, runs: int = 3) -> float:
    def once() -> None:
        loaded = load_paths([docs])
        inv = load_inventory(inventory)
        backend = LocalState(docs / "engine-ctl.state.json")
        plan_world(loaded.desired, inv, backend.read(), backend.location, backend.location, SSHOptions(), 32, ())

    return median(once, runs)


def cli(*args: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "engine_ctl", *args], check=True, capture_output=True, env=ENV)
    return time.perf_counter() - start


def engine_time_to_health(fleet: fleet_mod.Fleet) -> float:
    """The engine's own time from exec to GET /health 200, on a host, without engine-ctl."""
    h = fleet.hosts[0]
    server = f"{llama_server_dir()}/bin/llama-server --model {tiny_model()} --ctx-size 512 --port 8999"
    times = []
    for _ in range(3):
        fleet.ssh(h, f"(nohup {server} --host 0.0.0.0 >/dev/null 2>&1 & echo $! > /tmp/bench.pid)")
        start = time.perf_counter()
        while True:
            try:
                with urllib.request.urlopen(f"http://{h.address}:8999/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.01)
        times.append(time.perf_counter() - start)
        fleet.ssh(h, "kill $(cat /tmp/bench.pid)")
        time.sleep(0.3)
    return statistics.median(times)


def main() -> int:
    fleet = fleet_mod.up(HOSTS, engines={"llama.cpp": str(llama_server_dir() / "bin" / "llama-server")})
    try:
        for h in fleet.hosts:
            fleet.ssh(h, f"mkdir -p {MODELS_DIR}/tiny && cp {tiny_model()} {MODELS_DIR}/tiny/tiny.gguf")
        inv = Path(fleet.inventory)
        work = Path(tempfile.mkdtemp())
        dirs = {name: work / name for name in ("one", "many", "single", "wide")}
        for d in dirs.values():
            d.mkdir()
        (dirs["one"] / "docs.yaml").write_text(MODEL + deployment("d0"))
        (dirs["many"] / "docs.yaml").write_text(MODEL + "".join(deployment(f"d{i}") for i in range(200)))
        (dirs["single"] / "docs.yaml").write_text(MODEL + deployment("single"))
        (dirs["wide"] / "docs.yaml").write_text(MODEL + deployment("wide", replicas=HOSTS))

        engine = engine_time_to_health(fleet)
        startup = statistics.median(cli("apply", "--help") for _ in range(3))  # apply's imports, no work
        rows = []
        for name, n in (("single", 1), ("wide", HOSTS)):
            wall = cli("apply", "--auto-approve", str(dirs[name]), "--inventory", str(inv))
            planning = plan_seconds(dirs[name], inv)  # the same gathering and planning apply did first
            rows.append((name, n, wall, planning, wall - startup - planning - engine))
        floor = median(lambda: ssh_true(fleet, fleet.hosts), 3)
        noop = plan_seconds(dirs["wide"], inv)
        p1 = plan_seconds(dirs["one"], inv)
        p200 = plan_seconds(dirs["many"], inv)
        print(f"hosts: {HOSTS}")
        print(f"ssh true floor (16 in parallel):      {floor:6.2f} s")
        print(f"no-op plan (16 replicas on 16 hosts): {noop:6.2f} s   ratio {noop / floor:4.2f}x (target <= 1.5)")
        print(f"plan of 1 deployment:                 {p1:6.2f} s")
        print(f"plan of 200 deployments:              {p200:6.2f} s   ratio {p200 / p1:4.2f}x (target <= 1.5)")
        print(f"engine time to health (tiny model):   {engine:6.2f} s;  CLI start-up {startup:.2f} s")
        for _name, n, wall, planning, overhead in rows:
            print(
                f"apply {n:>2} replica(s): {wall:6.2f} s wall = start-up {startup:.2f} + plan {planning:.2f} + "
                f"engine {engine:.2f} + overhead {overhead:.2f} s (target <= 1 per replica; replicas on "
                "different hosts roll in parallel)"
            )
        for name in ("single", "wide"):
            argv = ["destroy", "--auto-approve", str(dirs[name]), "--inventory", str(inv)]
            subprocess.run([sys.executable, "-m", "engine_ctl", *argv], check=False, capture_output=True)
    finally:
        fleet_mod.down(fleet)
    return 0


if __name__ == "__main__":
    sys.exit(main())
