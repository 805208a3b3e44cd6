"""The promise of a plan on the real fleet (issue 24): "No changes" and exit 0 only when every document is served
as written. Real hosts, real SSH, the real llama-server and the tiny real model (tests/tools/make_tiny_model.py).

- A model path changed to a file that is not a GGUF (bad magic), or to a GGUF header of random bytes: plan names
  the file, each host and why, and exits 1 (with --detailed-exitcode too); apply exits 1 and changes nothing; the
  old replica serves on (points 2 and 16).
- A CPU model whose weights alone are larger than any host's memory is Pending with the seed's reason, not placed
  on the host with the most memory (point 10).
- A checkpoint changed on its host is drift that apply repairs: plan exits 2, apply fetches it again (every file
  verified against the hub) and restarts the replica on it, and the next plan is empty (point 4).
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from pathlib import Path

import pytest

from tests.fleetproject import MODELS_DIR, Project
from tests.hubdouble import HubDouble
from tests.llama import tiny_model
from tests.test_fleet_weights import REPO, hf_project, hub  # noqa: F401 (fixtures)

pytestmark = pytest.mark.fleet

NO_CHANGES = "No changes. The hosts match the documents."
BAD = {
    "bad-magic.gguf": ("head -c 65536 /dev/zero", "not a GGUF file (bad magic)"),
    "random.gguf": (
        "python3 -c \"import random,sys; sys.stdout.buffer.write(b'GGUF' + random.Random(24).randbytes(65536))\"",
        "not a valid GGUF file (unknown GGUF version ",
    ),
}


def test_a_model_path_changed_to_an_unusable_file_is_pending_naming_it_and_plan_and_apply_exit_1(
    project: Project,
) -> None:
    project.write("context_length: 512")
    project.cli("apply", "--auto-approve", check=True)
    (old,) = project.replicas()
    for h in project.fleet.hosts:
        for name, (make, _) in BAD.items():
            project.fleet.ssh(h, f"{make} > {MODELS_DIR}/tiny/{name} && chmod 644 {MODELS_DIR}/tiny/{name}")
    hosts = ", ".join(h.name for h in project.fleet.hosts)
    for name, (_, why) in BAD.items():
        project.write("context_length: 512", model_file=name)
        for args in (("plan",), ("plan", "--detailed-exitcode")):
            planned = project.cli(*args)
            said = planned.stdout + planned.stderr
            assert planned.returncode == 1, said
            assert NO_CHANGES not in said and "Pending: " + project.name in said
            assert f"{MODELS_DIR}/tiny/{name} on {hosts}: {why}" in said, said
        applied = project.cli("apply", "--auto-approve")
        assert applied.returncode == 1, applied.stdout + applied.stderr
        assert f"{MODELS_DIR}/tiny/{name} on {hosts}: {why}" in applied.stdout + applied.stderr
        (still,) = project.replicas()
        assert still["unit"] == old["unit"] and still["revision"] == 1 and project.health(still) == 200
        assert project.state()["deployments"][project.name]["revision"] == 1  # the new one is never recorded
    project.write("context_length: 512")
    assert project.cli("plan", "--detailed-exitcode").returncode == 0  # back to the served documents


def test_a_cpu_model_larger_than_any_hosts_memory_is_pending_with_the_seeds_reason(project: Project) -> None:
    # the tiny model's real GGUF header, its file extended (sparse) to 48 GiB: weights no fleet host can hold
    for h in project.fleet.hosts:
        huge = f"{MODELS_DIR}/tiny/huge.gguf"
        project.fleet.ssh(h, f"cp {tiny_model()} {huge} && truncate -s 48G {huge}")
    try:
        project.write("context_length: 512", model_file="huge.gguf")
        planned = project.cli("plan", "--json")
        assert planned.returncode == 1, planned.stdout + planned.stderr
        (change,) = json.loads(planned.stdout)["changes"]
        assert change["replicas"] == [] and not change["whole_host"]
        assert re.fullmatch(r"Waiting for a machine with 5\d\.\d GiB of free memory \(\d+\.\d GiB free here\)",
                            change["pending_reason"]), change["pending_reason"]  # fmt: skip
        human = project.cli("plan")
        assert human.returncode == 1 and NO_CHANGES not in human.stdout and "whole_host" not in human.stdout
        applied = project.cli("apply", "--auto-approve")
        assert applied.returncode == 1, applied.stdout + applied.stderr
        record = project.state()["deployments"][project.name]
        assert record["state"] == "Pending" and record["replicas"] == []
        assert re.fullmatch(r"Waiting for a machine with 5\d\.\d GiB of free memory \(\d+\.\d GiB free here\)",
                            record["reason"] or ""), record["reason"]  # fmt: skip
    finally:
        for h in project.fleet.hosts:
            project.fleet.ssh(h, f"rm -f {MODELS_DIR}/tiny/huge.gguf", check=False)


def test_a_checkpoint_changed_on_its_host_is_a_change_apply_fetches_it_again_and_restarts_the_replica(
    hub: HubDouble,  # noqa: F811
    hf_project: Project,  # noqa: F811
) -> None:
    p = hf_project
    p.cli("apply", "--auto-approve", check=True)
    (served,) = p.replicas()
    dest = f"{MODELS_DIR}/sources/{REPO}/{hub.repos[REPO].commit}"
    host = p.host_of(served)
    before = p.main_pid(served)
    good = hashlib.sha256(tiny_model().read_bytes()).hexdigest()
    # a byte of the served weights changed on the host, outside engine-ctl
    p.fleet.ssh(host, f"printf '\\x00' | dd of={dest}/tiny.gguf bs=1 seek=5000000 conv=notrunc status=none")
    planned = p.cli("plan", "--detailed-exitcode")
    said = planned.stdout + planned.stderr
    assert planned.returncode == 2, said
    assert NO_CHANGES not in said and f"the checkpoint digest of {REPO}@" in said, said
    doc = json.loads(p.cli("plan", "--json").stdout)
    assert [d["kind"] for d in doc["drift"]] == ["weights-changed"]
    (change,) = doc["changes"]
    (repair,) = change["replicas"]
    assert repair["action"] == ["update"] and repair["unit"] == served["unit"]
    (fetch,) = change["fetches"]
    assert fetch["host"] == served["host"] and fetch["in_place"] is False
    applied = p.cli("apply", "--auto-approve")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    on_host = p.fleet.ssh(host, f"sha256sum {dest}/tiny.gguf").stdout
    assert good in on_host  # fetched again from the hub, verified
    (after,) = p.replicas()
    assert after["unit"] == served["unit"] and after["checkpoint_digest"] == served["checkpoint_digest"]
    assert p.main_pid(after) != before and p.chat(after)["model"] == p.name  # restarted on the repaired weights
    again = p.cli("plan", "--detailed-exitcode")
    assert again.returncode == 0 and NO_CHANGES in again.stdout, again.stdout + again.stderr


def test_weights_written_at_a_path_after_the_replica_started_are_drift_and_apply_restarts_it(project: Project) -> None:
    """A `path:` model has no digest: the file replaced in place (a new quantisation copied over the old one) leaves
    the engine serving what it loaded at its start. Before, plan said "No changes"; now the write after the start
    is drift (the file's mtime against systemd's start of the replica's main process), apply restarts the replica,
    and the next plan is empty. A file only read (the probe, the engine) moves nothing."""
    for h in project.fleet.hosts:
        project.fleet.ssh(h, f"cp -p {MODELS_DIR}/tiny/tiny.gguf {MODELS_DIR}/tiny/written.gguf")
    project.write("context_length: 512", model_file="written.gguf")
    project.cli("apply", "--auto-approve", check=True)
    assert project.cli("plan", "--detailed-exitcode").returncode == 0
    (served,) = project.replicas()
    host, before = project.host_of(served), project.main_pid(served)
    time.sleep(1.5)  # past the second of slack either side of the replica's start
    path = f"{MODELS_DIR}/tiny/written.gguf"
    # `cp -p` keeps the old file's mtime (as rsync -a does): only the inode's ctime says it was written now
    project.fleet.ssh(host, f"cp -p {MODELS_DIR}/tiny/tiny.gguf {path}.new && mv {path}.new {path}")
    stat = project.fleet.ssh(host, f"stat -c '%Y %Z' {path}").stdout.split()
    assert int(stat[0]) < int(stat[1]), stat  # mtime before the replica's start, ctime after
    planned = project.cli("plan", "--detailed-exitcode")
    said = planned.stdout + planned.stderr
    assert planned.returncode == 2, said
    assert f"the weights at {path} were written after the replica started (written " in said, said
    assert "it serves what it loaded; apply restarts it on them" in said and NO_CHANGES not in said
    applied = project.cli("apply", "--auto-approve")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    (after,) = project.replicas()
    assert after["unit"] == served["unit"] and project.main_pid(after) != before
    assert project.health(after) == 200
    again = project.cli("plan", "--detailed-exitcode")
    assert again.returncode == 0 and NO_CHANGES in again.stdout, again.stdout + again.stderr


def test_a_unit_edited_restarted_then_put_back_is_drift_and_apply_restarts_it(project: Project) -> None:
    """A person adds settings to a replica's unit, restarts it on them, then copies the file back (`cp -p`,
    daemon-reload): the file is as recorded, but the engine runs at Nice=19 (the probe, session 16, F16: plan said
    "No changes"). The file's change after the engine's start is drift; apply restarts it on its file, and the
    next plan is empty."""
    project.write("context_length: 512")
    project.cli("apply", "--auto-approve", check=True)
    assert project.cli("plan", "--detailed-exitcode").returncode == 0
    (served,) = project.replicas()
    host, unit = project.host_of(served), served["unit"]
    path = f"/etc/systemd/system/{unit}"
    time.sleep(1.5)  # past the second of slack either side of the engine's start
    project.fleet.ssh(host, f"cp -p {path} /root/unit.kept && sed -i 's/^\\[Service\\]$/[Service]\\nNice=19/' {path} "
                            f"&& systemctl daemon-reload && systemctl restart {unit} && sleep 1.5 && "
                            f"cp -p /root/unit.kept {path} && systemctl daemon-reload")  # fmt: skip
    edited = project.main_pid(served)
    assert project.fleet.ssh(host, f"ps -o ni= -p {edited}").stdout.strip() == "19"
    planned = project.cli("plan", "--detailed-exitcode")
    said = planned.stdout + planned.stderr
    assert planned.returncode == 2, said
    assert f"{unit} on {host.name}: its unit file changed after its engine started (changed " in said, said
    assert NO_CHANGES not in said
    applied = project.cli("apply", "--auto-approve")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    (after,) = project.replicas()
    now = project.main_pid(after)
    assert after["unit"] == unit and now != edited and project.health(after) == 200
    assert project.fleet.ssh(host, f"ps -o ni= -p {now}").stdout.strip() == "0"
    again = project.cli("plan", "--detailed-exitcode")
    assert again.returncode == 0 and NO_CHANGES in again.stdout, again.stdout + again.stderr


def test_an_engine_stopped_by_sigstop_is_drift_and_apply_restarts_it(project: Project) -> None:
    """The unit stays active and its port open while the engine answers nothing. Before, plan said "No changes"."""
    project.write("context_length: 512")
    project.cli("apply", "--auto-approve", check=True)
    (served,) = project.replicas()
    host, before = project.host_of(served), project.main_pid(served)
    project.fleet.ssh(host, f"kill -STOP {before}")
    planned = project.cli("plan", "--detailed-exitcode")
    said = planned.stdout + planned.stderr
    assert planned.returncode == 2, said
    assert f"{served['unit']} runs on {host.name} but its engine (PID {before}) is stopped by a signal" in said, said
    status = project.cli("status")
    assert "stopped by a signal (SIGSTOP)" in status.stdout + status.stderr, status.stdout + status.stderr
    applied = project.cli("apply", "--auto-approve")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    (after,) = project.replicas()
    assert project.main_pid(after) != before and project.health(after) == 200
    again = project.cli("plan", "--detailed-exitcode")
    assert again.returncode == 0 and NO_CHANGES in again.stdout, again.stdout + again.stderr


def test_a_port_another_process_took_while_the_replica_was_down_is_named_and_nothing_restarts_into_it(
    project: Project,
) -> None:
    """The replica's unit stopped, another process listening on its port (here one that even answers GET /health
    with 200, as a health gate would take for the engine). Before, plan offered a restart, whose health gate could
    pass on that process; now plan names the port and exits 1, apply exits 1 and starts nothing, and once the port
    is free again the repair runs and the next plan is empty."""
    project.write("context_length: 512")
    project.cli("apply", "--auto-approve", check=True)
    (served,) = project.replicas()
    host, unit, port = project.host_of(served), served["unit"], served["port"]
    squatter = "ectl-test-squatter"
    project.fleet.ssh(host, f"systemctl stop {unit} && mkdir -p /tmp/{squatter} && echo ok > /tmp/{squatter}/health && "
                            f"systemd-run --quiet --collect --unit={squatter} python3 -m http.server {port} "
                            f"--directory /tmp/{squatter}")  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while f":{port} " not in project.fleet.ssh(host, f"ss -Hltn 'sport = :{port}'", check=False).stdout + " ":
            assert time.monotonic() < deadline, "the squatter never listened"
            time.sleep(0.3)
        planned = project.cli("plan", "--detailed-exitcode")
        said = planned.stdout + planned.stderr
        assert planned.returncode == 1, said
        assert f"replica 0 cannot start: port {port} on {host.name} is taken by another process" in said, said
        assert NO_CHANGES not in said and "rewritten and restarted" not in said, said
        applied = project.cli("apply", "--auto-approve")
        assert applied.returncode == 1, applied.stdout + applied.stderr
        assert project.fleet.ssh(host, f"systemctl is-active {unit}", check=False).stdout.strip() == "inactive"
        assert f"port {port} on {host.name} is taken by another process" in applied.stdout + applied.stderr
        status = project.cli("status")
        assert re.search(r"\bready\b", status.stdout.split("INSTANCE")[-1]) is None, status.stdout  # not serving
    finally:
        project.fleet.ssh(host, f"systemctl stop {squatter}", check=False)
    planned = project.cli("plan", "--detailed-exitcode")
    assert planned.returncode == 2, planned.stdout + planned.stderr
    project.cli("apply", "--auto-approve", check=True)
    (after,) = project.replicas()
    assert project.health(after) == 200
    again = project.cli("plan", "--detailed-exitcode")
    assert again.returncode == 0 and NO_CHANGES in again.stdout, again.stdout + again.stderr


def test_a_unit_file_that_outranks_engine_ctls_is_drift_and_apply_removes_it(project: Project) -> None:
    """A copy of the replica's unit in /etc/systemd/system.control (read before /etc/systemd/system), its engine's
    flags changed, and the unit restarted on it: systemd runs that copy and engine-ctl's file is ignored. Before,
    plan and apply said "No changes" (a probe, session 15, ran a replica without its key this way)."""
    project.write("context_length: 512")
    project.cli("apply", "--auto-approve", check=True)
    (served,) = project.replicas()
    host, unit = project.host_of(served), served["unit"]
    copy = f"/etc/systemd/system.control/{unit}"
    project.fleet.ssh(host, f"mkdir -p /etc/systemd/system.control && sed 's/\"--parallel\" \"[0-9]*\"/\"--parallel\" "
                            f"\"1\"/' /etc/systemd/system/{unit} > {copy} && systemctl daemon-reload && "
                            f"systemctl restart {unit}")  # fmt: skip
    fragment = project.fleet.ssh(host, f"systemctl show -p FragmentPath --value {unit}").stdout.strip()
    assert fragment == copy
    planned = project.cli("plan", "--detailed-exitcode")
    said = planned.stdout + planned.stderr
    assert planned.returncode == 2, said
    assert f"{copy} replaces {unit} on {host.name} (systemd loads it, not engine-ctl's file" in said, said
    applied = project.cli("apply", "--auto-approve")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert project.fleet.ssh(host, f"test -e {copy} && echo there || echo gone").stdout.strip() == "gone"
    fragment = project.fleet.ssh(host, f"systemctl show -p FragmentPath --value {unit}").stdout.strip()
    assert fragment == f"/etc/systemd/system/{unit}"
    (after,) = project.replicas()
    assert project.health(after) == 200
    again = project.cli("plan", "--detailed-exitcode")
    assert again.returncode == 0 and NO_CHANGES in again.stdout, again.stdout + again.stderr


def test_a_state_rolled_back_to_before_the_deployment_never_writes_over_its_running_unit(project: Project) -> None:
    """The same lineage's state from before the deployment existed (an old backup put back): before, apply wrote
    over the running unit's file (another port), said it served there, and the next plan said "No changes" while
    nothing listened on that port. Now plan and apply exit 1 naming the unit, and nothing on the host changes."""
    project.write("context_length: 512")
    project.cli("apply", "--auto-approve", check=True)
    (served,) = project.replicas()
    host, unit = project.host_of(served), served["unit"]
    kept = project.state_file.read_text()
    older = json.loads(kept)
    older["deployments"], older["serial"] = {}, 1
    project.state_file.write_text(json.dumps(older))
    sha = project.fleet.ssh(host, f"sha256sum /etc/systemd/system/{unit}").stdout.split()[0]
    pid = project.main_pid(served)
    try:
        planned = project.cli("plan", "--detailed-exitcode")
        said = planned.stdout + planned.stderr
        assert planned.returncode == 1, said
        assert f"replica 0 would be {unit} on {host.name}, which is there already and not in this state" in said
        applied = project.cli("apply", "--auto-approve")
        assert applied.returncode == 1, applied.stdout + applied.stderr
        assert project.fleet.ssh(host, f"sha256sum /etc/systemd/system/{unit}").stdout.split()[0] == sha
        assert project.main_pid(served) == pid and project.health(served) == 200
    finally:
        project.state_file.write_text(kept)
    again = project.cli("plan", "--detailed-exitcode")
    assert again.returncode == 0 and NO_CHANGES in again.stdout, again.stdout + again.stderr


def test_an_engine_started_with_settings_or_arguments_its_unit_does_not_give_is_drift(project: Project) -> None:
    """What runs, not only what the unit file says. (1) `systemctl set-environment LLAMA_ARG_N_PREDICT=1` and a
    restart: llama-server reads it as a flag (every answer one token long). (2) A wrapper put at the engine's path
    that adds arguments. Before, plan said "No changes" after each (a probe, session 15); now each is drift, apply
    unsets the manager's setting before the restart, and a wrapper keeps the plan from saying "No changes"."""
    project.write("context_length: 512")
    project.cli("apply", "--auto-approve", check=True)
    (served,) = project.replicas()
    host, unit = project.host_of(served), served["unit"]
    project.fleet.ssh(host, f"systemctl set-environment LLAMA_ARG_N_PREDICT=1 && systemctl restart {unit}")
    try:
        planned = project.cli("plan", "--detailed-exitcode")
        said = planned.stdout + planned.stderr
        assert planned.returncode == 2, said
        assert "its engine's environment sets LLAMA_ARG_N_PREDICT, which its unit does not" in said, said
        project.cli("apply", "--auto-approve", check=True)
        assert "LLAMA_ARG" not in project.fleet.ssh(host, "systemctl show-environment").stdout
        pid = project.main_pid(served)
        assert "LLAMA_ARG_N_PREDICT" not in project.fleet.ssh(host, f"tr '\\0' '\\n' < /proc/{pid}/environ").stdout
        again = project.cli("plan", "--detailed-exitcode")
        assert again.returncode == 0 and NO_CHANGES in again.stdout, again.stdout + again.stderr
    finally:
        project.fleet.ssh(host, "systemctl unset-environment LLAMA_ARG_N_PREDICT", check=False)
    exe = served["argv"][0]
    wrapper = f'#!/bin/sh\\nexec {exe}.real "$@" --parallel 1\\n'
    project.fleet.ssh(host, f"cp -p {exe} {exe}.real && printf '{wrapper}' > {exe}.new && chmod 755 {exe}.new && "
                            f"mv {exe}.new {exe} && systemctl restart {unit}")  # fmt: skip
    try:
        project.cli("apply", "--auto-approve")  # the engine's new build is adopted (a restart onto it)
        planned = project.cli("plan", "--detailed-exitcode")
        said = planned.stdout + planned.stderr
        assert planned.returncode == 2 and NO_CHANGES not in said, said
        assert "runs with other arguments than its unit gives (a wrapper at its executable's path?)" in said, said
    finally:
        project.fleet.ssh(host, f"mv {exe}.real {exe}", check=False)
    project.cli("apply", "--auto-approve", check=True)
    again = project.cli("plan", "--detailed-exitcode")
    assert again.returncode == 0 and NO_CHANGES in again.stdout, again.stdout + again.stderr


def test_two_hosts_addresses_swapped_in_the_inventory_refuse_the_plan_and_nothing_moves(project: Project) -> None:
    """Each name reaches the other's machine (its /etc/machine-id, recorded at apply). Before, apply "stopped and
    removed" the replica at the other address, where nothing ran, while the replica ran on, forgotten, and the next
    plan said "No changes" (a probe, session 17). Now plan and apply exit 1 naming both machines, and nothing on
    either host changes; with the addresses put back the plan is empty."""
    project.write("context_length: 512")
    project.cli("apply", "--auto-approve", check=True)
    (served,) = project.replicas()
    host = project.host_of(served)
    other = next(h for h in project.fleet.hosts if h.name != host.name)
    machine = project.fleet.ssh(host, "cat /etc/machine-id").stdout.strip()
    assert project.state()["hosts"][host.name]["machine_id"] == machine
    text = Path(project.fleet.inventory).read_text()
    swapped = project.path / "swapped.yaml"
    swapped.write_text(text.replace(f"address: {host.address}}}", "address: @A@}")
                       .replace(f"address: {other.address}}}", f"address: {host.address}}}")
                       .replace("address: @A@}", f"address: {other.address}}}"))  # fmt: skip
    pid = project.main_pid(served)
    for verb in (("plan", "--detailed-exitcode"), ("apply", "--auto-approve")):
        done = project.cli(*verb, str(project.path), "--inventory", str(swapped), docs=False)
        said = done.stdout + done.stderr
        assert done.returncode == 1, said
        assert f"{host.name} is not the machine this state recorded under that name" in said, said
        assert f"it is the machine this state knows as {other.name}" in said, said
        assert "stopped and removed" not in said and NO_CHANGES not in said, said
    assert project.main_pid(served) == pid and project.health(served) == 200
    mine = f"'engine-ctl-{project.name}-*'"
    assert project.fleet.ssh(other, f"systemctl list-units --all --plain --no-legend {mine}").stdout == ""
    again = project.cli("plan", "--detailed-exitcode")
    assert again.returncode == 0 and NO_CHANGES in again.stdout, again.stdout + again.stderr
