"""Engine builds on the real fleet, with the real llama-server: the inventory names the build per platform (the
CPU build here), the facts report its version and sha256, the state records them per replica, and an engine
changed under the deployment is drift that the plan restarts the replica onto; a pin the host's build does not
match leaves the host out with the reason."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fleet import Fleet
from tests.fleetproject import Project
from tests.llama import llama_server_dir

pytestmark = pytest.mark.fleet

BUILD = "/opt/ectl-build/bin/llama-server"


@pytest.fixture
def built(tmp_path: Path, fleet: Fleet, weights: None) -> Iterator[tuple[Project, Path]]:
    host = fleet.hosts[0]
    fleet.ssh(host, f"rm -rf /opt/ectl-build && mkdir -p /opt/ectl-build && cp -a {llama_server_dir()}/bin "
                    "/opt/ectl-build/")  # fmt: skip
    inventory = tmp_path / "inv" / "hosts.yaml"
    inventory.parent.mkdir()
    text = Path(fleet.inventory).read_text()
    text = re.sub(r"  engines: .*\n", "", text)
    engines = f"{{llama.cpp: {{cpu: {BUILD}, cuda: /opt/ectl-build-cuda/bin/llama-server, version: 0.6.0-dev}}}}"
    text = text.replace(f"  - {{name: {host.name},", f"  - {{engines: {engines}, name: {host.name},")
    inventory.write_text(text)
    docs = tmp_path / "docs"
    docs.mkdir()
    p = Project(docs, dataclasses.replace(fleet, inventory=str(inventory)), "t-engine-builds")
    p.write(f"context_length: 512\nhost: {host.name}")
    yield p, inventory
    if p.state_file.exists():
        p.cli("destroy", "--auto-approve")
    fleet.ssh(host, "rm -rf /opt/ectl-build", check=False)


def _sha(p: Project, host: str) -> str:
    return p.fleet.ssh(p.fleet.host(host), f"sha256sum {BUILD}").stdout.split()[0]


def test_the_build_for_the_platform_runs_is_recorded_and_an_engine_changed_under_it_is_drift(
    built: tuple[Project, Path],
) -> None:
    p, _ = built
    host = p.fleet.hosts[0].name
    planned = json.loads(p.cli("plan", "--json", check=True).stdout)
    (step,) = planned["changes"][0]["replicas"]
    first = _sha(p, host)
    assert step["argv"][0] == BUILD and step["engine_sha256"] == first and "0.6.0-dev" in step["engine_version"]
    p.cli("apply", "--auto-approve", check=True)
    (replica,) = p.replicas()
    assert replica["engine_sha256"] == first and "0.6.0-dev" in replica["engine_version"]
    assert p.chat(replica)["model"] == p.name

    # another build under the running replica, installed as package managers do (a new file renamed over it)
    p.fleet.ssh(
        p.fleet.host(host), f"cp -p {BUILD} {BUILD}.new && printf '\\0' >> {BUILD}.new && mv {BUILD}.new {BUILD}"
    )
    second = _sha(p, host)
    assert second != first
    again = p.cli("plan", "--json")
    assert again.returncode == 0, again.stderr
    doc = json.loads(again.stdout)
    (drift,) = [d for d in doc["drift"] if d["kind"] == "engine-changed"]
    assert drift["host"] == host and drift["unit"] == replica["unit"]
    assert f"the engine at {BUILD} on {host} changed: version " in drift["detail"]
    assert f"(sha256 {first[:12]}…) → " in drift["detail"] and f"(sha256 {second[:12]}…)" in drift["detail"]
    (restart,) = doc["changes"][0]["replicas"]
    assert restart["action"] == ["update"] and restart["engine_sha256"] == second
    assert "engine-changed" in json.dumps(doc["drift"]) and "restarts onto it" in p.cli("plan").stdout

    p.cli("apply", "--auto-approve", check=True)
    (after,) = p.replicas()
    assert after["engine_sha256"] == second and p.chat(after)["model"] == p.name
    assert p.cli("plan", "--detailed-exitcode").returncode == 0


def test_a_host_whose_build_is_not_the_pinned_version_is_left_out_with_the_reason(
    built: tuple[Project, Path],
) -> None:
    p, inventory = built
    inventory.write_text(inventory.read_text().replace("version: 0.6.0-dev", "version: 9.9.9"))
    out = p.cli("plan")
    host = p.fleet.hosts[0].name
    assert f"llama.cpp at {BUILD} on {host} is version version: 0.6.0-dev" in out.stdout
    assert "not the pinned 9.9.9" in out.stdout and "Pending" in out.stdout


def test_a_build_that_is_not_the_seeds_release_runs_only_pinned_and_the_plan_names_its_version(
    built: tuple[Project, Path],
) -> None:
    """Issue 25 point 15 (seed 001: llama.cpp v0.5.0 by default): the real llama-server says 0.6.0-dev."""
    p, inventory = built
    host = p.fleet.hosts[0].name
    pinned = p.cli("plan")
    assert pinned.returncode == 0 and "    engine: version 0.6.0-dev (sha256 " in pinned.stdout, pinned.stdout
    inventory.write_text(inventory.read_text().replace(", version: 0.6.0-dev", ""))
    out = p.cli("plan")
    assert out.returncode == 1, out.stdout + out.stderr
    refusal = (f"llama.cpp at {BUILD} on {host} is version 0.6.0-dev, not the release engine-ctl runs by default "
               "(0.5.0): pin it in the inventory to run it (engines.llama.cpp.version: 0.6.0-dev)")  # fmt: skip
    assert refusal in out.stdout, out.stdout


def test_engine_add_asks_the_hosts_records_the_version_and_engine_list_shows_who_has_what(
    tmp_path: Path, fleet: Fleet
) -> None:
    """Seed 003, "Add an engine": `engine add` registers a build in the inventory once the hosts it is for have it,
    with the version they report as its pin; `engine list` shows each build, its version and digest, and its
    hosts. Issue 25 point 10."""
    import hashlib
    import subprocess
    import sys

    host = fleet.hosts[0]
    fleet.ssh(host, f"rm -rf /opt/ectl-build && mkdir -p /opt/ectl-build && cp -a {llama_server_dir()}/bin "
                    "/opt/ectl-build/")  # fmt: skip
    for other in fleet.hosts[1:]:
        fleet.ssh(other, "rm -rf /opt/ectl-build")
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text(re.sub(r"  engines: .*\n", "", Path(fleet.inventory).read_text()))

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([sys.executable, "-m", "engine_ctl", "engine", *args, "--inventory", str(inventory)],
                              capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
        assert "Traceback" not in proc.stderr, proc.stderr
        return proc

    before = inventory.read_text()
    refused = cli("add", "llama.cpp", BUILD)  # every host: the others lack it, and nothing is written
    others = ", ".join(h.name for h in fleet.hosts[1:])
    assert refused.returncode == 1 and f"{BUILD} is not an executable llama.cpp on {others}" in refused.stderr
    assert inventory.read_text() == before
    one = cli("add", "llamacpp", BUILD, "--host", host.name)
    assert one.returncode == 0, one.stdout + one.stderr
    assert "version 0.6.0-dev, pinned" in one.stdout, one.stdout
    shared = str(llama_server_dir() / "bin" / "llama-server")
    assert cli("add", "llama.cpp", shared).returncode == 0
    text = inventory.read_text()
    assert text.startswith("# the test fleet") and f"cpu: {shared}" in text and "version: 0.6.0-dev" in text, text
    listed = cli("list", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {r["path"]: r for r in json.loads(listed.stdout)["engines"]}
    digest = hashlib.sha256(Path(shared).read_bytes()).hexdigest()
    assert rows[BUILD]["hosts"] == [host.name] and rows[BUILD]["version"] == "0.6.0-dev"
    assert rows[BUILD]["sha256"] == digest and rows[BUILD]["build"] == "cpu"  # a copy of the same binary
    assert set(rows[shared]["hosts"]) >= {h.name for h in fleet.hosts[1:]}, rows[shared]
    assert rows[shared]["pinned"] == {"version": "0.6.0-dev"} and not rows[shared]["missing"]
    table = cli("list").stdout
    assert "ENGINE" in table and "0.6.0-dev (pinned)" in table and digest[:12] in table, table
