"""Helpers shared by the tests: load documents from text, run the real CLI in-process."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path
from typing import Any

from click.testing import CliRunner, Result

from engine_ctl.cli.main import cli
from engine_ctl.core.diagnostics import Diagnostic
from engine_ctl.core.documents.loader import LoadResult, load_documents
from engine_ctl.core.documents.rules import check
from engine_ctl.core.documents.yamlsource import parse_text

MODEL_GGUF = """
kind: Model
metadata: {name: llama-3-2-3b}
spec: {format: gguf, path: llama/Llama-3.2-3B-Q4_K_M.gguf, context_length: 131072, parameters: 3210000000}
"""
MODEL_ST = """
kind: Model
metadata: {name: qwen}
spec: {format: safetensors, path: /srv/models/qwen, context_length: 40960}
"""


def load(*texts: str, file: str = "d.yaml") -> tuple[LoadResult, list[Diagnostic]]:
    docs = []
    problems: list[Diagnostic] = []
    for i, text in enumerate(texts):
        found, bad = parse_text(textwrap.dedent(text), f"{i}-{file}")
        docs.extend(found)
        problems.extend(bad)
    result = load_documents(docs)
    return result, problems + result.diagnostics + check(result.desired, frozenset(result.broken_models))


def messages(diagnostics: list[Diagnostic], severity: str = "error") -> list[str]:
    return [d.message for d in diagnostics if d.severity == severity]


def deployment(spec: str, name: str = "chat", model: str = MODEL_GGUF) -> tuple[LoadResult, list[Diagnostic]]:
    body = "metadata: {name: %s}\nspec:\n" % name + textwrap.indent(textwrap.dedent(spec).strip(), "  ") + "\n"
    return load(model, body)


def run(*args: str) -> Result:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=True)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"engine-ctl {' '.join(args)} raised {result.exception!r}\n{result.output}")
    return result


def write(tmp: Path, name: str, text: str) -> Path:
    path = tmp / name
    path.write_text(textwrap.dedent(text))
    return path


LINEAGE_LINE = re.compile(r"^# lineage: .*\n(?:# id: .*\n)?(# content-sha256: )[0-9a-f]{64}$", re.MULTILINE)


def unit_text_without_lineage(text: str) -> str:
    """A unit's text without its lineage and ID lines and content hash: what two plans of a state that was never
    written share (each plan offers a new lineage, which the units' headers carry, and a new deployment's ID is
    derived from it)."""
    return LINEAGE_LINE.sub(r"\1", text)


def plan_without_offered_lineage(doc: dict[str, Any]) -> dict[str, Any]:
    """A plan's JSON without the lineage it offers a state that was never written: not state_lineage, nor the
    units' lineage lines and the hashes that cover them (the rest is compared byte for byte)."""
    out = json.loads(json.dumps(doc))
    out.pop("state_lineage", None)
    for change in out.get("changes", []):
        change.pop("deployment_id", None)  # derived from the offered lineage
        for step in change.get("replicas", []):
            if step.get("unit_text"):
                step["unit_text"] = unit_text_without_lineage(step["unit_text"])
                step.pop("unit_sha256", None)
    return out


QUICKSTART = Path(__file__).resolve().parents[1] / "examples" / "quickstart"


def models_with_tiny(tmp: Path) -> Path:
    """A models_dir under `tmp` holding the quickstart's tiny model (tiny-llama/tiny-llama-f32.gguf): a plan of the
    quickstart against it is not Pending on the weights (plan exits 1 while a document cannot be served)."""
    import shutil

    from tests.llama import tiny_model

    models = tmp / "models"
    (models / "tiny-llama").mkdir(parents=True, exist_ok=True)
    shutil.copy(tiny_model(), models / "tiny-llama" / "tiny-llama-f32.gguf")
    return models


def quickstart_copy(tmp: Path) -> Path:
    """examples/quickstart copied under `tmp`, its inventory's models_dir one that holds the tiny model."""
    import shutil

    copy = tmp / "quickstart"
    shutil.copytree(QUICKSTART, copy)
    hosts = copy / "hosts.yaml"
    hosts.write_text(hosts.read_text().replace("/var/lib/engine-ctl/models", str(models_with_tiny(tmp))))
    return copy
