"""plan and apply on the fleet, as a user runs them (whole `engine-ctl` processes), against floors measured in the
same run (issue 10's targets):

| figure                                                | floor                          | target          |
| no-op `engine-ctl plan`, 16 replicas on 16 hosts      | 16 parallel `ssh host true`    | <= 1.5x         |
| `engine-ctl plan` of 200 deployments                  | `engine-ctl plan` of 1         | <= 1.5x         |
| apply's overhead per replica beyond the engine's own  | (apply - plan of the same      | <= 0.5 s        |
|   time to health                                      |   change) / replicas - engine  |                 |

and, with --scaling, how apply's time grows with hosts: N one-replica deployments, one per host (they roll side by
side; one replica at a time within a deployment), for N = 1, 4, 8, 16.

Run as root:  .venv/bin/python -m bench.plan [--runs 5] [--scaling]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from bench.facts import ssh_true
from bench.startup import ENV, boot_fleet, engine_ctl, release_fleet
from tests import fleet as fleet_mod
from tests.llama import llama_server_dir, tiny_model

HOSTS = 16
MODELS_DIR = "/var/lib/engine-ctl/models"
MODEL = "kind: Model\nmetadata: {name: tiny}\nspec: {format: gguf, path: tiny/tiny.gguf, parameters: 4170048}\n"


def deployment(name: str, replicas: int = 1, host: str | None = None) -> str:
    pin = f", host: {host}" if host else ""
    return (
        f"---\nmetadata: {{name: {name}}}\nspec: {{model: tiny, accelerator: cpu, context_length: 256, "
        f"replicas: {{min: {replicas}, max: {replicas}}}{pin}}}\n"
    )


def cli(*args: str) -> float:
    """One whole `engine-ctl` process (as a user runs it); seconds."""
    start = time.perf_counter()
    done = subprocess.run([*engine_ctl(), *args], capture_output=True, text=True, env=ENV, check=False)
    if done.returncode != 0:
        raise SystemExit(f"engine-ctl {' '.join(args)} exited {done.returncode}: {done.stderr[-2000:]}")
    return time.perf_counter() - start


def paired(figure, floor, runs: int) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """Median seconds of `figure` and of `floor`, timed in turn (floor, figure, floor, ...) after a warm-up."""
    figure(), floor()
    a, b = [], []
    for _ in range(runs):
        start = time.perf_counter()
        floor()
        b.append(time.perf_counter() - start)
        start = time.perf_counter()
        figure()
        a.append(time.perf_counter() - start)
    return statistics.median(a), statistics.median(b)


def engine_time_to_health(fleet: fleet_mod.Fleet, tries: int = 3) -> float:
    """The engine's own time from exec to GET /health 200, on a host, without engine-ctl."""
    h = fleet.hosts[0]
    server = f"{llama_server_dir()}/bin/llama-server --model {tiny_model()} --ctx-size 512 --port 8999"
    times = []
    for _ in range(tries):
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


def apply_overhead(fleet: fleet_mod.Fleet, docs: Path, inv: Path, replicas: int, runs: int) -> str:
    """`runs` rounds of: the engine's own time to health, the plan, the apply (then a destroy, but for the last
    round: the deployment stays applied). Each figure is the median of its rounds, so a load that swings within
    the run (2 to 12 here within a minute) weighs on all three alike, not on whichever ran at the worst moment."""
    engines, plans, applies = [], [], []
    for round_ in range(runs):
        engines.append(engine_time_to_health(fleet, tries=1))
        plans.append(cli("plan", str(docs), "--inventory", str(inv)))
        applies.append(cli("apply", "--auto-approve", str(docs), "--inventory", str(inv)))
        if round_ < runs - 1:
            cli("destroy", "--auto-approve", str(docs), "--inventory", str(inv))
    engine, planning, wall = (statistics.median(x) for x in (engines, plans, applies))
    per = (wall - planning) / replicas - engine
    verdict = "met" if per <= 0.5 else "NOT MET"
    return (
        f"apply {replicas:>2} replica(s): {wall:6.2f} s = plan {planning:.2f} + {replicas} x (engine {engine:.2f} + "
        f"overhead {per:.2f}) s   (target overhead <= 0.5 s per replica: {verdict})"
    )


def scaling(fleet: fleet_mod.Fleet, work: Path, inv: Path) -> None:
    """apply (and destroy) of N one-replica deployments, one per host, for N = 1, 4, 8, 16."""
    print(f"{'hosts':>5} {'apply s':>8} {'destroy s':>10}")
    for n in (n for n in (1, 4, 8, 16) if n <= len(fleet.hosts)):
        docs = work / f"scale{n}"
        docs.mkdir()
        (docs / "docs.yaml").write_text(MODEL + "".join(deployment(f"s{i}", host=h.name)
                                                        for i, h in enumerate(fleet.hosts[:n])))  # fmt: skip
        up = cli("apply", "--auto-approve", str(docs), "--inventory", str(inv))
        down = cli("destroy", "--auto-approve", str(docs), "--inventory", str(inv))
        print(f"{n:>5} {up:>8.2f} {down:>10.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--scaling", action="store_true", help="also apply 1, 4, 8, 16 deployments, one per host")
    parser.add_argument("--hosts", type=int, default=HOSTS, help=f"fleet hosts (default {HOSTS})")
    args = parser.parse_args(argv)
    hosts = args.hosts
    fleet = boot_fleet(hosts)
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
        (dirs["wide"] / "docs.yaml").write_text(MODEL + deployment("wide", replicas=hosts))

        engine = engine_time_to_health(fleet)
        print(f"hosts: {hosts}; engine's own time to health (tiny model): {engine:.2f} s; {args.runs} runs, medians")
        print(apply_overhead(fleet, dirs["single"], inv, 1, args.runs))
        print(apply_overhead(fleet, dirs["wide"], inv, hosts, args.runs))
        plan = [*engine_ctl(), "plan", str(dirs["wide"]), "--inventory", str(inv)]
        noop, floor = paired(
            lambda: subprocess.run(plan, check=True, capture_output=True, env=ENV),
            lambda: ssh_true(fleet, fleet.hosts),
            args.runs,
        )
        print(f"no-op plan, {hosts} replicas on {hosts} hosts: {noop:6.2f} s / {hosts} parallel ssh true "
              f"{floor:.2f} s = {noop / floor:.2f}x (target <= 1.5x)")  # fmt: skip
        p200, p1 = paired(
            lambda: cli("plan", str(dirs["many"]), "--inventory", str(inv)),
            lambda: cli("plan", str(dirs["one"]), "--inventory", str(inv)),
            max(3, args.runs // 2),
        )
        print(f"plan of 200 deployments: {p200:6.2f} s / plan of 1 {p1:.2f} s = {p200 / p1:.2f}x (target <= 1.5x)")
        for name in ("single", "wide"):
            cli("destroy", "--auto-approve", str(dirs[name]), "--inventory", str(inv))
        if args.scaling:
            scaling(fleet, work, inv)
        print(f"whole processes: {' '.join(engine_ctl())}")
    finally:
        release_fleet(fleet)
    return 0


if __name__ == "__main__":
    sys.exit(main())
