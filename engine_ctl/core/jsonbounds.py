"""Reading the JSON engine-ctl writes (saved plans, states) within bounds, as documents are read
(engine_ctl.core.documents.yamlsource): a size and a nesting depth, checked before the text is parsed, so a file
of any size or depth gives a located error, never a RecursionError or a parse of hundreds of MiB. Pure.

A saved plan and a state are inputs like any other (a CI artifact, a shared database row): these bounds are far
above what engine-ctl writes (a plan of thousands of deployments is tens of MiB, and nests about a dozen levels)."""

from __future__ import annotations

import json
import re
from typing import Any

MAX_DEPTH = 64
"""Levels of nesting ({ and [) in a saved plan or a state; engine-ctl's own nest about a dozen."""
MAX_PLAN_BYTES = 64 * 1024 * 1024
"""A saved plan's size: one of thousands of deployments is tens of MiB."""
MAX_STATE_BYTES = 64 * 1024 * 1024
"""A state's size: it holds no unit texts, so it is smaller than a plan of the same deployments."""

_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')
"""A JSON string (skipped whole: brackets in it do not nest) or a bracket."""


class JsonBoundError(ValueError):
    """The text passes a bound; `line` and `column` (1-based) say where, when known."""

    def __init__(self, message: str, line: int | None = None, column: int | None = None) -> None:
        super().__init__(message)
        self.message, self.line, self.column = message, line, column

    @property
    def where(self) -> str:
        return f"line {self.line}, column {self.column}: " if self.line is not None else ""


def position(text: str, offset: int) -> tuple[int, int]:
    """The 1-based line and column of `offset` in `text`."""
    line = text.count("\n", 0, offset) + 1
    return line, offset - (text.rfind("\n", 0, offset) + 1) + 1


def too_deep(text: str, max_depth: int = MAX_DEPTH) -> JsonBoundError | None:
    """Where `text` nests deeper than `max_depth` ({ and [ outside strings), or None."""
    depth = 0
    for m in _TOKEN.finditer(text):
        token = m.group()
        if token in "[{":
            depth += 1
            if depth > max_depth:
                line, column = position(text, m.start())
                return JsonBoundError(f"nested more than {max_depth} levels deep", line, column)
        elif token in "]}":
            depth -= 1
    return None


def size_problem(size: int, what: str, max_bytes: int) -> JsonBoundError | None:
    if size <= max_bytes:
        return None
    return JsonBoundError(
        f"larger than {max_bytes // 1024**2} MiB ({max_bytes:,} bytes), the most engine-ctl reads of a {what}"
    )


def bounded_json(text: str, what: str, max_bytes: int, max_depth: int = MAX_DEPTH) -> Any:
    """The value of `text` (a `what`: "saved plan", "state"), once it is within `max_bytes` characters and
    `max_depth` levels; JsonBoundError otherwise, and ValueError (json.JSONDecodeError among them) when it is not
    JSON (read it with a limit: max_bytes + 1)."""
    problem = size_problem(len(text), what, max_bytes) or too_deep(text, max_depth)
    if problem is not None:
        raise problem
    return json.loads(text)


def bounded_json_bytes(data: bytes, what: str, max_bytes: int, max_depth: int = MAX_DEPTH) -> Any:
    """bounded_json of bytes (read with a limit: max_bytes + 1): the size is checked before they are decoded."""
    problem = size_problem(len(data), what, max_bytes)
    if problem is not None:
        raise problem
    return bounded_json(data.decode(), what, max_bytes, max_depth)


__all__ = [
    "MAX_DEPTH", "MAX_PLAN_BYTES", "MAX_STATE_BYTES", "JsonBoundError", "bounded_json", "bounded_json_bytes",
    "position", "size_problem", "too_deep",
]  # fmt: skip
