"""The operator verbs on the real fleet (seed 003, "Stop, start, delete" and parking): real llama-server units
under systemd, the real HAProxy gateway in front, the real CLI in a subprocess.

One deployment, `lc` (one replica, pinned to the second host; the first host is the gateway), goes through the
verbs in order: stop then an immediate start (exit 25, nothing started), a request through the gateway while it is
stopped (deployment_stopped, nothing started), start --wait (ready), park and wake (llama.cpp restarts: its
MainPID changes), delete right after a stop (delete_requires_cleanup), delete --stop (units gone, weights kept),
and the tombstone: no plan re-creates it while its document is there, and the apply after its document is removed
forgets it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from engine_ctl.core.documents.apikey import key_sha256
from tests.fleet import Fleet, FleetHost
from tests.fleetproject import MODELS_DIR, gateway_chat

pytestmark = pytest.mark.fleet
KEY = "ak-test-lifecycle-" + "d4" * 24
ULID = re.compile(r"[0-9A-HJKMNP-TV-Z]{26}")
UNIT = "engine-ctl-lc-0a.service"


class Lifecycle:
    """Documents (the inventory's first host a gateway), a state beside them, and the real CLI run there."""

    def __init__(self, path: Path, fleet: Fleet) -> None:
        self.path, self.fleet = path, fleet
        self.gateway, self.engine_host = fleet.hosts[0], fleet.hosts[1]
        inventory = Path(fleet.inventory).read_text()
        line = f"  - {{name: {self.gateway.name}, address: {self.gateway.address}}}"
        assert line in inventory
        self.inventory = path / "hosts.yaml"
        self.inventory.write_text(inventory.replace(line, line[:-1] + ", roles: [gateway]}"))
        self.docs = path / "docs"
        self.docs.mkdir()
        self.write(with_deployment=True)

    def write(self, with_deployment: bool) -> None:
        model = "kind: Model\nmetadata: {name: tiny}\nspec: {format: gguf, path: tiny/tiny.gguf, parameters: 4170048}\n"
        deployment = textwrap.dedent(f"""
            ---
            metadata: {{name: lc}}
            spec: {{model: tiny, accelerator: cpu, cpu_cores: 1, context_length: 512, host: {self.engine_host.name}}}
            """)  # fmt: skip
        key = f"---\nkind: ApiKey\nmetadata: {{name: all}}\nspec: {{sha256: {key_sha256(KEY)}}}\n"
        (self.docs / "docs.yaml").write_text(model + (deployment if with_deployment else "") + key)

    def cli(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "engine_ctl", *args]
        if args[0] in ("plan", "apply", "destroy", "status", "list"):
            argv.append(str(self.docs))
        argv += ["--inventory", str(self.inventory)]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, cwd=self.docs)
        assert "Traceback" not in proc.stderr, proc.stderr
        return proc

    def state(self) -> dict:  # type: ignore[type-arg]
        return json.loads((self.path / "engine-ctl.state.json").read_text())

    def on_engine_host(self, command: str) -> str:
        return self.fleet.ssh(self.engine_host, command, check=False).stdout.strip()

    def unit_state(self) -> str:
        return self.on_engine_host(f"systemctl is-active {UNIT}")

    def main_pid(self) -> int:
        return int(self.on_engine_host(f"systemctl show -p MainPID --value {UNIT}"))

    def wait_for_unit(self, wanted: str, within: float = 90) -> None:
        deadline = time.monotonic() + within
        while self.unit_state() != wanted:
            assert time.monotonic() < deadline, f"{UNIT} is {self.unit_state()}, not {wanted}"
            time.sleep(1)

    def ask(self) -> tuple[int, dict]:  # type: ignore[type-arg]
        """One chat request through the gateway: its HTTP status and JSON body."""
        return gateway_chat(self.gateway.address, KEY, "lc")


@pytest.fixture(scope="module")
def lc(fleet: Fleet, weights: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lifecycle]:
    p = Lifecycle(tmp_path_factory.mktemp("lifecycle"), fleet)
    applied = p.cli("apply", "--auto-approve")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    yield p
    if (p.path / "engine-ctl.state.json").exists():
        p.cli("destroy", "--auto-approve")
    fleet.ssh(p.gateway, "systemctl disable --now engine-ctl-gateway.service", check=False)


def host(fleet: Fleet, name: str) -> FleetHost:
    return next(h for h in fleet.hosts if h.name == name)


def test_each_deployment_gets_a_stable_id_shown_in_status(lc: Lifecycle) -> None:
    first = lc.state()["deployments"]["lc"]["id"]
    assert ULID.fullmatch(first)
    shown = lc.cli("status", "lc")
    assert re.search(rf"^ID\s+{first}$", shown.stdout, re.MULTILINE), shown.stdout + shown.stderr
    again = lc.cli("apply", "--auto-approve")
    assert again.returncode == 0 and lc.state()["deployments"]["lc"]["id"] == first


def test_stop_then_an_immediate_start_is_refused_with_25_and_nothing_starts(lc: Lifecycle) -> None:
    stopped = lc.cli("stop", "deployment", "lc")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    lines = stopped.stdout.splitlines()
    rid = identity(stopped.stderr.splitlines()[0])  # first, on stderr: stdout is what the verb did
    assert lines[:2] == ["Stop requested for lc", ""] and re.fullmatch(r"  Operation   [0-9A-Z]{26}", lines[2]), lines
    start = lc.cli("start", "deployment", "lc")
    assert start.returncode == 25, start.stdout + start.stderr
    assert start.stderr.splitlines()[-1] == (
        "error [still_stopping]: lc is still stopping; nothing was started. Retry in a moment, or run "
        "`engine-ctl start deployment lc --wait`, which waits for the stop to finish and then starts"
    )
    lc.wait_for_unit("inactive")  # the stop finishes; the refused start started nothing
    assert lc.on_engine_host(f"systemctl is-enabled {UNIT}") == "disabled"
    assert lc.state()["deployments"]["lc"]["operator"]["verb"] == "stopped"
    again = lc.cli("stop", "deployment", "lc", "--request-id", rid)  # a finished request: its result, nothing done
    assert again.returncode == 0 and f"Request {rid} (`stop deployment lc`) finished at" in again.stdout, again.stdout
    recorded = next(r for r in lc.state()["requests"] if r["id"] == rid)
    assert recorded["command"] == "stop deployment lc" and recorded["exit_code"] == 0


def identity(line: str) -> str:
    """Seed 003's first line of a command that changes something; returns its ULID."""
    found = re.fullmatch(r"Request identity: ([0-9A-Z]{26}) \(reuse --request-id \1 to recover this command\)", line)
    assert found, line
    return found.group(1)


def test_a_request_through_the_gateway_for_the_stopped_deployment_is_refused_and_starts_nothing(lc: Lifecycle) -> None:
    ident = lc.state()["deployments"]["lc"]["id"]
    status, body = lc.ask()
    assert status == 409
    said = (f"deployment {ident} was stopped by an operator; inference does not start it; start it with "
            f"`engine-ctl start deployment {ident}`")  # fmt: skip
    assert (body["code"], body["message"]) == ("deployment_stopped", said)  # the seed's shape
    assert body["error"] == {"message": said, "type": "invalid_request_error", "param": "model",
                             "code": "deployment_stopped"}  # and the OpenAI envelope clients read  # fmt: skip
    time.sleep(3)
    assert lc.unit_state() == "inactive"


def test_engine_controls_are_never_reachable_through_the_gateway(lc: Lifecycle) -> None:
    """Sleep controls (vLLM's /sleep, /wake_up; SGLang's /release_memory_occupation) live beside /v1 on a replica's
    port: the gateway forwards only /v1/."""
    for path in ("/sleep?level=1", "/wake_up", "/release_memory_occupation", "/slots"):
        req = urllib.request.Request(f"http://{lc.gateway.address}:8800{path}", data=b"{}", method="POST",
                                     headers={"Authorization": f"Bearer {KEY}"})  # fmt: skip
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(req, timeout=10)
        assert refused.value.code == 404 and json.loads(refused.value.read())["error"]["code"] == "unknown_url"


def test_plan_and_apply_keep_it_stopped_and_say_so(lc: Lifecycle) -> None:
    plan = lc.cli("plan", "--detailed-exitcode")
    assert plan.returncode == 0, plan.stdout + plan.stderr
    assert "Held: lc was stopped by an operator" in plan.stdout and "Changed outside engine-ctl" not in plan.stdout
    assert lc.cli("apply", "--auto-approve").returncode == 0
    assert lc.unit_state() == "inactive"
    status = lc.cli("status", "lc")
    assert re.search(r"^lc\s+stopped\s+0/1", status.stdout, re.MULTILINE), status.stdout


def test_a_hand_edit_of_a_stopped_units_file_is_written_back_and_nothing_starts(lc: Lifecycle) -> None:
    """`engine-ctl start` starts the units as they are: an edit made while it is stopped would run then. Before,
    plan listed the edit beside "No changes" and apply left it; now apply writes engine-ctl's file back, and the
    unit stays stopped and disabled."""
    path = f"/etc/systemd/system/{UNIT}"
    written = lc.on_engine_host(f"sha256sum {path}").split()[0]
    lc.on_engine_host(f"sed -i 's/^\\[Service\\]$/[Service]\\nEnvironment=ECTL_HELD_EDIT=1/' {path} && "
                      "systemctl daemon-reload")  # fmt: skip
    assert "ECTL_HELD_EDIT=1" in lc.on_engine_host(f"cat {path}")
    plan = lc.cli("plan", "--detailed-exitcode")
    said = plan.stdout + plan.stderr
    assert plan.returncode == 2, said
    assert "unit file edited by hand" in said and "written again, kept stopped" in said, said
    assert "Held: lc was stopped by an operator" in said and "Replicas: 1 to repair." in said, said
    applied = lc.cli("apply", "--auto-approve")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert lc.on_engine_host(f"sha256sum {path}").split()[0] == written
    assert lc.unit_state() == "inactive" and lc.on_engine_host(f"systemctl is-enabled {UNIT}") == "disabled"
    assert lc.state()["deployments"]["lc"]["operator"]["verb"] == "stopped"
    again = lc.cli("plan", "--detailed-exitcode")
    assert again.returncode == 0, again.stdout + again.stderr


def test_start_wait_starts_it_and_returns_when_it_answers(lc: Lifecycle) -> None:
    """Right after the gateway was killed (systemd restarts it within seconds): the start waits for its stats
    socket to answer again (issue 24's soak, seed 31: it ended in "this is a bug in engine-ctl" with the
    deployment's hold lifted in the state and still refused by the gateway)."""
    ident = lc.state()["deployments"]["lc"]["id"]  # as the gateway's deployment_stopped answer names it
    lc.fleet.ssh(lc.gateway, "kill -9 $(systemctl show -p MainPID --value engine-ctl-gateway.service)")
    started = lc.cli("start", "deployment", ident, "--wait")
    assert started.returncode == 0, started.stdout + started.stderr
    identity(started.stderr.splitlines()[0])
    assert started.stdout.splitlines() == [
        "Waiting for the stop of lc to finish (at most 160s)",
        "Started lc: ready",
        "",
        "  Ready       1/1",
        f"  Hosts       {lc.engine_host.name}",
        "  Operation   initialize succeeded",
    ]
    assert lc.unit_state() == "active"
    status, body = lc.ask()
    assert status == 200 and body["model"] == "lc", body
    assert "operator" not in lc.state()["deployments"]["lc"]
    plan = lc.cli("plan", "--detailed-exitcode")
    assert plan.returncode == 0, plan.stdout + plan.stderr


def test_park_and_wake_of_a_llamacpp_deployment_is_a_restart(lc: Lifecycle) -> None:
    before = lc.main_pid()
    parked = lc.cli("park", "deployment", "lc")
    assert parked.returncode == 0, parked.stdout + parked.stderr
    assert parked.stdout.splitlines()[:2] == ["Park requested for lc", ""], parked.stdout
    identity(parked.stderr.splitlines()[0])
    seen = set()
    deadline = time.monotonic() + 90
    while "parked" not in seen:
        assert time.monotonic() < deadline, seen
        shown = lc.cli("status", "lc").stdout
        seen |= {m.group(1) for m in [re.search(r"^lc\s+(\S+)", shown, re.MULTILINE)] if m}
    assert seen >= {"parking", "parked"} or seen == {"parked"}, seen
    assert lc.unit_state() == "inactive"
    woken = lc.cli("start", "deployment", "lc", "--wait")
    assert woken.returncode == 0 and "Started lc: ready" in woken.stdout, woken.stdout + woken.stderr
    assert woken.stdout.startswith("Waking lc from its park"), woken.stdout  # a wake, not a stop's words
    assert lc.unit_state() == "active" and lc.main_pid() != before  # restart_only: a new engine process
    assert lc.ask()[0] == 200
    # --json: the same verbs for scripts, one document on stdout with stable fields
    parked = lc.cli("park", "lc", "--json")
    assert parked.returncode == 0, parked.stdout + parked.stderr
    doc = json.loads(parked.stdout)
    assert {k: doc[k] for k in ("format_version", "verb", "deployment")} == {"format_version": 1, "verb": "park",
                                                                           "deployment": "lc"}  # fmt: skip
    assert isinstance(doc["operation"], str) and doc["operation"]
    woken = lc.cli("start", "lc", "--wait", "--json")
    assert woken.returncode == 0, woken.stdout + woken.stderr
    doc = json.loads(woken.stdout)
    assert (doc["verb"], doc["ready"], doc["replicas"]) == ("start", 1, 1) and doc["hosts"], doc
    unknown = lc.cli("stop", "nope", "--json")
    assert unknown.returncode == 1
    assert json.loads(unknown.stdout)["error"]["details"][0]["code"] == "unknown_deployment", unknown.stdout


def test_a_park_asleep_is_parking_while_its_park_job_runs_then_parked(lc: Lifecycle) -> None:
    """An engine that sleeps (vLLM, SGLang) stays active while parked, so status asks its host for the park job
    (`park-<unit>`, a transient systemd unit). No such engine runs here: the record says a level-1 park of `lc`,
    and a real transient unit of that name stands for its job."""
    path = lc.path / "engine-ctl.state.json"
    before = path.read_text()
    doc = json.loads(before)
    doc["deployments"]["lc"]["operator"] = {"verb": "parked", "when": "2026-12-03T11:00:00+00:00", "level": 1}
    path.write_text(json.dumps(doc))
    try:
        lc.on_engine_host(f"systemd-run --quiet --collect --unit=park-{UNIT} sleep 60")
        shown = lc.cli("status", "lc").stdout
        assert re.search(r"^lc\s+parking\s", shown, re.MULTILINE), shown
        lc.on_engine_host(f"systemctl stop park-{UNIT}")
        shown = lc.cli("status", "lc").stdout
        assert re.search(r"^lc\s+parked\s", shown, re.MULTILINE), shown
    finally:
        lc.on_engine_host(f"systemctl stop park-{UNIT} 2>/dev/null")
        path.write_text(before)


def test_a_start_without_wait_records_starting_until_the_engine_answers_and_apply_then_records_serving(
    lc: Lifecycle,
) -> None:
    assert lc.cli("stop", "deployment", "lc").returncode == 0
    lc.wait_for_unit("inactive")
    started = lc.cli("start", "deployment", "lc")
    assert started.returncode == 0, started.stdout + started.stderr
    assert started.stdout.splitlines()[:2] == ["Start requested for lc", ""], started.stdout
    record = lc.state()["deployments"]["lc"]
    assert [r["status"] for r in record["replicas"]] == ["starting"] and record["last_operation"] == "start requested"
    seen = set()
    deadline = time.monotonic() + 120
    while "ready" not in seen:  # status reads live health: starting while the engine loads, then ready
        assert time.monotonic() < deadline, seen
        shown = lc.cli("status", "lc").stdout
        seen |= {m.group(1) for m in [re.search(r"^lc\s+(\S+)", shown, re.MULTILINE)] if m}
    assert seen <= {"starting", "ready"}, seen
    applied = lc.cli("apply", "--auto-approve")  # proves it answers (as after a cut-off apply) and records it
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert [r["status"] for r in lc.state()["deployments"]["lc"]["replicas"]] == ["serving"]
    assert lc.cli("plan", "--detailed-exitcode").returncode == 0
    assert lc.ask()[0] == 200


def test_a_stopped_unit_started_by_hand_is_said_stopped_again_by_apply_and_start_wait_takes_it_back(
    lc: Lifecycle,
) -> None:
    """`systemctl start` of a stopped deployment's unit once its stop is over: its stop job gone from the host, well
    within STOP_WAIT_S (the state's stop time set back 30 s only: a job may start up to 10 s after the stop is
    recorded). Before, plan said "No changes", status `stopping` for good, `start --wait` exited 25 and `stop` said
    "already stopped" (a probe, session 15); and until 160 s had passed, "stopping" (session 17). Its unit enabled
    by hand (it would start at the next boot) is drift as well, which apply disables."""
    assert lc.cli("stop", "deployment", "lc").returncode == 0
    lc.wait_for_unit("inactive")
    path = lc.path / "engine-ctl.state.json"
    doc = json.loads(path.read_text())
    doc["deployments"]["lc"]["operator"]["when"] = (datetime.now(UTC) - timedelta(seconds=30)).isoformat()
    path.write_text(json.dumps(doc))
    lc.on_engine_host(f"systemctl start {UNIT}")
    lc.wait_for_unit("active")
    status = lc.cli("status", "lc")
    assert re.search(r"^lc\s+stopped\s", status.stdout, re.MULTILINE), status.stdout
    assert "runs again (started outside engine-ctl)" in status.stdout, status.stdout
    plan = lc.cli("plan", "--detailed-exitcode")
    said = plan.stdout + plan.stderr
    assert plan.returncode == 2, said
    assert f"{UNIT} runs on {lc.engine_host.name} though lc is stopped by an operator" in said, said
    applied = lc.cli("apply", "--auto-approve")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert lc.unit_state() == "inactive" and lc.on_engine_host(f"systemctl is-enabled {UNIT}") == "disabled"
    assert lc.cli("plan", "--detailed-exitcode").returncode == 0
    lc.on_engine_host(f"systemctl enable {UNIT}")
    enabled = lc.cli("plan", "--detailed-exitcode")
    assert enabled.returncode == 2, enabled.stdout + enabled.stderr
    assert f"{UNIT} is enabled on {lc.engine_host.name} though lc is stopped by an operator: it would start at the " \
           "next boot" in enabled.stdout, enabled.stdout  # fmt: skip
    assert lc.cli("apply", "--auto-approve").returncode == 0
    assert lc.unit_state() == "inactive" and lc.on_engine_host(f"systemctl is-enabled {UNIT}") == "disabled"
    assert lc.cli("plan", "--detailed-exitcode").returncode == 0
    lc.on_engine_host(f"systemctl start {UNIT}")  # once more by hand: the verbs take it from there
    lc.wait_for_unit("active")
    again = lc.cli("stop", "deployment", "lc")
    assert again.returncode == 0 and "stopped again" in again.stdout, again.stdout + again.stderr
    lc.wait_for_unit("inactive")
    lc.on_engine_host(f"systemctl start {UNIT}")
    lc.wait_for_unit("active")
    started = lc.cli("start", "deployment", "lc", "--wait")
    assert started.returncode == 0 and "Started lc: ready" in started.stdout, started.stdout + started.stderr
    assert "operator" not in lc.state()["deployments"]["lc"] and lc.ask()[0] == 200
    assert lc.cli("plan", "--detailed-exitcode").returncode == 0


def test_delete_right_after_stop_is_refused_then_delete_stop_removes_the_units_and_keeps_the_weights(
    lc: Lifecycle,
) -> None:
    assert lc.cli("stop", "deployment", "lc").returncode == 0
    refused = lc.cli("delete", "deployment", "lc")
    assert refused.returncode == 25, refused.stdout + refused.stderr
    assert refused.stderr.splitlines()[-1].startswith(
        "error [delete_requires_cleanup]: lc is still stopping; nothing was deleted."
    )
    assert lc.on_engine_host(f"test -e /etc/systemd/system/{UNIT} && echo there") == "there"
    deleted = lc.cli("delete", "deployment", "lc", "--stop")
    assert deleted.returncode == 0, deleted.stdout + deleted.stderr
    assert "Deleted lc" in deleted.stdout
    assert lc.on_engine_host(f"test -e /etc/systemd/system/{UNIT} || echo gone") == "gone"
    assert lc.on_engine_host(f"test -s {MODELS_DIR}/tiny/tiny.gguf && echo kept") == "kept"
    record = lc.state()["deployments"]["lc"]
    assert record["operator"]["verb"] == "deleted" and record["replicas"] == []


def test_the_tombstone_keeps_the_plan_from_re_creating_it_until_the_document_is_removed(lc: Lifecycle) -> None:
    plan = lc.cli("plan", "--detailed-exitcode")
    assert plan.returncode == 0, plan.stdout + plan.stderr
    assert "Held: lc was deleted by an operator" in plan.stdout and "not re-created" in plan.stdout
    lc.write(with_deployment=False)
    forget = lc.cli("apply", "--auto-approve")
    assert forget.returncode == 0, forget.stdout + forget.stderr
    assert "lc" not in lc.state()["deployments"]
