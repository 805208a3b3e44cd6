"""A host the scalers no longer reach loses their key: which hosts the last apply authorized (read back from the
scalers' known_hosts files), and the script that takes the key and the forced command away, run by a real sh on a
real authorized_keys file."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

from engine_ctl.core.documents.inventory import Host
from engine_ctl.core.render.scaler import KEY_COMMENT
from engine_ctl.shell.scaler.apply import REVOKE, authorized_line, known_hosts_line, reached_names

A = Host(name="node-a", address="198.18.0.11")
B = Host(name="node-b", address="198.18.0.12", port=2222)
C = Host(name="node-c", address="198.18.0.13")
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIF3hW0N9SEZYbGSvj0h1yZb3c5SkMbUGD6Wk3qX8d3oU"
OPERATOR = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBEM4zCmqgJdKvC6kGdT7JDrNsQ0fA4mpuZbLdCRv2Ox ops@laptop"


def test_the_hosts_named_in_a_known_hosts_file_are_found_by_address_and_port() -> None:
    hosts = {h.name: h for h in (A, B, C)}
    text = known_hosts_line(A, KEY) + "\n" + known_hosts_line(B, KEY) + "\n198.18.0.99 " + KEY + "\n\n"
    assert reached_names(text, hosts) == {"node-a", "node-b"}  # 198.18.0.99 is no host of the inventory any more
    assert reached_names("198.18.0.12 " + KEY, hosts) == set()  # node-b answers on 2222, not 22
    assert reached_names("", hosts) == set()


def revoke(home: Path, command: Path) -> subprocess.CompletedProcess[str]:
    script = REVOKE % {"comment": KEY_COMMENT, "command": str(command)}
    return subprocess.run(["sh", "-c", script], env={**os.environ, "HOME": str(home)}, capture_output=True,
                          text=True, check=False)  # fmt: skip


def test_the_scalers_keys_and_forced_command_go_and_the_operators_key_stays(tmp_path: Path) -> None:
    (tmp_path / ".ssh").mkdir()
    keys = tmp_path / ".ssh" / "authorized_keys"
    lines = [OPERATOR, authorized_line(KEY), authorized_line(KEY, "gw-b"), f"{OPERATOR[:-10]} not-{KEY_COMMENT}"]
    keys.write_text("\n".join(lines) + "\n")
    keys.chmod(0o600)
    command = tmp_path / "scaler-command"
    command.write_text("#!/usr/bin/python3\n")
    said = revoke(tmp_path, command)
    assert said.returncode == 0, said.stderr
    assert keys.read_text().splitlines() == [lines[0], lines[3]]
    assert stat.S_IMODE(keys.stat().st_mode) == 0o600
    assert not command.exists()
    again = revoke(tmp_path, command)  # nothing left to take: a no-op that succeeds
    assert again.returncode == 0 and keys.read_text().splitlines() == [lines[0], lines[3]]


def test_a_file_of_scaler_keys_alone_is_left_empty_and_a_host_without_one_is_untouched(tmp_path: Path) -> None:
    (tmp_path / ".ssh").mkdir()
    keys = tmp_path / ".ssh" / "authorized_keys"
    keys.write_text(authorized_line(KEY) + "\n")
    assert revoke(tmp_path, tmp_path / "none").returncode == 0
    assert keys.read_text() == ""
    bare = tmp_path / "bare"
    bare.mkdir()
    assert revoke(bare, bare / "none").returncode == 0 and not (bare / ".ssh").exists()
