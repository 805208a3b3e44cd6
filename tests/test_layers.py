"""The architecture holds: importing the pure core (documents, rules, fit, render, plan, saved plans, status)
loads no I/O — not the CLI, not the transport or SSH, not a state backend, not PostgreSQL."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SHELL_PREFIXES = ("engine_ctl.shell", "engine_ctl.cli", "engine_ctl.__main__")
SHELL = {"engine_ctl.state.local", "engine_ctl.state.postgres", "engine_ctl.state.base"}
IO_LIBRARIES = ("paramiko", "fabric", "invoke", "psycopg", "click", "rich")


def _core_modules() -> list[str]:
    """Every module under engine_ctl/core/ (the recorded state included), the providers, and the backends package."""
    names = []
    for path in sorted((ROOT / "engine_ctl" / "core").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    names += [f"engine_ctl.providers.{p.stem}" for p in sorted((ROOT / "providers").glob("*.py"))
              if p.stem != "__init__"]  # fmt: skip
    return [*names, "engine_ctl.state"]


def test_the_core_imports_no_shell_module_and_no_io_library() -> None:
    core = _core_modules()
    assert {"engine_ctl.core.plan.planner", "engine_ctl.core.plan.savedplan", "engine_ctl.core.fit.fitting"} <= set(
        core
    )
    script = (
        "import importlib, json, sys\n"
        f"for name in {core!r}:\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=ROOT)
    loaded = set(json.loads(out.stdout))
    shell = sorted(m for m in loaded if m in SHELL or m.startswith(SHELL_PREFIXES))
    libraries = sorted(m for m in loaded if m.split(".")[0] in IO_LIBRARIES)
    assert shell == [], f"the pure core loads shell modules: {shell}"
    assert libraries == [], f"the pure core loads I/O libraries: {libraries}"
