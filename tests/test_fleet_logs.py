"""`engine-ctl logs` on the real fleet: the real llama-server's journal over SSH, every line prefixed by host and
instance; `--follow` streams from every host at once and stops on Ctrl-C (exit 130, nothing left running)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from tests.fleetproject import ROOT, Project

pytestmark = pytest.mark.fleet
LINE = re.compile(r"^(\S+) instance (\d+) +\| \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (.*)$")


def test_logs_show_and_follow_every_replica_prefixed_and_ctrl_c_stops_cleanly(
    project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    project.write("replicas: {min: 2, max: 2}\ncontext_length: 512")
    project.cli("apply", "--auto-approve", check=True)
    replicas = {r["index"]: r["host"] for r in project.replicas()}
    assert len(set(replicas.values())) == 2  # one replica per host: two hosts, two streams
    # configured by environment, as CI does: no --state, no --inventory
    monkeypatch.setenv("ENGINE_CTL_STATE", str(project.state_file))
    monkeypatch.setenv("ENGINE_CTL_INVENTORY", project.fleet.inventory)

    shown = project.cli("logs", project.name, docs=False)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    seen: dict[tuple[str, int], list[str]] = {}
    for line in shown.stdout.splitlines():
        m = LINE.match(line)
        assert m, f"not prefixed by host and instance: {line!r}"
        seen.setdefault((m.group(1), int(m.group(2))), []).append(m.group(3))
    assert set(seen) == {(host, index) for index, host in replicas.items()}
    for lines in seen.values():  # the real llama-server's own words, and systemd's about the unit
        assert any("llama_server: listening on http://198.18." in t for t in lines), "\n".join(lines)  # its address
        assert any(t.startswith("systemd: Started") for t in lines), lines

    as_json = project.cli("logs", project.name, "--json", docs=False)  # issue 26: --json, stable field names
    assert as_json.returncode == 0, as_json.stderr
    entries = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert entries and all(list(e) == ["time", "deployment", "host", "instance", "unit", "source", "message"]
                           for e in entries)  # fmt: skip
    assert {(e["host"], e["instance"]) for e in entries} == {(host, index) for index, host in replicas.items()}
    assert {e["deployment"] for e in entries} == {project.name} and [e["time"] for e in entries] == sorted(
        e["time"] for e in entries
    )
    assert any(e["source"] == "systemd" and e["message"].startswith("Started") for e in entries)
    assert any(e["source"] == "engine" and "llama_server: listening" in e["message"] for e in entries)

    only = project.cli("logs", project.name, "--instance", "1", "--lines", "5", docs=False)
    assert only.returncode == 0 and only.stdout
    assert {LINE.match(x).group(2) for x in only.stdout.splitlines()} == {"1"}  # type: ignore[union-attr]
    assert len(only.stdout.splitlines()) == 5
    since = project.cli("logs", project.name, "--since", "1d", docs=False)
    assert since.returncode == 0 and len(since.stdout.splitlines()) >= len(shown.stdout.splitlines())

    follow = subprocess.Popen(
        [sys.executable, "-m", "engine_ctl", "logs", project.name, "--follow", "--lines", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip
    streamed: list[str] = []
    assert follow.stdout is not None and follow.stderr is not None
    out = follow.stdout
    reader = threading.Thread(target=lambda: streamed.extend(iter(out.readline, "")), daemon=True)
    reader.start()
    try:
        time.sleep(3)
        assert follow.poll() is None, follow.stderr.read()
        # each engine logs a request: its new lines arrive while following. A stream may open later than another
        # on a loaded machine, so a replica not heard from yet is asked again until its line arrives.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and {h for h, _ in _prefixes(streamed)} != set(replicas.values()):
            heard = {h for h, _ in _prefixes(streamed)}
            for r in project.replicas():
                if r["host"] not in heard:
                    project.chat(r)
            time.sleep(1)
        assert _prefixes(streamed) == {(host, index) for index, host in replicas.items()}, streamed
        follow.send_signal(signal.SIGINT)
        code = follow.wait(timeout=15)
    finally:
        if follow.poll() is None:
            follow.kill()
    err = follow.stderr.read()
    assert code == 130, err
    assert "Traceback" not in err
    time.sleep(1)
    for h in {r["host"]: project.host_of(r) for r in project.replicas()}.values():  # remote journalctl ended too
        left = project.fleet.ssh(h, "pgrep -a journalctl || true").stdout
        assert "--follow" not in left, left


def _prefixes(lines: list[str]) -> set[tuple[str, int]]:
    out = set()
    for line in lines:
        m = LINE.match(line.rstrip("\n"))
        assert m, f"not prefixed by host and instance: {line!r}"
        out.add((m.group(1), int(m.group(2))))
    return out
