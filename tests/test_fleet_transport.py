"""The SSH transport on real hosts: a host reached through another (ssh_config's ProxyJump), each hop's host key
checked as strictly as a direct host's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from engine_ctl.core.documents.inventory import Inventory
from engine_ctl.shell import transport
from engine_ctl.shell.transport import HostFailure, SSHTransport
from tests.fleet import Fleet


@pytest.fixture
def ssh_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    path = tmp_path / "ssh_config"
    monkeypatch.setattr(transport, "SSH_CONFIG_FILES", (str(path),))
    transport._ssh_config.cache_clear()
    yield path
    transport._ssh_config.cache_clear()


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
