"""The command line: the imperative shell around the pure core."""

from __future__ import annotations

import os
import sys

import click

from engine_ctl import __version__
from engine_ctl.diagnostics import Diagnostic, InputError
from engine_ctl.output import console

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_CHANGES = 2


def print_diagnostics(diagnostics: list[Diagnostic]) -> None:
    err = console(stderr=True)
    for d in diagnostics:
        err.print(d.render())


class EngineCtlGroup(click.Group):
    """Turns InputError (bad input, with located diagnostics) into its message and exit 1, for every command."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except InputError as exc:
            print_diagnostics(exc.diagnostics)
            ctx.exit(EXIT_ERROR)


@click.group(cls=EngineCtlGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, "--version", prog_name="engine-ctl", message="%(prog)s %(version)s")
def cli() -> None:
    """engine-ctl: plan and apply LLM inference engines (llama.cpp, vLLM, SGLang) on SSH-managed hosts.

    Deployments are YAML documents; `validate` checks them offline.
    """


def _register() -> None:
    from engine_ctl.commands import facts_cmd, plan_cmd, render_cmd, status_cmd, validate_cmd

    cli.add_command(validate_cmd.validate)
    cli.add_command(validate_cmd.schema)
    cli.add_command(facts_cmd.facts)
    cli.add_command(render_cmd.render)
    cli.add_command(plan_cmd.plan)
    cli.add_command(plan_cmd.apply)
    cli.add_command(plan_cmd.destroy)
    cli.add_command(status_cmd.status)
    cli.add_command(status_cmd.list_cmd)
    cli.add_command(status_cmd.state_group)
    cli.add_command(status_cmd.force_unlock)


_register()


def main() -> None:
    """Entry point: never a traceback for the user; ENGINE_CTL_DEBUG=1 shows one for developers."""
    try:
        cli.main(prog_name="engine-ctl", standalone_mode=True)
    except InputError as exc:
        print_diagnostics(exc.diagnostics)
        sys.exit(EXIT_ERROR)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)
    except Exception as exc:  # the last line of defence: report, never a traceback
        if os.environ.get("ENGINE_CTL_DEBUG"):
            raise
        click.echo(
            f"error: internal error: {type(exc).__name__}: {exc}\n"
            "  hint: this is a bug in engine-ctl; rerun with ENGINE_CTL_DEBUG=1 and report the traceback",
            err=True,
        )
        sys.exit(EXIT_ERROR)


__all__ = ["EXIT_CHANGES", "EXIT_ERROR", "EXIT_OK", "cli", "main", "print_diagnostics"]
