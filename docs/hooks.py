"""MkDocs hook: field tables generated from the documents' pydantic models, so the reference never copies them by
hand. A page writes `<!-- fields: engine_ctl.core.documents.forms:DeploymentSpec -->` and gets the table: each
field's name (as written in YAML), its type, its default and its description, read from the model itself."""

from __future__ import annotations

import importlib
import re
import types
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

MARKER = re.compile(r"<!--\s*fields:\s*([\w.]+):(\w+)\s*-->")


def _type_text(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        parts = [_type_text(a) for a in args if a is not type(None)]
        return " \\| ".join(parts) + (" \\| null" if type(None) in args else "")
    if origin is typing.Annotated:
        return _type_text(args[0])
    if origin in (list, tuple, set):
        return f"list of {_type_text(args[0])}" if args else "list"
    if origin is dict:
        return f"map of {_type_text(args[0])} to {_type_text(args[1])}" if args else "map"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation.__name__
    return getattr(annotation, "__name__", str(annotation))


def _default_text(field: Any) -> str:
    if field.is_required():
        return "required"
    if field.default_factory is not None:
        value = field.default_factory()
        if isinstance(value, BaseModel):
            return "(its defaults)"
        return "(empty)" if value in ({}, [], ()) else f"`{value!r}`"
    if field.default is None or field.default is PydanticUndefined:
        return "—"
    return f"`{str(field.default).lower() if isinstance(field.default, bool) else field.default}`"


def field_table(model: type[BaseModel]) -> str:
    """The Markdown table of one model's fields, in the model's order."""
    rows = ["| field | type | default | what it is |", "|---|---|---|---|"]
    for name, field in model.model_fields.items():
        shown = field.alias or name
        description = (field.description or "").replace("|", "\\|").replace("\n", " ")
        rows.append(f"| `{shown}` | {_type_text(field.annotation)} | {_default_text(field)} | {description} |")
    return "\n".join(rows)


def expand(markdown: str) -> str:
    """Every fields marker of a page replaced by its table."""

    def table(match: re.Match[str]) -> str:
        model = getattr(importlib.import_module(match.group(1)), match.group(2))
        return field_table(model)

    return MARKER.sub(table, markdown)


INCLUDE_README = "<!-- include: README.md -->"


def readme_as_page(readme: str) -> str:
    """The README as the site's home page: its links into docs/ become links between pages."""
    text = readme.replace("](docs/)", "](index.md)")
    return re.sub(r"\]\(docs/([\w.-]+\.md(?:#[\w-]+)?)\)", r"](\1)", text)


def on_page_markdown(markdown: str, **_: Any) -> str:
    if INCLUDE_README in markdown:
        readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
        markdown = markdown.replace(INCLUDE_README, readme_as_page(readme))
    return expand(markdown)
