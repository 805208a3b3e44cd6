"""The internal key (gateway -> replicas) on the real HAProxy 2.6 of this machine, on loopback: the gateway reads it
from a map in its run directory, changes it at run time over the stats socket with no reload (what a rotation
does), and reads the file again at a reload. The unit loads the root-only key file as a credential and copies it
there before HAProxy starts. The replica is a loopback stand-in that echoes the Authorization header it got."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine_ctl.core.documents.apikey import key_sha256
from engine_ctl.core.documents.inventory import Host
from engine_ctl.core.model import ApiKey
from engine_ctl.core.render.gateway import (
    GATEWAY_KEY,
    INTERNAL_MAP_FILE,
    GatewayBackend,
    GatewayServer,
    gateway_key_text,
    parse_gateway_key,
    render_gateway,
)
from engine_ctl.shell.gateway.runtime import internal_key_commands, runtime
from engine_ctl.shell.transport import LocalTransport
from tests.ports import free_port
from tests.test_gateway_loopback import Replica

HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
CLIENT = "ak-client-" + "6" * 40
OLD, NEW = "a" * 64, "b" * 64


def test_the_key_map_and_what_older_hosts_hold_parse() -> None:
    assert gateway_key_text(OLD) == f"gateway {OLD}\n"
    assert parse_gateway_key(gateway_key_text(OLD, NEW)) == (OLD, NEW)
    assert parse_gateway_key(f"ENGINE_CTL_GATEWAY_KEY={OLD}\n") == (OLD, None)  # engine-ctl's earlier env file
    assert parse_gateway_key(f"{OLD}\n{NEW}\n") == (OLD, None)  # a replica's key file: the first is the one sent
    assert parse_gateway_key("gateway not-a-key\n") == (None, None)


def test_the_unit_loads_the_key_as_a_credential_never_its_text() -> None:
    host = Host(name="edge", address="10.0.0.2", roles=("gateway",))
    rendered = render_gateway(host, [], [])
    assert f"LoadCredential=internal-key:{GATEWAY_KEY}\n" in rendered.unit_text
    assert (
        f"ExecStartPre=/bin/cp -f %d/internal-key /run/engine-ctl-gateway/{INTERNAL_MAP_FILE}\n" in rendered.unit_text
    )
    assert "EnvironmentFile" not in rendered.unit_text
    cfg = rendered.files["haproxy.cfg"]
    assert 'set-header Authorization "Bearer %[str(gateway),map(/run/engine-ctl-gateway/internal.map)]"' in cfg
    assert INTERNAL_MAP_FILE not in rendered.files and "internal.key" not in rendered.files


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[dict[str, object]]:
    port = free_port()
    replica = Replica("r0", port)
    host = Host(name="edge", address="127.0.0.1", gateway_port=free_port(), transport="local")
    backends = [GatewayBackend(deployment="chat", servers=(GatewayServer(name="r0a", address="127.0.0.1", port=port,
                                                                         maxconn=4),))]  # fmt: skip
    rendered = render_gateway(host, backends, [ApiKey(name="c", sha256=key_sha256(CLIENT))], run_dir=str(tmp_path))
    for name, text in rendered.files.items():
        (tmp_path / name).write_text(text)
    shutil.copy(tmp_path / "start.state", tmp_path / "server-state")
    (tmp_path / INTERNAL_MAP_FILE).write_text(gateway_key_text(OLD))  # as the unit's ExecStartPre copies it
    proc = subprocess.Popen([HAPROXY, "-W", "-f", str(tmp_path / "haproxy.cfg")], stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{host.gateway_port}"
    yield {"base": base, "dir": tmp_path, "master": proc.pid, "transport": LocalTransport(host)}
    proc.terminate()
    proc.wait(timeout=10)
    replica.shutdown()
    replica.server_close()


def sent_key(base: str, timeout: float = 10) -> str:
    """The internal key the replica was sent (asking until the gateway serves the replica)."""
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "model": "chat"}).encode()
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {CLIENT}"}
    deadline = time.monotonic() + timeout
    while True:
        try:
            request = urllib.request.Request(base + "/v1/chat/completions", data=body, headers=headers)
            with urllib.request.urlopen(request, timeout=10) as r:
                return str(json.loads(r.read())["authorization"]).removeprefix("Bearer ")
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_the_key_changes_at_run_time_and_a_reload_reads_the_file(gateway: dict) -> None:  # type: ignore[type-arg]
    base, folder = str(gateway["base"]), Path(gateway["dir"])  # type: ignore[arg-type]
    assert sent_key(base) == OLD
    name = str(folder / INTERNAL_MAP_FILE)
    answers = runtime(gateway["transport"], internal_key_commands(name, NEW, None), str(folder / "admin.sock"))  # type: ignore[arg-type]
    assert answers[0].strip() == "", answers
    assert sent_key(base) == NEW, "the running gateway sends the new key with no reload"
    (folder / INTERNAL_MAP_FILE).write_text(gateway_key_text(NEW))  # what set_internal_key writes beside it
    os.kill(int(gateway["master"]), signal.SIGUSR2)  # type: ignore[call-overload]  # a reload, as systemctl reload
    time.sleep(1.5)
    assert sent_key(base) == NEW, "a reload reads the key from the run directory again"


def test_the_probe_and_apply_read_the_running_gateways_key_where_it_is(gateway: dict) -> None:  # type: ignore[type-arg]
    """What plan compares (fingerprints of the key file, the run directory's copy and the running map) and what apply
    falls back to when the key file is gone (the key the running gateway sends), read from the real HAProxy."""
    from engine_ctl.core.plan.internalkey import key_fingerprint
    from engine_ctl.shell.gateway.runtime import read_running_key
    from engine_ctl.shell.remote.facts_probe import gateway_key

    base, folder = str(gateway["base"]), Path(gateway["dir"])  # type: ignore[arg-type]
    assert sent_key(base) == OLD
    socket, key_file = str(folder / "admin.sock"), folder / "internal.key"
    key_file.write_text(gateway_key_text(OLD))
    old, new = key_fingerprint(OLD), key_fingerprint(NEW)
    assert gateway_key(socket, [str(key_file)], str(folder)) == {"file": old, "copy": old, "running": old}
    assert read_running_key(gateway["transport"], socket) == OLD  # type: ignore[arg-type]
    runtime(gateway["transport"], internal_key_commands(str(folder / INTERNAL_MAP_FILE), NEW, None), socket)  # type: ignore[arg-type]
    assert sent_key(base) == NEW
    assert gateway_key(socket, [str(key_file)], str(folder)) == {"file": old, "copy": old, "running": new}
    assert read_running_key(gateway["transport"], socket) == NEW  # type: ignore[arg-type]
    key_file.unlink()
    assert gateway_key(socket, [str(key_file)], str(folder))["file"] is None
    assert gateway_key(str(folder / "nothing.sock"), [str(key_file)], str(folder)) == {"file": None, "copy": old}
    assert read_running_key(gateway["transport"], str(folder / "nothing.sock")) is None  # type: ignore[arg-type]
