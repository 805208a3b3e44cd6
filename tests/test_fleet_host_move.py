"""A plan means the same thing every time, on the real fleet: three plans in a row are identical and render agrees;
changing spec.host replaces the replica onto the new host (the old unit is gone, the new one serves); a host not
in the inventory is refused with a did-you-mean; weights on no host make the replica
Pending with the seed's reason. Real hosts, real SSH, the real llama-server, the tiny model."""

from __future__ import annotations

import json
import textwrap

import pytest

from tests.fleetproject import MODELS_DIR, Project
from tests.helpers import plan_without_offered_lineage, unit_text_without_lineage

pytestmark = pytest.mark.fleet


def _plan_json(p: Project) -> dict:  # type: ignore[type-arg]
    proc = p.cli("plan", "--json", check=True)
    doc = json.loads(proc.stdout)
    doc.pop("created_at")
    # no state yet: each plan offers a new lineage (the state adopts the applied one's), which the units carry
    return plan_without_offered_lineage(doc)


def test_three_plans_in_a_row_are_identical_and_render_agrees(project: Project) -> None:
    project.write("replicas: {min: 2, max: 2}\ncontext_length: 512")
    plans = [_plan_json(project) for _ in range(3)]
    assert plans[0] == plans[1] == plans[2]
    (change,) = plans[0]["changes"]
    planned = [(r["index"], r["host"], r["port"], r["unit_text"]) for r in change["replicas"]]
    assert [h for _, h, _, _ in planned] == [project.fleet.hosts[0].name, project.fleet.hosts[1].name]
    argv = ("render", project.name, str(project.path), "--inventory", project.fleet.inventory, "--json")
    rendered = json.loads(project.cli(*argv, docs=False, check=True).stdout)
    shown = [(p["index"], p["host"], p["port"]) for p in rendered["placements"]]
    assert shown == [(i, h, port) for i, h, port, _ in planned]
    assert [unit_text_without_lineage(u["text"]) for u in rendered["units"]] == [text for *_, text in planned]


def test_a_host_move_replaces_the_replica_onto_the_new_host(project: Project) -> None:
    first, second = project.fleet.hosts[0].name, project.fleet.hosts[1].name
    project.write(f"host: {first}\ncontext_length: 512")
    project.cli("apply", "--auto-approve", check=True)
    (old,) = project.replicas()
    assert old["host"] == first and project.health(old) == 200

    project.write(f"host: {second}\ncontext_length: 512")
    planned = project.cli("plan")
    assert planned.returncode == 0, planned.stdout + planned.stderr
    assert f"{first} → {second}" in planned.stdout and "+/-" in planned.stdout
    assert "spec.host" in planned.stdout
    applied = project.cli("apply", "--auto-approve")
    assert applied.returncode == 0, applied.stdout + applied.stderr

    (new,) = project.replicas()
    assert new["host"] == second and new["status"] == "serving"
    assert project.health(new) == 200
    assert project.chat(new)["model"] == project.name
    gone = project.fleet.ssh(project.host_of(old), f"systemctl is-active {old['unit']} || true").stdout.strip()
    assert gone in ("inactive", "unknown"), gone
    again = project.cli("plan", "--detailed-exitcode")
    assert again.returncode == 0, again.stdout  # nothing left to do: the replica is where the document says


def test_a_host_not_in_the_inventory_is_refused_with_a_did_you_mean(project: Project) -> None:
    typo = project.fleet.hosts[1].name + "x"
    project.write(f"host: {typo}\ncontext_length: 512")
    for args in (("plan",), ("apply", "--auto-approve")):
        proc = project.cli(*args)
        assert proc.returncode == 1
        assert f'spec.host "{typo}": no host of that name in the inventory' in proc.stderr
        assert f"did you mean '{project.fleet.hosts[1].name}'?" in proc.stderr
    assert not project.state_file.exists()


def test_weights_on_no_host_make_the_replica_pending(project: Project) -> None:
    """The shape is stated (spec.architecture), so the fit is known; the file is on no host: no host is chosen,
    and the plan says what it waits for, and exits 1: the document is not served, and no apply can serve it now."""
    (project.path / "docs.yaml").write_text(
        textwrap.dedent(
            f"""
            kind: Model
            metadata: {{name: tiny}}
            spec:
              format: gguf
              path: tiny/absent.gguf
              parameters: 4170048
              weights_bytes: 16680192
              context_length: 2048
              architecture: {{layers: 2, heads: 4, kv_heads: 2, embedding_length: 64}}
            ---
            metadata: {{name: {project.name}}}
            spec: {{model: tiny, accelerator: cpu, context_length: 512}}
            """
        )
    )
    proc = project.cli("plan", "--json")
    assert proc.returncode == 1, proc.stderr  # Pending: not served, and no apply can serve it now
    (change,) = json.loads(proc.stdout)["changes"]
    assert change["replicas"] == []
    assert change["pending_reason"].startswith(f"Waiting for the weights of tiny at {MODELS_DIR}/tiny/absent.gguf (")
    assert set(change["waiting"]) == {h.name for h in project.fleet.hosts}
