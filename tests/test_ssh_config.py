"""Host settings resolved as OpenSSH resolves them: `ssh -G` (the real OpenSSH client of this machine) reads the
config with its Include, Match and Host patterns; the inventory's own fields still win."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from engine_ctl.shell import transport
from engine_ctl.shell.transport import SSHConfigError, openssh_settings


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    key = tmp_path / "alice_key"
    key.write_text("not used to connect here\n")
    (tmp_path / "conf.d").mkdir()
    (tmp_path / "conf.d" / "fleet.conf").write_text(
        "Host gpu-01\n  HostName 198.18.6.11\n  Port 2222\n"
        f"Match originalhost gpu-01\n  User alice\n  IdentityFile {key}\n"
        "Host gpu-02\n  HostName 198.18.6.12\n  ProxyJump bastion-user@198.18.6.1:2200\n"
    )
    main = tmp_path / "config"
    main.write_text(f"Include {tmp_path}/conf.d/*.conf\nHost *\n  User nobody-by-default\n")
    monkeypatch.setenv(transport.SSH_CONFIG_VARIABLE, str(main))
    openssh_settings.cache_clear()
    yield main
    openssh_settings.cache_clear()


def test_include_and_match_are_read_as_openssh_reads_them(config: Path) -> None:
    target = transport._resolve("gpu-01", None, None, None, 5.0)
    assert (target.hostname, target.port, target.user) == ("198.18.6.11", 2222, "alice")
    assert str(config.parent / "alice_key") in target.key_filenames
    other = transport._resolve("gpu-02", None, None, None, 5.0)
    assert (other.hostname, other.port, other.user) == ("198.18.6.12", 22, "nobody-by-default")
    assert other.jumps == (("bastion-user", "198.18.6.1", 2200),)


def test_the_inventory_fields_win_over_the_config(config: Path) -> None:
    target = transport._resolve("gpu-01", "root", 22, "/etc/engine-ctl/key", 5.0)
    assert (target.hostname, target.port, target.user) == ("198.18.6.11", 22, "root")
    assert target.key_filenames[0] == "/etc/engine-ctl/key" and not target.look_for_keys


def test_a_config_openssh_refuses_is_its_own_words(config: Path) -> None:
    config.write_text("Host *\n  NoSuchOption yes\n")
    with pytest.raises(SSHConfigError, match=r"(?i)bad configuration option"):
        openssh_settings("gpu-01", str(config))
