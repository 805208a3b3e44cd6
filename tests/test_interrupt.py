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


def _sigint_caught(pid: int) -> bool:
    """The process has a SIGINT handler (Python's own is installed early in start-up): SigCgt has bit 2."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(caught, 16) & (1 << (signal.SIGINT - 1)))


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


@pytest.mark.parametrize("argv", COMMANDS, ids=[c[0] for c in COMMANDS])
@pytest.mark.parametrize("after", [0.0, 0.3])
def test_ctrl_c_during_start_up_and_work_exits_130_without_a_traceback(
    argv: tuple[str, ...], after: float, tmp_path: Path
) -> None:
    """SIGINT as soon as Python can take it (imports still under way), or a moment later (loading documents,
    reaching hosts): 130 and one line, never a traceback. A command that already ended is not interrupted."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "engine_ctl", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        cwd=tmp_path, env={**os.environ, "ENGINE_CTL_STATE": str(tmp_path / "s.json")},
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while not _sigint_caught(proc.pid) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.001)
    time.sleep(after)
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    text = (out + err).decode(errors="replace")
    assert "Traceback" not in text, text
    if proc.returncode != 130:  # only when it finished before the signal came
        assert "interrupted" not in text and proc.returncode in (0, 1), (proc.returncode, text)
    else:
        assert "interrupted" in text


def test_at_least_one_start_up_interrupt_lands_in_the_imports(tmp_path: Path) -> None:
    """The start-up case is really exercised: SIGINT right after Python installs its handler reaches engine-ctl
    while it imports, and still exits 130 with no traceback."""
    codes = []
    for _ in range(3):
        proc = subprocess.Popen([sys.executable, "-m", "engine_ctl", "plan", str(QUICKSTART)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path)  # fmt: skip
        while not _sigint_caught(proc.pid) and proc.poll() is None:
            time.sleep(0.0005)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        assert b"Traceback" not in out + err, (out + err).decode()
        codes.append(proc.returncode)
    assert codes == [130, 130, 130]


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


def test_the_readme_says_how_to_turn_completion_on() -> None:
    readme = (ROOT / "README.md").read_text()
    assert 'eval "$(_ENGINE_CTL_COMPLETE=bash_source engine-ctl)"' in readme
