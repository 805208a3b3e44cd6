"""`engine-ctl render` end to end: documents + live facts of a fleet host + the model read on the host."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from engine_ctl.core.documents.inventory import Host
from engine_ctl.core.fit.modelfacts import read_safetensors_dir
from engine_ctl.shell.gather import gather
from tests import fleet as fleet_mod
from tests.fleet import Fleet
from tests.helpers import run
from tests.llama import tiny_model

pytestmark = pytest.mark.fleet


def test_render_on_the_fleet_reads_the_model_on_the_host(fleet: Fleet, tmp_path: Path) -> None:
    host = fleet.hosts[0]
    models_dir = "/var/lib/engine-ctl/models"
    fleet.ssh(host, f"mkdir -p {models_dir}/tiny && cp {tiny_model()} {models_dir}/tiny/tiny.gguf")
    (tmp_path / "docs.yaml").write_text(
        textwrap.dedent(
            """
            kind: Model
            metadata: {name: tiny}
            spec: {format: gguf, path: tiny/tiny.gguf, parameters: 4170048}
            ---
            metadata: {name: tiny-chat}
            spec: {model: tiny, accelerator: cpu, context_length: 1024, engine_args: [--temp, "0.7"]}
            """
        )
    )
    try:
        result = run(
            "render", "tiny-chat", str(tmp_path), "--inventory", fleet.inventory, "--host", host.name, "--json"
        )
        assert result.exit_code == 0, result.output
        doc = json.loads(result.stdout)
        assert doc["format_version"] == 1
        plan = doc["plan"]
        assert plan["memory_basis"] == "arch" and plan["weights_bytes"] == 16680192
        assert plan["kv_cache_bytes"] == 2 * 2 * 16 * 2 * 2 * 1024 * 2  # layers·kv heads·(k+v dims)·f16·ctx·parallel
        (unit,) = doc["units"]
        assert unit["host"] == host.name and unit["name"] == "engine-ctl-tiny-chat-0a.service"
        assert unit["argv"][1:3] == ["--model", f"{models_dir}/tiny/tiny.gguf"]
        assert unit["argv"][-2:] == ["--temp", "0.7"]
        assert "ExecStart=" in unit["text"]
        human = run("render", "tiny-chat", str(tmp_path), "--inventory", fleet.inventory, "--host", host.name)
        assert f"# {fleet_mod.PREFIX}1:/etc/systemd/system/engine-ctl-tiny-chat-0a.service" in human.stdout
        missing = run("render", "nope", str(tmp_path), "--inventory", fleet.inventory)
        assert missing.exit_code == 1 and "no deployment named 'nope'" in missing.stderr
    finally:
        fleet.ssh(host, f"rm -rf {models_dir}/tiny", check=False)


def test_safetensors_checkpoint_facts_locally_and_through_the_probe(tmp_path: Path) -> None:
    ckpt = tmp_path / "qwen"
    ckpt.mkdir()
    config = {
        "architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": 36, "num_attention_heads": 32,
        "num_key_value_heads": 8, "hidden_size": 4096, "head_dim": 128, "max_position_embeddings": 40960,
        "torch_dtype": "bfloat16",
    }  # fmt: skip
    (ckpt / "config.json").write_text(json.dumps(config))
    (ckpt / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 16381470720}}))
    local = read_safetensors_dir(ckpt)
    found, failures = gather([Host(name="h", address="h", transport="local")], model_paths={"h": [str(ckpt)]})
    assert failures == {} and found["h"].models[str(ckpt)] == local
    assert (local.block_count, local.head_count_kv, local.head_dims) == (36, 8, (128, 128))
    assert local.weights_bytes == 16381470720 and local.dtype == "bfloat16" and local.context_length == 40960
