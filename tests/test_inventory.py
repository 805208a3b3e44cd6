"""hosts.yaml: defaults, local transport, located errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine_ctl.diagnostics import InputError
from engine_ctl.inventory import DEFAULT_MODELS_DIR, load_inventory
from tests.helpers import write


def test_defaults_are_inherited_and_overridden(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "hosts.yaml",
        """
        defaults:
          user: ops
          identity_file: keys/id
          labels: {dc: fra}
          engines: {llamacpp: /opt/llama/bin/llama-server}
        hosts:
          - {name: gpu-01, address: 198.18.0.11, labels: {gpu: h100}}
          - {name: gpu-02, address: 198.18.0.12, port: 2222, user: root, roles: [gateway]}
          - {name: me, transport: local}
        """,
    )
    inv = load_inventory(path)
    a, b, me = inv.hosts
    assert (a.user, a.port, a.labels) == ("ops", 22, {"dc": "fra", "gpu": "h100"})
    assert a.identity_file == str(tmp_path / "keys/id")
    assert a.engines == {"llama.cpp": "/opt/llama/bin/llama-server"}
    assert (b.user, b.port, b.roles) == ("root", 2222, ("gateway",))
    assert me.transport == "local" and me.address == "me" and me.models_dir == DEFAULT_MODELS_DIR


def test_unknown_host_field_is_located(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts.yaml", "hosts:\n  - name: a\n    adress: 1.2.3.4\n")
    with pytest.raises(InputError) as err:
        load_inventory(path)
    (d,) = err.value.diagnostics
    assert (d.location.line, d.location.column) == (3, 5)
    assert d.field == "hosts[0].adress" and d.hint == "did you mean 'address'?"


def test_duplicate_host_names(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts.yaml", "hosts:\n  - {name: a}\n  - {name: a}\n")
    with pytest.raises(InputError) as err:
        load_inventory(path)
    assert err.value.diagnostics[0].message == "duplicate host name 'a' (also hosts[0])"
