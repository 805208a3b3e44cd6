"""The SSH transport on real hosts: a host reached through another (ssh_config's ProxyJump), each hop's host key
checked as strictly as a direct host's."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine_ctl.core.documents.inventory import Inventory
from engine_ctl.shell import transport
from engine_ctl.shell.transport import HostFailure, SSHTransport
from tests.fleet import Fleet

pytestmark = pytest.mark.fleet


@pytest.fixture
def ssh_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The test's own ssh_config, read by `ssh -G -F` (and the paramiko fallback) through ENGINE_CTL_SSH_CONFIG."""
    path = tmp_path / "ssh_config"
    monkeypatch.setenv(transport.SSH_CONFIG_VARIABLE, str(path))
    transport._ssh_config.cache_clear()
    transport.openssh_settings.cache_clear()
    yield path
    transport._ssh_config.cache_clear()
    transport.openssh_settings.cache_clear()


def test_a_host_behind_a_proxy_jump(fleet: Fleet, fleet_inventory: Inventory, ssh_config: Path) -> None:
    jump, target = fleet.hosts[0], fleet_inventory.hosts[1]
    ssh_config.write_text(
        f"Host {target.address}\n  ProxyJump root@{jump.address}\nHost *\n  IdentityFile {fleet.key}\n"
    )
    t = SSHTransport(target)
    try:
        result = t.run(["sh", "-c", 'hostname; echo "$SSH_CONNECTION"'])
    finally:
        t.close()
    name, connection = result.stdout.splitlines()
    assert name == fleet.hosts[1].name
    assert connection.split()[0] == jump.address  # the target saw the jump host, not this machine, connect


def test_a_jump_host_with_an_unknown_key_is_refused(
    fleet: Fleet, fleet_inventory: Inventory, ssh_config: Path, tmp_path: Path
) -> None:
    jump, target = fleet.hosts[0], fleet_inventory.hosts[1]
    known = tmp_path / "known_hosts"  # the target's key only
    known.write_text("".join(line + "\n" for line in Path(fleet.known_hosts).read_text().splitlines()
                             if line.startswith(f"{target.address} ")))  # fmt: skip
    ssh_config.write_text(
        f"Host {target.address}\n  ProxyJump root@{jump.address}\nHost *\n  IdentityFile {fleet.key}\n"
    )
    t = SSHTransport(target.model_copy(update={"known_hosts": str(known)}))
    with pytest.raises(HostFailure) as failure:
        t.run(["true"])
    t.close()
    assert failure.value.kind == "host_key" and f"unknown host key for {jump.address}" in failure.value.message


def own_connections(address: str) -> int:
    """This process's established TCP connections to address:22, as `ss -p` sees them here (the host's side
    would also count what other tests left, such as a session of a host whose link was cut)."""
    out = subprocess.run(["ss", "-Htnp", "state", "established", f"( dst {address} and dport = :22 )"],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    return sum(f"pid={os.getpid()}," in line for line in out.splitlines())


def test_run_stream_and_feed_share_one_connection_and_say_what_timed_out(
    fleet: Fleet, fleet_inventory: Inventory, ssh_config: Path
) -> None:
    """The three ways a command runs (issue 10: one session helper behind them): output, exit status, stdin,
    the one reused connection, and a command past its time named as such."""
    import threading

    ssh_config.write_text(f"Host *\n  IdentityFile {fleet.key}\n")
    t = SSHTransport(fleet_inventory.hosts[0])
    try:
        ran = t.run(["sh", "-c", "cat; echo err >&2; exit 3"], stdin="in\n")
        assert (ran.exit_code, ran.stdout, ran.stderr) == (3, "in\n", "err\n")
        streamed: list[str] = []
        assert t.stream(["sh", "-c", "echo a; echo b >&2; exit 4"], streamed.append, threading.Event()) == 4
        assert [line.strip() for line in streamed] == ["a", "b"]  # stdout and stderr together, on a terminal
        fed: list[str] = []
        assert t.feed(["sh", "-c", "tr a-z A-Z; exit 5"], "one\ntwo\n", fed.append, timeout=10) == 5
        assert [line.strip() for line in fed] == ["ONE", "TWO"]
        assert own_connections(fleet_inventory.hosts[0].address) == 1
        with pytest.raises(HostFailure) as slow:
            t.run(["sleep", "5"], timeout=1)
        assert (slow.value.kind, slow.value.message) == ("timeout", "sleep did not finish within 1 s")
        with pytest.raises(HostFailure) as silent:
            t.feed(["sleep", "5"], "", fed.append, timeout=1)
        assert (silent.value.kind, silent.value.message) == ("timeout", "sleep went silent for 1 s")
    finally:
        t.close()
