"""The SSH transport's settings from ssh_config (what fabric used to read) and its import cost. No hosts needed:
test_fleet_transport.py connects through them."""

from __future__ import annotations

import getpass
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine_ctl.shell import transport


@pytest.fixture
def ssh_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An ssh_config file of the test's own in place of ~/.ssh/config and /etc/ssh/ssh_config (ENGINE_CTL_SSH_CONFIG,
    which OpenSSH's `ssh -G -F` and the paramiko fallback both read)."""
    path = tmp_path / "ssh_config"
    path.write_text("")
    monkeypatch.setenv(transport.SSH_CONFIG_VARIABLE, str(path))
    transport._ssh_config.cache_clear()
    transport.openssh_settings.cache_clear()
    yield path
    transport._ssh_config.cache_clear()
    transport.openssh_settings.cache_clear()


def test_paramiko_is_imported_without_invoke() -> None:
    code = (
        "import sys, json\n"
        "from engine_ctl.shell.transport import _paramiko\n"
        "p = _paramiko()\n"
        "print(json.dumps([p.__name__, 'invoke' in sys.modules, 'asyncio' in sys.modules, p.config.invoke is None]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == ["paramiko", False, False, True]


def test_the_inventory_wins_and_ssh_config_fills_in(ssh_config: Path, tmp_path: Path) -> None:
    key = tmp_path / "id_test"
    key.write_text("")
    ssh_config.write_text(
        f"Host web1\n  HostName 10.0.0.5\n  User deploy\n  Port 2222\n  IdentityFile {key}\n"
        "  IdentityFile /nonexistent/key\n"
    )
    t = transport._resolve("web1", None, None, None, 5)
    assert (t.hostname, t.port, t.user, t.key_filenames, t.look_for_keys) == (
        "10.0.0.5",
        2222,
        "deploy",
        (str(key),),
        True,
    )
    t = transport._resolve("web1", "root", 22, "/keys/own", 5)
    assert (t.user, t.port, t.key_filenames, t.look_for_keys) == ("root", 22, ("/keys/own", str(key)), False)
    t = transport._resolve("other", None, None, None, 5)
    assert (t.hostname, t.port, t.user, t.proxy_command, t.jumps) == ("other", 22, getpass.getuser(), None, ())


def test_proxy_command_and_proxy_jump(ssh_config: Path) -> None:
    ssh_config.write_text(
        "Host behind\n  ProxyCommand ssh -W %h:%p bastion\n"
        "Host deep\n  ProxyJump ops@bastion1:2200,bastion2\n"
        "Host direct\n  ProxyJump none\n"
    )
    assert transport._resolve("behind", None, None, None, 5).proxy_command == "ssh -W behind:22 bastion"
    deep = transport._resolve("deep", None, None, None, 5)
    assert deep.jumps == (("ops", "bastion1", 2200), (None, "bastion2", None)) and deep.proxy_command is None
    assert transport._resolve("direct", None, None, None, 5).jumps == ()


def test_match_exec_brings_invoke_in_only_then(ssh_config: Path, tmp_path: Path) -> None:
    """Without OpenSSH installed (PATH has no ssh), paramiko reads the config and runs `Match exec` with invoke:
    the lookup imports it when a file has one (in a fresh process, as engine-ctl runs), and the command's answer
    decides the match. With OpenSSH, `ssh -G` runs it and invoke is never imported."""
    ssh_config.write_text("Match exec true\n  User matched\nHost *\n  User fallback\n")
    no_ssh = tmp_path / "bin"  # a PATH with a shell and `true`, and no ssh
    no_ssh.mkdir()
    for tool in ("sh", "bash", "true"):
        (no_ssh / tool).symlink_to(f"/bin/{tool}")
    code = (
        "import json, os, sys\n"
        f"os.environ['PATH'] = {str(no_ssh)!r}\n"
        "from engine_ctl.shell import transport\n"
        "transport._paramiko()\n"
        "before = 'invoke' in sys.modules\n"
        "t = transport._resolve('anyhost', None, None, None, 5)\n"
        "print(json.dumps([before, t.user]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == [False, "matched"]
    with_openssh = code.replace(f"os.environ['PATH'] = {str(no_ssh)!r}\n", "") + "print('invoke' in sys.modules)\n"
    out = subprocess.run([sys.executable, "-c", with_openssh], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["[false,", '"matched"]', "False"]
