"""Fewest replicas of a deployment per host, on the real fleet with the real llama-server (issue 24, point 15):
a roll of a 2-replica deployment while a host has just freed its cores keeps the replicas on two hosts (the
replica with no room for a surge on its own host stops and starts there rather than surging beside the other),
and a plan after room appears reports the spread it can restore, and apply restores it. Filler deployments
pinned to hosts take the cores (each fleet host has the machine's cores)."""

from __future__ import annotations

import os
import textwrap

import pytest

from tests.fleetproject import Project
from tests.test_fleet_trust import cut_off

pytestmark = pytest.mark.fleet
CORES = os.cpu_count() or 2
MODEL = "kind: Model\nmetadata: {name: tiny}\nspec: {format: gguf, path: tiny/tiny.gguf, parameters: 4170048}\n"


def deployment(name: str, cores: int, host: str | None = None, replicas: int = 1, context: int = 512) -> str:
    pin = f", host: {host}" if host else ""
    return textwrap.dedent(f"""\
        ---
        metadata: {{name: {name}}}
        spec: {{model: tiny, accelerator: cpu, cpu_cores: {cores}, context_length: {context}{pin}, priority: {
        0 if name == "chat" else 5
    }, replicas: {{min: {replicas}, max: {replicas}}}}}
        """)


def write(p: Project, fillers: dict[str, tuple[int, str]], chat_context: int | None = 512) -> None:
    text = MODEL + "".join(deployment(n, c, h) for n, (c, h) in sorted(fillers.items()))
    if chat_context is not None:
        text += deployment("chat", 1, replicas=2, context=chat_context)
    (p.path / "docs.yaml").write_text(text)


def hosts_of(p: Project, name: str) -> list[str]:
    return sorted(r["host"] for r in p.state()["deployments"][name]["replicas"])


def test_the_plan_restores_a_broken_spread_and_a_roll_keeps_it(project: Project) -> None:
    h = [x.name for x in project.fleet.hosts]
    assert CORES >= 2 and len(h) >= 4
    # 1. h0..h2 full: chat's two replicas can only go to h3, both
    fillers = {"fa": (CORES, h[0]), "fb": (CORES, h[1]), "fc": (CORES, h[2])}
    write(project, fillers)
    project.cli("apply", "--auto-approve", check=True)
    assert hosts_of(project, "chat") == [h[3], h[3]]
    # 2. h1 frees its cores (fb removed): the next plan moves one replica there, and says why
    del fillers["fb"]
    write(project, fillers)
    project.cli("apply", "--auto-approve", check=True)
    plan = project.cli("plan", "--detailed-exitcode")
    assert plan.returncode == 2, plan.stdout + plan.stderr
    assert f"moved: 2 replicas of chat on {h[3]}, and {h[1]} has room with 0" in plan.stdout, plan.stdout
    project.cli("apply", "--auto-approve", check=True)
    assert hosts_of(project, "chat") == sorted([h[1], h[3]])
    assert project.cli("plan", "--detailed-exitcode").returncode == 0
    # 3. h1 and h3 hold one replica each with one core left; h2 frees its cores, and chat rolls: replica on h1
    #    surges onto h2, and the other, with no room on h3 for a surge, stops and starts there (not beside it)
    fillers = {"fa": (CORES, h[0]), "fb": (CORES - 1, h[1]), "fd": (CORES - 1, h[3])}
    write(project, fillers)
    project.cli("apply", "--auto-approve", check=True)
    assert hosts_of(project, "chat") == sorted([h[1], h[3]])
    write(project, fillers, chat_context=1024)
    plan = project.cli("plan", "--detailed-exitcode")
    assert plan.returncode == 2 and "stop-then-start" in plan.stdout, plan.stdout
    project.cli("apply", "--auto-approve", check=True)
    after = hosts_of(project, "chat")
    assert len(set(after)) == 2, after
    assert project.cli("plan", "--detailed-exitcode").returncode == 0


def test_with_a_host_cut_off_a_stop_then_start_of_the_only_reachable_replica_warns(project: Project) -> None:
    """Issue 24, point 16: chat's two replicas each take a whole host, the other hosts are full; one of chat's hosts
    is cut off. A roll can only stop and start the reachable replica: the plan warns that nothing will serve."""
    h = [x.name for x in project.fleet.hosts]
    fillers = {"fa": (CORES, h[0]), "fb": (CORES, h[1])}
    text = MODEL + "".join(deployment(n, c, host) for n, (c, host) in sorted(fillers.items()))
    (project.path / "docs.yaml").write_text(text + deployment("chat", CORES, replicas=2))
    project.cli("apply", "--auto-approve", check=True)
    assert hosts_of(project, "chat") == [h[2], h[3]]
    (project.path / "docs.yaml").write_text(text + deployment("chat", CORES, replicas=2, context=1024))
    with cut_off(project.fleet.hosts[3]):
        plan = project.cli("plan")
    warning = (f"chat will have no serving replica during the change: no free room for a surge, so stop-then-start, "
               f"and its other replicas are on hosts out of reach ({h[3]})")  # fmt: skip
    assert "stop-then-start" in plan.stdout and warning in " ".join((plan.stdout + plan.stderr).split()), plan.stdout
