"""Output a reviewer reads once (issue 16 §4), on the real fleet: a scale-down reads `replicas 2 → 1` and the
closing line counts replicas; a unit edited by hand on a host is shown as the diff of its text (a token pasted
into it hidden) in the terminal, the JSON plan, the saved plan and the Markdown, and its repair keeps the
revision; `destroy` speaks as destroy from its plan to its last line. Real hosts, real SSH, real systemd, the
real llama-server and the tiny model."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.fleetproject import ROOT, Project

pytestmark = pytest.mark.fleet

SECRET = "hf_pasted_by_hand_0123456789"


def test_scale_down_a_hand_edited_unit_and_destroy_read_as_they_are(project: Project) -> None:
    project.write("replicas: {min: 2, max: 2}\ncontext_length: 512")
    project.cli("apply", "--auto-approve", check=True)

    # a scale-down: replicas 2 → 1, counted in the closing line (max 2 would keep slot 1, on demand)
    project.write("replicas: {min: 1, max: 1}\ncontext_length: 512")
    down = project.cli("plan", check=True).stdout
    assert "(replicas 2 → 1)" in down and "replicas 1 → 1" not in down, down
    assert "Plan: 0 to add, 1 to change, 0 to destroy. Replicas: 1 to remove." in down, down
    project.cli("apply", "--auto-approve", check=True)
    (kept,) = project.replicas()
    revision = project.state()["deployments"][project.name]["revision"]

    # a hand edit: the plan shows what changed in the unit's text, never the token pasted into it
    unit = f"/etc/systemd/system/{kept['unit']}"
    project.fleet.ssh(
        project.host_of(kept),
        f"sed -i -e 's/^RestartSec=5/RestartSec=1/' -e '/^\\[Service\\]/a Environment=HF_TOKEN={SECRET}' {unit}",
    )
    planned = project.cli("plan")
    text = planned.stdout
    assert planned.returncode == 0, text + planned.stderr
    assert f"--- {kept['host']}:{unit} (edited by hand)" in text, text
    assert "-RestartSec=1" in text and "+RestartSec=5" in text
    assert "-Environment=HF_TOKEN=(sensitive)" in text and SECRET not in text
    assert text.index("+RestartSec=5") < text.index("engine-ctl will perform the following actions:")
    assert f"will be updated in place (revision {revision} stays: the documents did not change)" in text
    assert f"revision {revision} → {revision}" not in text
    assert "Replicas: 1 to repair." in text

    saved = project.path / "repair.plan.json"
    as_json = project.cli("plan", "--json", "--out", str(saved), check=True).stdout
    (drift,) = json.loads(as_json)["drift"]
    assert drift["kind"] == "edited" and "+RestartSec=5" in drift["diff"]
    assert SECRET not in as_json and SECRET not in saved.read_text()

    markdown = project.cli("plan", "--markdown", check=True).stdout
    assert SECRET not in markdown
    warning, diff_block, section = (markdown.index(s) for s in ("[!WARNING]", "```diff\n---", f"<b>{project.name}</b>"))
    assert warning < diff_block < section, markdown  # the warnings first, then the unit's diff, then the change

    project.cli("apply", "--auto-approve", check=True)
    assert "RestartSec=5" in project.fleet.ssh(project.host_of(kept), f"cat {unit}").stdout
    status = project.cli("status", project.name, check=True).stdout
    header = next(line for line in status.splitlines() if line.startswith("INSTANCE"))
    assert header.split() == ["INSTANCE", "HOST", "STATE", "LIFECYCLE", "DEVICES", "LAST", "ERROR"], status
    assert f"Units: engine-ctl-{project.name}-<INSTANCE><SLOT>.service on each HOST" in status

    # destroy: asked as destroy, cancelled as destroy, done as destroy
    refused = _destroy(project, subprocess.DEVNULL)  # stdin is not a terminal
    assert refused.returncode == 1 and "destroy asks for confirmation" in refused.stderr
    assert "apply asks" not in refused.stderr and "apply a saved plan file" not in refused.stderr
    cancelled = _destroy_answering(project, "no")
    assert cancelled.returncode == 1, cancelled.stdout + cancelled.stderr
    assert "Do you really want to destroy these deployments?" in cancelled.stdout
    assert "Destroy cancelled; nothing was destroyed." in cancelled.stdout and "Apply" not in cancelled.stdout
    assert project.health(project.replicas()[0]) == 200
    done = project.cli("destroy", "--auto-approve", check=True).stdout
    assert "engine-ctl destroy will stop and remove the units of these deployments:" in done
    assert f"# {project.name} will be destroyed: its units stopped and removed (the model stays)" in done
    assert "engine-ctl destroy destroys it" in done and f"{kept['unit']} (destroyed)" in done
    assert "Plan: 0 to add, 0 to change, 1 to destroy. Replicas: 1 to remove." in done
    assert "Destroy complete: destroyed. (1 deployment destroyed as planned)" in done
    for wrong in ("removed from the documents", "not in the documents", "Apply complete", "Apply cancelled"):
        assert wrong not in done, wrong
    assert project.state()["deployments"] == {}
    nothing = project.cli("destroy", "--auto-approve", check=True).stdout
    assert "Nothing to destroy: the state has no deployments." in nothing and "No changes" not in nothing


def _destroy(project: Project, stdin: int) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "engine_ctl", "destroy", str(project.path), "--inventory", project.fleet.inventory]
    proc = subprocess.run(argv, stdin=stdin, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def _destroy_answering(project: Project, answer: str) -> subprocess.CompletedProcess[str]:
    """engine-ctl destroy with a terminal on stdin (a pty) that answers the prompt."""
    primary, secondary = os.openpty()
    try:
        os.write(primary, f"{answer}\n".encode())
        return _destroy(project, secondary)
    finally:
        os.close(primary)
        os.close(secondary)
