"""validate at scale (issue 27, point 12): whole engine-ctl processes, as a user runs them.

| figure                                           | target                                              |
| validate of one file of 1,001 documents (~200 KB) | <= 1 s, the whole process (median)                  |
| validate of one document                          | <= 1.3x the floor: python -c importing click,       |
|                                                   | pydantic and ruamel.yaml and building one model     |

Each figure and its floor run in turn (floor, figure, floor, figure, ...), so a machine that slows down mid-run
slows both. Wall seconds are what a user waits; CPU seconds (user + system of the child) are printed beside
them, since on a shared, loaded machine the wall clock measures the other tenants too.

Run:  .venv/bin/python -m bench.validate [--runs 11]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.startup import ENV, ONE_MODEL, engine_ctl

MODEL = """kind: Model
metadata:
  name: tiny-llama
spec:
  format: gguf
  path: tiny-llama/tiny-llama-f32.gguf
  context_length: 2048
  parameters: 4170048
  capabilities: [chat]
"""
DEPLOYMENT = """---
metadata:
  name: chat-{i:04d}
  labels: {{team: bench, tier: t{tier}}}
spec:
  model: tiny-llama
  accelerator: cpu
  replicas: {{min: 1, max: 2}}
  context_length: 1024
  engine_args: [--temp, "0.7", --flash-attn=off]
"""
ONE_DOCUMENT = "name: tiny-chat\nmodel: tiny-llama/tiny.gguf\n"


def write_inputs(where: Path) -> tuple[Path, Path]:
    many = where / "many" / "docs.yaml"
    many.parent.mkdir()
    many.write_text(MODEL + "".join(DEPLOYMENT.format(i=i, tier=i % 3) for i in range(1000)))
    one = where / "one" / "chat.yaml"
    one.parent.mkdir()
    one.write_text(ONE_DOCUMENT)
    return many, one


@dataclass
class Runs:
    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)

    def run(self, argv: Sequence[str]) -> None:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        code = subprocess.run(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, env=ENV).returncode
        self.wall.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        if code != 0:
            raise SystemExit(f"{' '.join(argv)} exited {code}")

    def line(self, name: str) -> str:
        return (
            f"{name:<46} wall min {min(self.wall):6.3f}  median {statistics.median(self.wall):6.3f} s   "
            f"cpu median {statistics.median(self.cpu):6.3f} s"
        )


def measure(figure: Sequence[str], floor: Sequence[str], runs: int) -> tuple[Runs, Runs]:
    Runs().run(floor)  # warm-up, not counted: page cache and bytecode
    Runs().run(figure)
    fig, flo = Runs(), Runs()
    for _ in range(runs):
        flo.run(floor)
        fig.run(figure)
    return fig, flo


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT MET"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=11, help="timed runs of each figure and of its floor")
    args = parser.parse_args(argv)
    floor = [sys.executable, "-c", ONE_MODEL]
    with tempfile.TemporaryDirectory() as tmp:
        many, one = write_inputs(Path(tmp))
        print(f"1,001 documents: {many.stat().st_size:,} bytes; {args.runs} runs each, in turn with the floor")
        big, big_floor = measure([*engine_ctl(), "validate", str(many)], floor, args.runs)
        small, small_floor = measure([*engine_ctl(), "validate", str(one)], floor, args.runs)
    print(big_floor.line("floor: click + pydantic + ruamel.yaml + 1 model"))
    print(big.line("validate, 1,001 documents"))
    wall = statistics.median(big.wall)
    print(f"  -> {wall:.3f} s (target <= 1 s: {verdict(wall <= 1.0)}); "
          f"{statistics.median(big.cpu):.3f} s of CPU")  # fmt: skip
    print(small_floor.line("floor: click + pydantic + ruamel.yaml + 1 model"))
    print(small.line("validate, 1 document"))
    ratio = statistics.median(small.wall) / statistics.median(small_floor.wall)
    cpu_ratio = statistics.median(small.cpu) / statistics.median(small_floor.cpu)
    print(f"  -> {ratio:.2f}x the floor (target <= 1.3x: {verdict(ratio <= 1.3)}); CPU {cpu_ratio:.2f}x")
    print(f"medians of runs timed in turn in this run; {sys.executable}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
