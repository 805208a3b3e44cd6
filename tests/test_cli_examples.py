"""Every command's --help ends with examples, and every example parses with the command's own options (so an
example can never name a flag the command lacks); no help text names the seeds."""

from __future__ import annotations

import shlex

import click
import pytest
from click.testing import CliRunner

from engine_ctl.cli.examples import EXAMPLES
from engine_ctl.cli.main import COMMANDS, cli, load_command


def test_every_command_has_examples() -> None:
    assert set(EXAMPLES) == set(COMMANDS)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_the_help_ends_with_examples_that_parse(name: str) -> None:
    shown = CliRunner().invoke(cli, [name, "--help"], terminal_width=120)
    assert shown.exit_code == 0, shown.output
    tail = shown.output.rstrip().split("Examples:", 1)
    assert len(tail) == 2, shown.output
    assert "seed 00" not in shown.output
    for example in EXAMPLES[name]:
        assert example.split("  #")[0].strip() in tail[1]
        words = shlex.split(example, comments=True)
        words = words[: words.index(">")] if ">" in words else words  # the shell's redirection, not the command's
        assert words[:2] == ["engine-ctl", name]
        command: click.Command = load_command(name)
        args = words[2:]
        with click.Context(command, info_name=name) as ctx:
            if isinstance(command, click.Group):  # as click resolves it (`stop chat` is `stop deployment chat`)
                _, sub, args = command.resolve_command(ctx, list(args))
                assert sub is not None, example
                command = sub
            command.make_context(name, list(args))  # raises on an option the command does not have


def test_the_command_list_names_no_seed() -> None:
    shown = CliRunner().invoke(cli, ["--help"], terminal_width=200)
    assert "seed 00" not in shown.output
