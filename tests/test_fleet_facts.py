"""Facts and the SSH transport on real hosts (the test fleet)."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from engine_ctl.core.documents.inventory import Host, Inventory
from engine_ctl.shell.gather import gather
from engine_ctl.shell.transport import SSHOptions, SSHTransport
from tests import fleet as fleet_mod
from tests.fleet import Fleet
from tests.fleetfacts import RECORDINGS
from tests.helpers import run

pytestmark = pytest.mark.fleet

MIB = 1024**2


def test_facts_match_what_each_host_says_by_other_means(fleet: Fleet, fleet_inventory: Inventory) -> None:
    found, failures = gather(list(fleet_inventory.hosts))
    assert failures == {}
    assert set(found) == {h.name for h in fleet.hosts}
    for h in fleet.hosts:
        f = found[h.name]
        other = fleet.ssh(
            h,
            "hostname; nproc; grep MemTotal /proc/meminfo; df -B1 --output=size / | tail -1; "
            "systemctl --version | head -1; ss -Htln | awk '{print $4}'",
        ).stdout.splitlines()
        assert f.hostname == other[0] == h.name
        assert f.cpu.cores == int(other[1])
        assert f.memory.total_bytes == int(other[2].split()[1]) * 1024
        assert f.disks["models_dir"].total_bytes == int(other[3])
        assert f.systemd_version == other[4].split()[1]
        listening = {int(addr.rsplit(":", 1)[1]) for addr in other[5:] if addr}
        assert set(f.ports_in_use) == listening and 22 in listening
        assert f.engines["llama.cpp"].version and "version:" in f.engines["llama.cpp"].version
        assert f.gpus == ()


def test_a_host_that_is_down_is_reported_by_name_and_the_others_still_answer(
    fleet: Fleet, fleet_inventory: Inventory, tmp_path: Path
) -> None:
    down = Host(name="ghost", address=f"{fleet_mod.SUBNET}.250", connect_timeout=2, known_hosts=fleet.known_hosts)
    inventory = Inventory(hosts=(*fleet_inventory.hosts, down))
    found, failures = gather(list(inventory.hosts))
    assert set(found) == {h.name for h in fleet.hosts}
    assert set(failures) == {"ghost"} and failures["ghost"].kind in ("unreachable", "timeout")
    # through the CLI: exit 1, the others' facts still shown
    path = tmp_path / "hosts.yaml"
    path.write_text(
        Path(fleet.inventory).read_text()
        + f"  - {{name: ghost, address: {fleet_mod.SUBNET}.250, connect_timeout: 2}}\n"
    )
    result = run("facts", "--inventory", str(path), "--json")
    assert result.exit_code == 1
    doc = json.loads(result.stdout)
    assert doc["format_version"] == 1
    assert set(doc["hosts"]) == {h.name for h in fleet.hosts}
    assert doc["failures"]["ghost"]["host"] == "ghost"
    human = run("facts", "--inventory", str(path))
    assert (
        human.exit_code == 1
        and "error: host ghost:" in human.stderr
        and f"{fleet_mod.PREFIX}1 ({fleet_mod.PREFIX}1)" in human.stdout
    )


def test_a_changed_host_key_is_refused_and_nothing_runs(
    fleet: Fleet, fleet_inventory: Inventory, tmp_path: Path
) -> None:
    host = fleet_inventory.hosts[0]
    other_key = (Path(fleet.hosts[1].root) / "etc/ssh/ssh_host_ed25519_key.pub").read_text().split()
    known = tmp_path / "known_hosts"
    known.write_text(f"{host.address} {other_key[0]} {other_key[1]}\n")
    marker = f"/tmp/engine-ctl-should-not-exist-{tmp_path.name}"
    transport = SSHTransport(host.model_copy(update={"known_hosts": str(known)}))
    try:
        transport.run(["touch", marker])
        raise AssertionError("a changed host key was accepted")
    except Exception as exc:
        from engine_ctl.shell.transport import HostFailure

        assert isinstance(exc, HostFailure) and exc.kind == "host_key"
        assert "CHANGED" in exc.message and "SHA256:" in exc.message and host.name == exc.host
    assert fleet.ssh(fleet.hosts[0], f"test -e {marker}", check=False).returncode == 1
    # --accept-new-host-keys never accepts a changed key either
    accepting = SSHTransport(host.model_copy(update={"known_hosts": str(known)}), SSHOptions(accept_new_host_keys=True))
    try:
        accepting.connect()
        raise AssertionError("a changed host key was accepted with --accept-new-host-keys")
    except Exception as exc:
        assert getattr(exc, "kind", None) == "host_key"


def test_unknown_host_key_refused_unless_opted_in_then_recorded(fleet_inventory: Inventory, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    host = fleet_inventory.hosts[0].model_copy(update={"known_hosts": str(known)})
    found, failures = gather([host])
    assert failures[host.name].kind == "host_key" and "unknown host key" in failures[host.name].message
    found, failures = gather([host], SSHOptions(accept_new_host_keys=True))
    assert failures == {} and host.name in found
    assert host.address in known.read_text()
    found, failures = gather([host])  # now known: strict checking passes
    assert failures == {}


def test_pinned_host_key_in_the_inventory(fleet: Fleet, fleet_inventory: Inventory) -> None:
    key = (Path(fleet.hosts[0].root) / "etc/ssh/ssh_host_ed25519_key.pub").read_text().split()
    host = fleet_inventory.hosts[0].model_copy(update={"known_hosts": "/nonexistent", "host_key": f"{key[0]} {key[1]}"})
    found, failures = gather([host])
    assert failures == {} and found[host.name].hostname == fleet.hosts[0].name


def test_a_unit_started_by_hand_appears_with_its_state_and_file_hash(fleet: Fleet, fleet_inventory: Inventory) -> None:
    import hashlib

    h = fleet.hosts[1]
    unit = "engine-ctl-manual-0a.service"
    text = "[Service]\nType=exec\nExecStart=/usr/bin/sleep 600\n"
    fleet.ssh(
        h,
        f"printf %s {shlex.quote(text)} > /etc/systemd/system/{unit} && systemctl daemon-reload "
        f"&& systemctl start {unit}",
    )
    try:
        found, _ = gather([fleet_inventory.host(h.name)])  # type: ignore[list-item]
        (u,) = [u for u in found[h.name].units if u.name == unit]
        assert u.active_state == "active" and u.sub_state == "running"
        assert u.sha256 == hashlib.sha256(text.encode()).hexdigest()
        pid = int(fleet.ssh(h, f"systemctl show -p MainPID --value {unit}").stdout)
        assert u.main_pid == pid > 0 and u.n_restarts == 0
    finally:
        fleet.ssh(h, f"systemctl stop {unit}; rm -f /etc/systemd/system/{unit}; systemctl daemon-reload", check=False)


def _install_tool(fleet: Fleet, host_index: int, tool: str, script: str) -> None:
    h = fleet.hosts[host_index]
    fleet.ssh(h, f"printf %s {shlex.quote(script)} > /usr/local/bin/{tool} && chmod 755 /usr/local/bin/{tool}")


def _serve(recording: str) -> str:
    text = (RECORDINGS / recording).read_text()
    return f"cat <<'RECORDED'\n{text}RECORDED\n"


def test_gpu_recordings_served_on_a_host_parse_end_to_end(fleet: Fleet, fleet_inventory: Inventory) -> None:
    """An executable named like the tool prints recorded real output (tests/recordings/README.md)."""
    nvidia = "#!/bin/sh\n" + _serve("nvidia-smi-8xH100.csv")
    amd = (
        '#!/bin/sh\ncase "$1" in\n static) ' + _serve("amd-smi-static-2xMI300X.json") + ";;\n"
        " metric) " + _serve("amd-smi-metric-2xMI300X.json") + ";;\nesac\n"
    )
    _install_tool(fleet, 2, "nvidia-smi", nvidia)
    _install_tool(fleet, 3 % len(fleet.hosts), "amd-smi", amd)
    try:
        hosts = [fleet_inventory.hosts[2], fleet_inventory.hosts[3 % len(fleet.hosts)]]
        found, failures = gather(hosts)
        assert failures == {}
        nv = found[hosts[0].name].gpus
        assert len(nv) == 8 and nv[3].uuid == "GPU-2f7b6c1e-5a0d-4c3e-9b1f-0a1b2c3d4e53"
        assert nv[0].memory_total_bytes == 81559 * MIB and nv[0].name == "NVIDIA H100 80GB HBM3"
        amd_gpus = found[hosts[1].name].gpus
        assert [g.uuid for g in amd_gpus] == ["GPU-3a1f6c2d8e4b5970", "GPU-3a1f6c2d8e4b5971"]
        assert amd_gpus[0].memory_used_bytes == 283 * MIB
    finally:
        for i in (2, 3 % len(fleet.hosts)):
            fleet.ssh(fleet.hosts[i], "rm -f /usr/local/bin/nvidia-smi /usr/local/bin/amd-smi", check=False)


def test_one_ssh_connection_per_host_per_command(fleet: Fleet, fleet_inventory: Inventory) -> None:
    def accepted(h: object) -> int:
        out = fleet.ssh(h, "journalctl -u ssh --no-pager -o cat | grep -c 'Accepted publickey' || true").stdout  # type: ignore[arg-type]
        return int(out.strip() or 0)

    before = {h.name: accepted(h) for h in fleet.hosts}
    result = run("facts", "--inventory", fleet.inventory, "--json")
    assert result.exit_code == 0
    after = {h.name: accepted(h) for h in fleet.hosts}
    # each count also includes the one `accepted()` connection made to read it
    assert {n: after[n] - before[n] for n in before} == {n: 2 for n in before}


def test_remote_commands_are_quoted(fleet_inventory: Inventory) -> None:
    transport = SSHTransport(fleet_inventory.hosts[0])
    try:
        weird = "a b; echo INJECTED $(id) `id` 'q' \"d\" \\"
        result = transport.run(["printf", "%s", weird])
        assert result.stdout == weird and "INJECTED" not in result.stdout.replace(weird, "")
        assert re.fullmatch(r"\d+", transport.run(["id", "-u"]).stdout.strip())
    finally:
        transport.close()


def test_wrong_key_is_an_auth_failure_named_by_host(fleet_inventory: Inventory, tmp_path: Path) -> None:
    import subprocess

    key = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    host = fleet_inventory.hosts[0].model_copy(update={"identity_file": str(key)})
    _, failures = gather([host, *fleet_inventory.hosts[1:2]])
    assert set(failures) == {host.name} and failures[host.name].kind == "auth"


def test_local_transport_facts_without_ssh(tmp_path: Path) -> None:
    import os

    from engine_ctl.core.documents.inventory import Host

    found, failures = gather([Host(name="here", address="here", transport="local", models_dir=str(tmp_path))])
    assert failures == {}
    assert found["here"].cpu.cores == len(os.sched_getaffinity(0))
    assert found["here"].disks["models_dir"].exists
    result = run("facts", "--inventory", str(Path(__file__).parents[1] / "examples/quickstart/hosts.yaml"), "--json")
    assert result.exit_code == 0 and "localhost" in json.loads(result.stdout)["hosts"]
