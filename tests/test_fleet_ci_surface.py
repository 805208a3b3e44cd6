"""The CI surface on the real fleet (real hosts, systemd, llama-server and the tiny model): apply's JSON event
stream, status --json's members, apply --refresh-only, and a rolling restart without editing a document."""

from __future__ import annotations

import json
import urllib.request

import pytest

from tests.fleetproject import Project

pytestmark = pytest.mark.fleet

STEP_FIELDS = {"event", "deployment", "timestamp", "replica", "host", "unit"}


def events_of(stdout: str) -> list[dict]:  # type: ignore[type-arg]
    """Every line of `apply --json` is one JSON object (JSON lines), nothing else on stdout."""
    lines = stdout.splitlines()
    assert lines, "no events"
    return [json.loads(line) for line in lines]


def test_apply_json_is_a_stream_of_json_events_a_pipeline_can_follow(project: Project) -> None:
    project.write("replicas: {min: 2, max: 2}\ncontext_length: 512")
    applied = project.cli("apply", "--auto-approve", "--json")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    events = events_of(applied.stdout)
    kinds = [e["event"] for e in events]
    assert kinds[0] == "planned" and kinds[-1] == "finished", kinds
    assert events[0]["add"] == 1 and events[-1]["exit_code"] == 0 and events[-1]["result"] == "applied"
    started = [e for e in events if e["event"] == "started"]
    healthy = [e for e in events if e["event"] == "healthy"]
    assert sorted(e["replica"] for e in started) == [0, 1] == sorted(e["replica"] for e in healthy)
    for e in started + healthy:
        assert set(e) >= STEP_FIELDS, e
        assert e["deployment"] == project.name and e["timestamp"].endswith("Z")
    for h in healthy:  # each replica's health comes after its own start, and carries where it answers
        start = next(e for e in started if e["replica"] == h["replica"])
        assert kinds.index("started") <= events.index(h) and start["timestamp"] <= h["timestamp"]
        assert h["port"] > 0 and h["elapsed_s"] >= 0
    (recorded,) = [e for e in events if e["event"] == "recorded"]
    assert recorded["state"] == "Ready" and recorded["revision"] == 1
    assert "Plan: 1 to add" in applied.stderr  # the people's view goes to stderr


def test_status_json_has_members_with_address_port_and_url_and_list_json_does_not(project: Project) -> None:
    project.write("context_length: 512")
    project.cli("apply", "--auto-approve", check=True)
    (dep,) = json.loads(project.cli("status", project.name, "--json", check=True).stdout)["deployments"]
    (member,) = dep["members"]
    (replica,) = project.replicas()
    assert member["host"] == replica["host"] and member["port"] == replica["port"]
    assert member["address"] == project.address(replica["host"])
    assert member["url"] == f"http://{member['address']}:{member['port']}"
    with urllib.request.urlopen(member["url"] + "/health", timeout=5) as r:
        assert r.status == 200
    (row,) = json.loads(project.cli("list", "--json", check=True).stdout)["deployments"]
    assert "members" not in row and "instances" not in row
    assert row["name"] == project.name and row["ready"] == 1 and row["hosts"] == [replica["host"]]


def test_apply_refresh_only_records_what_drifted_and_changes_no_host(project: Project) -> None:
    project.write("context_length: 512")
    project.cli("apply", "--auto-approve", check=True)
    (replica,) = project.replicas()
    host = project.host_of(replica)
    project.fleet.ssh(host, f"systemctl stop {replica['unit']}")
    refreshed = project.cli("apply", "--refresh-only", "--auto-approve")
    assert refreshed.returncode == 0, refreshed.stdout + refreshed.stderr
    (after,) = project.replicas()
    assert after["status"] == "stopped" and after["unit"] == replica["unit"]
    active = project.fleet.ssh(host, f"systemctl is-active {replica['unit']}", check=False).stdout.strip()
    assert active == "inactive"  # refresh-only records; it never starts or stops anything
    history = project.state()["operations"]
    assert history[-1]["command"] == "apply --refresh-only" and history[-1]["result"] == "refreshed"


def test_restart_replaces_every_replica_one_at_a_time_and_the_next_plan_is_empty(project: Project) -> None:
    project.write("replicas: {min: 2, max: 2}\ncontext_length: 512")
    project.cli("apply", "--auto-approve", check=True)
    before = {r["index"]: (r["unit"], project.main_pid(r)) for r in project.replicas()}
    planned = project.cli("plan", "--replace", project.name, "--json", "--detailed-exitcode")
    assert planned.returncode == 2, planned.stdout + planned.stderr
    (change,) = json.loads(planned.stdout)["changes"]
    assert change["action"] in (["create", "delete"], ["delete", "create"]) and change["reasons"] == [
        "a rolling replace: replace requested"
    ]
    assert [r["reason"] for r in change["replicas"]] == ["replace requested"] * 2
    human = project.cli("plan", "--replace", project.name).stdout
    symbol = "+/-" if change["action"] == ["create", "delete"] else "-/+"  # a surge where there is room
    assert "replace requested" in human and symbol in human

    restarted = project.cli(
        "restart", project.name, str(project.path), "--inventory", project.fleet.inventory, "--auto-approve",
        "--json", docs=False,
    )  # fmt: skip
    assert restarted.returncode == 0, restarted.stdout + restarted.stderr
    steps = [e for e in events_of(restarted.stdout) if e["event"] in ("started", "healthy", "removed")]
    # one replica at a time: each is started, healthy and its old unit removed before the next one starts
    order = [(e["event"], e.get("replica"), e["unit"]) for e in steps]
    assert [kind for kind, _, _ in order] == ["started", "healthy", "removed"] * 2, order
    assert order[0][1] == order[1][1] and order[3][1] == order[4][1] and order[0][1] != order[3][1]
    assert {order[2][2], order[5][2]} == {unit for unit, _ in before.values()}  # the old units went
    after = {r["index"]: (r["unit"], project.main_pid(r)) for r in project.replicas()}
    assert set(after) == set(before) == {0, 1}
    for index, (unit, pid) in after.items():
        old_unit, old_pid = before[index]
        assert unit != old_unit and pid > 0 and pid != old_pid, (index, before, after)
    for r in project.replicas():
        assert r["status"] == "serving" and project.health(r) == 200
    again = project.cli("plan", "--detailed-exitcode")
    assert again.returncode == 0 and "No changes." in again.stdout, again.stdout + again.stderr
    assert project.state()["deployments"][project.name]["revision"] == 1  # a restart is not a new revision


def test_a_failed_step_is_a_failed_event_with_the_engines_reason_then_recorded(project: Project) -> None:
    project.write("context_length: 512", model_file="corrupt.gguf")
    applied = project.cli("apply", "--auto-approve", "--json")
    assert applied.returncode == 1, applied.stdout + applied.stderr
    events = events_of(applied.stdout)
    kinds = [e["event"] for e in events]
    assert kinds[0] == "planned" and kinds[-1] == "finished" and events[-1]["exit_code"] == 1, kinds
    assert "healthy" not in kinds
    (started,) = [e for e in events if e["event"] == "started"]
    (failed,) = [e for e in events if e["event"] == "failed"]
    (recorded,) = [e for e in events if e["event"] == "recorded"]
    assert kinds.index("started") < kinds.index("failed") < kinds.index("recorded")
    assert started["replica"] == 0 and started["host"] and started["unit"].startswith(f"engine-ctl-{project.name}-")
    assert failed["deployment"] == project.name and failed["reason"].startswith("launch_failed:"), failed
    assert recorded["state"] == project.state()["deployments"][project.name]["state"]
