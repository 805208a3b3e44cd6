"""Turn pydantic validation errors into located, actionable diagnostics (with "did you mean")."""

from __future__ import annotations

import difflib
import re
import types
import typing
from typing import Any

from pydantic import BaseModel, ValidationError

from engine_ctl.core.diagnostics import Diagnostic, Location, format_path
from engine_ctl.core.documents.yamlsource import SourceDocument


def _model_classes(annotation: Any) -> list[type[BaseModel]]:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType, list, tuple, typing.Annotated):
        out: list[type[BaseModel]] = []
        for arg in typing.get_args(annotation):
            out.extend(_model_classes(arg))
        return out
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return []


def fields_at(model: type[BaseModel], path: tuple[str | int, ...]) -> list[str]:
    """The field names allowed at `path` below `model` (for "did you mean")."""
    candidates = [model]
    for part in path:
        if isinstance(part, int):
            continue
        nxt: list[type[BaseModel]] = []
        for cls in candidates:
            info = cls.model_fields.get(part)
            if info is not None:
                nxt.extend(_model_classes(info.annotation))
        candidates = nxt or candidates
    names: list[str] = []
    for cls in candidates:
        names.extend(n for n in cls.model_fields if n not in names)
    return names


def _clean_loc(loc: tuple[Any, ...], data: Any, missing: bool = False) -> tuple[str | int, ...]:
    """Drop pydantic's union-member tags ('str', 'HfSource') from a loc, keeping only the parts that exist in the
    data, and the absent last key of a missing field."""
    out: list[str | int] = []
    cur = data
    for n, part in enumerate(loc):
        last = n == len(loc) - 1
        if (isinstance(cur, dict) and isinstance(part, str) and part in cur) or (
            isinstance(cur, list) and isinstance(part, int) and 0 <= part < len(cur)
        ):
            out.append(part)
            cur = cur[part]  # type: ignore[index]
        elif last and missing and isinstance(part, str) and isinstance(cur, dict):
            out.append(part)
    return tuple(out)


INSTANCE_OF = re.compile(r"a valid dictionary or instance of \w+")


def _wanted(message: str) -> str:
    """pydantic's "Input should be …", without its prefix or the names of engine-ctl's classes."""
    return INSTANCE_OF.sub("a mapping", message.removeprefix("Input should be "))


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


TOPOLOGY_FIELDS = ("nodes", "topology")
"""Fields that would spread a flat-form replica over machines: seed 003 ("runs on one machine: a topology is
refused"); the spec form's spec.nodes goes beyond it (issue 30)."""


def topology_refused(where: Location, field: str) -> Diagnostic:
    return Diagnostic(
        where, field, "a topology is refused: a flat-form deployment runs on one machine",
        hint="write the deployment in the metadata/spec form, whose spec.nodes spreads one replica over machines",
        code="topology_refused",
    )  # fmt: skip


def diagnostics_from(exc: ValidationError, doc: SourceDocument, model: type[BaseModel]) -> list[Diagnostic]:
    raw = exc.errors(include_url=False)
    cleaned = [(_clean_loc(tuple(e["loc"]), doc.data, e["type"] == "missing"), e) for e in raw]
    keep = []
    for path, err in cleaned:
        shallow_type = err["type"].endswith("_type") or err["type"] in ("model_type", "dict_type")
        deeper = any(len(p) > len(path) and p[: len(path)] == path for p, _ in cleaned)
        if shallow_type and deeper:
            continue
        keep.append((path, err))
    by_path: dict[tuple[str | int, ...], list[Any]] = {}
    for path, err in keep:
        by_path.setdefault(path, []).append(err)
    out: list[Diagnostic] = []
    for path, errs in by_path.items():
        field = format_path(path)
        first = errs[0]
        if first["type"] == "extra_forbidden":
            name = str(path[-1])
            allowed = fields_at(model, path[:-1])
            close = difflib.get_close_matches(name, allowed, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}?" if close else f"known fields here: {', '.join(allowed)}"
            if len(path) == 1 and name in TOPOLOGY_FIELDS and "engine_config" in allowed:  # the flat form
                out.append(topology_refused(doc.locate(path, key=True), field))
                continue
            out.append(
                Diagnostic(
                    doc.locate(path, key=True), field, f"unknown field {name!r}", hint=hint, code="unknown_field"
                )
            )
        elif first["type"] == "missing":
            out.append(
                Diagnostic(
                    doc.locate(path[:-1], key=True),
                    field,
                    "required field is missing",
                    hint=f"add {path[-1]}:",
                    code="missing_field",
                )
            )
        else:
            wanted = "; or ".join(dict.fromkeys(_wanted(str(e["msg"])) for e in errs))
            value = first.get("input")
            got = _describe(value)
            if isinstance(value, str | int | float) and not isinstance(value, bool) and len(str(value)) <= 60:
                got += f" ({value!r})"
            out.append(Diagnostic(doc.locate(path), field, f"should be {wanted}; got {got}", code="wrong_type"))
    return out
