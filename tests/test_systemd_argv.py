"""Every systemctl and journalctl command has one home, engine_ctl/shell/systemd.py (issue 27, point 4): the other
shell and CLI modules run what it builds. The scripts it builds are run here with `systemctl` and `journalctl`
shims on PATH that write down their argv, so the order and the quoting are what a host would see; the fleet tests
run the same scripts against real systemd."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

from engine_ctl.shell import systemd

ROOT = Path(__file__).resolve().parents[1] / "engine_ctl"
HOME = ROOT / "shell" / "systemd.py"
SHIPPED = ROOT / "shell" / "remote"
"""Scripts shipped to hosts and run there alone (stdlib only, nothing of engine_ctl to import): not the shell's."""
COMMAND = re.compile(
    r"^(systemctl|journalctl)$|systemctl (daemon-reload|enable|disable|start|stop|restart|try-restart|reload|"
    r"is-active|show|reset-failed)|journalctl (-|_|--)"
)


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            ids.add(id(body[0].value))
    return ids


def _commands_built_in(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    docs = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        text = node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None
        if text is not None and id(node) not in docs and COMMAND.search(text):
            found.append(f"{path.relative_to(ROOT.parent)}:{node.lineno}: {text[:60]!r}")
    return found


def test_no_shell_or_cli_module_but_systemd_py_builds_a_systemctl_or_journalctl_command() -> None:
    modules = [p for p in (ROOT / "shell").rglob("*.py") if p != HOME and SHIPPED not in p.parents]
    modules += list((ROOT / "cli").rglob("*.py"))
    assert len(modules) > 20
    built = [line for p in modules for line in _commands_built_in(p)]
    assert built == [], "\n".join(built)
    assert _commands_built_in(HOME), "the check finds the commands where they are"


@pytest.fixture
def shims(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """`systemctl` and `journalctl` that append their argv (one NUL-separated line a call) to calls.log."""
    log = tmp_path / "calls.log"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("systemctl", "journalctl"):
        shim = bin_dir / name
        shim.write_text(f'#!/bin/sh\nprintf "%s\\0" {name} "$@" >> {log}\necho >> {log}\nexit 0\n')
        shim.chmod(0o755)
    return {"PATH": f"{bin_dir}:/usr/bin:/bin"}, log


def _run(argv: list[str], env: dict[str, str], log: Path) -> list[list[str]]:
    subprocess.run(argv, env=env, check=True, timeout=10)
    lines = log.read_text().splitlines() if log.exists() else []
    return [line.rstrip("\0").split("\0") for line in lines if line]


def test_reload_then_reloads_before_it_enables_and_starts(shims: tuple[dict[str, str], Path]) -> None:
    """A start resets a failed unit first (a gateway that crashed in a loop is in systemd's start limit, where a
    plain start fails at once); a reload does not."""
    env, log = shims
    calls = _run(systemd.reload_then("start", "engine-ctl-gateway.service", enable=True), env, log)
    assert calls == [
        ["systemctl", "daemon-reload"],
        ["systemctl", "enable", "engine-ctl-gateway.service"],
        ["systemctl", "reset-failed", "engine-ctl-gateway.service"],
        ["systemctl", "start", "engine-ctl-gateway.service"],
    ]
    log.write_text("")
    calls = _run(systemd.reload_then("reload", "engine-ctl-gateway.service"), env, log)
    assert calls == [["systemctl", "daemon-reload"], ["systemctl", "reload", "engine-ctl-gateway.service"]]


def test_a_unit_name_with_shell_characters_stays_one_argument(shims: tuple[dict[str, str], Path]) -> None:
    env, log = shims
    odd = "x; touch /tmp/pwned-by-unit-name.service"
    calls = _run(systemd.start_unit_argv(odd, wait=False), env, log)
    assert calls == [
        ["systemctl", "reset-failed", odd],
        ["systemctl", "enable", "--no-reload", odd],
        ["systemctl", "show", "-p", "LoadState,NeedDaemonReload,UnitFileState", odd],
        ["systemctl", "daemon-reload"],  # the shim's show prints nothing: the reload runs
        ["systemctl", "start", "--no-block", odd],
    ]
    assert not Path("/tmp/pwned-by-unit-name.service").exists()
    waited = _run(systemd.start_unit_argv("a.service", wait=True), env, log)[-1]
    assert waited == ["systemctl", "start", "a.service"]


def test_remove_unit_disables_then_deletes_then_reloads(shims: tuple[dict[str, str], Path], tmp_path: Path) -> None:
    env, log = shims
    extra = tmp_path / "config.json"
    extra.write_text("{}")
    text = systemd.remove_unit("engine-ctl-scaler.service", str(extra))
    calls = _run(["sh", "-c", text], env, log)
    assert calls == [
        ["systemctl", "disable", "--now", "engine-ctl-scaler.service"],
        ["systemctl", "daemon-reload"],
    ]
    assert not extra.exists()
    guarded = systemd.remove_unit("engine-ctl-not-installed-here.service", str(tmp_path), only_if_installed=True)
    assert _run(["sh", "-c", guarded], env, log) == calls  # no unit file: nothing at all ran
    assert tmp_path.exists()


def test_disable_now_and_show_and_the_journal_argv() -> None:
    quiet = "systemctl disable --now a.service 'b c.service' 2>/dev/null"
    assert systemd.disable_now("a.service", "b c.service") == quiet
    assert systemd.show(["Id", "ActiveState"], ["a.service", "b.service"]) == [
        "systemctl", "show", "-p", "Id,ActiveState", "--", "a.service", "b.service",
    ]  # fmt: skip
    argv = systemd.journal_argv(["a.service"], "MESSAGE", "@1700000000", 50, follow=True)
    assert argv == [
        "journalctl", "--no-pager", "--output=json", "--output-fields=MESSAGE", "--unit=a.service",
        "--since=@1700000000", "--lines=50", "--follow",
    ]  # fmt: skip
    assert systemd.journal_argv(["a.service"], "MESSAGE", None, None, follow=False)[-1] == "--unit=a.service"
