"""Ctrl-C exits 130 in every command, at a prompt and during start-up, never with a traceback: real processes
(`python -m engine_ctl`, as the script runs it) sent a real SIGINT. And shell completion produces a script."""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "examples" / "quickstart"
PROMPT = b"Only 'yes' will be accepted"


def _read_until(fd: int, wanted: bytes, timeout: float) -> bytes:
    seen = b""
    deadline = time.monotonic() + timeout
    while wanted not in seen and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            seen += chunk
    return seen


def test_ctrl_c_at_the_apply_prompt_exits_130_without_a_traceback(tmp_path: Path) -> None:
    """A real terminal (a pty) so that apply asks; SIGINT while it waits for the answer."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "engine_ctl", "apply", str(QUICKSTART), "--state", str(tmp_path / "s.json")],
        stdin=slave, stdout=slave, stderr=slave, cwd=tmp_path, env={**os.environ, "NO_COLOR": "1"},
    )  # fmt: skip
    os.close(slave)
    try:
        seen = _read_until(master, PROMPT, timeout=120)
        assert PROMPT in seen, seen.decode(errors="replace")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 130
        seen += _read_until(master, b"\x00never", timeout=2)
    finally:
        proc.kill() if proc.poll() is None else None
        os.close(master)
    text = seen.decode(errors="replace")
    assert "interrupted" in text and "Traceback" not in text and "Aborted" not in text, text
    assert not (tmp_path / "s.json").exists() or "tiny-chat" not in (tmp_path / "s.json").read_text()


COMMANDS = [
    ("plan", str(QUICKSTART)),
    ("validate", str(QUICKSTART)),
    ("facts", "--inventory", str(QUICKSTART / "hosts.yaml")),
    ("status",),
    ("render", "tiny-chat", str(QUICKSTART)),
]
STARTED = b" engine_ctl.cli"
"""`-X importtime` writes a line as each import completes: this one once engine-ctl's own start-up runs (before
it, the interpreter itself is starting, where no program can take a signal and Python reports a fatal error)."""


def _interrupted(argv: tuple[str, ...], after: float, cwd: Path) -> tuple[int, str]:
    """Start `python -X importtime -m engine_ctl ARGV`, wait until engine-ctl's start-up runs, wait `after`
    seconds more, send SIGINT (if it still runs); its exit status and what it said (import timings left out)."""
    proc = subprocess.Popen(
        [sys.executable, "-X", "importtime", "-m", "engine_ctl", *argv], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, cwd=cwd, env={**os.environ, "ENGINE_CTL_STATE": str(cwd / "s.json")},
    )  # fmt: skip
    assert proc.stderr is not None
    head = line = b""
    while not line.rstrip().endswith(STARTED):
        line = proc.stderr.readline()
        assert line, head.decode(errors="replace")
        head += line
    time.sleep(after)
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    said = [ln for ln in (head + err).decode(errors="replace").splitlines() if not ln.startswith("import time:")]
    return proc.returncode, out.decode(errors="replace") + "\n".join(said)


@pytest.mark.parametrize("argv", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_ctrl_c_during_start_up_exits_130_without_a_traceback(argv: tuple[str, ...], tmp_path: Path) -> None:
    """SIGINT while engine-ctl is still importing what the command needs: 130 and one line."""
    code, said = _interrupted(argv, 0.0, tmp_path)
    assert code == 130 and "Traceback" not in said and "interrupted" in said, (code, said)


@pytest.mark.parametrize("argv", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_ctrl_c_while_a_command_works_exits_130_without_a_traceback(argv: tuple[str, ...], tmp_path: Path) -> None:
    """SIGINT a moment later (loading documents, reaching the host, printing): 130 and one line, or, where the
    command was already done, its own exit status; never a traceback."""
    code, said = _interrupted(argv, 0.4, tmp_path)
    assert "Traceback" not in said and "Aborted" not in said, said
    if code != 130:  # it finished before the signal came
        assert code in (0, 1) and "interrupted" not in said, (code, said)
    else:
        assert "interrupted" in said


LOST_INTERRUPT = """
import weakref
from engine_ctl.__main__ import interrupts_in_callbacks_end_the_command

class Referent:
    pass

def callback(_ref):
    raise KeyboardInterrupt  # as a Ctrl-C does when it lands in importlib's module-lock weakref callback

with interrupts_in_callbacks_end_the_command():
    kept = Referent()
    ref = weakref.ref(kept, callback)
    del kept
    print("the command went on to its end")
"""


def test_ctrl_c_inside_a_callback_python_cannot_raise_from_still_exits_130_without_a_traceback() -> None:
    """CI saw `plan` print "Exception ignored in: <function _get_module_lock.<locals>.cb> … Traceback …
    KeyboardInterrupt": a SIGINT inside a weakref callback. The same, made certain with a real weakref callback."""
    done = subprocess.run([sys.executable, "-c", LOST_INTERRUPT], capture_output=True, text=True, timeout=60,
                          check=False)  # fmt: skip
    assert done.returncode == 130, (done.returncode, done.stdout, done.stderr)
    assert "the command went on to its end" in done.stdout
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr
    assert done.stderr.strip() == "interrupted", done.stderr


def test_shell_completion_produces_a_script_for_each_shell() -> None:
    for shell, marker in (("bash", "complete -o nosort -F"), ("zsh", "compdef"), ("fish", "complete --no-files")):
        env = {**os.environ, "_ENGINE_CTL_COMPLETE": f"{shell}_source"}
        done = subprocess.run([sys.executable, "-m", "engine_ctl"], env=env, capture_output=True, text=True,
                              timeout=60, check=False)  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert marker in done.stdout and "_ENGINE_CTL_COMPLETE" in done.stdout, (shell, done.stdout)
    env = {**os.environ, "_ENGINE_CTL_COMPLETE": "bash_complete", "COMP_WORDS": "engine-ctl pl", "COMP_CWORD": "1"}
    done = subprocess.run([sys.executable, "-m", "engine_ctl"], env=env, capture_output=True, text=True, timeout=60,
                          check=False)  # fmt: skip
    assert "plain,plan" in done.stdout, done.stdout  # the commands themselves complete


def test_the_docs_say_how_to_turn_completion_on() -> None:
    readme = (ROOT / "docs" / "ci.md").read_text()
    assert 'eval "$(_ENGINE_CTL_COMPLETE=bash_source engine-ctl)"' in readme
