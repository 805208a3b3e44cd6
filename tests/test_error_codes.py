"""Every diagnostic carries a stable code, listed in the README, and `plan --json` on invalid documents prints the
documented error object on stdout."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from engine_ctl.core.diagnostics import CODES
from tests.helpers import run

ROOT = Path(__file__).resolve().parents[1]
MAKERS = {"Diagnostic", "ArgProblem", "_err", "_warn"}
"""What makes a diagnostic (or the engine-argument problem one is made from)."""


def _called(node: ast.Call) -> str:
    f = node.func
    return f.id if isinstance(f, ast.Name) else (f.attr if isinstance(f, ast.Attribute) else "")


def codes_in_source() -> tuple[set[str], list[str]]:
    """Every literal code engine-ctl passes, and every maker call without a code (file:line)."""
    used: set[str] = set()
    missing: list[str] = []
    for path in sorted((ROOT / "engine_ctl").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                keywords = {k.arg: k.value for k in node.keywords}
                if "code" not in keywords and _called(node) in MAKERS:
                    missing.append(f"{path.relative_to(ROOT)}:{node.lineno}")
                value = keywords.get("code")
                if isinstance(value, ast.Constant) and isinstance(value.value, str):
                    used.add(value.value)
            if isinstance(node, ast.Assign):  # hint, code = "…", "yaml_syntax"
                for target in node.targets:
                    names = target.elts if isinstance(target, ast.Tuple) else [target]
                    values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
                    for name, value in zip(names, values, strict=False):
                        if (
                            isinstance(name, ast.Name) and name.id == "code" and isinstance(value, ast.Constant)
                            and isinstance(value.value, str) and re.fullmatch(r"[a-z][a-z_]*", value.value)
                        ):  # fmt: skip
                            used.add(value.value)
    return used, missing


def readme_codes() -> set[str]:
    text = (ROOT / "docs" / "commands.md").read_text()
    table = text.split("## Error codes", 1)[1].split("\n#", 1)[0]
    return set(re.findall(r"^\| `([a-z_0-9]+)` \|", table, re.MULTILINE))


def test_every_diagnostic_is_made_with_a_code_that_is_defined() -> None:
    used, missing = codes_in_source()
    assert not missing, f"diagnostics made without a code: {missing}"
    assert used, "no code found: the scan is broken"
    assert used <= set(CODES), f"codes used but not defined in CODES: {sorted(used - set(CODES))}"
    assert set(CODES) - used == set(), f"codes defined but never used: {sorted(set(CODES) - used)}"


def test_the_readme_lists_every_code_and_no_other() -> None:
    listed = readme_codes()
    assert listed == set(CODES), (sorted(set(CODES) - listed), sorted(listed - set(CODES)))


BROKEN = {
    "fields.yaml": """\
kind: Model
metadata: {name: tiny}
spec: {format: gguf, path: tiny/tiny.gguf, parameters: 4170048}
---
metadata: {name: chat}
spec:
  model: tiny
  accelerator: cpu
  replicas: {min: 1, max: 100}
  parralel: 2
  engine_args: ["-c", "4096", "--api-key", "x"]
""",
    "model.yaml": """\
metadata: {name: other}
spec: {model: missing, context_length: 12}
""",
    "syntax.yaml": "metadata: {name: [\n",
    "dup.yaml": "metadata: {name: a}\nmetadata: {name: b}\n",
    "empty.yaml": "",
    "kind.yaml": "kind: Modle\nmetadata: {name: x}\n",
}


def test_plan_json_on_invalid_documents_prints_the_error_object_with_a_code_on_every_detail(tmp_path: Path) -> None:
    for name, text in BROKEN.items():
        (tmp_path / name).write_text(text)
    result = run("plan", str(tmp_path), "--json", "--state", str(tmp_path / "state.json"))
    assert result.exit_code == 1, result.output
    doc = json.loads(result.stdout)
    assert doc["format_version"] == 1 and set(doc) == {"format_version", "error"}
    error = doc["error"]
    assert error["status"] == 400 and error["code"] == "INVALID_DEPLOYMENT"
    codes = [d["code"] for d in error["details"]]
    assert None not in codes and set(codes) <= set(CODES)
    for expected in ("unknown_field", "out_of_range", "short_flag", "flag_refused", "unknown_model", "yaml_syntax",
                     "duplicate_key", "empty_file", "unknown_kind"):  # fmt: skip
        assert expected in codes, (expected, codes)
    for d in error["details"]:
        assert d["file"] and d["line"] and d["message"], d
    assert "error:" in result.stderr  # the people's version still goes to stderr
    assert not (tmp_path / "state.json").exists()  # nothing was planned, no host asked


def test_validate_json_details_carry_codes_too(tmp_path: Path) -> None:
    (tmp_path / "fields.yaml").write_text(BROKEN["fields.yaml"])
    result = run("validate", str(tmp_path), "--json")
    assert result.exit_code == 1
    details = json.loads(result.stdout)["error"]["details"]
    assert {d["code"] for d in details} >= {"unknown_field", "out_of_range", "short_flag"}


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (("render", "nope", "--json"), "unknown_deployment"),
        (("status", "nope", "--json"), "unknown_deployment"),
    ],
)
def test_a_command_refusing_input_under_json_prints_the_error_object(
    args: tuple[str, ...], code: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "d.yaml").write_text(BROKEN["fields.yaml"].replace("  parralel: 2\n", "").replace("100", "1")
                                     .replace('  engine_args: ["-c", "4096", "--api-key", "x"]\n', ""))  # fmt: skip
    (tmp_path / "hosts.yaml").write_text("hosts:\n  - {name: localhost, transport: local}\n")
    result = run(*args)
    assert result.exit_code == 1, result.output
    (detail,) = json.loads(result.stdout)["error"]["details"]
    assert detail["code"] == code


def readme_exit_statuses() -> dict[str, int]:
    text = (ROOT / "docs" / "plan-apply.md").read_text()
    table = text.split("### Exit status of each error code", 1)[1].split("\n#", 1)[0]
    return {code: int(n) for code, n in re.findall(r"^\| `([a-z_0-9]+)` \| (\d+) \|", table, re.MULTILINE)}


def test_the_readme_lists_the_exit_status_of_every_code_that_does_not_exit_1() -> None:
    from engine_ctl.core.diagnostics import EXIT_STATUSES

    assert readme_exit_statuses() == EXIT_STATUSES
    assert set(EXIT_STATUSES) <= set(CODES) and all(n not in (0, 1, 2, 130) for n in EXIT_STATUSES.values())
