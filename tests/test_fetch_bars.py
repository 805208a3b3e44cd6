"""apply's progress bars while weights come in: one per file and host, on a terminal."""

from __future__ import annotations

import io

from rich.console import Console

from engine_ctl.cli.views.fetch import FetchBars
from engine_ctl.shell.fetch import FetchProgress


def test_each_file_on_each_host_gets_its_own_bar_that_reaches_its_size() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120)
    with FetchBars(console) as bars:
        bars.update("d", "gpu-01", FetchProgress("", 0, 0, 0, 3_000_000))  # the start: no file yet, no bar
        bars.update("d", "gpu-01", FetchProgress("a.gguf", 1_000_000, 2_000_000, 1_000_000, 3_000_000))
        bars.update("d", "gpu-01", FetchProgress("a.gguf", 2_000_000, 2_000_000, 2_000_000, 3_000_000))
        bars.update("d", "gpu-01", FetchProgress("README.md", 1_000_000, 1_000_000, 3_000_000, 3_000_000))
        bars.update("d", "gpu-02", FetchProgress("a.gguf", 500_000, 2_000_000, 500_000, 3_000_000))
        tasks = {t.description: (t.completed, t.total) for t in bars._progress.tasks}
    assert tasks == {
        "d gpu-01 a.gguf": (2_000_000, 2_000_000),
        "d gpu-01 README.md": (1_000_000, 1_000_000),
        "d gpu-02 a.gguf": (500_000, 2_000_000),
    }
    shown = out.getvalue()
    assert "d gpu-01 a.gguf" in shown and "2.0/2.0 MB" in shown
