"""Saved plans and states of any size and depth (issue 31, point 8): read within bounds (a size and a nesting depth,
as documents are), with a located error, never "internal error: RecursionError" and never a parse of hundreds of
MiB; a state with a negative serial is refused. The local file and a real PostgreSQL state."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from engine_ctl.state import PostgresState, open_backend
from engine_ctl.state.local import LocalState

from engine_ctl.core.jsonbounds import MAX_DEPTH, MAX_PLAN_BYTES, MAX_STATE_BYTES, JsonBoundError, bounded_json
from engine_ctl.core.plan.savedplan import PlanFileError, decode_plan
from engine_ctl.core.record.model import State, StateError

DSN = os.environ.get("ENGINE_CTL_TEST_PG", "postgresql:///engine_ctl_test")
ROOT = Path(__file__).resolve().parents[1]
ENV = {k: v for k, v in os.environ.items() if not k.startswith("ENGINE_CTL_")}
DEEP = 100_000
"""Levels: Python's json gives RecursionError past about 1,000."""


def engine_ctl(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "engine_ctl", *args], capture_output=True, text=True, timeout=120, env=ENV, cwd=cwd
    )
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr, proc.stderr[-2000:]
    return proc


def deep_plan(levels: int = DEEP) -> str:
    return '{"format_version": 2, "state_lineage": "x", "changes": [], "pad":\n  ' + "[" * levels + "]" * levels + "}"


def state_text(**fields: object) -> str:
    return json.dumps({**State(lineage="l").model_dump(mode="json"), **fields})


# --- the bounds, in the core ---------------------------------------------------------------------------------
def test_the_depth_is_found_where_it_passes_the_bound_and_brackets_in_strings_do_not_count() -> None:
    with pytest.raises(JsonBoundError) as raised:
        bounded_json(deep_plan(), "saved plan", MAX_PLAN_BYTES)
    assert raised.value.message == f"nested more than {MAX_DEPTH} levels deep"
    assert (raised.value.line, raised.value.column) == (2, 2 + MAX_DEPTH)  # the 64th [ of line 2 (in the outer {)
    nested = "[" * MAX_DEPTH + "]" * MAX_DEPTH
    assert bounded_json(nested, "state", MAX_STATE_BYTES) == json.loads(nested)  # exactly the bound: read
    text = json.dumps({"a": "[" * 500 + '\\"{' * 500, "b": [[1]]})
    assert bounded_json(text, "state", MAX_STATE_BYTES)["b"] == [[1]]
    with pytest.raises(JsonBoundError, match=r"larger than 1 MiB \(1,048,576 bytes\), the most engine-ctl reads of a"):
        bounded_json('"' + "a" * 1024**2 + '"', "state", 1024**2)


def test_a_deep_saved_plan_is_refused_with_its_place() -> None:
    with pytest.raises(PlanFileError) as raised:
        decode_plan(deep_plan())
    assert "nested more than 64 levels deep" in str(raised.value)
    assert (raised.value.line, raised.value.column) == (2, 66)
    assert decode_plan("[" * DEEP) is None  # not a JSON object: not a plan (the documents' reader bounds it)


# --- saved plans, through the CLI ----------------------------------------------------------------------------
def test_show_and_apply_of_a_deep_plan_say_where_it_is_too_deep(tmp_path: Path) -> None:
    plan = tmp_path / "deep.json"
    plan.write_text(deep_plan())
    for command in (["show", str(plan)], ["apply", str(plan), "--auto-approve"]):
        said = engine_ctl(*command, cwd=tmp_path)
        assert said.returncode == 1, said.stdout + said.stderr
        assert f"{plan}:2:66" in said.stderr and "nested more than 64 levels deep" in said.stderr, said.stderr
    listed = tmp_path / "list.json"
    listed.write_text("[" * DEEP + "]" * DEEP)
    said = engine_ctl("show", str(listed), cwd=tmp_path)
    assert said.returncode == 1 and "is not a saved plan" in said.stderr, said.stderr


def test_a_plan_of_300_mb_is_refused_without_reading_it_whole(tmp_path: Path) -> None:
    plan = tmp_path / "huge.json"
    with plan.open("wb") as f:  # sparse: 300 MB that take no disk
        f.write(b'{"format_version": 2, "state_lineage": "x", "changes": [], "pad": "')
        f.truncate(300 * 1024**2)
    measure = (
        "import resource, subprocess, sys; "
        "p = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
        "sys.stdout.write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) + '\\n' + p.stderr)"
    )
    for command in ("apply", "show"):
        argv = [sys.executable, "-c", measure, sys.executable, "-m", "engine_ctl", command, str(plan)]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=ENV, cwd=tmp_path).stdout
        rss_kib, _, stderr = out.partition("\n")
        assert "larger than 64 MiB" in stderr and str(plan) in stderr, stderr
        assert "Traceback" not in stderr
        assert int(rss_kib) < 250 * 1024, f"{command}: {int(rss_kib) // 1024} MiB resident"


# --- states: the local file ----------------------------------------------------------------------------------
def test_a_deep_state_file_is_refused_with_its_place_and_nothing_is_written(tmp_path: Path) -> None:
    path = tmp_path / "engine-ctl.state.json"
    text = state_text()[:-1] + ', "deployments_x":\n ' + "[" * DEEP + "]" * DEEP + "}"
    path.write_text(text)
    with pytest.raises(StateError, match=rf"{path}:2:{1 + MAX_DEPTH}: cannot read the state: nested more than 64"):
        LocalState(path).read()
    said = engine_ctl("state", "history", "--state", str(path), cwd=tmp_path)
    assert said.returncode == 1 and "nested more than 64 levels deep" in said.stderr, said.stderr
    assert path.read_text() == text


def test_a_state_file_past_its_size_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    path = tmp_path / "engine-ctl.state.json"
    with path.open("wb") as f:
        f.write(state_text().encode()[:-1] + b', "pad": "')
        f.truncate(MAX_STATE_BYTES + 10)
    with pytest.raises(StateError, match="cannot read the state: larger than 64 MiB"):
        LocalState(path).read()


def test_a_negative_serial_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "engine-ctl.state.json"
    path.write_text(state_text(serial=-5))
    with pytest.raises(StateError, match=r"serial: -5: at least 0"):
        LocalState(path).read()
    path.write_text(state_text(serial=7))
    assert LocalState(path).read().serial == 7


# --- states: a real PostgreSQL -------------------------------------------------------------------------------
@pytest.fixture
def pg() -> Iterator[PostgresState]:
    b = open_backend(f"{DSN}#bounds-{uuid.uuid4().hex[:8]}")
    assert isinstance(b, PostgresState)
    b.write(State())  # the tables and a row
    yield b
    with psycopg.connect(b.dsn) as conn:
        for table in ("engine_ctl_state", "engine_ctl_state_history", "engine_ctl_lock"):
            conn.execute(f"DELETE FROM {table} WHERE name = %s", (b.name,))


def _set_body(b: PostgresState, sql: str, *params: object) -> None:
    with psycopg.connect(b.dsn) as conn:
        conn.execute(f"UPDATE engine_ctl_state SET body = {sql} WHERE name = %s", (*params, b.name))


def test_postgres_a_deep_state_is_refused_and_a_negative_serial_too(pg: PostgresState) -> None:
    _set_body(pg, "%s::jsonb", state_text()[:-1] + ', "x": ' + "[" * 5000 + "]" * 5000 + "}")
    with pytest.raises(StateError, match=r"cannot read the state: line 1, column \d+: nested more than 64 levels"):
        pg.read()
    said = engine_ctl("state", "history", "--state", f"{DSN}#{pg.name}")
    assert said.returncode == 1 and "nested more than 64 levels deep" in said.stderr, said.stderr
    _set_body(pg, "%s::jsonb", state_text(serial=-5))
    with pytest.raises(StateError, match=r"serial: -5: at least 0"):
        pg.read()


def test_postgres_a_state_past_its_size_is_refused_and_never_sent(pg: PostgresState) -> None:
    _set_body(pg, "jsonb_build_object('format_version', 1, 'pad', repeat('a', %s))", MAX_STATE_BYTES + 1)
    with pytest.raises(StateError, match="cannot read the state: larger than 64 MiB"):
        pg.read()
