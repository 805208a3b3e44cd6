"""`engine-ctl validate` through the real CLI: messages, locations, JSON, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.helpers import run, write

ROOT = Path(__file__).resolve().parents[1]


def test_seed_deployment_json_validates_and_shows_filled_in_defaults() -> None:
    result = run("validate", str(ROOT / "examples/seed"))
    assert result.exit_code == 0, result.output
    assert f"{ROOT / 'examples/seed/deployment.json'} is a valid deployment document" in result.output
    assert "spec.cpu_cores               4   (4 per GPU)" in result.output
    assert "spec.gpu_vendor              any" in result.output
    assert "Not checked" in result.output


def test_seed_deployment_json_as_json() -> None:
    result = run("validate", "--json", str(ROOT / "examples/seed"))
    doc = json.loads(result.stdout)
    assert doc["format_version"] == 1 and doc["valid"] is True
    (dep,) = doc["deployments"]
    assert dep["name"] == "chat" and dep["engine"] == "llama.cpp"
    filled = {d["field"]: d["value"] for d in dep["defaults"]}
    assert filled["spec.cpu_cores"] == 4
    assert {x["code"] for x in doc["not_checked"]} >= {"host_unpublished", "checkpoint_digest_pending"}


def test_invalid_document_is_400_invalid_deployment_in_json(tmp_path: Path) -> None:
    write(tmp_path, "m.yaml", "kind: Model\nmetadata: {name: m}\nspec: {format: gguf, path: m.gguf}\n")
    write(tmp_path, "d.yaml", "metadata: {name: chat}\nspec:\n  model: m\n  parallel: 0\n")
    result = run("validate", "--json", str(tmp_path))
    assert result.exit_code == 1
    doc = json.loads(result.stdout)
    assert doc["valid"] is False
    assert doc["error"]["status"] == 400 and doc["error"]["code"] == "INVALID_DEPLOYMENT"
    (detail,) = doc["error"]["details"]
    assert detail["message"] == "spec.parallel: between 1 and 1024"
    assert (detail["file"], detail["line"], detail["column"]) == (str(tmp_path / "d.yaml"), 4, 13)


def test_models_in_one_file_deployments_in_another(tmp_path: Path) -> None:
    m = write(tmp_path, "models.yaml", "kind: Model\nmetadata: {name: m}\nspec: {format: gguf, path: m.gguf}\n")
    d = write(tmp_path, "deploy.yaml", "metadata: {name: chat}\nspec: {model: m}\n")
    assert run("validate", str(d)).exit_code == 1
    assert run("validate", str(m), str(d)).exit_code == 0


def test_errors_name_file_line_column(tmp_path: Path) -> None:
    path = write(tmp_path, "d.yaml", "metadata: {name: chat}\nspec:\n  model: m\n  replicas: {max: 65}\n")
    write(tmp_path, "m.yaml", "kind: Model\nmetadata: {name: m}\nspec: {format: gguf, path: m.gguf}\n")
    result = run("validate", str(tmp_path))
    assert result.exit_code == 1
    assert f"{path}:4:19: error: spec.replicas.max: between 1 and 64" in result.stderr


def test_yaml_syntax_error(tmp_path: Path) -> None:
    path = write(tmp_path, "d.yaml", "metadata:\n  name: x\nspec: {model: [1\n")
    result = run("validate", str(path))
    assert result.exit_code == 1
    assert f"{path}:4:1: error:" in result.stderr


def test_duplicate_keys(tmp_path: Path) -> None:
    path = write(tmp_path, "d.yaml", "metadata: {name: x}\nspec: {model: m}\nspec: {model: n}\n")
    result = run("validate", str(path))
    assert result.exit_code == 1
    assert f"{path}:3:1: error: duplicate key 'spec'" in result.stderr


def test_wrong_type(tmp_path: Path) -> None:
    path = write(tmp_path, "d.yaml", "metadata: {name: x}\nspec: {model: m, gpus: two}\n")
    result = run("validate", str(path))
    assert f"{path}:2:24: error: spec.gpus: should be a valid integer; got a string ('two')" in result.stderr


def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("# nothing\n")
    result = run("validate", str(path))
    assert result.exit_code == 1
    assert f"{path}:1:1: error: empty file: no document in it" in result.stderr


def test_binary_input(tmp_path: Path) -> None:
    path = tmp_path / "model.yaml"
    path.write_bytes(b"GGUF\x03\x00\x00\x00\xff\xfe")
    result = run("validate", str(path))
    assert result.exit_code == 1
    assert str(path) in result.stderr and ("not UTF-8" in result.stderr or "binary" in result.stderr)


def test_missing_path(tmp_path: Path) -> None:
    result = run("validate", str(tmp_path / "nope.yaml"))
    assert result.exit_code == 1 and "no such file or directory" in result.stderr


def test_real_console_script_and_module_entry_points(tmp_path: Path) -> None:
    path = write(tmp_path, "d.yaml", "metadata: {name: x}\nspec: {model: m}\n")
    for argv in (["engine-ctl"], [sys.executable, "-m", "engine_ctl"]):
        exe = argv if argv[0] != "engine-ctl" else [str(Path(sys.executable).parent / "engine-ctl")]
        proc = subprocess.run([*exe, "validate", str(path)], capture_output=True, text=True, check=False)
        assert proc.returncode == 1
        assert "Traceback" not in proc.stderr
        assert f'{path}:2:15: error: spec.model "m": a model of the deployment\'s own workspace' in proc.stderr
    version = subprocess.run([sys.executable, "-m", "engine_ctl", "--version"], capture_output=True, text=True)
    assert version.stdout.strip() == "engine-ctl 0.1.0"


def test_schema_is_generated_from_the_models_and_committed() -> None:
    result = run("schema")
    schema = json.loads(result.stdout)
    assert schema["$schema"].endswith("2020-12/schema")
    spec = schema["$defs"]["DeploymentSpec"]["properties"]
    assert "1, 2, 4 or 8" in spec["gpus"]["description"]
    assert spec["accelerator"]["enum"] == ["gpu", "cpu"]
    committed = json.loads((ROOT / "schema/engine-ctl.schema.json").read_text())
    assert committed == schema, "schema/engine-ctl.schema.json is stale: run engine-ctl schema --out it"


def test_every_command_has_help() -> None:
    from engine_ctl.cli.main import cli

    for name in cli.list_commands(None):  # type: ignore[arg-type]
        result = run(name, "--help")
        assert result.exit_code == 0 and "Usage: " in result.output


def test_examples_validate() -> None:
    for example in ("quickstart", "gpu-fleet", "seed"):
        result = run("validate", str(ROOT / "examples" / example))
        assert result.exit_code == 0, result.output
