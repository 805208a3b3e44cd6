"""Start-up: what a command imports before it does anything (issue 10). Not timed: bench/startup.py times it;
these fail when a heavy library creeps back into --version, --help or validate."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from engine_ctl.__main__ import VERSION_LINE
from engine_ctl.cli.main import COMMANDS, cli, load_command

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("pydantic", "paramiko", "fabric", "invoke", "deepdiff", "numpy", "rich", "jinja2", "ruamel")

# Runs the entry point the `engine-ctl` script runs, then prints the top-level packages it imported.
PROBE = """
import json, sys
sys.argv = ["engine-ctl", *sys.argv[1:]]
from engine_ctl.__main__ import main
try:
    main()
except SystemExit:
    pass
sys.stdout.write("\\nMODULES " + json.dumps(sorted(sys.modules)))
"""


def imported_names(*args: str) -> tuple[set[str], str]:
    """Every module `engine-ctl ARGS` imported (full dotted names), and what it printed."""
    result = subprocess.run(
        [sys.executable, "-c", PROBE, *args], capture_output=True, text=True, cwd=ROOT, timeout=60, check=False
    )
    out, _, modules = result.stdout.rpartition("\nMODULES ")
    assert modules, result.stderr
    return set(json.loads(modules)), out


def imported(*args: str) -> tuple[set[str], str]:
    """The top-level packages `engine-ctl ARGS` imported, and what it printed."""
    names, out = imported_names(*args)
    return {m.split(".")[0] for m in names}, out


@pytest.mark.parametrize("args", [["--version"], ["--help"], ["-h"]], ids=" ".join)
def test_version_and_help_import_nothing_heavy(args: list[str]) -> None:
    modules, out = imported(*args)
    assert out.strip(), "the command printed nothing"
    assert not modules & set(HEAVY), f"engine-ctl {' '.join(args)} imported {sorted(modules & set(HEAVY))}"


def test_version_imports_not_even_click() -> None:
    modules, out = imported("--version")
    assert out.strip() == VERSION_LINE
    assert "click" not in modules


def test_the_fast_version_line_is_clicks_own() -> None:
    result = CliRunner().invoke(cli, ["--version"], prog_name="engine-ctl")
    assert result.exit_code == 0 and result.output.strip() == VERSION_LINE


def test_validate_opens_no_connection_library() -> None:
    modules, out = imported("validate", str(ROOT / "examples" / "quickstart"))
    assert "is a valid deployment document" in out
    assert not modules & {"paramiko", "fabric", "invoke", "deepdiff", "numpy", "jinja2", "rich"}, sorted(modules)
    names, _ = imported_names("validate", str(ROOT / "examples" / "quickstart"))
    shell = sorted(m for m in names if m.startswith("engine_ctl.shell"))
    assert not shell, f"validate imported {shell}"


def test_help_lists_every_command_with_its_own_short_help() -> None:
    """--help is written from COMMANDS alone, so COMMANDS' text must be what each command says of itself."""
    for name, (target, short_help) in COMMANDS.items():
        command = load_command(name)
        assert command.name == name, f"COMMANDS[{name!r}] -> {target} is the command {command.name!r}"
        assert short_help == command.get_short_help_str(10_000), f"COMMANDS[{name!r}]'s help differs from {target}'s"
    listed = CliRunner().invoke(cli, ["--help"], terminal_width=400, max_content_width=400).output
    for name, (_, short_help) in COMMANDS.items():
        assert f"  {name} " in listed and short_help in listed


def test_a_command_loads_when_it_runs(tmp_path: Path) -> None:
    group = type(cli)(name="probe", commands={})
    assert sorted(COMMANDS) == group.list_commands(click.Context(group))
    assert group.commands == {}
    assert group.get_command(click.Context(group), "validate") is load_command("validate")
    assert list(group.commands) == ["validate"]
    assert group.get_command(click.Context(group), "no-such-command") is None


def test_a_registry_entry_that_is_not_a_command_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(COMMANDS, "broken", ("engine_ctl.cli.main:COMMANDS", "Not a command."))
    with pytest.raises(
        TypeError, match=r"COMMANDS\['broken'\] names engine_ctl.cli.main:COMMANDS, which is not a click"
    ):
        load_command("broken")
