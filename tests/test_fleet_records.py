"""Lifecycle records on the real fleet (issue 13 §2-5), with the real llama-server and the tiny real model:
revisions (the instance count alone keeps the engine, a context change rolls), apply --revision, request
identities (kill -9 mid-roll, then --request-id: it converges, no step twice), start-up measured on the first start
and reused by the next plan, and seed 003's tables column for column."""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import subprocess
import sys
import time
from typing import Any

import pytest
from engine_ctl.providers.base import at_least_2gib

from engine_ctl.core.fit.startup import SOURCES
from tests.fleet import Fleet
from tests.fleetproject import MODELS_DIR, ROOT, Project
from tests.llama import llama_server_dir

pytestmark = pytest.mark.fleet

REQUEST = re.compile(r"Request identity: ([0-9A-Z]{26}) \(reuse --request-id \1 to recover this command\)")
STATUS_HEADER = ["NAME", "STATE", "READY", "REVISION", "STARTUP", "INITIALIZE", "LAST", "OPERATION"]
INSTANCE_HEADER = ["INSTANCE", "HOST", "STATE", "LIFECYCLE", "DEVICES", "LAST", "ERROR"]


def record(project: Project) -> dict[str, Any]:
    return project.state()["deployments"][project.name]  # type: ignore[no-any-return]


def rows(text: str, header: str) -> list[list[str]]:
    """The table under the line starting with `header`: its header, then its rows, split into words."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    out = []
    for line in lines[start:]:
        if not line.strip():
            break
        out.append(line.split())
    return out


def test_revisions_startup_and_the_seeds_tables(project: Project) -> None:
    name = project.name
    project.write("replicas: {min: 1, max: 1}\ncontext_length: 512")
    first = project.cli("apply", "--auto-approve", check=True)
    found = REQUEST.search(first.stderr.splitlines()[0])
    assert found, first.stderr
    state = project.state()
    (request,) = [r for r in state["requests"] if r["id"] == found.group(1)]
    assert request["command"] == "apply" and request["exit_code"] == 0 and request["result"] == "applied"
    assert len(request["steps"]) == 1 and request["steps"][0].startswith(f"{name}: create engine-ctl-{name}-0a")
    rec = record(project)
    assert rec["revision"] == 1 and rec["last_operation"] == "initialize succeeded"
    startup = rec["startup"]  # the fleet's hosts are cgroup v1 with no memory controller of the unit's own
    assert startup["revision"] == 1 and startup["host_source"] in SOURCES.values(), startup
    assert 1024 * 1024 < startup["host_peak_bytes"] < 4 * 1024**3 and startup["initialize_s"] > 0, startup

    shown = project.cli("status", "deployment", name, check=True).stdout
    table = rows(shown, "NAME")
    assert table[0] == STATUS_HEADER, shown
    assert table[1][:4] == [name, "ready", "1/1", "1"] and table[1][-2:] == ["initialize", "succeeded"], shown
    assert re.fullmatch(r"\d+s", table[1][6]) and table[1][5] == "MiB", shown  # e.g. 41.3 MiB, 2s
    instances = rows(shown, "INSTANCE")
    assert instances[0] == INSTANCE_HEADER and instances[1][0] == "0" and instances[1][2:] == ["ready", "active", "-",
                                                                                              "-"], shown  # fmt: skip
    (doc,) = json.loads(project.cli("status", "deployment", name, "--json", check=True).stdout)["deployments"]
    assert doc["startup"]["provenance"] == "measured" and doc["startup"]["measured"] == startup
    assert "api" not in doc and doc["status"]["state"] == "Ready" and doc["plan"]["engine"] == "llama.cpp"

    # the next plan sets the measured peak aside instead of the estimate
    (change,) = json.loads(project.cli("plan", "--json", check=True).stdout)["changes"]
    # (never below seed 000's floor of 2 GiB per replica: the tiny model's peak is far below it)
    assert change["startup_provenance"] == "measured"
    assert change["fit"]["memory_bytes"] == at_least_2gib(startup["host_peak_bytes"])

    # only the instance count: a new revision, and the engine keeps running (same MainPID), its start-up kept
    (r0,) = project.replicas()
    pid = project.main_pid(r0)
    project.write("replicas: {min: 2, max: 2}\ncontext_length: 512")
    project.cli("apply", "--auto-approve", "--revision", f"{name}=1", check=True)
    rec = record(project)
    assert rec["revision"] == 2 and project.main_pid(r0) == pid and rec["startup"]["revision"] == 2
    assert len(project.replicas()) == 2

    # someone applied since revision 1: refused, exit 26, nothing applied
    project.write("replicas: {min: 2, max: 2}\ncontext_length: 1024")
    refused = project.cli("apply", "--auto-approve", "--revision", f"{name}=1")
    assert refused.returncode == 26, refused.stdout + refused.stderr
    assert f"{name} is at revision 2, not revision 1" in refused.stderr and record(project)["revision"] == 2
    assert project.main_pid(r0) == pid

    # a context change: a new revision and a rolling restart (new units, new engines), measured anew
    before = {r["unit"] for r in project.replicas()}
    project.cli("apply", "--auto-approve", "--revision", f"{name}=2", check=True)
    rec = record(project)
    assert rec["revision"] == 3 and rec["startup"]["revision"] == 3
    after = project.replicas()
    assert {r["unit"] for r in after}.isdisjoint(before) and {r["revision"] for r in after} == {3}
    assert all(project.health(r) == 200 for r in after)
    listed = project.cli("list", check=True).stdout
    lines = [line.split() for line in listed.splitlines() if line.strip()]
    assert lines[0] == ["NAME", "STATE", "READY", "REVISION", "HOSTS"], listed
    assert lines[1][:4] == [name, "ready", "2/2", "3"], listed


def _events(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def test_kill_9_mid_roll_then_request_id_converges_with_no_step_twice(project: Project) -> None:
    project.write("replicas: {min: 3, max: 3}\ncontext_length: 512")
    project.cli("apply", "--auto-approve", check=True)
    project.write("replicas: {min: 3, max: 3}\ncontext_length: 1024")
    argv = [sys.executable, "-m", "engine_ctl", "apply", str(project.path), "--inventory", project.fleet.inventory,
            "--auto-approve", "--json"]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT)
    assert proc.stdout is not None
    first: list[dict[str, Any]] = []
    for line in proc.stdout:
        first.append(json.loads(line))
        if first[-1]["event"] == "healthy":
            proc.kill()  # kill -9, mid-roll: one replica replaced, two to go
            break
    proc.wait(timeout=30)
    request_id = first[0]["request_id"]
    assert first[0]["event"] == "planned" and proc.returncode == -9
    assert project.state_file.with_name(project.state_file.name + ".lock").exists()  # left by the killed apply

    again = project.cli("apply", "--auto-approve", "--json", "--request-id", request_id, timeout=600)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"Continuing request {request_id} (`apply`" in again.stderr
    # the killed apply's lock: the kernel freed it with its process; the re-run clears what it left and says so
    assert f"(request {request_id})` (lock ID" in again.stderr and "was stale" in again.stderr, again.stderr
    second = _events(again.stdout)
    started = [(e["action"], e["unit"]) for e in first + second if e["event"] == "started"]
    assert len(started) == len(set(started)), started  # no step twice
    created = [unit for action, unit in started if "create" in action]
    assert len(created) == len(set(created)) == 3, started
    final = project.replicas()
    assert {r["unit"] for r in final} == set(created) and {r["revision"] for r in final} == {2}
    assert all(r["status"] == "serving" and project.health(r) == 200 for r in final)
    for r in final:  # each new engine was started once: the journal says so
        journal = project.fleet.ssh(project.host_of(r), f"journalctl -u {r['unit']} -o cat --no-pager").stdout
        assert journal.count("Started engine-ctl") == 1, journal
    assert project.cli("plan", "--detailed-exitcode").returncode == 0
    request = next(r for r in project.state()["requests"] if r["id"] == request_id)
    assert request["exit_code"] == 0 and request["finished"] and len(request["steps"]) >= 2

    # the finished request run again: its result, nothing done
    serial = project.state()["serial"]
    done = project.cli("apply", "--auto-approve", "--request-id", request_id)
    assert done.returncode == 0 and "nothing was done again" in done.stdout, done.stdout + done.stderr
    assert project.state()["serial"] == serial and record(project)["revision"] == 2


def test_a_failed_first_start_says_so_in_last_operation(project: Project) -> None:
    project.write("context_length: 512", model_file="corrupt.gguf")
    failed = project.cli("apply", "--auto-approve")
    assert failed.returncode == 1
    rec = record(project)
    assert rec["last_operation"] == "initialize failed (launch_failed)", rec
    assert rec["last_error"].startswith("launch_failed: launch failed: engine launch failed: "), rec
    shown = project.cli("status", "deployment", project.name).stdout
    table = rows(shown, "NAME")
    assert table[0] == STATUS_HEADER and table[1][-3:] == ["initialize", "failed", "(launch_failed)"], shown
    # seed 003: the failed replica keeps its row: READY 0/1, REVISION 1, row 0 with LAST ERROR launch_failed: …
    assert table[1][1:4] == ["failed", "0/1", "1"], shown
    instances = rows(shown, "INSTANCE")
    host = rec["failed_starts"][0]["host"]
    assert instances[0] == INSTANCE_HEADER, shown
    assert instances[1][:6] == ["0", host, "failed", "active", "-", "launch_failed:"], shown
    assert instances[-1][-2:] == ["each", "HOST"], shown  # its unit was removed: no unit runs now
    assert f"Hosts     {host}" in shown, shown
    (dep,) = json.loads(project.cli("status", project.name, "--json").stdout)["deployments"]
    assert (dep["state"], dep["ready"], dep["replicas"], dep["revision"]) == ("Failed", 0, 1, 1), dep
    (member,) = dep["members"]
    assert (member["index"], member["host"], member["state"]) == (0, host, "failed"), member
    assert member["last_error"] == rec["last_error"] and not member["ready"], member
    listed = rows(project.cli("list").stdout, "NAME")
    assert listed[1][1:] == ["failed", "0/1", "1", host], listed
    project.write("context_length: 512")  # the model mended: the row is the serving replica's, no failed start
    project.cli("apply", "--auto-approve", check=True)
    assert "failed_starts" not in record(project), record(project)
    assert rows(project.cli("status", project.name).stdout, "INSTANCE")[1][2] == "ready"
    # a roll whose new replica fails to start: it keeps its own row beside the one put back
    project.write("context_length: 512", model_file="corrupt.gguf")
    rolled = project.cli("apply", "--auto-approve")
    assert rolled.returncode == 1, rolled.stdout + rolled.stderr
    shown = project.cli("status", "deployment", project.name).stdout
    assert rows(shown, "NAME")[1][1:3] == ["ready", "1/1"], shown  # the old replica serves on
    old, new = (r for r in rows(shown, "INSTANCE")[1:] if r[0] in ("0a", "0b"))
    assert old[2] == "ready" and new[2:4] == ["failed", "active"] and new[5] == "launch_failed:", shown
    project.write("context_length: 512")
    project.cli("apply", "--auto-approve", check=True)
    # seed 000's plan object names the build the replica runs (path and digest) and its port; capabilities derived
    (dep,) = json.loads(project.cli("status", project.name, "--json").stdout)["deployments"]
    binary = llama_server_dir() / "bin" / "llama-server"
    assert dep["plan"]["image"]["path"] == str(binary), dep["plan"]
    assert dep["plan"]["image"]["sha256"] == hashlib.sha256(binary.read_bytes()).hexdigest(), dep["plan"]
    assert dep["plan"]["cpu_burst"] is True and dep["plan"]["port"] == dep["members"][0]["port"], dep["plan"]
    assert dep["capabilities"]["engine"] == "llama.cpp" and dep["capabilities"]["chat"] is True, dep["capabilities"]
    # a repair that restarts the replica and fails (its weights replaced under it by a file the engine refuses) is a
    # start that failed: LAST OPERATION says so (a probe, session 17: "initialize succeeded" after it)
    (served,) = record(project)["replicas"]
    where = next(h for h in project.fleet.hosts if h.name == served["host"])
    weights = f"{MODELS_DIR}/tiny/tiny.gguf"
    project.fleet.ssh(where, f"cp -p {weights} {weights}.kept && cp {MODELS_DIR}/tiny/corrupt.gguf {weights}")
    try:
        broken = project.cli("apply", "--auto-approve")
        assert broken.returncode == 1, broken.stdout + broken.stderr
        assert record(project)["last_operation"] == "initialize failed (launch_failed)", record(project)
    finally:
        project.fleet.ssh(where, f"mv {weights}.kept {weights}")
    project.cli("apply", "--auto-approve", check=True)


# The double speaks nvidia-smi's per-process query as NVIDIA's manual gives it (`nvidia-smi
# --help-query-compute-apps`; with --format=csv,noheader,nounits one line per process: `<pid>, <gpu_uuid>,
# <used_memory in MiB>`): the unit's processes on one GPU, 300 MiB on its first call and 700 MiB after, and a
# process of another program (pid 1) that must not count.
SMI_DOUBLE = """#!/bin/sh
n=$(cat /run/smi-double-calls 2>/dev/null || echo 0); n=$((n+1)); echo $n > /run/smi-double-calls
case "$*" in *--query-compute-apps=pid,gpu_uuid,used_memory*--format=csv,noheader,nounits*) ;; *) exit 2;; esac
cg=$(systemctl show -p ControlGroup --value engine-ctl-probe-0a.service)
for p in $(cat /sys/fs/cgroup/systemd$cg/cgroup.procs 2>/dev/null); do
  if [ "$n" = 1 ]; then echo "$p, GPU-5f2b0c1e-0000-4000-8000-00000000000a, 300"
  else echo "$p, GPU-5f2b0c1e-0000-4000-8000-00000000000a, 700"; fi
done
echo "1, GPU-5f2b0c1e-0000-4000-8000-00000000000a, 99999"
"""


def test_the_gpu_sampler_and_the_measurement_on_a_host_with_an_nvidia_smi_double(fleet: Fleet) -> None:
    from engine_ctl.core.fit.startup import DEVICE_SOURCE, MIB, parse_measurement
    from engine_ctl.shell.systemd import measured_argv, measurement

    h = fleet.hosts[-1]
    unit = "engine-ctl-probe-0a.service"
    fleet.ssh(h, f"printf %s {shlex.quote(SMI_DOUBLE)} > /usr/local/bin/nvidia-smi && chmod 755 "
                 "/usr/local/bin/nvidia-smi && rm -f /run/smi-double-calls")  # fmt: skip
    try:
        start = ["sh", "-c", f"systemd-run --quiet --unit={unit} --service-type=exec sleep 60 && sleep 3"]
        started = fleet.ssh(h, shlex.join(measured_argv(start, unit)))
        assert started.returncode == 0
        calls = int(fleet.ssh(h, "cat /run/smi-double-calls").stdout)
        found = parse_measurement(measurement(started.stdout))  # the measurement comes in the start's own session
        assert calls >= 3  # sampled every 0.5 s while it started, and no longer
        time.sleep(1.5)
        assert int(fleet.ssh(h, "cat /run/smi-double-calls").stdout) == calls
    finally:
        fleet.ssh(h, f"systemctl stop {unit}; rm -f /usr/local/bin/nvidia-smi /run/smi-double-calls", check=False)
    assert found.device_peak_bytes == {"GPU-5f2b0c1e-0000-4000-8000-00000000000a": 700 * MIB}, found
    assert found.device_source == DEVICE_SOURCE and found.host_peak_bytes and found.host_peak_bytes > 0


def test_removing_a_unit_says_whether_the_host_had_it(fleet: Fleet) -> None:
    """apply's removal of a replica says "stopped and removed" only where the host had that unit: a host name whose
    address now reaches another machine has nothing to stop, and apply says so (a probe, session 17: it said
    "stopped and removed" while the replica ran on, forgotten, on the machine it was on)."""
    from engine_ctl.shell.systemd import NOT_THERE, remove_argv

    h = fleet.hosts[-1]
    unit = "engine-ctl-gone-0a.service"
    absent = fleet.ssh(h, shlex.join(remove_argv(unit)))
    assert absent.returncode == 0 and NOT_THERE in absent.stdout, absent.stdout + absent.stderr
    fleet.ssh(h, f"printf '[Service]\\nExecStart=/bin/sleep 300\\n' > /etc/systemd/system/{unit} && "
                 f"systemctl daemon-reload && systemctl start {unit} && mkdir -p /run/engine-ctl/exits && "
                 f"echo '1733312345 signal killed SEGV' > /run/engine-ctl/exits/{unit}")  # fmt: skip
    removed = fleet.ssh(h, shlex.join(remove_argv(unit)))
    assert removed.returncode == 0 and NOT_THERE not in removed.stdout, removed.stdout + removed.stderr
    assert fleet.ssh(h, f"systemctl is-active {unit}", check=False).stdout.strip() != "active"
    assert fleet.ssh(h, f"test -e /etc/systemd/system/{unit}", check=False).returncode != 0
    # its crashes go with it (a probe, session 17: a new unit of the same name showed its predecessor's)
    assert fleet.ssh(h, f"test -e /run/engine-ctl/exits/{unit}", check=False).returncode != 0
