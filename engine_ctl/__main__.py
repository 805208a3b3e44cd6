"""The `engine-ctl` script and `python -m engine_ctl`.

`engine-ctl --version` is answered here, before click and the commands are imported: click alone costs as
much as starting Python, and a version check should cost no more than the interpreter (issue 10). Everything
else is engine_ctl.cli.main's; tests/test_startup.py checks that both print the same version line.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import sys
from collections.abc import Iterator

from engine_ctl import __version__

VERSION_LINE = f"engine-ctl {__version__}"


INTERRUPTED = 130
"""The exit status of a command interrupted by Ctrl-C (128 + SIGINT), as shells report it."""


GC_THRESHOLD = (50_000, 20, 20)
"""Collect the young generation every 50,000 allocations instead of 700: building the document models at start-up
(and a plan's models) makes many objects and few cycles; about 6% of validate's CPU time (issue 10)."""


def _interrupt_and_exit() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    sys.stderr.write("\ninterrupted\n")
    sys.stderr.flush()
    os._exit(INTERRUPTED)  # at once, as engine_ctl.cli.main.interrupted does (see there why)


@contextlib.contextmanager
def interrupts_in_callbacks_end_the_command() -> Iterator[None]:
    """A Ctrl-C that lands inside a callback Python cannot raise from (a weakref callback of the import system,
    a __del__) would print "Exception ignored in … Traceback … KeyboardInterrupt" and be lost. It is kept
    instead: nothing is printed, the command goes on to a consistent end, and then the process exits 130 with
    the one line every other interrupt gives."""
    late: list[bool] = []

    def unraisable(args: sys.UnraisableHookArgs) -> None:
        if args.exc_type is not None and issubclass(args.exc_type, KeyboardInterrupt):
            late.append(True)
            return
        sys.__unraisablehook__(args)

    sys.unraisablehook = unraisable
    try:
        yield
    finally:
        if late:
            _interrupt_and_exit()


def main() -> None:
    if sys.argv[1:] == ["--version"]:
        print(VERSION_LINE)
        return
    gc.set_threshold(*GC_THRESHOLD)
    with interrupts_in_callbacks_end_the_command():
        _run()


def _run() -> None:
    try:  # Ctrl-C while the commands are still being imported (start-up) is an interrupt too, never a traceback
        from engine_ctl.cli.main import main as cli_main
    except KeyboardInterrupt:
        _interrupt_and_exit()
    try:
        cli_main()
    finally:  # the command is done: a Ctrl-C now (while Python shuts down) must not turn its status into -SIGINT
        signal.signal(signal.SIGINT, signal.SIG_IGN)


if __name__ == "__main__":
    main()
