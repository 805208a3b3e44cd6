"""hosts.yaml: defaults, local transport, located errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine_ctl.core.diagnostics import InputError
from engine_ctl.core.documents.inventory import DEFAULT_MODELS_DIR, load_inventory
from tests.helpers import run, write

ROOT = Path(__file__).resolve().parents[1]


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


@pytest.mark.parametrize(
    "exe",
    ["/opt/a$b/llama-server", "/opt/a%b/llama-server", "/opt/my llama/llama-server", "llama-server", '/opt/"q"/x'],
)
def test_an_executable_systemd_cannot_run_as_written_is_refused_with_its_place(tmp_path: Path, exe: str) -> None:
    """ExecStart's first word cannot escape `$` (`$$` stays two characters there: 203/EXEC): refused up front."""
    path = write(tmp_path, "hosts.yaml", f"hosts:\n  - name: a\n    engines:\n      llama.cpp: '{exe}'\n")
    with pytest.raises(InputError) as err:
        load_inventory(path)
    (d,) = err.value.diagnostics
    assert (d.location.line, d.location.column, d.field) == (4, 18, "hosts[0].engines.llama.cpp")
    assert d.message == (
        f"executable {exe!r}: an absolute path of letters, digits and / . _ + : = , @ - (no spaces, $, % or quotes)"
    )


def test_validate_inventory_refuses_it_and_defaults_are_located_too(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts.yaml", "defaults:\n  engines: {vllm: /opt/v$1/vllm}\nhosts: [{name: a}]\n")
    result = run("validate", "--inventory", str(path), str(ROOT / "examples/seed"))
    assert result.exit_code == 1
    assert f"{path}:2:19: error: defaults.engines.vllm: executable '/opt/v$1/vllm'" in result.stderr


def test_models_and_cache_dirs_are_absolute(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts.yaml", "hosts:\n  - {name: a, models_dir: models, cache_dir: /c}\n")
    with pytest.raises(InputError) as err:
        load_inventory(path)
    (d,) = err.value.diagnostics
    assert (d.location.line, d.field, d.message) == (2, "hosts[0].models_dir", "'models': an absolute path on the host")


@pytest.mark.parametrize(
    ("line", "field"),
    [
        ('  - {name: a, models_dir: "/srv/m\\nx"}', "hosts[0].models_dir"),
        ('  - {name: a, cache_dir: "/var/c\\u2028"}', "hosts[0].cache_dir"),
        ('  - {name: a, engines: {llama.cpp: "/opt/l\\tx"}}', "hosts[0].engines.llama.cpp"),
        ('  - {name: a, identity_file: "~/.ssh/id\\r"}', "hosts[0].identity_file"),
        ('  - {name: "a\\n"}', "hosts[0].name"),
        ('  - {name: a, address: "10.0.0.1\\u0085"}', "hosts[0].address"),
    ],
)
def test_control_characters_in_the_inventory_are_refused_with_their_place(
    tmp_path: Path, line: str, field: str
) -> None:
    path = write(tmp_path, "hosts.yaml", "hosts:\n" + line + "\n")
    with pytest.raises(InputError) as err:
        load_inventory(path)
    (d,) = err.value.diagnostics
    assert (d.location.line, d.field) == (2, field) and "no control or invisible characters" in d.message
