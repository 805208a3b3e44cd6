"""apply's progress bars while hf: weights come in: one bar per file and host, on a terminal only."""

from __future__ import annotations

import threading
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TaskID, TextColumn, TransferSpeedColumn

from engine_ctl.shell.fetch import FetchProgress


class FetchBars:
    """A rich progress display (a context manager), updated from the executor's threads."""

    def __init__(self, console: Console) -> None:
        self._progress = Progress(
            TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(), console=console
        )
        self._tasks: dict[tuple[str, str, str], TaskID] = {}
        self._lock = threading.Lock()

    def __enter__(self) -> FetchBars:
        self._progress.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._progress.stop()

    def update(self, deployment: str, host: str, p: FetchProgress) -> None:
        if not p.file:
            return
        with self._lock:
            key = (deployment, host, p.file)
            if key not in self._tasks:
                self._tasks[key] = self._progress.add_task(f"{deployment} {host} {p.file}", total=p.file_size)
            self._progress.update(self._tasks[key], completed=p.file_done)
