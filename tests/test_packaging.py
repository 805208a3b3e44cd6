"""What users install: every subpackage is in the wheel, and the wheel and sdist run outside the source tree."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _declared() -> tuple[set[str], dict[str, str]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    return set(config["packages"]), config["package-dir"]


def test_every_subpackage_in_the_tree_is_declared() -> None:
    """A folder with __init__.py that pyproject does not list is missing from the wheel (ModuleNotFoundError)."""
    packages, package_dir = _declared()
    found = set()
    for package, folder in package_dir.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(ROOT / folder)
            found.add(".".join([package, *relative.parts]))
    assert found - packages == set(), f"subpackages not listed in pyproject's packages: {found - packages}"
    assert packages - found == set(), f"listed packages that do not exist: {packages - found}"


@pytest.mark.slow
def test_wheel_and_sdist_install_and_run_outside_the_tree() -> None:
    """Build both, install each into a fresh venv, run --help, validate, plan and schema from an empty dir."""
    result = subprocess.run(
        ["bash", str(ROOT / "tools" / "check_wheel.sh"), sys.executable],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "wheel ok: engine_ctl-" in result.stdout
    assert "sdist ok: engine_ctl-" in result.stdout
