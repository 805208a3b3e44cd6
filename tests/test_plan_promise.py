"""The promise of a plan (issue 24), in the pure core: "No changes" and exit 0 only when every document is served
as written; a plan names each difference, and its problems (what makes plan and apply exit 1) hold every
deployment that no apply can serve now: Failed, or Pending.

- A model path changed to a file no host can use (bad magic, a GGUF header of random bytes) is Pending, naming
  the file, the host and why (point 2 and point 16), while the old replica is left serving.
- Weights larger than every GPU count the deployment may use fail "does not fit" before the KV shape is known:
  the weights alone are a lower bound (point 3). GPUs come from recorded real nvidia-smi output.
- A CPU replica whose weights alone exceed what any host has is Pending with the seed's reason, never placed on
  the biggest host as a whole_host first start (point 10).
- A changed checkpoint digest is a change: the replica is repaired (fetched again, restarted), exit 2 (point 4).
- Weights written at a `path:` model's path after its replica started are a change too: it is restarted on them.
"""

from __future__ import annotations

import random
from pathlib import Path

from engine_ctl.cli.views.plan import plan_text
from engine_ctl.core.documents.inventory import Host, Inventory
from engine_ctl.core.documents.loader import load_documents
from engine_ctl.core.documents.yamlsource import parse_text
from engine_ctl.core.fit.hostfacts import HostFacts
from engine_ctl.core.fit.modelfacts import ModelFacts
from engine_ctl.core.model import DesiredState
from engine_ctl.core.plan.fetching import plan_fetches
from engine_ctl.core.plan.planner import Plan, make_plan
from engine_ctl.core.record.model import State
from engine_ctl.core.sizes import GIB
from engine_ctl.core.weights import Checkout, HubFile, checkout_dir
from tests.fleetfacts import cpu_host, h100x8
from tests.test_plan_core import applied

SHAPE = ModelFacts(block_count=2, head_count=4, head_count_kv=2, embedding_length=64, weights_bytes=17_000_000)
NO_CHANGES = "No changes. The hosts match the documents."


def desired(model_spec: str, deployment_spec: str = "accelerator: cpu, cpu_cores: 2") -> DesiredState:
    text = (f"kind: Model\nmetadata: {{name: m}}\nspec: {{format: gguf, {model_spec}}}\n---\n"
            f"metadata: {{name: chat}}\nspec: {{model: m, {deployment_spec}}}\n")  # fmt: skip
    found, problems = parse_text(text, "d.yaml")
    assert not problems
    result = load_documents(found)
    assert not [d for d in result.diagnostics if d.severity == "error"], result.diagnostics
    return result.desired


def inventory(*facts: HostFacts) -> Inventory:
    return Inventory(hosts=tuple(Host(name=f.host, address=f.host, models_dir="/srv/models") for f in facts))


def plan(d: DesiredState, state: State, facts: dict[str, HostFacts], model: ModelFacts | None) -> Plan:
    return make_plan(d, state, inventory(*facts.values()), facts, {"m": model})


# --- point 2 and point 16: a model file no host can use ---------------------------------------------------------


def test_a_model_path_changed_to_a_file_no_host_can_use_is_pending_naming_file_host_and_why() -> None:
    hosts = {h.host: h for h in (cpu_host("h1"), cpu_host("h2"))}
    state, hosts = applied(plan(desired("path: m/good.gguf"), State(), hosts, SHAPE), State(), hosts)
    for why in ("not a GGUF file (bad magic)", "not a valid GGUF file (unknown GGUF version 3059489832)"):
        bad = {n: h.model_copy(update={"model_problems": {"/srv/models/m/bad.gguf": why}}) for n, h in hosts.items()}
        p = plan(desired("path: m/bad.gguf"), state, bad, None)  # no host has usable files: no model facts
        (change,) = p.changes
        assert change.pending_reason == (
            f"the weights of m are not usable on any reachable host (/srv/models/m/bad.gguf on h1, h2: {why}); "
            "replace the file, or point the model's path at a valid one"
        )
        assert change.waiting == {h: f"/srv/models/m/bad.gguf is not usable: {why}" for h in ("h1", "h2")}
        assert change.replicas == [] and change.action == ["no-op"]  # the old replica is left serving
        assert p.problems == [f"chat is Pending: {change.pending_reason}"]  # plan and apply exit 1
        text = plan_text(p)
        assert NO_CHANGES not in text and "No changes can be made; but the hosts do not match the documents" in text
        assert f"Pending: chat: {change.pending_reason}" in text


def test_weights_simply_not_there_keep_the_fit_unknown_reason_and_exit_1() -> None:
    hosts = {"h1": cpu_host("h1").model_copy(update={"model_problems": {"/srv/models/m/m.gguf": "not found"}})}
    p = plan(desired("path: m/m.gguf"), State(), hosts, None)
    (change,) = p.changes
    assert change.pending_reason is not None and change.pending_reason.startswith(
        "the fit is not known yet: the weights of m are on no reachable host yet"
    )
    assert p.problems == [f"chat is Pending: {change.pending_reason}"]


def test_a_deployment_an_operator_holds_is_a_problem_only_when_its_documents_changed_to_what_cannot_serve() -> None:
    """Held (stopped) as it was recorded, its weights gone meanwhile: the operator's hold, no reason to exit 1.
    Held, and its documents changed to a file no host can use (issue 24's soak, seed 7): Pending, exit 1, since
    its start would roll in what cannot be served."""
    from engine_ctl.core.record.model import OperatorAction

    hosts = {"h1": cpu_host("h1")}
    state, hosts = applied(plan(desired("path: m/m.gguf"), State(), hosts, SHAPE), State(), hosts)
    state.deployments["chat"].operator = OperatorAction(verb="stopped", who="ops", when="2026-12-04T10:00:00+00:00")
    gone = {"h1": hosts["h1"].model_copy(update={"model_problems": {"/srv/models/m/m.gguf": "not found"}})}
    as_recorded = plan(desired("path: m/m.gguf"), state, gone, None)
    assert as_recorded.changes[0].operator is not None and as_recorded.problems == []
    bad = {"h1": hosts["h1"].model_copy(update={"model_problems": {"/srv/models/m/x.gguf": "not a GGUF file"}})}
    p = plan(desired("path: m/x.gguf"), state, bad, None)
    (change,) = p.changes
    assert change.operator is not None and change.field_changes and change.pending_reason is not None
    assert p.problems == [f"chat is Pending: {change.pending_reason}"]


# --- point 3: weights bigger than the GPUs, known without the KV shape -------------------------------------------


def test_weights_bigger_than_one_gpu_fail_does_not_fit_before_the_kv_shape_is_known() -> None:
    hosts = {"gpu-h100": h100x8()}  # recorded nvidia-smi: 8 x H100 80GB HBM3 (85.5 GB each)
    p = plan(desired("path: big/big.gguf, weights_bytes: 240000000000", "gpus: 1"), State(), hosts, None)
    (change,) = p.changes
    assert change.failed_reason == (
        "does not fit: the weights of m alone (240 GB) need at least 240.9 GB on each of 1 GPU (the largest GPU it "
        "may use has 85.5 GB)"
    )
    assert change.pending_reason is None and change.replicas == []
    assert p.problems == [f"chat is Failed: {change.failed_reason}"]
    assert NO_CHANGES not in plan_text(p)


def test_weights_that_some_gpu_count_may_hold_wait_for_the_shape_and_more_than_eight_gpus_fail() -> None:
    hosts = {"gpu-h100": h100x8()}
    fits_on_four = plan(desired("path: big/big.gguf, weights_bytes: 240000000000", "gpus: 4"), State(), hosts, None)
    assert fits_on_four.changes[0].failed_reason is None
    assert (fits_on_four.changes[0].pending_reason or "").startswith("the fit is not known yet")
    too_big = plan(desired("path: big/big.gguf, weights_bytes: 800000000000", "parallel: 1"), State(), hosts, None)
    assert (too_big.changes[0].failed_reason or "").startswith(
        "does not fit: the weights of m alone (800 GB) need at least 100.9 GB on each of 8 GPUs"
    )


# --- point 10: a CPU model bigger than any host's memory -----------------------------------------------------------

LLAMA_70B = ModelFacts(architecture="llama", block_count=80, head_count=64, head_count_kv=8, embedding_length=8192,
                       context_length=131072, weights_bytes=42_520_000_000, file_type="Q4_K_M")  # fmt: skip


def test_a_cpu_model_whose_weights_exceed_every_host_is_pending_with_the_seeds_reason_not_placed() -> None:
    small = cpu_host("cpu-22", cores=16)
    small = small.model_copy(update={"memory": small.memory.model_copy(update={"available_bytes": 22 * GIB})})
    p = plan(desired("path: m/70b.gguf"), State(), {"cpu-22": small}, LLAMA_70B)
    (change,) = p.changes
    assert change.replicas == [] and not change.whole_host
    assert change.pending_reason == "Waiting for a machine with 46.1 GiB of free memory (22.0 GiB free here)"
    assert not any("whole_host" in w for w in change.warnings)
    assert p.problems == [f"chat is Pending: {change.pending_reason}"]


def test_an_estimate_above_every_host_whose_weights_fit_still_runs_its_first_start_alone() -> None:
    host = cpu_host("cpu-48", cores=16)
    host = host.model_copy(update={"memory": host.memory.model_copy(update={"available_bytes": 42 * GIB})})
    p = plan(desired("path: m/70b.gguf"), State(), {"cpu-48": host}, LLAMA_70B)  # weights 39.6 GiB: they fit
    (change,) = p.changes
    assert change.whole_host and [r.host for r in change.replicas] == ["cpu-48"] and not p.problems


# --- point 4: a changed checkpoint is a change that apply repairs --------------------------------------------------

REPO, COMMIT = "org/tiny", "0123456789abcdef0123456789abcdef01234567"
DEST = checkout_dir("/srv/models", REPO, COMMIT)


def test_a_changed_checkpoint_digest_is_a_repair_with_a_fetch_and_exit_2() -> None:
    d = desired(f"hf: '{REPO}@{COMMIT}', file: tiny.gguf")
    checkout = Checkout(repo=REPO, commit=COMMIT, files=(HubFile(path="tiny.gguf", size=17, sha256="a" * 64),))
    hosts = {"h1": cpu_host("h1").model_copy(update={"models": {f"{DEST}/tiny.gguf": SHAPE}})}
    first = plan_fetches(plan(d, State(), hosts, SHAPE), d, inventory(*hosts.values()), hosts, {"m": checkout},
                         State())  # fmt: skip
    state, hosts = applied(first, State(), hosts)
    state.deployments["chat"].replicas[0].checkpoint_digest = "d" * 64
    from engine_ctl.core.fit.hostfacts import EngineInstall

    engine = {"llama.cpp": EngineInstall(path=state.deployments["chat"].replicas[0].argv[0])}  # (else: a warning)
    same = {"h1": hosts["h1"].model_copy(update={"checkpoints": {DEST: "d" * 64}, "engines": engine})}
    quiet = plan_fetches(plan(d, state, same, SHAPE), d, inventory(*same.values()), same, {"m": checkout}, state)
    assert not quiet.has_changes and not quiet.drift and NO_CHANGES in plan_text(quiet)
    tampered = {"h1": hosts["h1"].model_copy(update={"checkpoints": {DEST: "e" * 64}})}
    p = plan_fetches(plan(d, state, tampered, SHAPE), d, inventory(*tampered.values()), tampered, {"m": checkout},
                     state)  # fmt: skip
    (drift,) = p.drift
    assert drift.kind == "weights-changed" and "recorded dddddddddddd, measured eeeeeeeeeeee" in drift.detail
    (change,) = p.changes
    (repair,) = change.replicas
    assert repair.action == ["update"] and repair.unit == state.deployments["chat"].replicas[0].unit
    assert "the checkpoint digest of org/tiny@0123456789ab" in repair.reason
    (fetch,) = change.fetches
    assert fetch.host == "h1" and not fetch.in_place  # fetched again: every file verified, a changed one anew
    assert p.has_changes and not p.problems  # plan --detailed-exitcode: 2
    assert NO_CHANGES not in plan_text(p)


def test_a_changed_checkpoint_with_downloads_off_says_apply_fails_there_until_the_files_are_put_back() -> None:
    from engine_ctl.core.documents.inventory import Downloads

    d = desired(f"hf: '{REPO}@{COMMIT}', file: tiny.gguf")
    checkout = Checkout(repo=REPO, commit=COMMIT, files=(HubFile(path="tiny.gguf", size=17, sha256="a" * 64),))
    hosts = {"h1": cpu_host("h1").model_copy(update={"models": {f"{DEST}/tiny.gguf": SHAPE}})}
    state, hosts = applied(plan(d, State(), hosts, SHAPE), State(), hosts)
    state.deployments["chat"].replicas[0].checkpoint_digest = "d" * 64
    tampered = {"h1": hosts["h1"].model_copy(update={"checkpoints": {DEST: "e" * 64}})}
    off = inventory(*tampered.values()).model_copy(update={"downloads": Downloads(enabled=False)})
    p = plan_fetches(make_plan(d, state, off, tampered, {"m": SHAPE}), d, off, tampered, {"m": checkout}, state)
    assert p.has_changes and [r.action for r in p.changes[0].replicas] == [["update"]]
    assert (
        f"the checkpoint {REPO}@{COMMIT} changed on h1 and downloads are off (downloads.enabled: false in the "
        f"inventory): apply fails there until the files at {DEST} are put back"
    ) in p.changes[0].warnings


def test_the_probe_says_a_gguf_header_of_random_bytes_is_not_a_valid_gguf_file(tmp_path: Path) -> None:
    from engine_ctl.shell.remote import facts_probe

    (tmp_path / "random.gguf").write_bytes(b"GGUF" + random.Random(24).randbytes(65536))
    said = facts_probe.model_metadata(str(tmp_path / "random.gguf"))
    assert said == {"error": "not a valid GGUF file (unknown GGUF version 3059489832)"}, said


def test_weights_written_after_the_replica_started_are_a_repair_and_exit_2() -> None:
    d = desired("path: m/m.gguf")
    hosts = {"h1": cpu_host("h1")}
    state, hosts = applied(plan(d, State(), hosts, SHAPE), State(), hosts)
    (unit,) = hosts["h1"].units
    path = "/srv/models/m/m.gguf"

    def at(written: float | None, started: float | None, active: str = "active") -> Plan:
        now = unit.model_copy(update={"started_at": started, "active_state": active})
        mtimes = {path: written} if written is not None else {}
        found = {"h1": hosts["h1"].model_copy(update={"units": (now,), "model_mtimes": mtimes})}
        return plan(d, state, found, SHAPE)

    for quiet in (at(900.0, 1000.0), at(1000.9, 1000.0), at(None, 1000.0), at(2000.0, None)):
        assert not quiet.has_changes and not quiet.drift, plan_text(quiet)
    p = at(1_796_500_000.0, 1_796_400_000.0)
    (drift,) = p.drift
    assert (drift.kind, drift.unit) == ("weights-changed", unit.name)
    assert drift.detail == (f"the weights at {path} were written after the replica started (written 2026-12-05 "
                            "19:46:40 UTC, started 2026-12-04 16:00:00 UTC): it serves what it loaded; apply "
                            "restarts it on them")  # fmt: skip
    (change,) = p.changes
    (repair,) = change.replicas
    assert repair.action == ["update"] and p.has_changes and not p.problems
    stopped = at(1_796_500_000.0, 1_796_400_000.0, active="inactive")
    assert "weights-changed" not in [x.kind for x in stopped.drift], "a stopped replica loads them when it starts"


def test_a_unit_file_changed_after_its_engine_started_is_a_restart_and_exit_2() -> None:
    """A unit edited, restarted on the edit, then put back (`cp -p`, daemon-reload): the file is as recorded, but
    the engine runs what the edit said (a probe, session 16: plan said "No changes"). The file's change time
    after the engine's start is drift, which apply repairs by a restart; a second of slack either side, and
    nothing without both times, for a unit that does not run, or for a file whose edit is still there (`edited`)."""
    d = desired("path: m/m.gguf")
    hosts = {"h1": cpu_host("h1")}
    state, hosts = applied(plan(d, State(), hosts, SHAPE), State(), hosts)
    (unit,) = hosts["h1"].units

    def at(changed: float | None, started: float | None, **more: object) -> Plan:
        now = unit.model_copy(update={"file_changed_at": changed, "started_at": started, **more})
        return plan(d, state, {"h1": hosts["h1"].model_copy(update={"units": (now,)})}, SHAPE)

    for quiet in (at(900.0, 1000.0), at(1000.9, 1000.0), at(None, 1000.0), at(2000.0, None)):
        assert not quiet.has_changes and not quiet.drift, plan_text(quiet)
    inactive = at(2000.0, 1000.0, active_state="inactive")  # it starts on its file (its own drift: not running)
    assert "launch" not in [x.kind for x in inactive.drift], inactive.drift
    p = at(1_796_500_000.0, 1_796_400_000.0)
    (drift,) = p.drift
    assert (drift.kind, drift.unit) == ("launch", unit.name)
    assert drift.detail == (f"{unit.name} on h1: its unit file changed after its engine started (changed 2026-12-05 "
                            "19:46:40 UTC, started 2026-12-04 16:00:00 UTC: edited, restarted, then put back?), so "
                            "the engine may run settings its file does not give; apply restarts it on what its unit "
                            "gives")  # fmt: skip
    (repair,) = p.changes[0].replicas
    assert repair.action == ["update"] and p.has_changes and not p.problems
    edited = at(1_796_500_000.0, 1_796_400_000.0, sha256="0" * 64)
    assert [x.kind for x in edited.drift] == ["edited"], "the edit is named, not twice"


def test_the_probe_reports_when_weights_were_written_never_a_time_ahead_of_its_clock(tmp_path: Path) -> None:
    """The later of a file's mtime and its inode's ctime: a copy that keeps the old mtime (`cp -p`, `rsync -a`,
    `touch -d`: here os.utime) still moves the ctime, which no program sets back (a probe, session 15: `cp -p` of
    other weights over the path gave "No changes" while the engine served the deleted file)."""
    import os
    import time

    from engine_ctl.shell.remote.facts_probe import newest_mtime

    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF")
    os.utime(f, (1000, 1000))  # the mtime set back, as cp -p does
    assert newest_mtime(str(f)) == round(os.stat(f).st_ctime, 3) > 1000.0
    d = tmp_path / "ckpt"
    d.mkdir()
    for name in ("a.safetensors", "config.json"):
        (d / name).write_text("x")
        os.utime(d / name, (2000, 2000))
    newest = max(os.stat(d / n).st_ctime for n in ("a.safetensors", "config.json"))
    time.sleep(0.05)
    (d / ".engine-ctl-checkpoint.json").write_text("{}")  # written last: engine-ctl's marker is no weight
    assert newest_mtime(str(d)) == round(newest, 3) < os.stat(d / ".engine-ctl-checkpoint.json").st_ctime
    os.utime(f, (time.time() + 3600, time.time() + 3600))
    assert newest_mtime(str(f)) is None, "a file server's clock ahead of this host's"
    assert newest_mtime(str(tmp_path / "absent")) is None


def test_an_engine_stopped_by_a_signal_is_drift_and_status_says_it_serves_nothing() -> None:
    """SIGSTOP leaves the unit active and its health check unanswered: not "No changes", not "starting"."""
    from engine_ctl.core.plan.status import deployment_status

    d = desired("path: m/m.gguf")
    hosts = {"h1": cpu_host("h1")}
    state, hosts = applied(plan(d, State(), hosts, SHAPE), State(), hosts)
    (unit,) = hosts["h1"].units
    for letter in ("S", "R", "D", None):
        running = {"h1": hosts["h1"].model_copy(update={"units": (unit.model_copy(update={"process_state": letter}),)})}
        assert not plan(d, state, running, SHAPE).has_changes, letter
    stopped = unit.model_copy(update={"process_state": "T", "main_pid": 4242})
    found = {"h1": hosts["h1"].model_copy(update={"units": (stopped,), "health": {}})}
    p = plan(d, state, found, SHAPE)
    (drift,) = p.drift
    assert (drift.kind, drift.detail) == ("stopped", f"{unit.name} runs on h1 but its engine (PID 4242) is stopped by "
                                          "a signal (SIGSTOP): it answers nothing; apply restarts it")  # fmt: skip
    assert p.changes[0].replicas[0].action == ["update"] and p.has_changes
    (instance,) = deployment_status(state.deployments["chat"], found).instances
    assert instance.state == "failed" and "stopped by a signal (SIGSTOP)" in (instance.last_error or "")


def test_the_probe_reads_a_processs_state_letter() -> None:
    import os
    import signal
    import subprocess
    import time

    from engine_ctl.shell.remote.facts_probe import process_state

    child = subprocess.Popen(["sleep", "60"])
    try:
        time.sleep(0.2)
        assert process_state(str(child.pid)) == "S"
        os.kill(child.pid, signal.SIGSTOP)
        time.sleep(0.2)
        assert process_state(str(child.pid)) == "T"
    finally:
        child.kill()
        child.wait()
    assert process_state("0") is None and process_state("") is None and process_state("999999999") is None


def test_a_port_another_process_took_while_the_replica_is_down_is_named_and_nothing_restarts_into_it() -> None:
    """A replica whose engine died (or that an operator stopped) while another process listens on its port: a
    restart fails, or its health gate passes on that process (a false "serving"). Before, the plan offered a
    restart that could not work; now it names the port and the process's listener, and exits 1 (blocked)."""
    from engine_ctl.core.record.model import OperatorAction

    d = desired("path: m/m.gguf")
    hosts = {"h1": cpu_host("h1")}
    state, hosts = applied(plan(d, State(), hosts, SHAPE), State(), hosts)
    (unit,) = hosts["h1"].units
    port = state.deployments["chat"].replicas[0].port
    dead = unit.model_copy(update={"active_state": "failed", "sub_state": "failed", "exec_main_status": 1})
    free = {"h1": hosts["h1"].model_copy(update={"units": (dead,), "ports_in_use": (22,)})}
    restarted = plan(d, state, free, SHAPE)
    assert restarted.changes[0].replicas[0].action == ["update"] and not restarted.problems  # the port is free
    taken = {"h1": free["h1"].model_copy(update={"ports_in_use": (22, port)})}
    p = plan(d, state, taken, SHAPE)
    (c,) = p.changes
    assert c.replicas == [] and any(x.kind == "port-taken" for x in p.drift)
    (blocked,) = c.blocked
    assert blocked.startswith(f"replica 0 cannot start: port {port} on h1 is taken by another process while ")
    assert f"`ss -ltnp 'sport = :{port}'` on h1 names the process" in blocked
    assert p.problems == [f"chat: {blocked}"]  # plan and apply exit 1; apply leaves it as it is
    text = plan_text(p)
    assert NO_CHANGES not in text and "No changes can be made; but the hosts do not match the documents" in text
    running = {"h1": hosts["h1"].model_copy(update={"ports_in_use": (22, port)})}  # its own engine listens there
    assert not plan(d, state, running, SHAPE).has_changes and not plan(d, state, running, SHAPE).drift
    # stopped by an operator: nothing to do, and the plan says why `engine-ctl start` would fail
    state.deployments["chat"].operator = OperatorAction(verb="stopped", when="2026-12-06T02:00:00+00:00",
                                                        who="ops", operation="01KBJ0Q7ZP0000000000000000")  # fmt: skip
    stopped = unit.model_copy(update={"active_state": "inactive", "sub_state": "dead", "unit_file_state": "disabled"})
    held = plan(d, state, {"h1": taken["h1"].model_copy(update={"units": (stopped,)})}, SHAPE)
    (c,) = held.changes
    assert not held.has_changes and not held.problems and c.replicas == []
    assert any(w.startswith("replica 0 cannot start: port") for w in c.warnings), c.warnings
    assert held.drift == [], "said once, as the held deployment's warning"


def test_an_engine_started_with_arguments_or_settings_its_unit_does_not_give_is_drift() -> None:
    """/proc/PID/cmdline and the names in /proc/PID/environ of the replica's engine (the facts keep no value):
    a wrapper's added arguments, or a LLAMA_ARG_* from systemd's manager environment, are drift; the command line
    as the unit gives it (a key flag's value hidden on both sides) and the unit's own Environment= are not."""
    from engine_ctl.core.plan.unitdiff import hide_argv

    d = desired("path: m/m.gguf")
    hosts = {"h1": cpu_host("h1")}
    state, hosts = applied(plan(d, State(), hosts, SHAPE), State(), hosts)
    (unit,) = hosts["h1"].units
    argv = state.deployments["chat"].replicas[0].argv
    text = "[Service]\nEnvironment=LLAMA_ARG_THREADS_HTTP=2 OTHER=1\nExecStart=/x\n"
    as_given = {"proc_argv": hide_argv(argv), "proc_env": ("LLAMA_ARG_THREADS_HTTP", "PATH"), "main_pid": 42,
                "text": text}  # fmt: skip

    def with_unit(**change: object) -> dict[str, HostFacts]:
        return {"h1": hosts["h1"].model_copy(update={"units": (unit.model_copy(update={**as_given, **change}),)})}

    assert not plan(d, state, with_unit(), SHAPE).has_changes
    interpreted = with_unit(proc_argv=("/usr/bin/python3", *hide_argv(argv)))  # an interpreter before the script
    assert not plan(d, state, interpreted, SHAPE).has_changes
    assert not plan(d, state, with_unit(proc_argv=None, proc_env=None), SHAPE).has_changes  # not read: no verdict
    wrapped = plan(d, state, with_unit(proc_argv=(*hide_argv(argv), "--parallel", "1", "--n-predict", "1")), SHAPE)
    (drift,) = wrapped.drift
    assert drift.kind == "launch" and wrapped.has_changes
    assert "its engine (PID 42) runs with other arguments than its unit gives (--n-predict added) (a wrapper" in \
        drift.detail  # fmt: skip
    env = plan(d, state, with_unit(proc_env=("LLAMA_ARG_N_PREDICT", "LLAMA_ARG_THREADS_HTTP", "PATH")), SHAPE)
    (drift,) = env.drift
    assert "its engine's environment sets LLAMA_ARG_N_PREDICT, which its unit does not" in drift.detail
    # a key it answers beside its key file's (llama-server's LLAMA_API_KEY), code loaded into it (LD_PRELOAD)
    backdoor = plan(d, state, with_unit(proc_env=("LLAMA_API_KEY", "LD_PRELOAD", "LLAMA_ARG_THREADS_HTTP")), SHAPE)
    (drift,) = backdoor.drift
    assert "its engine's environment sets LLAMA_API_KEY, LD_PRELOAD, which its unit does not" in drift.detail
    assert env.changes[0].replicas[0].action == ["update"]
    assert hide_argv(["/x", "--api-key", "s3", "--api-key-file=/k", "--port", "1"]) == (
        "/x", "--api-key", "(sensitive)", "--api-key-file=(sensitive)", "--port", "1")  # fmt: skip


def test_status_calls_an_engine_systemd_keeps_restarting_failed_not_starting() -> None:
    """activating/auto-restart: the engine exited and systemd starts it again (a port another process holds, a bad
    flag). Before, status said `starting` ("a replica is starting") through the whole crash loop."""
    from engine_ctl.core.plan.status import deployment_status

    d = desired("path: m/m.gguf")
    hosts = {"h1": cpu_host("h1")}
    state, hosts = applied(plan(d, State(), hosts, SHAPE), State(), hosts)
    (unit,) = hosts["h1"].units
    looping = unit.model_copy(update={"active_state": "activating", "sub_state": "auto-restart", "n_restarts": 4,
                                      "exec_main_status": 1})  # fmt: skip
    found = {"h1": hosts["h1"].model_copy(update={"units": (looping,), "health": {}})}
    (instance,) = deployment_status(state.deployments["chat"], found).instances
    assert instance.state == "failed" and instance.last_error == "restarted 4 time(s), last: exit status 1"
    starting = unit.model_copy(update={"active_state": "activating", "sub_state": "start-post"})
    found = {"h1": hosts["h1"].model_copy(update={"units": (starting,), "health": {}})}
    assert [i.state for i in deployment_status(state.deployments["chat"], found).instances] == ["starting"]


def test_a_serving_replica_whose_engine_or_weights_are_gone_is_warned_of() -> None:
    """A probe (session 16): `chmod -x` of the engine, or its weights moved away, under a serving replica: the
    plan said "No changes" with no word, and the next crash or reboot left the replica down. apply cannot put
    them back; the plan says it (no change to make, a warning)."""
    from engine_ctl.core.fit.hostfacts import EngineInstall

    d = desired("path: m/m.gguf")
    hosts = {"h1": cpu_host("h1")}
    state, hosts = applied(plan(d, State(), hosts, SHAPE), State(), hosts)
    argv0 = state.deployments["chat"].replicas[0].argv[0]
    there = hosts["h1"].model_copy(update={"engines": {"llama.cpp": EngineInstall(path=argv0)}})

    def warned(h: HostFacts) -> list[str]:
        p = plan(d, state, {"h1": h}, SHAPE)
        assert not p.has_changes
        return [w for c in p.changes for w in c.warnings if "serves" in w]

    assert warned(there) == []
    assert warned(hosts["h1"]) == [f"replica 0 on h1 serves, but its engine {argv0} is not there (or not executable): "
                                   "it would not start again (a crash, a reboot); install it"]  # fmt: skip
    argv = state.deployments["chat"].replicas[0].argv
    path = argv[argv.index("--model") + 1]  # where its inventory's models_dir puts them
    moved = there.model_copy(update={"model_problems": {path: "not found"}})
    # gone from every host, the deployment is Failed ("the model is gone"); gone from its host only: this
    p = plan(d, state, {"h1": moved, "h2": cpu_host("h2")}, SHAPE)
    assert not p.has_changes
    assert [w for c in p.changes for w in c.warnings if "serves" in w] == [
        f"replica 0 on h1 serves what it loaded, but the weights of m are not at {path} (not found): it would not "
        "start again; put them back"
    ]
