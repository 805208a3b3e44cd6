"""The `engine-ctl` script and `python -m engine_ctl`.

`engine-ctl --version` is answered here, before click and the commands are imported: click alone costs as
much as starting Python, and a version check should cost no more than the interpreter (issue 10). Everything
else is engine_ctl.cli.main's; tests/test_startup.py checks that both print the same version line.
"""

from __future__ import annotations

import gc
import os
import signal
import sys

from engine_ctl import __version__

VERSION_LINE = f"engine-ctl {__version__}"


INTERRUPTED = 130
"""The exit status of a command interrupted by Ctrl-C (128 + SIGINT), as shells report it."""


GC_THRESHOLD = (50_000, 20, 20)
"""Collect the young generation every 50,000 allocations instead of 700: building the document models at start-up
(and a plan's models) makes many objects and few cycles; about 6% of validate's CPU time (issue 10)."""


def main() -> None:
    if sys.argv[1:] == ["--version"]:
        print(VERSION_LINE)
        return
    gc.set_threshold(*GC_THRESHOLD)
    try:  # Ctrl-C while the commands are still being imported (start-up) is an interrupt too, never a traceback
        from engine_ctl.cli.main import main as cli_main
    except KeyboardInterrupt:
        sys.stderr.write("\ninterrupted\n")
        sys.stderr.flush()
        os._exit(INTERRUPTED)  # at once, as engine_ctl.cli.main.interrupted does (see there why)
    try:
        cli_main()
    finally:  # the command is done: a Ctrl-C now (while Python shuts down) must not turn its status into -SIGINT
        signal.signal(signal.SIGINT, signal.SIG_IGN)


if __name__ == "__main__":
    main()
