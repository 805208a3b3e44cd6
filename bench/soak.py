"""A long soak of the stateful test (issue 24) on the real fleet: random rules, the promise checked after every step.

    ENGINE_CTL_FLEET_ID=N python -m bench.soak --steps 300 [--seed 24] [--restrict rule,rule] [--keep-fleet]

Boots three fleet hosts (tests/fleet.py) unless one with this ID is up and --use-running is given, runs the steps
(tests/statefulfleet.py) and prints the steps, the operations by kind, the time, and every violation with its seed
and the shortest sequence from a converged fleet that shows it. A violation resets the fleet to the starting
documents and the soak goes on. Exit status: 0 with no violation, 1 otherwise."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from tests import fleet as fleet_mod
from tests.llama import llama_engine
from tests.statefulfleet import Machine, Project


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="bench.soak", description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--seed", type=int, default=24)
    ap.add_argument("--restrict", default="", help="rules left out, comma-separated (a known, reported bug)")
    ap.add_argument("--use-running", action="store_true", help="use the fleet already up with this ID")
    ap.add_argument("--keep-fleet", action="store_true", help="leave the fleet up at the end")
    args = ap.parse_args(argv)
    if args.use_running and fleet_mod.STATE.exists():
        fleet = fleet_mod.Fleet.load()
    else:
        fleet = fleet_mod.up(3, engines={"llama.cpp": llama_engine()})
    started = time.monotonic()
    project = Project(Path(tempfile.mkdtemp(prefix="engine-ctl-soak-")), fleet)
    machine = Machine(project, args.seed, log=lambda line: print(line, flush=True))
    try:
        machine.setup()
        machine.run(args.steps, restrict={r for r in args.restrict.split(",") if r})
    finally:
        took = time.monotonic() - started
        print(f"\nsteps: {len(machine.sequence) - machine.kinds['reset']} in {took / 60:.1f} min "
              f"(seed {args.seed}, {took / max(1, len(machine.sequence)):.1f} s a step)")  # fmt: skip
        print("operations by kind: " + ", ".join(f"{k} {n}" for k, n in sorted(machine.kinds.items())))
        print(machine.timing_report())
        print(f"violations: {len(machine.violations)}")
        for v in machine.violations:
            print(v)
        machine.teardown()
        if not args.keep_fleet and not args.use_running:
            fleet_mod.down(fleet)
    return 1 if machine.violations else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
