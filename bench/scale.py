"""The pure planner at fleet scale, by simulation (issue 10, section 3). No hosts: synthetic facts in the real
HostFacts shape (GPU hosts with 8 H100s parsed from a recorded nvidia-smi CSV, CPU hosts), a few models and
deployments of 5 replicas each, 60% on one GPU, 40% on CPU cores.

For 100, 1,000 and 5,000 replicas on 20, 200 and 1,000 hosts it times, each the least CPU time of --runs:

- plan:        make_plan from an empty state (every replica created, placed and rendered);
- + load:      the same with the documents parsed and loaded from YAML text first;
- replan:      make_plan against the state that plan records once applied (every replica re-rendered and found
               unchanged: the everyday no-op plan);
- text:        the plan's text view (what `engine-ctl plan` prints), of the first plan;
- markdown:    the plan's Markdown for a pull request (summary first, details collapsed, cut at GitHub's limit).

and the ratio of each figure to the one of the size before (10x and 5x more replicas and hosts).

Targets: 5,000 replicas on 1,000 hosts planned in <= 1 s; each 10x step of plan, + load and replan <= 12x time;
the text view <= 1 s more.

Run:  .venv/bin/python -m bench.scale [--runs 3] [--profile]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from engine_ctl.cli.views.plan import plan_markdown, plan_text
from engine_ctl.core.documents.inventory import Host, Inventory
from engine_ctl.core.documents.loader import load_documents
from engine_ctl.core.documents.yamlsource import parse_text
from engine_ctl.core.fit.hostfacts import Cpu, EngineInstall, HostFacts, Memory, UnitFact, parse_nvidia_smi
from engine_ctl.core.fit.modelfacts import ModelFacts
from engine_ctl.core.model import DesiredState
from engine_ctl.core.plan.changes import DELETE, Plan
from engine_ctl.core.plan.planner import make_plan
from engine_ctl.core.record.model import DeploymentRecord, ReplicaRecord, State
from engine_ctl.core.sizes import GIB

RECORDING = Path(__file__).resolve().parent.parent / "tests" / "recordings" / "nvidia-smi-8xH100.csv"
"""Real nvidia-smi output (tests/recordings/README.md): each GPU host is this machine with its own UUIDs."""
SIZES = ((100, 20), (1_000, 200), (5_000, 1_000))
PER_DEPLOYMENT = 5
LINEAGE = "00000000-0000-4000-8000-000000000000"
"""The state's lineage: each unit's header carries it, so the re-plan's state has the first plan's."""
TARGET_PLAN_S = 1.0
TARGET_STEP = 12.0
TARGET_TEXT_S = 1.0
PLANNING = ("plan", "+ load", "replan")
"""The figures held to the linear-growth target (the views take milliseconds at the small sizes)."""
MODELS = """kind: Model
metadata: {name: llama-8b}
spec: {format: gguf, path: llama-8b/llama-8b-q4.gguf, context_length: 131072}
---
kind: Model
metadata: {name: qwen-0-5b}
spec: {format: gguf, path: qwen/qwen-0.5b-q8.gguf, context_length: 32768}
"""
MODEL_FACTS = {
    "llama-8b": ModelFacts(block_count=32, head_count=32, head_count_kv=8, embedding_length=4096,
                           context_length=131072, weights_bytes=4_900_000_000),
    "qwen-0-5b": ModelFacts(block_count=24, head_count=14, head_count_kv=2, embedding_length=896,
                            context_length=32768, weights_bytes=530_000_000, parameters=494_000_000),
}  # fmt: skip
ENGINES = {"llama.cpp": EngineInstall(path="/usr/local/bin/llama-server", version="b4000")}


def gpu_host(i: int, csv: str) -> HostFacts:
    uuids = csv.replace("GPU-2f7b6c1e-5a0d-4c3e-9b1f-0a1b2c3d4e5", f"GPU-{i:08x}-0000-4000-8000-00000000000")
    return HostFacts(
        host=f"gpu-{i:04}", hostname=f"gpu-{i:04}", arch="x86_64", engines=ENGINES,
        cpu=Cpu(cores=96, model="AMD EPYC 9454", flags=("avx2", "avx512f")),
        memory=Memory(total_bytes=2048 * GIB, available_bytes=2000 * GIB), gpus=tuple(parse_nvidia_smi(uuids)),
    )  # fmt: skip


def cpu_host(i: int) -> HostFacts:
    return HostFacts(
        host=f"cpu-{i:04}", hostname=f"cpu-{i:04}", arch="x86_64", engines=ENGINES,
        cpu=Cpu(cores=64, model="Intel Xeon", flags=("avx2",)),
        memory=Memory(total_bytes=512 * GIB, available_bytes=500 * GIB),
    )  # fmt: skip


def fleet(hosts: int) -> tuple[Inventory, dict[str, HostFacts]]:
    """80% GPU hosts (8 GPUs each), 20% CPU hosts."""
    csv = RECORDING.read_text()
    gpus = hosts * 4 // 5
    facts = [gpu_host(i, csv) for i in range(gpus)] + [cpu_host(i) for i in range(hosts - gpus)]
    inventory = Inventory(hosts=tuple(Host(name=f.host, address=f.host, models_dir="/srv/models") for f in facts))
    return inventory, {f.host: f for f in facts}


def documents(replicas: int) -> str:
    """replicas / 5 deployments of 5 replicas: 3 of every 5 on one GPU (llama-8b), 2 on 4 CPU cores (qwen)."""
    out = [MODELS]
    for i in range(replicas // PER_DEPLOYMENT):
        if i % 5 < 3:
            spec = "model: llama-8b, gpus: 1, context_length: 8192"
        else:
            spec = "model: qwen-0-5b, accelerator: cpu, cpu_cores: 4, context_length: 4096"
        out.append(f"metadata: {{name: chat-{i:04}}}\nspec: {{{spec}, replicas: {{min: 5, max: 5}}}}\n")
    return "---\n".join(out)


def load(text: str) -> DesiredState:
    docs, problems = parse_text(text, "bench.yaml")
    assert not problems, problems
    result = load_documents(docs)
    assert not [d for d in result.diagnostics if d.severity == "error"], result.diagnostics[:3]
    return result.desired


def applied(plan: Plan, facts: dict[str, HostFacts]) -> tuple[State, dict[str, HostFacts]]:
    """The state a successful apply of `plan` records, and the hosts' facts with the units it wrote."""
    state = State(lineage=LINEAGE, serial=1)
    units: dict[str, list[UnitFact]] = {h: [] for h in facts}
    for c in plan.changes:
        replicas = []
        for r in c.replicas:
            replicas.append(ReplicaRecord(
                index=r.index, slot="a", host=r.host, unit=r.unit, port=r.port, gpus=r.gpus,
                gpu_indexes=r.gpu_indexes, unit_sha256=r.unit_sha256 or "", revision=r.revision, argv=r.argv,
                status="serving",
            ))  # fmt: skip
            units[r.host].append(UnitFact(name=r.unit, sha256=r.unit_sha256, active_state="active",
                                          sub_state="running"))  # fmt: skip
        state.deployments[c.name] = DeploymentRecord(
            name=c.name, revision=c.revision, spec=c.spec, model=c.model, spec_hash=c.spec_hash, plan=c.fit,
            state="Ready", chosen=dict(c.chosen), replicas=replicas,
        )  # fmt: skip
    return state, {h: f.model_copy(update={"units": tuple(units[h])}) for h, f in facts.items()}


def timed(fn: Callable[[], object], runs: int) -> tuple[float, object]:
    """The least CPU time of `runs` calls (this process's: the planner is one thread, and on a shared machine the
    wall clock also counts other processes' turns; the least is the run others disturbed least), and the last
    result."""
    times, result = [], None
    for _ in range(runs):
        start = time.process_time()
        result = fn()
        times.append(time.process_time() - start)
    return min(times), result


@dataclass
class Row:
    replicas: int
    hosts: int
    figures: dict[str, float]
    markdown_chars: int
    placed: int


def measure(replicas: int, hosts: int, runs: int) -> Row:
    inventory, facts = fleet(hosts)
    text = documents(replicas)
    desired = load(text)
    plan_s, first = timed(lambda: make_plan(desired, State(lineage=LINEAGE), inventory, facts, MODEL_FACTS), runs)
    assert isinstance(first, Plan)
    loaded_s, _ = timed(lambda: make_plan(load(text), State(lineage=LINEAGE), inventory, facts, MODEL_FACTS), runs)
    state, after = applied(first, facts)
    replan_s, again = timed(lambda: make_plan(desired, state, inventory, after, MODEL_FACTS), runs)
    assert isinstance(again, Plan) and not again.has_changes, "the plan of an applied state has no changes"
    text_s, _ = timed(lambda: plan_text(first), runs)
    markdown_s, markdown = timed(lambda: plan_markdown(first, "plan.json"), runs)
    assert isinstance(markdown, str) and readable(markdown)
    placed = sum(len(c.replicas) for c in first.changes if c.actions != DELETE)
    figures = {"plan": plan_s, "+ load": loaded_s, "replan": replan_s, "text": text_s, "markdown": markdown_s}
    return Row(replicas, hosts, figures, len(markdown), placed)


def readable(markdown: str) -> bool:
    """The summary line first; every deployment's details collapsed (<details>, closed as often as opened)."""
    return markdown.startswith("### engine-ctl plan: ") and markdown.count("<details>") == markdown.count("</details>")


def report(rows: list[Row]) -> int:
    names = list(rows[0].figures)
    print(f"{'replicas':>8} {'hosts':>6} " + " ".join(f"{n:>16}" for n in names) + "   markdown chars")
    failures = []
    for before, row in zip([None, *rows], rows, strict=False):
        cells = []
        for name in names:
            seconds = row.figures[name]
            ratio = f"({seconds / before.figures[name]:4.1f}x)" if before else " " * 7
            cells.append(f"{seconds:8.3f}s {ratio}")
            step = row.replicas / before.replicas if before else 0
            if before and step == 10 and name in PLANNING and seconds / before.figures[name] > TARGET_STEP:
                failures.append(f"{name} grew {seconds / before.figures[name]:.1f}x for 10x ({row.replicas})")
        print(
            f"{row.replicas:>8} {row.hosts:>6} " + " ".join(f"{c:>16}" for c in cells) + f"   {row.markdown_chars:>8}"
        )
        assert row.placed == row.replicas, f"{row.placed} of {row.replicas} replicas placed"
    last = rows[-1]
    if last.figures["plan"] > TARGET_PLAN_S:
        failures.append(
            f"plan of {last.replicas} replicas took {last.figures['plan']:.2f} s (target {TARGET_PLAN_S} s)"
        )
    if last.figures["text"] > TARGET_TEXT_S:
        failures.append(f"the text view took {last.figures['text']:.2f} s (target {TARGET_TEXT_S} s)")
    print("(x) = this size's time / the size before's (10x, then 5x more replicas and hosts)")
    verdict = "met" if not failures else "NOT MET: " + "; ".join(failures)
    print(f"targets: plan of {last.replicas} replicas <= {TARGET_PLAN_S:g} s; each 10x step <= {TARGET_STEP:g}x; "
          f"text view <= {TARGET_TEXT_S:g} s: {verdict}")  # fmt: skip
    return 1 if failures else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="timed runs of each figure (the least is shown)")
    parser.add_argument("--sizes", type=int, default=len(SIZES), help="how many of the sizes to run (1 to 3)")
    parser.add_argument("--profile", action="store_true", help="profile the largest size's plan and replan")
    args = parser.parse_args(argv)
    sizes = SIZES[: args.sizes]
    if args.profile:
        return profile(*sizes[-1])
    rows = [measure(replicas, hosts, args.runs) for replicas, hosts in sizes]
    return report(rows)


def profile(replicas: int, hosts: int) -> int:
    import cProfile
    import pstats

    inventory, facts = fleet(hosts)
    desired = load(documents(replicas))
    with cProfile.Profile() as prof:
        make_plan(desired, State(), inventory, facts, MODEL_FACTS)
    pstats.Stats(prof).sort_stats("cumulative").print_stats(35)
    return 0


if __name__ == "__main__":
    sys.exit(main())
