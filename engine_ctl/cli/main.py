"""The command line: the imperative shell around the pure core.

Start-up is part of what a user feels, so a command's module is imported only when that command runs:
`engine-ctl --help` and `--version` import click and this module, not pydantic, paramiko, rich or jinja2.
A command is one line of COMMANDS (tests/test_startup.py checks the help there against the command's own).
"""

from __future__ import annotations

import contextlib
import errno
import importlib
import os
import sys
from typing import NoReturn

import click

from engine_ctl import __version__
from engine_ctl.core.diagnostics import Diagnostic, InputError, by_place, exit_status

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_CHANGES = 2
EXIT_INTERRUPTED = 130

# name -> ("module:attribute" of the click command, its short help as `engine-ctl --help` lists it).
COMMANDS: dict[str, tuple[str, str]] = {
    "apply": (
        "engine_ctl.cli.plan_cmd:apply",
        "Make the hosts match the documents: plan, confirm, then roll replicas one at a time, health-gated.",
    ),
    "delete": (
        "engine_ctl.cli.lifecycle_cmd:delete",
        "Delete a deployment's units (never its model files); the state keeps a tombstone.",
    ),
    "deploy": (
        "engine_ctl.cli.deploy_cmd:deploy",
        "`deploy model --file FILE`: save a new revision of the deployment(s) of FILE without starting it, or with "
        "--activate start it; --revision N deploys only while N is the recorded revision.",
    ),
    "destroy": (
        "engine_ctl.cli.plan_cmd:destroy",
        "Stop and remove the units of every deployment in the state (or --target ones).",
    ),
    "engine": (
        "engine_ctl.cli.engine_cmd:engine",
        "The engines the inventory registers: `list` them with their builds, versions and hosts; `add` a build.",
    ),
    "facts": (
        "engine_ctl.cli.facts_cmd:facts",
        "Gather facts from HOSTS (default: every host of the inventory): OS, CPU, memory, disks, GPUs, engines, "
        "engine-ctl's units, ports in use, model files, HAProxy.",
    ),
    "force-unlock": (
        "engine_ctl.cli.status_cmd:force_unlock",
        "Remove the state lock LOCK_ID left by a command that died.",
    ),
    "key": ("engine_ctl.cli.key_cmd:key", "API keys for the gateway: only their SHA-256 is ever written anywhere."),
    "logs": (
        "engine_ctl.cli.logs_cmd:logs",
        "Each replica's engine log, lines prefixed by host and instance; with --gateway, the gateways' request log.",
    ),
    "import": (
        "engine_ctl.cli.import_cmd:import_cmd",
        "Rebuild the state from the units on the hosts and the documents (PATHS), touching no host.",
    ),
    "list": (
        "engine_ctl.cli.status_cmd:list_cmd",
        "Every deployment: NAME STATE READY REVISION HOSTS, from the state and live health.",
    ),
    "monitoring": (
        "engine_ctl.cli.monitoring_cmd:monitoring",
        "Prometheus: what to scrape on the gateway hosts (the inventory's monitoring block).",
    ),
    "park": (
        "engine_ctl.cli.lifecycle_cmd:park",
        "Take a deployment off its GPUs without losing it: asleep where its engine has a sleep mode, else stopped.",
    ),
    "plan": (
        "engine_ctl.cli.plan_cmd:plan",
        "Show what apply would change: documents + recorded state + live host facts.",
    ),
    "render": (
        "engine_ctl.cli.render_cmd:render",
        "Print the fit of DEPLOYMENT and the systemd unit(s) its replicas would run, from live host facts.",
    ),
    "show": ("engine_ctl.cli.show_cmd:show", "Show a saved plan without touching hosts or state."),
    "restart": (
        "engine_ctl.cli.plan_cmd:restart",
        "Restart deployment NAME: replace its replicas one at a time, health-gated, without editing a document "
        "(the same as `apply --target NAME --replace NAME`).",
    ),
    "schema": (
        "engine_ctl.cli.validate_cmd:schema",
        "Print the JSON Schema of engine-ctl documents (for editors' YAML language servers).",
    ),
    "start": (
        "engine_ctl.cli.lifecycle_cmd:start",
        "Start a deployment an operator stopped or parked, or `deploy` saved (or lift its delete).",
    ),
    "state": (
        "engine_ctl.cli.state_cmd:state_group",
        "Inspect the recorded state, move it between backends (push, pull), forget or rename a deployment's record "
        "(rm, mv), read the operations log (history).",
    ),
    "status": (
        "engine_ctl.cli.status_cmd:status",
        "A deployment's state and each instance: NAME STATE READY REVISION STARTUP INITIALIZE LAST "
        "OPERATION, then INSTANCE HOST STATE LIFECYCLE DEVICES LAST ERROR (all deployments without NAME).",
    ),
    "stop": (
        "engine_ctl.cli.lifecycle_cmd:stop",
        "Stop a deployment's engines and keep them stopped (apply too) until `start`.",
    ),
    "usage": (
        "engine_ctl.cli.usage_cmd:usage",
        "Requests, errors, bytes in and out, p50 time to first byte and tokens per key name (--by key) or "
        "deployment, from every gateway host's request log since --since.",
    ),
    "validate": (
        "engine_ctl.cli.validate_cmd:validate",
        "Check deployment, model and inventory documents offline.",
    ),
}


def print_diagnostics(diagnostics: list[Diagnostic]) -> None:
    from engine_ctl.cli.views.output import console

    err = console(stderr=True)
    for d in by_place(diagnostics):
        err.print(d.render())


JSON_LINES = frozenset({"apply", "destroy", "restart"})
"""Commands whose --json output is JSON lines (one event a line): their error object is one line too."""


def print_error_object(diagnostics: list[Diagnostic], one_line: bool = False) -> None:
    import json

    from engine_ctl.core.diagnostics import error_object

    doc = error_object(diagnostics)
    sys.stdout.write((json.dumps(doc) if one_line else json.dumps(doc, indent=2)) + "\n")
    sys.stdout.flush()


def _command(ctx: click.Context) -> str:
    protected = getattr(ctx, "_protected_args", None) or []
    return str(protected[0]) if protected else ""


def load_command(name: str) -> click.Command:
    """Import the module of COMMANDS[name] and return its click command."""
    module_name, _, attribute = COMMANDS[name][0].partition(":")
    command = getattr(importlib.import_module(module_name), attribute)
    if not isinstance(command, click.Command):
        raise TypeError(f"COMMANDS[{name!r}] names {COMMANDS[name][0]}, which is not a click command")
    if command.epilog is None:
        from engine_ctl.cli.examples import epilog

        command.epilog = epilog(name)
    return command


class EngineCtlGroup(click.Group):
    """Loads a command from COMMANDS when it runs (click's lazy-group pattern), lists them from COMMANDS
    alone, and turns InputError (bad input, with located diagnostics) into its message and exit 1."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            self.add_command(load_command(cmd_name), cmd_name)
        return super().get_command(ctx, cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The command list of --help, from COMMANDS' short help: no command's module is imported. Each
        description is shown whole, wrapped under its command, never cut short with `...`."""
        names = self.list_commands(ctx)
        if not names:
            return
        rows = [(name, self._short_help(ctx, name)) for name in names]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def _short_help(self, ctx: click.Context, name: str) -> str:
        if name in COMMANDS:
            return COMMANDS[name][1]
        command = super().get_command(ctx, name)
        return command.get_short_help_str(limit=10_000) if command else ""

    def invoke(self, ctx: click.Context) -> object:
        command = _command(ctx)
        as_json = "--json" in ctx.args  # read now: click's invoke consumes the arguments
        try:
            return super().invoke(ctx)
        except InputError as exc:
            if not exc.printed:
                print_diagnostics(exc.diagnostics)
            if as_json:  # a script reads the error object on stdout, as documented
                print_error_object(exc.diagnostics, one_line=command in JSON_LINES)
            ctx.exit(exit_status(exc.diagnostics))
        except (KeyboardInterrupt, click.exceptions.Abort):  # Ctrl-C anywhere, a click prompt included
            interrupted()


@click.group(cls=EngineCtlGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, "--version", prog_name="engine-ctl", message="%(prog)s %(version)s")
def cli() -> None:
    """engine-ctl: plan and apply LLM inference engines on SSH-managed hosts.

    Deployments are YAML documents; `validate` checks them offline.
    """


# A bad flag or ENGINE_CTL_* value is an error (exit 1), never click's usage status 2, which `--detailed-exitcode`
# gives "changes present".
click.exceptions.UsageError.exit_code = EXIT_ERROR


def interrupted() -> NoReturn:
    """Ctrl-C: exit 130 (128 + SIGINT) with one line, in every command, at a prompt too; never a traceback.

    By the time it is called the interrupt has unwound the command (its state lock released). It ends the process
    at once: worker threads still talking to hosts are not waited for, and CPython, when the interrupt came inside
    an exec() (dataclasses and pydantic build classes so while they are imported), would otherwise end the process
    by SIGINT rather than with this status."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    sys.stderr.write("\ninterrupted\n")
    sys.stderr.flush()
    os._exit(EXIT_INTERRUPTED)


def main() -> None:
    """Entry point: never a traceback for the user; ENGINE_CTL_DEBUG=1 shows one for developers."""
    try:  # click's standalone mode, less its "Aborted!" exit 1 for Ctrl-C (while the arguments are parsed too)
        code = cli.main(prog_name="engine-ctl", standalone_mode=False)
    except InputError as exc:
        print_diagnostics(exc.diagnostics)
        sys.exit(exit_status(exc.diagnostics))
    except (KeyboardInterrupt, click.exceptions.Abort):
        interrupted()
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except BrokenPipeError:  # `engine-ctl … | head`: the reader left; nothing more to say
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115 (kept open until the interpreter exits)
        sys.exit(EXIT_ERROR)
    except OSError as exc:
        if os.environ.get("ENGINE_CTL_DEBUG") or exc.errno not in LOCAL_FAILURES:
            raise_or_report(exc)
            return
        where = f"{exc.filename}: " if exc.filename else ""
        click.echo(f"error: {where}{exc.strerror}; this command stopped there\n"
                   f"  hint: {LOCAL_FAILURES[exc.errno]}, then run the command again (what it did before is said "
                   "above; the state is the last one written whole)", err=True)  # fmt: skip
        sys.exit(EXIT_ERROR)
    except Exception as exc:  # the last line of defence: report, never a traceback
        raise_or_report(exc)
    sys.exit(code if isinstance(code, int) else EXIT_OK)


LOCAL_FAILURES = {
    errno.ENOSPC: "free space there",
    errno.EDQUOT: "free space there (a disk quota is full)",
    errno.EROFS: "the file system is read-only: remount it, or keep the state elsewhere (--state)",
    errno.EACCES: "give your user access there, or keep the state elsewhere (--state)",
}
"""This machine's own failures (its disk, its permissions), said as such rather than as a bug in engine-ctl."""


def raise_or_report(exc: Exception) -> None:
    """The last line of defence: report, never a traceback (ENGINE_CTL_DEBUG=1 raises it for developers)."""
    if os.environ.get("ENGINE_CTL_DEBUG"):
        raise exc
    click.echo(
        f"error: internal error: {type(exc).__name__}: {exc}\n"
        "  hint: this is a bug in engine-ctl; rerun with ENGINE_CTL_DEBUG=1 and report the traceback",
        err=True,
    )
    sys.exit(EXIT_ERROR)


__all__ = [
    "COMMANDS",
    "EXIT_CHANGES",
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "cli",
    "interrupted",
    "load_command",
    "main",
    "print_diagnostics",
]
