"""Start-up as a user feels it: whole engine-ctl processes, each against its floor measured in the same run
(issue 10). Each figure and its floor run in turn (floor, figure, floor, figure, ...), so a machine that slows
down mid-run slows both; the ratio is median / median.

| figure                                    | floor                          | target |
| engine-ctl --version                      | python -c pass (same python)   | <= 2x  |
| engine-ctl --help                         | python -c pass                 | (none) |
| engine-ctl validate examples/quickstart   | python -c pass                 | <= 5x  |
| (click, pydantic and ruamel.yaml alone)   | python -c pass                 | (none) |
| (the same + one pydantic model built)     | python -c pass                 | (none) |
| engine-ctl facts, 1 host (--fleet)        | one `ssh host true`            | <= 2x  |
| engine-ctl facts, 16 hosts (--fleet)      | 16 parallel `ssh host true`    | <= 1.3x |

Python runs with its bytecode cache, as an installed package has it (pip compiles at install): the children run
without PYTHONDONTWRITEBYTECODE, so the warm-up run writes __pycache__ and the timed runs read it.

Run:  .venv/bin/python -m bench.startup [--runs 15] [--fleet]   (--fleet boots 16 fleet hosts: root)
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tests import fleet as fleet_mod

ROOT = Path(__file__).resolve().parent.parent
FLEET_HOSTS = 16
# What a user's shell has: no PYTHONDONTWRITEBYTECODE (set here, every run would recompile engine-ctl's modules).
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
# What validate cannot do without: click (the CLI), pydantic (the document models), ruamel.yaml (line and column
# of every value). Their import alone is the floor under validate's figure.
LIBRARIES = "import click, ruamel.yaml; from pydantic import BaseModel"
ONE_MODEL = LIBRARIES + "\nclass One(BaseModel):\n    x: int\nOne(x=1)"
"""The libraries and one pydantic model built and used: pydantic's schema machinery (pydantic_core.core_schema,
_generate_schema) and its plugin loader (importlib.metadata) load only when a first model class is built, so no
program that validates with a pydantic model starts faster than this."""


@dataclass(frozen=True)
class Row:
    figure: str
    floor: str
    run_figure: Callable[[], None]
    run_floor: Callable[[], None]
    target: float | None


@dataclass(frozen=True)
class Timing:
    figure: list[float]
    floor: list[float]

    @property
    def ratio(self) -> float:
        return statistics.median(self.figure) / statistics.median(self.floor)


def engine_ctl() -> list[str]:
    """engine-ctl as a user runs it: the console script next to this interpreter (or `python -m engine_ctl`)."""
    script = Path(sys.executable).with_name("engine-ctl")
    return [str(script)] if script.exists() else [sys.executable, "-m", "engine_ctl"]


def process(argv: Sequence[str], ok: tuple[int, ...] = (0,)) -> Callable[[], None]:
    """One whole process, its output thrown away; an unexpected exit status stops the benchmark."""

    def run() -> None:
        quiet = subprocess.DEVNULL
        code = subprocess.run(list(argv), stdin=quiet, stdout=quiet, env=ENV, check=False).returncode
        if code not in ok:
            raise SystemExit(f"{' '.join(argv)} exited {code}")

    return run


def seconds(fn: Callable[[], None]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure(row: Row, runs: int) -> Timing:
    row.run_floor()  # warm-up, not counted: page cache and bytecode
    row.run_figure()
    figure, floor = [], []
    for _ in range(runs):
        floor.append(seconds(row.run_floor))
        figure.append(seconds(row.run_figure))
    return Timing(figure, floor)


def local_rows() -> list[Row]:
    cli = engine_ctl()
    python = process([sys.executable, "-c", "pass"])
    validate = process([*cli, "validate", str(ROOT / "examples" / "quickstart")])
    one_model = process([sys.executable, "-c", ONE_MODEL])
    return [
        Row("engine-ctl --version", "python -c pass", process([*cli, "--version"]), python, 2.0),
        Row("engine-ctl --help", "python -c pass", process([*cli, "--help"]), python, None),
        Row("engine-ctl validate examples/quickstart", "python -c pass", validate, python, 5.0),
        Row("(validate's libraries alone)", "python -c pass", process([sys.executable, "-c", LIBRARIES]), python, None),
        Row("(libraries + one pydantic model)", "python -c pass", one_model, python, None),
    ]


@contextmanager
def fleet_rows() -> Iterator[list[Row]]:
    """facts on 1 and on 16 fleet hosts, against OpenSSH itself on the same hosts (boots the fleet)."""
    from bench.facts import ssh_true

    fleet = boot_fleet(FLEET_HOSTS)
    try:
        facts = [*engine_ctl(), "facts", "--inventory", fleet.inventory]
        one = fleet.hosts[:1]
        yield [
            Row("engine-ctl facts, 1 host", "1 ssh host true", process([*facts, one[0].name]),
                lambda: ssh_true(fleet, one), 2.0),
            Row(f"engine-ctl facts, {FLEET_HOSTS} hosts", f"{FLEET_HOSTS} parallel ssh host true", process(facts),
                lambda: ssh_true(fleet, fleet.hosts), 1.3),
        ]  # fmt: skip
    finally:
        release_fleet(fleet)


def boot_fleet(n: int) -> fleet_mod.Fleet:
    """The fleet of `n` hosts with the real llama-server: one already up (`python -m tests.fleet up 16`, kept
    after the benchmark) when every host of it answers, else a new one (a boot that times out on a busy machine
    is retried)."""
    from tests import fleet as fleet_mod
    from tests.llama import llama_engine

    if fleet_mod.STATE.exists():
        fleet = fleet_mod.Fleet.load()
        answers = len(fleet.hosts) >= n and all(fleet.ssh(h, "true", check=False).returncode == 0 for h in fleet.hosts)
        if answers:
            fleet.hosts = fleet.hosts[:n]
            fleet.kept = True  # type: ignore[attr-defined]
            return fleet
    engines: dict[str, object] = {"llama.cpp": llama_engine()}
    for attempt in range(2):
        try:
            return fleet_mod.up(n, engines=engines)
        except RuntimeError as exc:
            print(f"(fleet boot {attempt + 1} failed: {exc}; retrying)", file=sys.stderr)
    return fleet_mod.up(n, engines=engines)


def release_fleet(fleet: fleet_mod.Fleet) -> None:
    """Take down a fleet boot_fleet booted; one that was already up stays up."""
    from tests import fleet as fleet_mod

    if not getattr(fleet, "kept", False):
        fleet_mod.down(fleet)


def print_row(row: Row, t: Timing) -> None:
    target = f"<= {row.target:g}x" if row.target is not None else "-"
    verdict = "" if row.target is None else ("met" if t.ratio <= row.target else "NOT MET")
    print(
        f"{row.figure:<40} {min(t.figure):>6.3f} {statistics.median(t.figure):>7.3f}   "
        f"{row.floor:<25} {min(t.floor):>6.3f} {statistics.median(t.floor):>7.3f}   "
        f"{t.ratio:>5.2f}x {target:>8} {verdict}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15, help="timed runs of each figure and of its floor")
    parser.add_argument("--fleet", action="store_true", help=f"also facts on 1 and {FLEET_HOSTS} fleet hosts (root)")
    args = parser.parse_args(argv)
    print(f"{'figure':<40} {'min s':>6} {'median':>7}   {'floor':<25} {'min s':>6} {'median':>7}   ratio   target")
    for row in local_rows():
        print_row(row, measure(row, args.runs))
    if args.fleet:
        with fleet_rows() as rows:
            for row in rows:
                print_row(row, measure(row, max(3, args.runs // 3)))
    else:
        print(f"(facts on 1 and {FLEET_HOSTS} hosts against ssh: run with --fleet, as root)")
    print(f"ratio = median figure / median floor, both timed in turn in this run; {sys.executable}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
