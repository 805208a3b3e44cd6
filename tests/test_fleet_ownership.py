"""Ownership and adoption on the real fleet, with the real llama-server: `import` after the state is lost gives
an empty next plan, two states on one fleet see each other's units as owned elsewhere and never touch them, and
`state mv` turns a rename into a rolling replace."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.fleet import Fleet
from tests.fleetproject import Project

pytestmark = pytest.mark.fleet

DSN = os.environ.get("ENGINE_CTL_TEST_PG", "postgresql:///engine_ctl_test")


@pytest.fixture
def second(
    tmp_path_factory: pytest.TempPathFactory, fleet: Fleet, weights: None, project: Project
) -> Iterator[Project]:
    """Another project (its own directory and state) on the same fleet, destroyed afterwards."""
    other = Project(tmp_path_factory.mktemp("second"), fleet, project.name[:26] + "-two")
    yield other
    if other.state_file.exists():
        other.state_file.with_name(other.state_file.name + ".lock").unlink(missing_ok=True)
        other.cli("destroy", "--auto-approve")


def test_import_after_losing_the_state_adopts_every_unit_and_the_next_plan_is_empty(project: Project) -> None:
    project.write("replicas: {min: 2, max: 2}\ncontext_length: 512")
    project.cli("apply", "--auto-approve", check=True)
    lost = project.state()
    running = {r["unit"]: project.main_pid(r) for r in project.replicas()}
    project.state_file.unlink()
    project.state_file.with_name(project.state_file.name + ".backup").unlink(missing_ok=True)

    # Without the state, the units are another state's (their lineage is not the new state's): listed apart,
    # never drift; none of them is touched by a plan of the same documents.
    blind = json.loads(project.cli("plan", "--json").stdout)
    assert {u["unit"] for u in blind["owned_elsewhere"]} == set(running)
    assert {u["lineage"] for u in blind["owned_elsewhere"]} == {lost["lineage"]}
    assert not any(d["unit"] in running for d in blind["drift"])

    imported = project.cli("import", check=True)
    assert f"lineage {lost['lineage']} (the lineage in the units' headers)" in imported.stdout
    for r in lost["deployments"][project.name]["replicas"]:
        assert f"+ {project.name} replica {r['index']} on {r['host']}: {r['unit']} (revision 1" in imported.stdout
    assert "Imported: adopted 2 unit(s) of 1 deployment(s)" in imported.stdout
    rebuilt = project.state()
    assert rebuilt["lineage"] == lost["lineage"]
    keys = ("index", "slot", "host", "unit", "port", "unit_sha256", "revision", "argv", "status")
    assert [{k: r[k] for k in keys} for r in project.replicas()] == [
        {k: r[k] for k in keys} for r in lost["deployments"][project.name]["replicas"]
    ]
    again = project.cli("plan", "--detailed-exitcode")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "No changes. The hosts match the documents." in again.stdout and "Owned elsewhere" not in again.stdout
    assert {r["unit"]: project.main_pid(r) for r in project.replicas()} == running  # nothing was restarted
    history = json.loads(project.cli("state", "history", "--json", "--state", str(project.state_file)).stdout)
    assert history["operations"][-1]["command"] == "import"
    assert "adopted 2 unit(s)" in history["operations"][-1]["result"]

    refused = project.cli("import")
    assert refused.returncode == 1 and "already records 1 deployment(s)" in refused.stderr + refused.stdout
    forced = project.cli("import", "--force", check=True)
    assert f"the previous state (serial {rebuilt['serial']}) is kept in" in forced.stdout
    assert project.state()["deployments"] == rebuilt["deployments"]

    # the same hosts imported into a real PostgreSQL state: the same records, the same empty plan
    shared = f"{DSN}#import-{uuid.uuid4().hex[:8]}"
    try:
        project.cli("import", "--state", shared, check=True)
        from_pg = project.cli("plan", "--state", shared, "--detailed-exitcode")
        assert from_pg.returncode == 0 and "No changes." in from_pg.stdout, from_pg.stdout + from_pg.stderr
    finally:
        with psycopg.connect(DSN) as conn:
            for table in ("engine_ctl_state", "engine_ctl_state_history", "engine_ctl_lock"):
                conn.execute(f"DELETE FROM {table} WHERE name = %s", (shared.rsplit("#", 1)[1],))


def test_two_states_on_one_fleet_see_each_others_units_as_owned_elsewhere(project: Project, second: Project) -> None:
    project.write("context_length: 512")
    project.cli("apply", "--auto-approve", check=True)
    (mine,) = project.replicas()
    pid = project.main_pid(mine)
    lineage = project.state()["lineage"]

    second.write("context_length: 512")
    seen = second.cli("plan")
    assert seen.returncode == 0, seen.stdout + seen.stderr
    assert "Owned elsewhere" in seen.stdout
    line = next(x for x in seen.stdout.splitlines() if mine["unit"] in x)
    assert f"deployment {project.name} revision 1" in line and f"lineage {lineage}" in line
    assert not line.lstrip().startswith(("~", "!", "-", "+"))
    assert "Changed outside engine-ctl" not in seen.stdout
    second.cli("apply", "--auto-approve", check=True)
    (theirs,) = second.replicas()
    assert (theirs["host"], theirs["port"]) != (mine["host"], mine["port"])
    assert project.main_pid(mine) == pid and project.health(mine) == 200  # never touched

    back = project.cli("plan", "--detailed-exitcode")
    assert back.returncode == 0, back.stdout + back.stderr
    assert "No changes." in back.stdout and theirs["unit"] in back.stdout and "Owned elsewhere" in back.stdout
    doc = json.loads(project.cli("plan", "--json").stdout)
    assert [(u["unit"], u["lineage"]) for u in doc["owned_elsewhere"]] == [(theirs["unit"], second.state()["lineage"])]
    assert doc["drift"] == []


def test_state_mv_turns_a_rename_into_a_rolling_replace(project: Project, tmp_path: Path) -> None:
    project.write("context_length: 512")
    project.cli("apply", "--auto-approve", check=True)
    (old,) = project.replicas()
    new_name = project.name[:30] + "-new"
    moved = project.cli("state", "mv", project.name, new_name, "--state", str(project.state_file), check=True)
    assert f"Moved {project.name} to {new_name}" in moved.stdout
    docs = project.path / "docs.yaml"
    docs.write_text(docs.read_text().replace(f"name: {project.name}}}", f"name: {new_name}}}"))
    planned = json.loads(project.cli("plan", "--json").stdout)
    (change,) = planned["changes"]
    assert change["name"] == new_name and change["action"] in (["create", "delete"], ["delete", "create"])
    (step,) = change["replicas"]
    assert step["old_unit"] == old["unit"] and step["unit"] == f"engine-ctl-{new_name}-0b.service"
    project.name = new_name
    project.cli("apply", "--auto-approve", check=True)
    (new,) = project.replicas()
    assert new["unit"] == step["unit"] and project.health(new) == 200
    assert "moved_from" not in project.state()["deployments"][new_name]  # every unit bears the new name now
    host = project.host_of(old)
    gone = project.fleet.ssh(host, f"test -e /etc/systemd/system/{old['unit']}", check=False)
    assert gone.returncode != 0
    assert "No changes." in project.cli("plan", check=True).stdout


def test_import_records_an_installed_unit_above_min_as_on_demand(project: Project) -> None:
    """The scaling envelope: apply enables slot 0 (below min) and installs slot 1 without enabling or starting it
    (on demand). An import after the state is lost reads that back from systemd's UnitFileState."""
    project.write("replicas: {min: 1, max: 2}\ncontext_length: 512")
    project.cli("apply", "--auto-approve", check=True)
    lost = {r["index"]: (r["on_demand"], r["status"]) for r in project.replicas()}
    assert lost == {0: (False, "serving"), 1: (True, "standby")}, lost
    project.state_file.unlink()
    project.state_file.with_name(project.state_file.name + ".backup").unlink(missing_ok=True)
    project.cli("import", check=True)
    assert {r["index"]: (r["on_demand"], r["status"]) for r in project.replicas()} == lost
    again = project.cli("plan", "--detailed-exitcode")
    assert again.returncode == 0, again.stdout + again.stderr
