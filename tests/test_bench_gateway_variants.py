"""bench/gateway.py's variants are what they say: each one a configuration the real HAProxy accepts (a variant it
refuses stops the whole bench: "no body buffering" once left a rule naming an ACL it had taken out), and each one
differs from the rendered configuration (a variant whose edit no longer matches the rendered text would measure the
rendered gateway twice under another name)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from bench.gateway import KEY, variants
from engine_ctl.core.documents.apikey import key_sha256
from engine_ctl.core.documents.inventory import Host
from engine_ctl.core.model import ApiKey
from engine_ctl.core.render.gateway import GatewayBackend, GatewayServer, render_gateway
from tests.test_gateway_loopback import HAPROXY


def rendered(folder: Path) -> str:
    host = Host(name="bench", address="127.0.0.1", gateway_port=18000)
    server = GatewayServer(name="r0a", address="127.0.0.1", port=18001, maxconn=8)
    files = render_gateway(host, [GatewayBackend(deployment="bench", servers=(server,))],
                           [ApiKey(name="bench", sha256=key_sha256(KEY))], internal_key=False, run_dir=str(folder),
                           metrics_port=18002).files  # fmt: skip
    for name, text in files.items():
        (folder / name).write_text(text)
    return files["haproxy.cfg"]


@pytest.mark.parametrize("name", list(variants("")))
def test_each_variant_is_a_configuration_haproxy_accepts(tmp_path: Path, name: str) -> None:
    config = rendered(tmp_path)
    text = variants(config)[name]
    assert name == "rendered" or text != config, f"the variant {name!r} no longer changes the configuration"
    (tmp_path / "variant.cfg").write_text(text)
    check = subprocess.run([HAPROXY, "-c", "-q", "-f", str(tmp_path / "variant.cfg")], capture_output=True,
                           text=True, cwd=tmp_path, check=False)  # fmt: skip
    assert check.returncode == 0, (name, check.stdout + check.stderr)
