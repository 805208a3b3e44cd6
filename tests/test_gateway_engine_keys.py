"""The gateway's internal key for every engine, never in an argv or a unit's text: llama.cpp reads it from a
credential file (--api-key-file, one key a line), SGLang from a credential YAML (--config, `api-key:`), vLLM from
its environment (VLLM_API_KEY, set by a root-only EnvironmentFile=). Units are checked by systemd-analyze."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from engine_ctl.providers import PROVIDERS

from engine_ctl.core.documents.inventory import Host, Inventory
from engine_ctl.core.plan.pipeline import render_deployment
from engine_ctl.core.record.model import State
from engine_ctl.core.render.gateway import internal_key_path, replica_key_files
from tests.fleetfacts import cpu_host, h100x8
from tests.helpers import load, messages
from tests.test_render import MODELS, SHAPES

KEY, OLD = "9" * 64, "8" * 64
CASES = {
    "vllm": ("model: qwen3-8b", h100x8),
    "sglang": ("model: qwen3-8b\nengine: sglang", h100x8),
    "llamacpp": ("model: tiny\naccelerator: cpu\ncontext_length: 1024", cpu_host),
}


def unit_behind_a_gateway(case: str, gateway: bool = True):  # type: ignore[no-untyped-def]
    spec, make_host = CASES[case]
    body = "metadata: {name: %s}\nspec:\n  %s\n" % (case, spec.replace("\n", "\n  "))
    result, diags = load(MODELS, body)
    assert messages(diags) == []
    facts = make_host()
    engines = {"vllm": "/usr/bin/python3", "sglang": "/usr/bin/python3"}
    hosts = [Host(name=facts.host, address="198.18.0.11", models_dir="/srv/models", engines=engines)]
    if gateway:
        hosts.append(Host(name="edge", address="198.18.0.2", roles=("gateway",)))
    model = result.desired.deployment(case).deployment.model  # type: ignore[union-attr]
    rendered = render_deployment(result.desired, case, Inventory(hosts=tuple(hosts)), {facts.host: facts},
                                 SHAPES[model], state=State())  # fmt: skip
    (unit,) = rendered.units
    return unit


def test_the_key_files_each_engine_reads() -> None:
    files = replica_key_files([KEY, OLD])
    assert files == {
        "/etc/engine-ctl/replica-key": f"{KEY}\n{OLD}\n",  # llama-server accepts every line
        "/etc/engine-ctl/replica-key.yaml": f"api-key: {KEY}\n",  # SGLang takes one key
        "/etc/engine-ctl/replica-key.vllm.env": f"VLLM_API_KEY={KEY}\n",  # vLLM takes one key
    }
    assert {internal_key_path(p) for p in PROVIDERS.values()} == set(files)


def test_vllm_gets_the_key_from_a_root_only_environment_file() -> None:
    unit = unit_behind_a_gateway("vllm")
    assert "EnvironmentFile=/etc/engine-ctl/replica-key.vllm.env\n" in unit.text
    assert "VLLM_API_KEY" not in unit.text and "--api-key" not in unit.argv and "LoadCredential" not in unit.text
    assert "IPAddressAllow=localhost 198.18.0.11 198.18.0.2" in unit.text


def test_sglang_gets_the_key_from_a_credential_yaml() -> None:
    unit = unit_behind_a_gateway("sglang")
    credential = f"/run/credentials/{unit.name}/replica-key.yaml"
    assert list(unit.argv[unit.argv.index("--config") :][:2]) == ["--config", credential]
    assert "LoadCredential=replica-key.yaml:/etc/engine-ctl/replica-key.yaml\n" in unit.text
    assert "--api-key" not in unit.argv and "EnvironmentFile" not in unit.text


def test_llama_cpp_keeps_its_key_file_credential() -> None:
    unit = unit_behind_a_gateway("llamacpp")
    assert "LoadCredential=replica-key:/etc/engine-ctl/replica-key\n" in unit.text
    assert f"/run/credentials/{unit.name}/replica-key" in unit.argv


@pytest.mark.parametrize("case", sorted(CASES))
def test_without_a_gateway_no_engine_is_given_a_key(case: str) -> None:
    unit = unit_behind_a_gateway(case, gateway=False)
    assert "replica-key" not in unit.text and "--config" not in unit.argv


@pytest.mark.parametrize("case", ["vllm", "sglang"])
def test_the_units_pass_systemd_analyze_verify(case: str, tmp_path: Path) -> None:
    unit = unit_behind_a_gateway(case)
    path = tmp_path / unit.name
    path.write_text(unit.text)
    proc = subprocess.run(["systemd-analyze", "verify", "--man=no", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
