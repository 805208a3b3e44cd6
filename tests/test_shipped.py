"""The programs shipped to hosts run there alone (issue 27, point 4: one admin-socket client, not four copies):
each script's one import of remote/haproxy_admin.py becomes that module's text when it is shipped. Each shipped
text is run here by an isolated python3 (-I, from an empty directory: engine_ctl cannot be imported) and its
client talks to a real Unix socket that answers as HAProxy's admin socket does (one command a connection)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine_ctl.shell import shipped

SHIPPED = ("facts_probe.py", "scaler.py", "scaler_command.py", "gateway_maps.py", "gateway_dropped.py")
REMOTE = Path(shipped.__file__).parent / "remote"


@pytest.fixture
def admin_socket(tmp_path: Path) -> Iterator[tuple[str, list[str]]]:
    """A Unix socket that records each command and answers as HAProxy does (`prepare map` -> a version)."""
    path, heard = str(tmp_path / "admin.sock"), []
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(8)

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                command = conn.recv(65536).decode().strip()
                heard.append(command)
                if command == "show info":  # HAProxy 2.6's answer, cut (`show info` on a gateway of the fleet)
                    answer = "Name: HAProxy\nVersion: 2.6.12-1+deb12u4\nDroppedLogs: 3215\nBusyPolling: 0\n"
                elif command.startswith("prepare map"):
                    answer = "New version created: 7\n"
                else:
                    answer = f"ok {command}\n"
                conn.sendall(answer.encode())

    threading.Thread(target=serve, daemon=True).start()
    yield path, heard
    server.close()


def _isolated(code: str, stdin: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-I", "-c", code], input=stdin, capture_output=True, text=True,
                          cwd=cwd, timeout=30)  # fmt: skip


@pytest.mark.parametrize("name", SHIPPED)
def test_each_shipped_script_is_self_contained_with_the_one_client(name: str, tmp_path: Path) -> None:
    text = shipped.script(name)
    assert shipped.SHARED_IMPORT in (REMOTE / name).read_text(), "the tree's script imports the client"
    assert shipped.SHARED_IMPORT not in text and "import engine_ctl" not in text
    assert text.count("def haproxy_ask(") == 1
    probe = (
        "import sys\nns = {'__name__': 'shipped'}\nexec(compile(sys.stdin.read(), 'shipped', 'exec'), ns)\n"
        "print(ns['haproxy_ask'].__code__.co_filename, 'engine_ctl' in sys.modules)"
    )
    ran = _isolated(probe, text, tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == ["shipped", "False"]


def test_no_module_opens_an_admin_socket_but_the_one_client() -> None:
    package = REMOTE.parents[1]
    for path in package.rglob("*.py"):
        if path.name != "haproxy_admin.py":
            assert "AF_UNIX" not in path.read_text(), f"{path} writes its own admin-socket client"


def test_the_shipped_dropped_lines_reader_says_haproxys_count_or_a_dash(
    admin_socket: tuple[str, list[str]], tmp_path: Path
) -> None:
    path, heard = admin_socket
    code = shipped.script("gateway_dropped.py")
    ran = subprocess.run([sys.executable, "-I", "-c", code, path], capture_output=True, text=True, cwd=tmp_path,
                         timeout=30)  # fmt: skip
    assert (ran.returncode, ran.stdout, heard) == (0, "3215\n", ["show info"]), ran.stderr
    silent = subprocess.run([sys.executable, "-I", "-c", code, str(tmp_path / "none.sock")], capture_output=True,
                            text=True, cwd=tmp_path, timeout=30)  # fmt: skip
    assert (silent.returncode, silent.stdout) == (0, "-\n"), silent.stderr


def test_the_shipped_map_changer_prepares_adds_and_commits_over_a_real_socket(
    admin_socket: tuple[str, list[str]], tmp_path: Path
) -> None:
    path, heard = admin_socket
    items = ["show servers state", {"map": "/run/keys.map", "entries": {"abc": "team-a"}}]
    ran = subprocess.run([sys.executable, "-I", "-c", shipped.script("gateway_maps.py"), path],
                         input=json.dumps(items), capture_output=True, text=True, cwd=tmp_path, timeout=30)  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    assert heard == [
        "show servers state",
        "prepare map /run/keys.map",
        "add map @7 /run/keys.map abc team-a",
        "commit map @7 /run/keys.map",
    ]
    assert json.loads(ran.stdout) == ["ok show servers state\n", "ok commit map @7 /run/keys.map\n"]
