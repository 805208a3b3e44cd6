"""Lifecycle records without hosts (issue 13 §2-5): request identities in the state (file and PostgreSQL),
`apply --revision`, the start-up measurement's parsing and reuse, and seed 003's status tables, column for column."""

from __future__ import annotations

import io
import json
import os
import uuid
from pathlib import Path

import pytest
from engine_ctl.state import LocalState, open_backend
from rich.console import Console

from engine_ctl.cli.views.status import deployment_table, detail_lines, instance_table, list_table
from engine_ctl.core.diagnostics import EXIT_STATUSES
from engine_ctl.core.fit.runspec import FitPlan
from engine_ctl.core.fit.startup import MIB, device_peaks, parse_measurement
from engine_ctl.core.plan.deployment import with_measured_startup
from engine_ctl.core.plan.revisions import mismatches, parse_checks
from engine_ctl.core.plan.status import (
    DeploymentStatus,
    InstanceStatus,
    deployment_status,
    startup_status,
    startup_text,
)
from engine_ctl.core.record.model import DeploymentRecord, RequestRecord, StartupRecord, State, StateError, parse_state
from engine_ctl.core.record.requests import begin, done_steps, finish, step_done
from tests.helpers import run

ULID_A = "01M8XRSY1C7M33AF3FG4A78MHS"
GIB = 1024**3


def render(*shown: object, width: int = 120) -> str:
    out = io.StringIO()
    terminal = Console(file=out, width=width, no_color=True)
    for s in shown:
        terminal.print(s)
    return out.getvalue()


# --- request identities in the state ------------------------------------------------------------------------
def test_a_request_records_its_steps_and_its_result_and_reads_back() -> None:
    state = State()
    begin(state, ULID_A, "apply", "me@here pid 1", "2026-12-03T11:00:00+00:00")
    step_done(state, ULID_A, "chat: create engine-ctl-chat-0a.service@h1 revision 1")
    step_done(state, ULID_A, "chat: create engine-ctl-chat-0a.service@h1 revision 1")  # once
    assert done_steps(state, ULID_A) == {"chat: create engine-ctl-chat-0a.service@h1 revision 1"}
    begin(state, ULID_A, "apply", "someone else", "later")  # a re-run keeps the record as it was
    assert state.request(ULID_A) is not None and state.request(ULID_A).who == "me@here pid 1"  # type: ignore[union-attr]
    finish(state, ULID_A, "applied", 0, "2026-12-03T11:01:00+00:00")
    again = parse_state(json.loads(state.model_dump_json()), "test")
    expected = RequestRecord(
        id=ULID_A, command="apply", who="me@here pid 1", started="2026-12-03T11:00:00+00:00",
        steps=["chat: create engine-ctl-chat-0a.service@h1 revision 1"], finished="2026-12-03T11:01:00+00:00",
        result="applied", exit_code=0,
    )  # fmt: skip
    assert again.requests == [expected]
    assert done_steps(again, None) == frozenset() and done_steps(again, "01M8XRSY1C7M33AF3FG4A78MHT") == frozenset()


def test_a_state_with_a_request_id_that_is_not_a_ulid_is_refused_with_its_field() -> None:
    raw = json.loads(State().model_dump_json())
    raw["requests"] = [{"id": "x; rm -rf /", "command": "apply"}]
    with pytest.raises(StateError, match=r"requests\[0\]\.id: 'x; rm -rf /' is not a ULID"):
        parse_state(raw, "test")


def test_an_older_state_without_the_new_records_still_reads() -> None:
    raw = {"format_version": 1, "serial": 3, "lineage": "x", "deployments": {"chat": {"name": "chat", "revision": 2}}}
    state = parse_state(raw, "test")
    assert state.requests == [] and state.deployments["chat"].startup is None
    assert state.deployments["chat"].last_operation is None


def test_requests_are_recorded_in_postgresql_too() -> None:
    backend = open_backend(f"{os.environ.get('ENGINE_CTL_TEST_PG', 'postgresql:///engine_ctl_test')}"
                           f"#records-{uuid.uuid4().hex[:8]}")  # fmt: skip
    state = backend.read()
    begin(state, ULID_A, "apply", "me", "now")
    step_done(state, ULID_A, "chat: step")
    state.deployments["chat"] = DeploymentRecord(
        name="chat", revision=1, startup=StartupRecord(revision=1, host="h1", host_peak_bytes=123 * MIB,
                                                       host_source="cgroup v1 memory.max_usage_in_bytes"),
    )  # fmt: skip
    backend.write(state)
    again = open_backend(backend.location).read()
    assert again.request(ULID_A) is not None and again.request(ULID_A).steps == ["chat: step"]  # type: ignore[union-attr]
    assert again.deployments["chat"].startup == state.deployments["chat"].startup


DOCS = """\
kind: Model
metadata: {name: tiny}
spec: {format: gguf, path: tiny/tiny.gguf, parameters: 4170048}
---
metadata: {name: chat}
spec: {model: tiny, accelerator: cpu}
"""


def _project(tmp_path: Path) -> Path:
    (tmp_path / "d.yaml").write_text(DOCS)
    (tmp_path / "hosts.yaml").write_text("hosts:\n  - {name: h1, address: 198.18.255.254}\n")
    return tmp_path


def test_apply_prints_its_request_identity_and_a_finished_one_is_reported_not_redone(tmp_path: Path) -> None:
    _project(tmp_path)
    state = State()
    begin(state, ULID_A, "apply", "me", "2026-12-03T11:00:00+00:00")
    finish(state, ULID_A, "applied", 0, "2026-12-03T11:01:00+00:00")
    LocalState(tmp_path / "engine-ctl.state.json").write(state)
    before = (tmp_path / "engine-ctl.state.json").read_text()
    again = run("apply", str(tmp_path), "--request-id", ULID_A.lower(), "--auto-approve")
    assert again.exit_code == 0, again.output
    assert again.stderr.splitlines()[0] == (
        f"Request identity: {ULID_A} (reuse --request-id {ULID_A} to recover this command)"
    )
    assert (f"Request {ULID_A} (`apply`) finished at 2026-12-03T11:01:00+00:00: applied (exit status 0); "
            "nothing was done again") in again.stdout  # fmt: skip
    assert (tmp_path / "engine-ctl.state.json").read_text() == before  # no host asked, nothing written
    other = run("destroy", str(tmp_path), "--request-id", ULID_A, "--auto-approve")
    assert other.exit_code == 1 and "request_mismatch" not in other.stdout
    assert f"request {ULID_A} was recorded for `apply`, not `destroy`; nothing was done" in other.stderr


def test_a_request_id_that_is_not_a_ulid_is_refused(tmp_path: Path) -> None:
    result = run("apply", str(_project(tmp_path)), "--request-id", "not-a-ulid", "--auto-approve")
    assert result.exit_code == 1
    assert "'not-a-ulid' is not a request identity (a ULID" in result.stderr


# --- apply --revision NAME=N --------------------------------------------------------------------------------
def test_revision_checks_parse_and_refuse_what_was_applied_since() -> None:
    checks, bad = parse_checks(["chat=2", "embed=0", "chat", "x=y"])
    assert checks == {"chat": 2, "embed": 0} and [d.code for d in bad] == ["invalid_revision_check"] * 2
    (refused,) = mismatches({"chat": 2, "embed": 0}, {"chat": 3}, "state")
    assert refused.code == "revision_mismatch" and refused.message == (
        "chat is at revision 3, not revision 2: a change was applied since you read it; nothing was applied"
    )
    assert "--revision chat=3" in (refused.hint or "")
    assert mismatches({"chat": 3}, {"chat": 3}, "state") == []
    assert EXIT_STATUSES["revision_mismatch"] == 26


def test_apply_with_a_stale_revision_is_refused_with_exit_26_before_any_host_is_asked(tmp_path: Path) -> None:
    _project(tmp_path)
    recorded = DeploymentRecord(name="chat", revision=3)
    LocalState(tmp_path / "engine-ctl.state.json").write(State(deployments={"chat": recorded}))
    result = run("apply", str(tmp_path), "--revision", "chat=2", "--auto-approve", "--json")
    assert result.exit_code == 26, result.output
    (detail,) = json.loads(result.stdout.splitlines()[-1])["error"]["details"]
    assert detail["code"] == "revision_mismatch" and "chat is at revision 3, not revision 2" in detail["message"]
    assert result.stderr.startswith("Request identity: ")  # stdout carries the JSON under --json
    bad = run("apply", str(tmp_path), "--revision", "chat", "--auto-approve")
    assert bad.exit_code == 1 and "'chat' is not NAME=N" in bad.stderr


# --- start-up measured, then reused -------------------------------------------------------------------------
# The GPU lines are nvidia-smi's per-process query as NVIDIA's manual gives it (`nvidia-smi --help-query-compute-apps`;
# `--query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader,nounits`: `<pid>, <gpu_uuid>, <MiB>`).
MEASURED_V1 = """\
cgroup-v1 4294967296
pid 4242 3900000
pid 4250 100
gpu-sample
4242, GPU-5f2b0c1e-0000-4000-8000-000000000001, 1024
9999, GPU-5f2b0c1e-0000-4000-8000-000000000001, 70000
gpu-sample
4242, GPU-5f2b0c1e-0000-4000-8000-000000000001, 12800
4250, GPU-5f2b0c1e-0000-4000-8000-000000000001, 717
4242, GPU-5f2b0c1e-0000-4000-8000-000000000002, [N/A]
gpu-sample
4242, GPU-5f2b0c1e-0000-4000-8000-000000000001, 9000
"""


def test_the_measurement_reads_cgroup_v1_and_nvidia_smis_per_process_samples_of_the_units_processes() -> None:
    m = parse_measurement(MEASURED_V1)
    assert m.host_peak_bytes == 4 * GIB and m.host_source == "cgroup v1 memory.max_usage_in_bytes"
    # the peak sample: 12800 + 717 MiB of the unit's processes (pid 9999 is another program's)
    assert m.device_peak_bytes == {"GPU-5f2b0c1e-0000-4000-8000-000000000001": (12800 + 717) * MIB}
    assert m.device_source.startswith("nvidia-smi --query-compute-apps")


def test_the_measurement_prefers_cgroup_v2_and_falls_back_to_the_processes_vmhwm() -> None:
    v2 = parse_measurement("cgroup-v2 1000\ncgroup-v1 2000\npid 1 5\n")
    assert (v2.host_peak_bytes, v2.host_source) == (1000, "cgroup v2 memory.peak")
    hwm = parse_measurement("pid 10 40000\npid 11 2000\n")  # an nspawn host: no memory cgroup of its own
    assert hwm.host_peak_bytes == 42000 * 1024 and "VmHWM" in hwm.host_source
    assert parse_measurement("").host_peak_bytes is None
    assert device_peaks([[("1", "GPU-a", 5)], [("1", "GPU-a", 3), ("2", "GPU-a", 4)]], set()) == {"GPU-a": 7}


FIT = FitPlan(engine="llama.cpp", gpu_vendor="nvidia", accelerator="gpu", kind="chat", gpus=1, min_gpu_memory_gb=15,
              memory_basis="estimate", cpu_cores=4, threads=None, memory_bytes=6 * GIB, context_length=4096,
              parallel=1, weights_bytes=10 * GIB, kv_cache_bytes=GIB, min_gpu_memory_bytes=14 * GIB)  # fmt: skip


def _measured(revision: int = 2) -> StartupRecord:
    return StartupRecord(revision=revision, host="gpu-box", host_peak_bytes=int(4.0 * GIB),
                         device_peak_bytes={"GPU-1": int(13.2 * GIB)}, initialize_s=130.4)  # fmt: skip


def test_a_later_fit_sets_the_measured_peak_aside_instead_of_the_estimate() -> None:
    record = DeploymentRecord(name="chat", revision=2, startup=_measured())
    fitted, provenance = with_measured_startup(FIT, record, 2)
    assert provenance == "measured" and fitted.memory_bytes == int(4.0 * GIB)
    assert fitted.min_gpu_memory_bytes == int(13.2 * GIB)
    assert with_measured_startup(FIT, record, 3) == (FIT, "default")  # a new revision is measured anew
    assert with_measured_startup(FIT, None, 1) == (FIT, "default")


def test_startup_shows_the_seeds_form_and_where_each_figure_came_from() -> None:
    measured = startup_status(DeploymentRecord(name="b", revision=2, plan=FIT, startup=_measured()))
    assert measured is not None and startup_text(measured) == "13.2 GiB (+4.0 GiB RAM)"
    assert (measured.provenance, measured.device_provenance, measured.host_provenance) == ("measured",) * 3
    estimated = startup_status(DeploymentRecord(name="b", revision=3, plan=FIT, startup=_measured()))
    assert estimated is not None and startup_text(estimated) == "14.0 GiB (+6.0 GiB RAM)"
    assert (estimated.provenance, estimated.device_provenance, estimated.host_provenance) == ("default",) * 3
    cpu = startup_status(DeploymentRecord(name="c", revision=1, plan=FIT.model_copy(update={"accelerator": "cpu",
                                                                                          "gpus": 0})))  # fmt: skip
    assert cpu is not None and startup_text(cpu) == "6.0 GiB" and cpu.device_provenance is None
    assert startup_text(startup_status(DeploymentRecord(name="d"))) == "-"


# --- seed 003's tables --------------------------------------------------------------------------------------
def _seed_example() -> DeploymentStatus:
    record = DeploymentRecord(name="broken-model", revision=1, plan=FIT, startup=_measured(1),
                              last_operation="initialize failed (launch_failed)", state="Failed")  # fmt: skip
    status = deployment_status(record, {})
    error = "launch_failed: launch failed: engine launch failed: the engine exited before readiness"
    instance = InstanceStatus(index=0, host="gpu-box", unit="engine-ctl-broken-model-0a.service", port=8000,
                              gpus=[0], state="failed", last_error=error, devices=["gpu0"])  # fmt: skip
    return status.model_copy(update={"state": "Failed", "ready": 0, "replicas": 1, "instances": [instance]})


def test_status_tables_have_the_seeds_columns_and_forms() -> None:
    s = _seed_example()
    text = render(deployment_table(s), instance_table(s), width=160)
    lines = [line.rstrip() for line in text.splitlines() if line.strip()]
    assert lines == [
        "NAME          STATE   READY  REVISION  STARTUP                  INITIALIZE  LAST OPERATION",
        "broken-model  failed  0/1    1         13.2 GiB (+4.0 GiB RAM)  130s        initialize failed (launch_failed)",
        "INSTANCE  HOST     STATE   LIFECYCLE  DEVICES  LAST ERROR",
        "0         gpu-box  failed  active     gpu0     launch_failed: launch failed: engine launch failed: the engine "
        "exited before readiness",
    ], text
    assert render(list_table([s])).splitlines()[0].split() == ["NAME", "STATE", "READY", "REVISION", "HOSTS"]


def test_a_decisions_deployment_shows_an_api_line_and_a_chat_one_has_none() -> None:
    s = _seed_example()
    assert not any(line.startswith("API") for line in detail_lines(s)) and s.api is None
    decisions = s.model_copy(update={"api": "decisions"})
    assert detail_lines(decisions)[0] == "API       decisions"


def test_status_json_carries_the_record_and_the_seeds_fields(tmp_path: Path) -> None:
    record = DeploymentRecord(name="chat", revision=1, plan=FIT, startup=_measured(1), state="Failed",
                              reason="does not fit any host", last_operation="initialize succeeded")  # fmt: skip
    LocalState(tmp_path / "engine-ctl.state.json").write(State(deployments={"chat": record}))
    result = run("status", "deployment", "chat", str(tmp_path), "--json")
    assert result.exit_code == 0, result.output
    (doc,) = json.loads(result.stdout)["deployments"]
    assert doc["startup"]["provenance"] == "measured" and doc["startup"]["device_provenance"] == "measured"
    assert doc["startup"]["measured"]["host_peak_bytes"] == int(4.0 * GIB) and doc["initialize_s"] == 130.4
    assert doc["last_operation"] == "initialize succeeded" and "api" not in doc
    assert doc["status"] == {"state": "Failed", "reason": "does not fit any host"}
    assert doc["plan"]["engine"] == "llama.cpp" and doc["ready_replicas"] == 0 and "capabilities" in doc
    plain = run("status", "deployment", "chat", str(tmp_path))
    assert plain.stdout.splitlines()[1].split()[:5] == ["chat", "failed", "0/0", "1", "13.2"], plain.stdout
    assert run("status", "chat", str(tmp_path)).stdout == plain.stdout  # `status NAME` still works


def test_a_revision_that_changes_only_the_instance_count_keeps_the_measured_startup() -> None:
    from engine_ctl.core.model import Deployment, Model

    model = Model(name="tiny", format="gguf", path="tiny/tiny.gguf", parameters=4170048)
    d = Deployment(name="chat", model="tiny", accelerator="cpu", context_length=512)
    record = DeploymentRecord(name="chat", revision=2, spec=d, model=model, startup=_measured())
    more = d.model_copy(update={"replicas_min": 3, "replicas_max": 3})
    assert with_measured_startup(FIT, record, 3, more, model)[1] == "measured"
    longer = d.model_copy(update={"context_length": 1024})
    assert with_measured_startup(FIT, record, 3, longer, model) == (FIT, "default")


def test_an_operator_verb_prints_its_request_identity_and_a_finished_one_is_not_redone(tmp_path: Path) -> None:
    state_file = tmp_path / "engine-ctl.state.json"
    state = State()
    begin(state, ULID_A, "stop deployment chat", "me", "2026-12-03T11:00:00+00:00")
    finish(state, ULID_A, "done", 0, "2026-12-03T11:00:01+00:00")
    LocalState(state_file).write(state)
    before = state_file.read_text()
    again = run("stop", "deployment", "chat", "--state", str(state_file), "--request-id", ULID_A)
    assert again.exit_code == 0, again.output
    assert again.stderr.splitlines()[0] == (
        f"Request identity: {ULID_A} (reuse --request-id {ULID_A} to recover this command)"
    )
    assert f"Request {ULID_A} (`stop deployment chat`) finished at 2026-12-03T11:00:01+00:00: done" in again.stdout
    assert state_file.read_text() == before
    other = run("park", "deployment", "chat", "--state", str(state_file), "--request-id", ULID_A)
    assert other.exit_code == 1
    assert "was recorded for `stop deployment chat`, not `park deployment chat`" in other.stderr


def test_an_estimate_above_what_any_host_gives_runs_its_first_start_alone_on_one_host() -> None:
    from engine_ctl.core.fit.hostfacts import Cpu, HostFacts, Memory
    from engine_ctl.core.plan.deployment import whole_host

    def host(name: str, available_gib: int) -> HostFacts:
        return HostFacts(host=name, cpu=Cpu(cores=8),
                         memory=Memory(total_bytes=64 * GIB, available_bytes=available_gib * GIB))  # fmt: skip

    capped, alone = whole_host(FIT, [host("a", 4), host("b", 5)])  # the estimate: 6 GiB of host memory
    assert alone and capped.memory_bytes == 5 * GIB and capped.min_gpu_memory_bytes == FIT.min_gpu_memory_bytes
    assert whole_host(FIT, [host("a", 4), host("b", 7)]) == (FIT, False)
    assert whole_host(FIT, []) == (FIT, False)


def test_state_rm_records_its_request_in_its_one_write_and_a_rerun_does_nothing(tmp_path: Path) -> None:
    state_file = tmp_path / "engine-ctl.state.json"
    LocalState(state_file).write(State(deployments={"chat": DeploymentRecord(name="chat", revision=1)}))
    removed = run("state", "rm", "chat", "--state", str(state_file), "--request-id", ULID_A)
    assert removed.exit_code == 0, removed.output
    assert removed.stderr.startswith(f"Request identity: {ULID_A} ")
    after = LocalState(state_file).read()
    assert after.serial == 2 and "chat" not in after.deployments  # one write: the edit and its request
    (request,) = after.requests
    assert (request.id, request.command, request.exit_code, request.result) == (ULID_A, "state rm chat", 0,
                                                                                 "forgot chat")  # fmt: skip
    again = run("state", "rm", "chat", "--state", str(state_file), "--request-id", ULID_A)
    assert again.exit_code == 0 and "nothing was done again" in again.stdout
    assert LocalState(state_file).read().serial == 2


def test_whole_host_is_in_the_plan_only_when_true_and_status_names_it_until_measured() -> None:
    from engine_ctl.core.plan.changes import DeploymentChange

    alone = DeploymentChange(name="chat", action=["create"], revision=1, whole_host=True)
    assert alone.model_dump()["whole_host"] is True
    assert DeploymentChange.model_validate_json(alone.model_dump_json()).whole_host
    assert "whole_host" not in DeploymentChange(name="chat", action=["create"], revision=1).model_dump()
    cpu = FIT.model_copy(update={"accelerator": "cpu", "gpus": 0})
    estimated = startup_status(DeploymentRecord(name="c", revision=1, plan=cpu, whole_host=True))
    assert estimated is not None and estimated.whole_host and estimated.provenance == "default"
    measured = startup_status(DeploymentRecord(name="c", revision=1, plan=cpu, whole_host=True,
                                               startup=_measured(1)))  # fmt: skip
    assert measured is not None and not measured.whole_host and measured.provenance == "measured"


def test_apply_skips_a_step_its_request_recorded_as_done_without_touching_a_host(tmp_path: Path) -> None:
    """The executor itself (no host: a step it ran would fail with `host … is not in the inventory`)."""
    from engine_ctl.core.plan.changes import DeploymentChange, Plan, ReplicaChange
    from engine_ctl.shell.apply import ApplyEvent, Executor, Recorder, step_key

    step = ReplicaChange(action=["create"], index=0, host="h1", unit="engine-ctl-chat-0a.service", slot="a",
                         port=8000, revision=1, unit_text="[Service]\n")  # fmt: skip
    change = DeploymentChange(name="chat", action=["create"], revision=1, replicas=[step])
    backend = LocalState(tmp_path / "engine-ctl.state.json")
    state = State()
    begin(state, ULID_A, "apply", "me", "then")
    step_done(state, ULID_A, step_key("chat", step))
    plan = Plan(changes=[change], state_serial=0, state_lineage="x")
    events: list[ApplyEvent] = []
    recorder = Recorder(backend, backend.write(state))
    result = Executor(plan, {}, recorder, observer=events.append, request_id=ULID_A).run()
    assert [e.event for e in events if e.replica == 0] == ["skipped"] and not result.failed, (events, result)
    again = Executor(
        Plan(changes=[change], state_serial=0, state_lineage="x"),
        {},
        Recorder(backend, backend.read()),
        request_id=None,
    ).run()
    assert "host h1 is not in the inventory" in again.failed["chat"]  # without the request, it would have run


def test_a_verb_cut_off_by_ctrl_c_is_recorded_unfinished_and_its_request_id_runs_it_again(tmp_path: Path) -> None:
    from engine_ctl.cli.requests import _run_then_record
    from engine_ctl.core.record.model import OperatorAction

    state_file = tmp_path / "engine-ctl.state.json"
    state = State()
    state.deployments["chat"] = DeploymentRecord(
        name="chat", revision=1, operator=OperatorAction(verb="stopped", when="2026-12-03T11:00:00+00:00")
    )
    LocalState(state_file).write(state)

    def cut_off() -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _run_then_record(cut_off, (), {}, LocalState(state_file), ULID_A, "stop deployment chat")
    found = LocalState(state_file).read().request(ULID_A)
    assert found is not None and found.finished is None and found.command == "stop deployment chat"
    (tmp_path / "hosts.yaml").write_text("hosts:\n  - {name: localhost, transport: local}\n")
    again = run("stop", "deployment", "chat", "--state", str(state_file), "--inventory", str(tmp_path / "hosts.yaml"),
                "--request-id", ULID_A)  # fmt: skip
    assert again.exit_code == 0, again.output
    assert f"Continuing request {ULID_A} (`stop deployment chat`" in again.stderr
    assert again.stdout.strip() == "chat is already stopped"
    done = LocalState(state_file).read().request(ULID_A)
    assert done is not None and done.finished is not None and done.exit_code == 0


def test_a_rolls_failed_start_keeps_its_row_beside_the_replica_put_back() -> None:
    """Issue 25: the new replica of a roll that failed to start (revision 2) keeps its own row, LAST ERROR
    launch_failed: …, beside the old replica (revision 1) that still serves; a start of revision 2 that serves
    takes its place."""
    from engine_ctl.core.record.model import FailedStart, ReplicaRecord

    old = ReplicaRecord(index=0, slot="a", host="h1", unit="engine-ctl-x-0a.service", port=8000, revision=1,
                        status="serving", unit_sha256="a" * 64)  # fmt: skip
    error = "launch_failed: launch failed: engine launch failed: the engine exited before readiness"
    failed = FailedStart(index=0, slot="b", host="h2", unit="engine-ctl-x-0b.service", port=8000, revision=2,
                         error=error)  # fmt: skip
    rec = DeploymentRecord(name="x", revision=1, replicas=[old], failed_starts=[failed])
    rows = [(i.unit, i.state, i.last_error) for i in deployment_status(rec, {}).instances]
    assert ("engine-ctl-x-0b.service", "failed", error) in rows and len(rows) == 2, rows
    served = rec.model_copy(update={"revision": 2, "replicas": [old.model_copy(update={"revision": 2})]})
    assert [i.state for i in deployment_status(served, {}).instances if i.state == "failed"] == []
