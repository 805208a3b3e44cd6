"""What makes plan and apply cost fewer round trips (issue 10), checked locally with real processes: the host's
Python is chosen by a real `sh`, and fan_out keeps the connections of the hosts whose work succeeded.
test_fleet_apply.py and test_fleet_records.py run the same code over SSH on the fleet."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from engine_ctl.core.documents.inventory import Host
from engine_ctl.shell.systemd import MEASURED, measurement
from engine_ctl.shell.transport import HostFailure, Kept, LocalTransport, fan_out, python_argv

WHICH = "import sys; print(sys.executable)"


def test_the_system_python_is_chosen_where_there_is_one() -> None:
    if not Path("/usr/bin/python3").is_file():
        pytest.fail("this machine has no /usr/bin/python3 (Debian's python3 package provides it)")
    out = subprocess.run(python_argv("-I", "-S", "-c", WHICH), capture_output=True, text=True, check=True).stdout
    assert out.strip() == "/usr/bin/python3"


def test_without_it_the_python3_on_path_runs_with_the_arguments_as_given(tmp_path: Path) -> None:
    shim = tmp_path / "python3"
    shim.write_text('#!/bin/sh\nprintf "%s|" "$@"\n')
    shim.chmod(0o755)
    argv = python_argv("-I", "-S", "-", '{"a": "b c"}', system=str(tmp_path / "absent"))
    done = subprocess.run(argv, capture_output=True, text=True, env={"PATH": f"{tmp_path}:/usr/bin:/bin"})
    assert done.stdout == '-I|-S|-|{"a": "b c"}|'


def test_with_no_python_at_all_the_exit_status_is_127(tmp_path: Path) -> None:
    (tmp_path / "sh").symlink_to("/bin/sh")  # a PATH with a shell and no python3
    argv = python_argv("-c", "pass", system=str(tmp_path / "absent"))
    done = subprocess.run(argv, capture_output=True, text=True, env={"PATH": str(tmp_path)})
    assert done.returncode == 127  # gather reports "python3 is not installed on the host"


def test_fan_out_keeps_the_connections_of_the_hosts_that_succeeded() -> None:
    hosts = [Host(name="a", address="127.0.0.1", transport="local"), Host(name="b", address="127.0.0.1",
                                                                          transport="local")]  # fmt: skip

    def work(t: object) -> str:
        assert isinstance(t, LocalTransport)
        if t.host.name == "b":
            raise HostFailure("b", "command", "refused")
        return t.run(["true"]).stdout

    kept: Kept = {}
    results, failures = fan_out(hosts, work, keep=kept)
    assert set(results) == {"a"} and set(failures) == {"b"}
    assert list(kept) == ["a"] and kept["a"].host.name == "a"


def test_the_measurement_is_what_follows_its_line_in_the_start_s_output() -> None:
    out = f"Created symlink x -> y\n{MEASURED}\ncgroup-v1 4096\npid 7 12\n"
    assert measurement(out) == "cgroup-v1 4096\npid 7 12\n"
    assert measurement("the start failed\n") == ""
