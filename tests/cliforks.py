"""The real CLI, started from an interpreter that has already imported it: the stateful test's checks run `plan`,
`status` and `list` after every step, and on this 2-core machine importing engine-ctl's commands costs each of
them more CPU than their work does.

One server process (`CliForks`) imports engine_ctl and every command module once, then, for each batch of command
lines it is sent, forks one child per line. A child is a fresh process, as `python -m engine_ctl ARGS` would be:
it takes the line's working directory, writes to its own stdout and stderr files, runs engine_ctl.__main__.main()
with the line as sys.argv, and exits with the command's status. Nothing is shared between two commands but the
modules already imported (no command runs in the server, so none leaves state behind for the next). A command
still running at its deadline is killed (SIGKILL) and reported as exit 124; so is every command still running when the
test that sent it is gone (the server exits then, as it does when its stdin closes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

SERVER = r"""
import importlib, json, os, signal, sys, time, traceback
import engine_ctl.__main__ as entry
from engine_ctl.cli.main import COMMANDS
for target, _ in COMMANDS.values():
    importlib.import_module(target.partition(":")[0])
import paramiko  # noqa: the transport imports it at its first connection

def child(job):
    os.chdir(job["cwd"])
    for fd, path in ((1, job["out"]), (2, job["err"])):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(f, fd)
        os.close(f)
    sys.argv = ["engine-ctl", *job["args"]]
    code = 0
    try:
        entry.main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc()
        code = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code)

parent = os.getppid()
print("ready", flush=True)
for line in sys.stdin:
    batch = json.loads(line)
    running = {}
    for i, job in enumerate(batch):
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            child(job)
        running[pid] = (i, time.monotonic(), time.monotonic() + job["timeout"])
    results = [None] * len(batch)
    while running:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0 and os.getppid() != parent:  # the test that sent the batch is gone: so are its commands
            for p in running:
                os.kill(p, signal.SIGKILL)
            sys.exit(1)
        if pid == 0:
            now = time.monotonic()
            for p, (i, started, deadline) in list(running.items()):
                if now > deadline:
                    os.kill(p, signal.SIGKILL)
                    os.waitpid(p, 0)
                    results[i] = {"rc": 124, "seconds": now - started}
                    del running[p]
            time.sleep(0.02)
            continue
        i, started, _ = running.pop(pid)
        results[i] = {"rc": os.waitstatus_to_exitcode(status), "seconds": time.monotonic() - started}
    print(json.dumps(results), flush=True)
"""


@dataclass
class Forked:
    rc: int
    out: str
    err: str
    seconds: float


class CliForks:
    """A server that forks the already-imported CLI, one child per command line (see the module's docstring)."""

    def __init__(self) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="engine-ctl-forks-"))
        self._lock = threading.Lock()
        self._proc = subprocess.Popen(
            [sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
        assert self._proc.stdout is not None
        ready = self._proc.stdout.readline()
        if ready.strip() != "ready":
            raise RuntimeError(f"the CLI fork server did not start: {ready!r}")
        self._n = 0

    def run(self, commands: list[tuple[list[str], Path]], timeout: float = 600) -> list[Forked]:
        """Run each (args, cwd) at once, in its own child; return their results in order."""
        assert self._proc.stdin is not None and self._proc.stdout is not None
        with self._lock:
            jobs = []
            for args, cwd in commands:
                self._n += 1
                out, err = self._dir / f"{self._n}.out", self._dir / f"{self._n}.err"
                jobs.append({"args": args, "cwd": str(cwd), "timeout": timeout, "out": str(out), "err": str(err)})
            self._proc.stdin.write(json.dumps(jobs) + "\n")
            self._proc.stdin.flush()
            line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError("the CLI fork server ended")
        done = []
        for job, result in zip(jobs, json.loads(line), strict=True):
            out, err = Path(job["out"]), Path(job["err"])
            done.append(Forked(result["rc"], out.read_text(), err.read_text(), result["seconds"]))
            out.unlink()
            err.unlink()
        return done

    def close(self) -> None:
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        for f in self._dir.iterdir():
            f.unlink()
        self._dir.rmdir()
