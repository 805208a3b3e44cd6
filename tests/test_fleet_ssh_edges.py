"""SSH at the edge, on real hosts with real sshd: a host named only in an Included ssh_config file, with its user
from a Match block, reached through a ProxyJump fleet host, exactly as OpenSSH reaches it; a connection reset
before the SSH banner is tried again; an authentication failure is not."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fleet import Fleet

pytestmark = pytest.mark.fleet

ROOT = Path(__file__).resolve().parent.parent


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "engine_ctl", *args], capture_output=True, text=True, timeout=180,
                          cwd=ROOT, env={**os.environ, **env, "NO_COLOR": "1"}, check=False)  # fmt: skip
    assert "Traceback" not in done.stderr, done.stderr
    return done


def test_a_host_in_an_included_config_is_reached_through_its_proxyjump(fleet: Fleet, tmp_path: Path) -> None:
    bastion, target = fleet.hosts[0], fleet.hosts[1]
    (tmp_path / "conf.d").mkdir()
    (tmp_path / "conf.d" / "gpu.conf").write_text(
        f"Host gpu-behind\n  HostName {target.address}\n  ProxyJump root@{bastion.address}\n"
        f"Match originalhost gpu-behind\n  User root\n  IdentityFile {fleet.key}\n"
    )
    config = tmp_path / "config"
    config.write_text(f"Include {tmp_path}/conf.d/*.conf\nHost *\n  User nobody\n  IdentityFile {fleet.key}\n"
                      f"  UserKnownHostsFile {fleet.known_hosts}\n  BatchMode yes\n")  # fmt: skip
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text(f"defaults: {{known_hosts: {fleet.known_hosts}, connect_timeout: 10}}\n"
                         "hosts:\n  - {name: gpu, address: gpu-behind}\n")  # fmt: skip
    fleet.ssh(target, "journalctl --rotate >/dev/null 2>&1; journalctl --vacuum-time=1s >/dev/null 2>&1; true")
    done = _cli("facts", "--inventory", str(inventory), "--json", env={"ENGINE_CTL_SSH_CONFIG": str(config)})
    assert done.returncode == 0, done.stdout + done.stderr
    assert '"gpu"' in done.stdout
    accepted = fleet.ssh(target, "journalctl -u ssh --no-pager -o cat | grep 'Accepted publickey for root'").stdout
    assert f"from {bastion.address}" in accepted, accepted  # the jump host opened the connection, not this machine
    # OpenSSH itself agrees: the same config, the same host
    ssh = subprocess.run(["ssh", "-F", str(config), "gpu-behind", "hostname"], capture_output=True, text=True,
                         timeout=60, check=False)  # fmt: skip
    assert ssh.returncode == 0 and ssh.stdout.strip() == target.name, ssh.stderr


class ResettingProxy:
    """A TCP proxy on loopback to a host's sshd that resets the first `resets` connections before any byte (a
    reset at connect, as a flapping network or a restarting sshd gives), then passes bytes both ways."""

    def __init__(self, upstream: tuple[str, int], resets: int) -> None:
        self.upstream, self.resets, self.accepted = upstream, resets, 0
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            self.accepted += 1
            if self.accepted <= self.resets:
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                client.close()  # RST
                continue
            upstream = socket.create_connection(self.upstream)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.server.close()


@pytest.fixture
def pinned_key(fleet: Fleet) -> str:
    host = fleet.hosts[0]
    line = next(ln for ln in Path(fleet.known_hosts).read_text().splitlines()
                if ln.split()[0] == host.address and ln.split()[1] == "ssh-ed25519")  # fmt: skip
    return " ".join(line.split()[1:3])


@pytest.fixture
def proxy(fleet: Fleet) -> Iterator[ResettingProxy]:
    p = ResettingProxy((fleet.hosts[0].address, 22), resets=2)
    yield p
    p.close()


def _inventory(tmp_path: Path, fleet: Fleet, port: int, key: str, host_key: str) -> Path:
    path = tmp_path / "hosts.yaml"
    path.write_text(f"hosts:\n  - {{name: flaky, address: 127.0.0.1, port: {port}, user: root, identity_file: {key},"
                    f" host_key: '{host_key}'}}\n")  # fmt: skip
    return path


def test_a_reset_at_connect_is_tried_again(
    fleet: Fleet, tmp_path: Path, proxy: ResettingProxy, pinned_key: str
) -> None:
    inventory = _inventory(tmp_path, fleet, proxy.port, fleet.key, pinned_key)
    done = _cli("facts", "--inventory", str(inventory), "--json", env={"ENGINE_CTL_SSH_CONFIG": "/dev/null"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert proxy.accepted == 3  # two resets, then the connection that worked


def test_an_authentication_failure_is_not_tried_again(fleet: Fleet, tmp_path: Path, pinned_key: str) -> None:
    proxy = ResettingProxy((fleet.hosts[0].address, 22), resets=0)
    try:
        wrong = tmp_path / "wrong_key"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(wrong)], check=True)
        inventory = _inventory(tmp_path, fleet, proxy.port, str(wrong), pinned_key)
        done = _cli("facts", "--inventory", str(inventory), env={"ENGINE_CTL_SSH_CONFIG": "/dev/null",
                                                                   "SSH_AUTH_SOCK": ""})  # fmt: skip
        assert done.returncode != 0
        assert "authentication failed" in done.stdout + done.stderr
        assert proxy.accepted == 1
    finally:
        proxy.close()
