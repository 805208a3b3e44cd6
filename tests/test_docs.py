"""The docs: a short README that links into docs/, and reference tables generated from the documents' models."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from engine_ctl.core.documents.forms import DeploymentSpec, FlatDeploymentDocument, Metadata, Replicas
from engine_ctl.core.documents.inventory import HostEntry

ROOT = Path(__file__).resolve().parent.parent


def _hooks():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_is_short_and_every_link_into_docs_exists() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) < 250
    links = re.findall(r"\]\((docs/[^)#]*)(?:#[^)]*)?\)", readme)
    assert len(links) >= 10
    for link in links:
        assert (ROOT / link).exists(), link
    assert "from openai import OpenAI" in readme and "curl" in readme  # the tutorial's two clients


def test_every_page_of_the_site_is_in_the_nav_and_the_nav_names_only_pages() -> None:
    nav = re.findall(r":\s*([\w-]+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.MULTILINE)
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md"))
    assert sorted(nav) == pages


def test_a_field_table_is_generated_with_every_field_of_its_model() -> None:
    hooks = _hooks()
    for model in (DeploymentSpec, Metadata, Replicas, FlatDeploymentDocument, HostEntry):
        table = hooks.field_table(model)
        for name, field in model.model_fields.items():
            row = next(line for line in table.splitlines() if line.startswith(f"| `{field.alias or name}` |"))
            assert (field.description or "").split(".")[0].replace("|", "\\|") in row


def test_the_reference_pages_use_generated_tables_not_copies() -> None:
    hooks = _hooks()
    documents = (ROOT / "docs" / "documents.md").read_text()
    for name in ("Metadata", "DeploymentSpec", "Replicas", "FlatDeploymentDocument"):
        assert f"<!-- fields: engine_ctl.core.documents.forms:{name} -->" in documents
    expanded = hooks.expand(documents)
    assert "<!-- fields:" not in expanded
    assert "| `context_length` | int \\| null |" in expanded
    assert "| `spec.context_length` |" not in documents  # the hand-copied table is gone


def test_the_home_page_is_the_readme_with_links_between_pages() -> None:
    hooks = _hooks()
    page = hooks.readme_as_page("see [Gateway](docs/gateway.md#keys) and [docs](docs/)")
    assert page == "see [Gateway](gateway.md#keys) and [docs](index.md)"
