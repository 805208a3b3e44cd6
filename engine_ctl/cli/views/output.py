"""Output: rich on a TTY, plain text otherwise or with NO_COLOR; JSON documents for machines.

rich is imported when a console is made, not with this module: `--version` and `--help` never pay for it.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console


def console(stderr: bool = False) -> Console:
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    plain = bool(os.environ.get("NO_COLOR")) or not stream.isatty()
    return Console(
        file=stream,
        no_color=plain,
        highlight=False,
        soft_wrap=True,
        force_terminal=False if plain else None,
        width=160 if plain else None,
        emoji=False,
        markup=False,
    )


def printer(stderr: bool = False) -> Callable[[str], None]:
    """Print lines of plain text (what `console().print(text)` prints for a str, with markup and highlighting
    off) without importing rich: for commands whose output is lines, not tables (validate)."""
    stream = sys.stderr if stderr else sys.stdout

    def write(text: str = "") -> None:
        stream.write(f"{text}\n")
        stream.flush()  # as rich does: lines of stdout and stderr stay in order on one terminal

    return write


def emit_json(doc: Any) -> None:
    sys.stdout.write(json.dumps(doc, indent=2, sort_keys=False, default=str) + "\n")
