"""Issue 8 §3 and §4: messages and small CLI faults, each through the real CLI on files written here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from engine_ctl.providers.llamacpp import ALLOWED
from engine_ctl.state import LocalState

from engine_ctl.core.record.model import DeploymentRecord, State
from tests.helpers import run, write

MODEL_ST = "kind: Model\nmetadata: {name: qwen}\nspec: {format: safetensors, path: /srv/models/qwen}\n"
MODEL_GGUF = "kind: Model\nmetadata: {name: llama}\nspec: {format: gguf, path: llama/x.gguf}\n"
COMMIT_A = "b968826d9c46dd6066d109eabc6255188de91218"
COMMIT_B = "0123456789abcdef0123456789abcdef01234567"


def validate(tmp_path: Path, text: str, *extra: str, name: str = "d.yaml") -> tuple[Path, str, int]:
    path = write(tmp_path, name, text)
    result = run("validate", *extra, str(path))
    return path, result.stderr if not extra else result.stdout, result.exit_code


# status [NAME] [PATHS...] and list: a path is a path; an empty state needs no inventory


def failed_state(directory: Path) -> None:
    """A state beside the documents with one deployment that runs nowhere (it did not fit)."""
    record = DeploymentRecord(name="chat", revision=1, state="Failed", reason="does not fit any host")
    LocalState(directory / "engine-ctl.state.json").write(State(deployments={"chat": record}))


def test_status_dot_is_the_current_directory_not_a_deployment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = run("status", ".")
    assert result.exit_code == 0, result.output
    empty = "No state at engine-ctl.state.json: nothing was applied from this project."
    assert result.stdout.startswith(empty), result.stdout
    assert not (tmp_path / "engine-ctl.state.json").exists()  # a command that finds no state never makes one


def test_status_path_argument_reads_the_state_beside_it(tmp_path: Path) -> None:
    deploy = tmp_path / "deploy"
    deploy.mkdir()
    failed_state(deploy)
    for arg in (f"{deploy}/", str(deploy)):
        result = run("status", arg)
        assert result.exit_code == 0, result.output
        lines = result.stdout.splitlines()
        assert lines[0].split() == ["NAME", "STATE", "READY", "REVISION", "STARTUP", "INITIALIZE", "LAST", "OPERATION"]
        assert lines[1].split() == ["chat", "failed", "0/0", "1", "-", "-", "-"], result.stdout
        assert "Reason    does not fit any host" in result.stdout


def test_status_name_then_paths_without_an_inventory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    failed_state(tmp_path)
    monkeypatch.chdir(tmp_path)
    result = run("status", "chat", ".")
    assert result.exit_code == 0, result.output
    assert "does not fit any host" in result.stdout
    unknown = run("status", "chat2", ".")
    assert unknown.exit_code == 1
    assert "state: error: no deployment named 'chat2' in the state\n  hint: deployments: chat" in unknown.stderr


def test_list_and_status_of_an_empty_state_need_no_inventory(tmp_path: Path) -> None:
    listed = run("list", str(tmp_path))
    assert listed.exit_code == 0, listed.output
    assert f"No state at {tmp_path}/engine-ctl.state.json" in listed.stdout
    shown = run("status", "--json", str(tmp_path))
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout) == {"format_version": 1, "deployments": []}


def test_status_help_states_the_path_rule() -> None:
    text = " ".join(run("status", "--help").stdout.split())
    assert "NAME is read as a path, not a deployment, when it looks like one" in text


# Flat-form documents are reported in the flat form's names


def test_flat_form_replicas_is_named_replicas(tmp_path: Path) -> None:
    path, err, code = validate(tmp_path, "name: chat\nengine: llamacpp\nmodel: llama/x.gguf\nreplicas: 0\n")
    assert code == 1
    assert err.splitlines()[0] == f"{path}:4:11: error: replicas: between 1 and 64"
    assert "spec." not in err


def test_flat_form_context_length_and_set_it_with(tmp_path: Path) -> None:
    text = """\
    name: chat
    engine: llamacpp
    model: llama/x.gguf
    engine_config:
      context_length: 100
      accept_extra_args: true
      extra_args: [--ctx-size, "4096"]
    """
    path, err, code = validate(tmp_path, text)
    assert code == 1
    assert f"{path}:5:19: error: engine_config.context_length: at least 256 tokens" in err
    assert (
        f"{path}:7:16: error: engine_config.extra_args[0] --ctx-size: set by the deployment; "
        "set it with engine_config.context_length"
    ) in err


def test_flat_form_filled_in_defaults_use_flat_names(tmp_path: Path) -> None:
    _, out, code = validate(tmp_path, "name: chat\nengine: llamacpp\nmodel: llama/x.gguf\n", "--json")
    assert code == 0
    (dep,) = json.loads(out)["deployments"]
    fields = [d["field"] for d in dep["defaults"]]
    assert fields == ["replicas", "engine_config.context_length", "gpus", "cpu_cores", "parallel"]
    human = run("validate", str(tmp_path / "d.yaml")).stdout
    assert "    replicas                     1   (default)" in human
    assert "spec." not in human


# hf: references


def test_flat_hf_without_commit_is_located_at_its_line(tmp_path: Path) -> None:
    path, err, _ = validate(tmp_path, "name: q\nengine: vllm\nmodel: {hf: Qwen/Qwen3-4B}\n")
    assert err.splitlines()[:2] == [
        f"{path}:3:13: error: model.hf Qwen/Qwen3-4B: no commit; validate works offline, so it refuses an hf: "
        "reference without a commit",
        "  hint: pin it: Qwen/Qwen3-4B@<commit>",
    ]


def test_flat_hf_string_without_commit_is_located_at_its_line(tmp_path: Path) -> None:
    path, err, _ = validate(tmp_path, "name: q\nengine: vllm\n\nmodel: Qwen/Qwen3-4B@\n")
    assert err.startswith(f"{path}:4:8: error: model Qwen/Qwen3-4B: no commit;")


def test_hf_with_two_commits_is_ambiguous(tmp_path: Path) -> None:
    text = f"name: q\nengine: vllm\nmodel:\n  hf: Qwen/Qwen3-4B@{COMMIT_A}\n  commit: {COMMIT_B}\n"
    path, err, code = validate(tmp_path, text)
    assert code == 1
    assert err.splitlines()[:2] == [
        f"{path}:5:11: error: model.commit {COMMIT_B}: ambiguous, model.hf Qwen/Qwen3-4B@{COMMIT_A} already "
        f"names commit {COMMIT_A}",
        "  hint: give the commit once: org/repo@<commit>, or hf: org/repo with commit: <commit>",
    ]
    assert err.count("error:") == 1


def test_model_document_hf_with_two_commits_is_ambiguous(tmp_path: Path) -> None:
    hf = f"{{hf: Qwen/Q@{COMMIT_A}, commit: {COMMIT_B}}}"
    text = f"kind: Model\nmetadata: {{name: q}}\nspec:\n  format: safetensors\n  hf: {hf}\n"
    path, err, code = validate(tmp_path, text)
    assert code == 1
    assert err.startswith(f"{path}:5:69: error: spec.hf.commit {COMMIT_B}: ambiguous, spec.hf.hf Qwen/Q@{COMMIT_A}")


@pytest.mark.parametrize("commit", ["main", "v1.0", COMMIT_A[:7], COMMIT_A.upper(), COMMIT_A + "0"])
def test_a_commit_is_40_hex_digits(tmp_path: Path, commit: str) -> None:
    path, err, code = validate(tmp_path, f"name: q\nengine: vllm\nmodel: Qwen/Qwen3-4B@{commit}\n")
    assert code == 1
    assert err.splitlines()[:2] == [
        f"{path}:3:8: error: model Qwen/Qwen3-4B@{commit}: a commit is 40 hexadecimal digits (0-9, a-f), "
        f"not {commit!r}",
        "  hint: pin the full commit id from Qwen/Qwen3-4B's history on huggingface.co; a branch, a tag or a "
        "short id is not a pin",
    ]


def test_a_commit_field_is_located_at_its_line(tmp_path: Path) -> None:
    text = "kind: Model\nmetadata: {name: q}\nspec:\n  format: safetensors\n  hf:\n    hf: Qwen/Q\n    commit: main\n"
    path, err, _ = validate(tmp_path, text)
    assert err.startswith(f"{path}:7:13: error: spec.hf.commit main: a commit is 40 hexadecimal digits")


def test_a_full_commit_validates(tmp_path: Path) -> None:
    _, _, code = validate(tmp_path, f"name: q\nengine: vllm\nmodel: {{hf: Qwen/Qwen3-4B, commit: {COMMIT_A}}}\n")
    assert code == 0


# replicas.min, format errors, refused flags


def test_replicas_min_negative_says_at_least_0(tmp_path: Path) -> None:
    text = MODEL_GGUF + "---\nmetadata: {name: chat}\nspec:\n  model: llama\n  replicas: {min: -1, max: 2}\n"
    path, err, code = validate(tmp_path, text)
    assert code == 1
    assert err.splitlines()[0] == f"{path}:8:19: error: spec.replicas.min: at least 0"


def test_format_error_at_the_model_line_and_no_vllm_for_cpu(tmp_path: Path) -> None:
    text = MODEL_ST + "---\nmetadata: {name: chat}\nspec:\n  model: qwen\n  accelerator: cpu\n"
    path, err, code = validate(tmp_path, text)
    assert code == 1
    assert err.splitlines()[:2] == [
        f"{path}:7:10: error: spec.model: llama.cpp serves GGUF; model qwen is a safetensors checkpoint: a "
        "CPU-only deployment is served by llama.cpp, so it needs a GGUF model",
        "  hint: point the deployment at a GGUF build of the model (kind: Model with format: gguf)",
    ]
    assert "vllm" not in err.lower()


def test_format_error_on_gpu_at_the_model_line(tmp_path: Path) -> None:
    text = MODEL_ST + "---\nmetadata: {name: chat}\nspec:\n  model: qwen\n  engine: llama.cpp\n"
    path, err, _ = validate(tmp_path, text)
    assert err.splitlines()[0] == (
        f"{path}:7:10: error: spec.model: llama.cpp serves GGUF; model qwen is a safetensors checkpoint: "
        "serve it with vllm"
    )


def test_refused_by_design_flag_also_gives_the_allow_list(tmp_path: Path) -> None:
    text = MODEL_GGUF + "---\nmetadata: {name: chat}\nspec:\n  model: llama\n  engine_args: [--api-key, k]\n"
    path, err, code = validate(tmp_path, text)
    assert code == 1
    assert err.splitlines()[0] == (
        f"{path}:8:17: error: spec.engine_args[0] --api-key: opens the server further (not allowed, by design); "
        f"not on llama.cpp's allow-list: {', '.join(ALLOWED)}"
    )


# §3: scaling needs no warning of the documents (the scaler is built); idle_minutes is cleared when min > 0


def test_min_zero_and_min_below_max_validate_without_a_warning(tmp_path: Path) -> None:
    for replicas in ("{min: 0, max: 1}", "{min: 2, max: 3}", "{min: 0, max: 4}", "{min: 3, max: 3}"):
        text = MODEL_GGUF + f"---\nmetadata: {{name: chat}}\nspec:\n  model: llama\n  replicas: {replicas}\n"
        _, err, code = validate(tmp_path, text)
        assert code == 0 and "warning" not in err, (replicas, err)


def test_idle_minutes_with_min_above_zero_is_cleared_with_a_warning(tmp_path: Path) -> None:
    text = (MODEL_GGUF + "---\nmetadata: {name: chat}\nspec:\n  model: llama\n"
            "  replicas: {min: 1, max: 2, idle_minutes: 5}\n")  # fmt: skip
    path, err, code = validate(tmp_path, text)
    assert code == 0
    assert err.splitlines()[0] == (
        f"{path}:8:44: warning: spec.replicas.idle_minutes: ignored (cleared) because spec.replicas.min is above 0"
    )


# Shape errors name the document's own fields, never engine-ctl's classes or pydantic's union tags


def test_unknown_field_in_an_hf_mapping_is_the_only_error(tmp_path: Path) -> None:
    path, err, code = validate(tmp_path, f"name: q\nengine: vllm\nmodel: {{hf: Qwen/Q, comit: {COMMIT_A}}}\n")
    assert code == 1
    assert err.splitlines()[:2] == [
        f"{path}:3:21: error: model.comit: unknown field 'comit'",
        "  hint: did you mean 'commit'?",
    ]
    assert err.count("error:") == 1


def test_wrong_type_of_model_names_no_class(tmp_path: Path) -> None:
    path, err, _ = validate(tmp_path, "name: q\nmodel: 5\n")
    wanted = "should be a valid string; or a mapping; got an integer (5)"
    assert err.splitlines()[0] == f"{path}:2:8: error: model: {wanted}"
