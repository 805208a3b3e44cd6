"""apply honours --fanout across hosts (issue 10), on the real fleet with the real llama-server: two deployments
on two hosts roll one host at a time under --fanout 1, side by side under --fanout 2."""

from __future__ import annotations

import json
import textwrap

import pytest

from tests.fleetproject import Project

pytestmark = pytest.mark.fleet


def _two_deployments(project: Project) -> list[str]:
    hosts = [h.name for h in project.fleet.hosts[:2]]
    docs = "kind: Model\nmetadata: {name: tiny}\nspec: {format: gguf, path: tiny/tiny.gguf, parameters: 4170048}\n"
    for i, host in enumerate(hosts):
        docs += textwrap.dedent(f"""\
            ---
            metadata: {{name: {project.name}-{i}}}
            spec: {{model: tiny, accelerator: cpu, context_length: 512, host: {host}}}
            """)
    (project.path / "docs.yaml").write_text(docs)
    return hosts


def _windows(project: Project) -> list[tuple[int, int]]:
    """Each deployment's unit: (when its start began, when it passed its health gate), CLOCK_MONOTONIC in µs
    (one kernel clock for every host of the fleet)."""
    out = []
    for _name, rec in sorted(project.state()["deployments"].items()):
        (replica,) = rec["replicas"]
        shown = project.fleet.ssh(
            project.host_of(replica),
            f"systemctl show -p InactiveExitTimestampMonotonic -p ActiveEnterTimestampMonotonic {replica['unit']}",
        ).stdout
        values = dict(line.split("=", 1) for line in shown.split())
        out.append((int(values["InactiveExitTimestampMonotonic"]), int(values["ActiveEnterTimestampMonotonic"])))
    return out


def test_fanout_one_works_on_one_host_at_a_time_and_two_on_both(project: Project) -> None:
    _two_deployments(project)
    applied = project.cli("apply", "--auto-approve", "--fanout", "1", "--json", check=True)
    events = [json.loads(line) for line in applied.stdout.splitlines()]
    healthy = [e for e in events if e["event"] == "healthy"]
    assert len(healthy) == 2, applied.stdout
    (_, a_ready), (b_start, _) = sorted(_windows(project))
    assert b_start >= a_ready, "under --fanout 1 the second host's replica started before the first one was up"
    project.cli("destroy", "--auto-approve", check=True)
    project.cli("apply", "--auto-approve", "--fanout", "2", check=True)
    (_, a_ready), (b_start, _) = sorted(_windows(project))
    assert b_start < a_ready, "under --fanout 2 the two hosts' replicas started one after the other"
