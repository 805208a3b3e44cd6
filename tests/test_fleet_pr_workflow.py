"""The PR-review example (examples/pr-review) run as written, in order, on the real fleet with the state in a
real PostgreSQL: the workflow's own engine-ctl steps, taken from workflow.yml, on a "pull request" checkout
(plan file and Markdown), then after "merge" on a fresh checkout with only the downloaded plan artifact
(apply converges, the replica answers /health), then the same plan file again (refused as stale)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from engine_ctl.state import PostgresState, open_backend
from ruamel.yaml import YAML

from engine_ctl.cli.environments import state_for_env
from tests.fleetproject import ROOT, Project

EXAMPLE = ROOT / "examples/pr-review"
DSN = os.environ.get("ENGINE_CTL_TEST_PG", "postgresql:///engine_ctl_test")


def workflow() -> dict[str, Any]:
    loaded = YAML(typ="safe").load((EXAMPLE / "workflow.yml").read_text())
    assert isinstance(loaded, dict)
    return loaded


def step(job: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [s for s in job["steps"] if s.get("name") == name]
    return found


ENV = "staging"
"""The environment the flow runs for here (the matrix's first); production's run is the same with its own files."""


def checkout(where: Path, project: Project) -> Path:
    """A checkout of the repository the example assumes: deploy/ and hosts.<env>.yaml (and engine-ctl in .venv)."""
    (where / "deploy").mkdir(parents=True)
    shutil.copy(project.path / "docs.yaml", where / "deploy" / "docs.yaml")
    shutil.copy(project.fleet.inventory, where / f"hosts.{ENV}.yaml")
    shim = where / ".venv" / "bin" / "engine-ctl"
    shim.parent.mkdir(parents=True)
    shim.write_text(f'#!/bin/sh\nexec {sys.executable} -m engine_ctl "$@"\n')
    shim.chmod(0o755)
    return where


def job_env(job: dict[str, Any]) -> dict[str, str]:
    """The job's env for the matrix entry ENV (${{ matrix.env }} is all the runner fills in there)."""
    assert job["strategy"]["matrix"]["env"] == ["staging", "production"]
    return {k: v.replace("${{ matrix.env }}", ENV) for k, v in job["env"].items()}


def run_step(where: Path, script: str, state: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """A workflow step's `run`, as written, in bash as GitHub Actions runs it (-e, pipefail)."""
    assert "${{" not in script, script  # nothing for the runner to fill in: the test runs the very text
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENGINE_CTL_")} | {"ENGINE_CTL_STATE": state} | env
    proc = subprocess.run(
        ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script],
        cwd=where, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def commands(script: str) -> list[str]:
    """The engine-ctl command lines of a shell text, continuations joined, without the venv's path."""
    joined = script.replace("\\\n", " ")
    lines = [" ".join(line.split()).replace(".venv/bin/engine-ctl", "engine-ctl") for line in joined.splitlines()]
    return [line for line in lines if line.startswith("engine-ctl ")]


def test_the_readme_shows_the_workflows_commands() -> None:
    flow = workflow()
    steps = [step(flow["jobs"]["plan"], "engine-ctl plan"), step(flow["jobs"]["apply"], "engine-ctl apply")]
    readme = (EXAMPLE / "README.md").read_text()
    block = readme.split("```sh\n", 1)[1].split("```", 1)[0]
    shown = [line.split("  #")[0].strip() for line in commands(block)]
    assert shown == [c for s in steps for c in commands(s["run"])]


@pytest.mark.fleet
def test_the_pr_review_workflow_in_order_on_a_postgresql_state(project: Project, tmp_path: Path) -> None:
    flow = workflow()
    plan_job, apply_job = flow["jobs"]["plan"], flow["jobs"]["apply"]
    assert "${{ vars.ENGINE_CTL_STATE }}" in flow["env"]["ENGINE_CTL_STATE"]
    # the apply job applies the reviewed artifact: it downloads it and never plans again
    uses = [s.get("uses", "") for s in apply_job["steps"]]
    runs = " ".join(s.get("run", "") for s in apply_job["steps"])
    assert any(u.startswith("actions/download-artifact") for u in uses) and "engine-ctl plan" not in runs
    upload = next(s for s in plan_job["steps"] if s.get("uses", "").startswith("actions/upload-artifact"))
    download = next(s for s in apply_job["steps"] if s.get("uses", "").startswith("actions/download-artifact"))
    assert upload["with"]["path"] == "pr.plan.json"
    assert upload["with"]["name"].split("${{")[0] == download["with"]["name"].split("${{")[0] == "plan-"

    state = f"{DSN}#pr-{uuid.uuid4().hex[:8]}"
    assert job_env(apply_job) == job_env(plan_job) == {"ENGINE_CTL_ENV": ENV}
    backend = open_backend(state_for_env(state, ENV))  # the environment's own state in that database
    assert isinstance(backend, PostgresState)
    project.write("context_length: 512")
    try:
        # on the pull request
        pr = checkout(tmp_path / "pr", project)
        planned = run_step(pr, step(plan_job, "engine-ctl plan")["run"], state, job_env(plan_job))
        assert planned.returncode == 0, planned.stdout + planned.stderr
        markdown = (pr / "plan.md").read_text()
        assert project.name in markdown and "1 to add" in markdown
        assert backend.read().serial == 0  # a plan writes no state
        # after merge: a fresh checkout of main, with the artifact the review saw
        main = checkout(tmp_path / "main", project)
        shutil.copy(pr / "pr.plan.json", main / "pr.plan.json")
        apply_run = step(apply_job, "engine-ctl apply")["run"]
        applied = run_step(main, apply_run, state, job_env(apply_job))
        assert applied.returncode == 0, applied.stdout + applied.stderr
        recorded = backend.read()
        (replica,) = recorded.deployments[project.name].replicas
        assert replica.status == "serving" and project.health(replica.model_dump()) == 200
        assert json.loads((pr / "pr.plan.json").read_text())["state_lineage"] == recorded.lineage
        assert project.cli("plan", "--detailed-exitcode", "--state", state, "--env", ENV).returncode == 0  # converged
        assert open_backend(state).read().serial == 0  # the state without the environment was never touched
        # the same plan file again (a re-run of the job): refused, nothing done
        again = run_step(main, apply_run, state, job_env(apply_job))
        assert again.returncode == 1 and "the saved plan is stale" in again.stderr, again.stdout + again.stderr
        assert backend.read().serial == recorded.serial
    finally:
        project.cli("destroy", "--auto-approve", "--state", state, "--env", ENV)
