"""The pure core reads in small pieces: no function in engine_ctl/core is longer than MAX_LINES lines (its
decorators, signature, docstring and body; issue 10: "no function over about 60 lines anywhere in the core")."""

from __future__ import annotations

import ast
from pathlib import Path

CORE = Path(__file__).resolve().parent.parent / "engine_ctl" / "core"
MAX_LINES = 60


def long_functions(source: str, limit: int = MAX_LINES) -> list[tuple[str, int, int]]:
    """(name, first line, length) of each function (nested ones too) longer than `limit` lines."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            length = (node.end_lineno or node.lineno) - first + 1
            if length > limit:
                out.append((node.name, first, length))
    return out


def test_no_function_in_the_core_is_longer_than_60_lines() -> None:
    files = sorted(CORE.rglob("*.py"))
    assert len(files) > 20 and any(p.name == "planner.py" for p in files)
    found = [f"{p.relative_to(CORE.parent.parent)}:{line} {name} ({n} lines)"
             for p in files for name, line, n in long_functions(p.read_text())]  # fmt: skip
    assert not found, "split these into named steps: " + "; ".join(found)


def test_the_check_counts_a_long_function_and_passes_a_short_one() -> None:
    lines = [f"x{i} = {i}" for i in range(MAX_LINES)]
    body = "".join(f"    {line}\n" for line in lines)
    assert long_functions(f"def long():\n{body}") == [("long", 1, MAX_LINES + 1)]
    short = "".join(f"    {line}\n" for line in lines[: MAX_LINES - 2])
    assert long_functions(f"@decorated\ndef short():\n{short}") == []  # exactly MAX_LINES, decorator counted
    inner = "".join(f"            {line}\n" for line in lines)
    nested = f"class C:\n    def m(self):\n        def inner():\n{inner}"
    assert [name for name, _, _ in long_functions(nested)] == ["m", "inner"]
