"""Diagnostics: what is wrong, where (file:line:column and field path), and what to do."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

Severity = Literal["error", "warning"]


@dataclass(frozen=True)
class Location:
    """A place in a source file; line and column are 1-based."""

    file: str
    line: int | None = None
    column: int | None = None

    def __str__(self) -> str:
        if self.line is None:
            return self.file
        return f"{self.file}:{self.line}:{self.column or 1}"


@dataclass(frozen=True)
class Diagnostic:
    """One finding about an input document."""

    location: Location
    field: str
    message: str
    hint: str | None = None
    severity: Severity = "error"
    code: str | None = None

    def render(self) -> str:
        where = str(self.location)
        head = f"{where}: {self.severity}: "
        if self.field and not self.message.startswith(self.field):
            head += f"{self.field}: "
        text = head + self.message
        if self.hint:
            text += f"\n  hint: {self.hint}"
        return text

    def as_json(self) -> dict[str, object]:
        return {
            "severity": self.severity,
            "file": self.location.file,
            "line": self.location.line,
            "column": self.location.column,
            "field": self.field,
            "message": self.message,
            "hint": self.hint,
            "code": self.code,
        }


class InputError(Exception):
    """Raised by the shell when input cannot be used; carries diagnostics for the user."""

    def __init__(self, diagnostics: Iterable[Diagnostic]) -> None:
        self.diagnostics = list(diagnostics)
        super().__init__("\n".join(d.render() for d in self.diagnostics))


def by_place(diagnostics: Iterable[Diagnostic]) -> list[Diagnostic]:
    """In reading order: by file, then line, then column (a diagnostic without a line first in its file); the
    order found is kept among equals."""
    return sorted(diagnostics, key=lambda d: (d.location.file, d.location.line or 0, d.location.column or 0))


def errors(diagnostics: Iterable[Diagnostic]) -> list[Diagnostic]:
    return [d for d in diagnostics if d.severity == "error"]


def format_path(path: tuple[object, ...]) -> str:
    """('spec', 'engine_args', 2) -> 'spec.engine_args[2]'."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out
