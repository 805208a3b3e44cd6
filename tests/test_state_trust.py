"""The state is input too: names, hosts and ports read back are held to engine-ctl's own naming rules (both
backends); the lock survives symlinks, empty or corrupt lock files and holders that died; a postgresql://
state without psycopg says how to install it."""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from engine_ctl.state import LocalState, LockHeld, PostgresState, open_backend
from engine_ctl.state.base import boot_id, process_alive, process_start

from engine_ctl.core.names import UnitName, parse_unit_name, unit_name
from engine_ctl.core.record.model import DeploymentRecord, ReplicaRecord, State, StateError, field_path
from tests.helpers import run

ROOT = Path(__file__).resolve().parents[1]
DSN = os.environ.get("ENGINE_CTL_TEST_PG", "postgresql:///engine_ctl_test")
SHA = "ab" * 32


def good_state() -> dict[str, Any]:
    replica = ReplicaRecord(
        index=0, slot="a", host="gpu-1", unit=unit_name("chat", 0), port=8001, gpus=["GPU-0a1b2c3d"],
        gpu_indexes=[0], unit_sha256=SHA, revision=1, status="serving",
    )  # fmt: skip
    state = State(deployments={"chat": DeploymentRecord(name="chat", revision=1, replicas=[replica])})
    return state.model_dump(mode="json")


def tampered(edit: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    raw = good_state()
    edit(raw)
    return raw


def replica0(raw: dict[str, Any]) -> dict[str, Any]:
    r: dict[str, Any] = raw["deployments"]["chat"]["replicas"][0]
    return r


def _set_unit(value: str) -> Callable[[dict[str, Any]], None]:
    return lambda raw: replica0(raw).update(unit=value)


def _rename_key(raw: dict[str, Any]) -> None:
    raw["deployments"]["other"] = raw["deployments"].pop("chat")


def _bad_host_key(raw: dict[str, Any]) -> None:
    raw["hosts"]["../etc"] = {"facts_fingerprint": "x"}


# (how the state is tampered with, the field path and the words the refusal must carry)
TAMPERED: list[tuple[str, Callable[[dict[str, Any]], None], str, str]] = [
    ("unit-outside", _set_unit("../../canary-engine-ctl"), "deployments.chat.replicas[0].unit",
     "'../../canary-engine-ctl' is not a unit engine-ctl names (engine-ctl-<deployment>-<index><slot>.service)"),
    ("unit-of-another", _set_unit(unit_name("other", 0)), "deployments.chat.replicas[0].unit",
     "is not the unit of replica 0a of deployment 'chat' (that is 'engine-ctl-chat-0a.service')"),
    ("unit-other-index", _set_unit(unit_name("chat", 3)), "deployments.chat.replicas[0].unit",
     "is not the unit of replica 0a"),
    ("unit-newline", _set_unit(unit_name("chat", 0) + "\n"), "deployments.chat.replicas[0].unit",
     "is not a unit engine-ctl names"),
    ("unit-system", _set_unit("sshd.service"), "deployments.chat.replicas[0].unit", "'sshd.service' is not a unit"),
    ("host-slash", lambda raw: replica0(raw).update(host="gpu-1/../x"), "deployments.chat.replicas[0].host",
     "'gpu-1/../x' is not a host name"),
    ("host-option", lambda raw: replica0(raw).update(host="-oProxyCommand=x"), "deployments.chat.replicas[0].host",
     "is not a host name"),
    ("port-0", lambda raw: replica0(raw).update(port=0), "deployments.chat.replicas[0].port",
     "0: a port is between 1 and 65535"),
    ("port-high", lambda raw: replica0(raw).update(port=70000), "deployments.chat.replicas[0].port",
     "70000: a port is between 1 and 65535"),
    ("slot-c", lambda raw: replica0(raw).update(slot="c"), "deployments.chat.replicas[0].slot", "'a' or 'b'"),
    ("gpu-uuid", lambda raw: replica0(raw).update(gpus=["GPU-1; rm -rf /"]), "deployments.chat.replicas[0].gpus[0]",
     "is not a GPU UUID"),
    ("gpu-index", lambda raw: replica0(raw).update(gpu_indexes=[-1]), "deployments.chat.replicas[0].gpu_indexes[0]",
     "-1: a GPU index is between 0 and 1023"),
    ("index", lambda raw: replica0(raw).update(index=-2), "deployments.chat.replicas[0].index",
     "-2: a replica index is between 0 and 999"),
    ("name", lambda raw: raw["deployments"]["chat"].update(name="Chat/.."), "deployments.chat.name",
     "'Chat/..' is not a deployment name"),
    ("key-differs", _rename_key, "deployments.other.name", "the record under 'other' must be named 'other'"),
    ("host-key", _bad_host_key, "hosts['../etc'] (the key)", "'../etc' is not a host name"),
    ("sha", lambda raw: replica0(raw).update(unit_sha256="$(x)"), "deployments.chat.replicas[0].unit_sha256",
     "is not a sha256"),
]  # fmt: skip
IDS = [t[0] for t in TAMPERED]


def test_the_good_state_reads_and_every_unit_name_parses_back() -> None:
    state = State.model_validate(good_state())
    assert state.deployments["chat"].replicas[0].unit == "engine-ctl-chat-0a.service"
    for name, index, slot in [("chat", 0, "a"), ("chat-2", 10, "b"), ("x-0a", 3, "a"), ("a" * 40, 999, "b")]:
        assert parse_unit_name(unit_name(name, index, slot)) == UnitName(name, index, slot)
    bad_names = [
        "engine-ctl-chat-01a.service", "engine-ctl--0a.service", f"engine-ctl-{'a' * 41}-0a.service",
        "engine-ctl-chat-0a.service.d/x", "engine-ctl-Chat-0a.service", "engine-ctl-chat-1000a.service",
    ]  # fmt: skip
    for bad in bad_names:
        assert parse_unit_name(bad) is None, bad


@pytest.mark.parametrize(("case", "edit", "path", "words"), TAMPERED, ids=IDS)
def test_a_tampered_local_state_is_refused_with_the_field(
    tmp_path: Path, case: str, edit: Callable[[dict[str, Any]], None], path: str, words: str
) -> None:
    file = tmp_path / "engine-ctl.state.json"
    file.write_text(json.dumps(tampered(edit)))
    with pytest.raises(StateError) as err:
        LocalState(file).read()
    message = str(err.value)
    assert f"{path}: " in message and words in message, message
    assert "engine-ctl did nothing" in message
    assert "previous state" not in message  # there is none to name


def test_field_paths_are_joined_with_dots_and_brackets() -> None:
    assert field_path(("deployments", "chat", "replicas", 0, "unit")) == "deployments.chat.replicas[0].unit"
    assert field_path(("deployments", "a.b", "name")) == "deployments['a.b'].name"


def test_several_problems_are_all_named_and_the_count_of_the_rest(tmp_path: Path) -> None:
    def many(raw: dict[str, Any]) -> None:
        r = replica0(raw)
        raw["deployments"]["chat"]["replicas"] = [dict(r, index=i, port=0) for i in range(8)]

    file = tmp_path / "engine-ctl.state.json"
    file.write_text(json.dumps(tampered(many)))
    with pytest.raises(StateError) as err:
        LocalState(file).read()
    message = str(err.value)
    for i in range(5):
        assert f"deployments.chat.replicas[{i}].port: 0: a port is between 1 and 65535" in message
    assert "replicas[5]" not in message and "and 3 more" in message


def test_the_backup_is_named_only_when_it_exists(tmp_path: Path) -> None:
    file = tmp_path / "engine-ctl.state.json"
    backend = LocalState(file)
    file.write_text("{not json")
    with pytest.raises(StateError) as err:
        backend.read()
    assert "previous state" not in str(err.value) and "cannot read the state" in str(err.value)
    file.unlink()
    first = backend.write(State.model_validate(good_state()))
    backend.write(first)  # now a backup exists
    file.write_text(json.dumps(tampered(_set_unit("../../x"))))
    with pytest.raises(StateError) as err:
        backend.read()
    assert backend.backup.is_file() and f"cp {backend.backup} {file}" in str(err.value)
    file.write_text("{not json")
    with pytest.raises(StateError) as err:
        backend.read()
    assert f"The previous state is in {backend.backup}" in str(err.value)


def test_plan_and_destroy_refuse_a_tampered_state_before_touching_any_host(tmp_path: Path) -> None:
    """Nothing is acted on: the state is read, and refused, before any host is reached (the inventory's only
    host is an address nobody answers at, so a host contacted would show as unreachable instead)."""
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text("hosts:\n  - {name: gpu-1, address: 127.0.0.1, port: 9}\n")
    (tmp_path / "models.yaml").write_text("kind: Model\nmetadata: {name: m}\nspec: {format: gguf, path: m.gguf}\n")
    state = tmp_path / "engine-ctl.state.json"
    state.write_text(json.dumps(tampered(_set_unit("../../canary-engine-ctl"))))
    before = state.read_bytes()
    for args in (["plan", str(tmp_path)], ["destroy", "--auto-approve"], ["status"]):
        result = run(*args, "--inventory", str(inventory), "--state", str(state))
        assert result.exit_code == 1, (args, result.output)
        assert "deployments.chat.replicas[0].unit: '../../canary-engine-ctl' is not a unit" in result.stderr
        assert "unreachable" not in result.output
    assert state.read_bytes() == before
    assert not (tmp_path / "engine-ctl.state.json.lock").exists()


def test_engine_ctl_never_writes_what_it_would_refuse(tmp_path: Path) -> None:
    state = State.model_validate(good_state())
    state.deployments["chat"].replicas[0].unit = "../../x"  # no validation on assignment: caught at write
    backend = LocalState(tmp_path / "engine-ctl.state.json")
    with pytest.raises(StateError, match="refusing to write a state it could not read back"):
        backend.write(state)
    assert not backend.path.exists()


# --- PostgreSQL: the same rules on read (a real server; .ci/run starts it) ---


@pytest.fixture
def pg() -> Iterator[PostgresState]:
    b = open_backend(f"{DSN}#trust-{uuid.uuid4().hex[:8]}")
    assert isinstance(b, PostgresState)
    yield b
    import psycopg

    with psycopg.connect(b.dsn) as conn:
        for table in ("engine_ctl_state", "engine_ctl_state_history", "engine_ctl_lock"):
            conn.execute(f"DELETE FROM {table} WHERE name = %s", (b.name,))


def _pg_store(b: PostgresState, body: dict[str, Any]) -> None:
    import psycopg

    with psycopg.connect(b.dsn) as conn:
        conn.execute("UPDATE engine_ctl_state SET body = %s WHERE name = %s", (json.dumps(body), b.name))


@pytest.mark.parametrize(
    ("case", "edit", "path", "words"),
    [t for t in TAMPERED if t[0] in ("unit-outside", "unit-of-another", "host-slash", "port-0")],
    ids=["unit-outside", "unit-of-another", "host-slash", "port-0"],
)
def test_a_tampered_postgres_state_is_refused_with_the_field(
    pg: PostgresState, case: str, edit: Callable[[dict[str, Any]], None], path: str, words: str
) -> None:
    pg.write(State.model_validate(good_state()))
    _pg_store(pg, tampered(edit))
    with pytest.raises(StateError) as err:
        pg.read()
    message = str(err.value)
    assert f"{path}: " in message and words in message, message
    assert pg.location in message and "engine_ctl_state_history" not in message  # no history yet
    result = run("status", "--state", f"{pg.dsn}#{pg.name}")
    assert result.exit_code == 1 and f"{path}: " in result.stderr


def test_a_tampered_postgres_state_names_the_history_when_it_has_one(pg: PostgresState) -> None:
    first = pg.write(State.model_validate(good_state()))
    pg.write(first)
    _pg_store(pg, tampered(_set_unit("../../canary")))
    with pytest.raises(StateError) as err:
        pg.read()
    assert "engine_ctl_state_history" in str(err.value) and "serial 1" in str(err.value)


# --- locks ---


def test_a_symlinked_state_is_locked_and_written_where_it_really_is(tmp_path: Path) -> None:
    real_dir, link_dir = tmp_path / "real", tmp_path / "elsewhere"
    real_dir.mkdir()
    link_dir.mkdir()
    real = real_dir / "engine-ctl.state.json"
    LocalState(real).write(State())
    link = link_dir / "engine-ctl.state.json"
    link.symlink_to(real)
    through_link, direct = LocalState(link), LocalState(real)
    with through_link.lock("apply") as info:
        assert (real_dir / "engine-ctl.state.json.lock").is_file()
        with pytest.raises(LockHeld) as err, direct.lock("apply"):
            pass
        assert info.id in str(err.value)
        through_link.write(through_link.read())
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert direct.read().serial == 2 and through_link.read().serial == 2
    assert (real_dir / "engine-ctl.state.json.backup").is_file()
    assert sorted(p.name for p in link_dir.iterdir()) == ["engine-ctl.state.json"]


def test_a_symlinked_directory_is_resolved_too(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "real")
    a, b = LocalState(tmp_path / "alias" / "s.json"), LocalState(tmp_path / "real" / "s.json")
    with a.lock("apply"), pytest.raises(LockHeld), b.lock("apply"):
        pass


@pytest.mark.parametrize("content", [b"", b'{"id": ', b"\xff\xfe garbage"], ids=["empty", "truncated", "binary"])
def test_an_unreadable_lock_file_says_the_way_out_and_force_unlock_clears_it(tmp_path: Path, content: bytes) -> None:
    backend = LocalState(tmp_path / "engine-ctl.state.json")
    backend.lock_path.write_bytes(content)
    with pytest.raises(LockHeld) as err, backend.lock("apply"):
        pass
    message = str(err.value)
    held = backend.lock_info()
    assert held is not None and held.id.startswith("unreadable-") and held.id != "?"
    assert f"its lock file {backend.lock_path} is unreadable" in message
    assert f"engine-ctl force-unlock {held.id} --state {backend.path}" in message
    assert f"rm {backend.lock_path}" in message
    result = run("force-unlock", held.id, "--state", str(backend.path))
    assert result.exit_code == 0, result.output
    assert not backend.lock_path.exists()
    with backend.lock("apply"):
        pass


def test_force_unlock_of_an_unreadable_lock_needs_its_id(tmp_path: Path) -> None:
    backend = LocalState(tmp_path / "engine-ctl.state.json")
    backend.lock_path.write_bytes(b"")
    held = backend.lock_info()
    assert held is not None
    wrong = run("force-unlock", "?", "--state", str(backend.path))
    assert wrong.exit_code == 1 and held.id in wrong.stderr and backend.lock_path.exists()
    backend.lock_path.write_bytes(b"changed since")  # another file now: the reported ID no longer clears it
    stale_id = run("force-unlock", held.id, "--state", str(backend.path))
    assert stale_id.exit_code == 1 and backend.lock_path.exists()


def test_the_lock_file_is_never_seen_empty(tmp_path: Path) -> None:
    """The lock is created whole (a link to a complete file): a second command racing the first never reads
    an empty lock file and calls it unreadable."""
    script = textwrap.dedent(
        f"""
        import sys
        from pathlib import Path
        from engine_ctl.state import LocalState, LockHeld
        b = LocalState(Path({str(tmp_path / "s.json")!r}))
        bad = 0
        for _ in range(300):
            try:
                with b.lock("apply"):
                    pass
            except LockHeld as e:
                bad += e.info.unreadable is not None
        print(bad)
        """
    )
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True) for _ in range(3)]
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert outs == ["0", "0", "0"]


def _hold_lock_and_die(state: Path) -> int:
    """A real engine-ctl process that takes the lock and dies without releasing it (as kill -9 would)."""
    code = (
        "import os, sys; from pathlib import Path; from engine_ctl.state import LocalState; "
        "held = LocalState(Path(sys.argv[1])).lock('apply'); held.__enter__(); os._exit(0)"
    )
    child = subprocess.run([sys.executable, "-c", code, str(state)], check=True)
    assert child.returncode == 0
    info = LocalState(state).lock_info()
    assert info is not None and info.pid is not None and info.pid != os.getpid()
    return info.pid


def test_a_lock_whose_process_died_here_is_cleared_by_the_next_command_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "engine-ctl.state.json"
    pid = _hold_lock_and_die(state)
    backend = LocalState(state)
    held = backend.lock_info()
    assert held is not None
    assert held.host == socket.gethostname() and held.boot_id == boot_id() and not process_alive(pid)
    with backend.lock("apply") as mine:  # no waiting, no force-unlock: the kernel freed the dead holder's lock
        assert backend.lock_info() == mine and mine.id != held.id
    said = capsys.readouterr().err
    assert f"(lock ID {held.id}) was stale" in said and f"pid {pid}" in said and "cleared it and went on" in said
    assert not backend.lock_path.exists()


def _holder(state: Path) -> subprocess.Popen[str]:
    """A live process that holds the lock of `state` for a minute (it prints `held` once it does)."""
    code = (
        "import sys, time; from pathlib import Path; from engine_ctl.state import LocalState\n"
        "with LocalState(Path(sys.argv[1])).lock('apply'):\n    print('held', flush=True); time.sleep(60)\n"
    )
    return subprocess.Popen([sys.executable, "-c", code, str(state)], stdout=subprocess.PIPE, text=True)


def test_kill_9_of_a_command_holding_the_lock_frees_it_for_the_next_at_once(tmp_path: Path) -> None:
    state = tmp_path / "engine-ctl.state.json"
    child = _holder(state)
    assert child.stdout is not None and child.stdout.readline().strip() == "held"
    with pytest.raises(LockHeld), LocalState(state).lock("apply"):  # alive: refused
        pass
    child.kill()  # SIGKILL: no cleanup runs, the .lock file stays
    child.wait()
    assert LocalState(state).lock_path.exists()
    with LocalState(state).lock("apply"):
        pass
    listed = run("state", "list", "--state", str(state))
    assert listed.exit_code == 0 and "locked" not in listed.output.lower()


def test_a_live_holder_is_not_stale(tmp_path: Path) -> None:
    state = tmp_path / "engine-ctl.state.json"
    child = _holder(state)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "held"
        with pytest.raises(LockHeld) as err, LocalState(state).lock("apply", timeout=0.3):
            pass
        assert "stale" not in str(err.value) and f"pid {child.pid}" in str(err.value)
        assert "wait for it to finish" in str(err.value)
    finally:
        child.kill()
        child.wait()


def test_a_reused_pid_is_not_taken_for_the_holder(tmp_path: Path) -> None:
    """Our own pid is alive, but with another start time it is another process: the holder is gone."""
    backend = LocalState(tmp_path / "engine-ctl.state.json")
    start = process_start(os.getpid())
    assert start is not None
    info = {
        "id": "old", "operation": "apply", "who": "x", "when": "t", "host": socket.gethostname(),
        "boot_id": boot_id(), "pid": os.getpid(), "pid_start": start - 1,
    }  # fmt: skip
    backend.lock_path.write_text(json.dumps(info))
    with backend.lock("apply"):  # the holder is gone: cleared
        pass
    backend.lock_path.write_text(json.dumps(dict(info, pid_start=start)))
    with pytest.raises(LockHeld) as err, backend.lock("apply"):
        pass
    assert "stale" not in str(err.value)


@pytest.mark.parametrize(
    "change", [{"host": "another-machine"}, {"boot_id": "00000000-0000-0000-0000-000000000000"}], ids=["host", "boot"]
)
def test_a_dead_pid_elsewhere_or_from_another_boot_is_not_called_stale(tmp_path: Path, change: dict[str, str]) -> None:
    state = tmp_path / "engine-ctl.state.json"
    _hold_lock_and_die(state)
    backend = LocalState(state)
    raw = json.loads(backend.lock_path.read_text())
    backend.lock_path.write_text(json.dumps(raw | change))
    with pytest.raises(LockHeld) as err, backend.lock("apply"):
        pass
    assert "stale" not in str(err.value) and "wait for it to finish" in str(err.value)


def test_an_old_lock_file_still_reads(tmp_path: Path) -> None:
    backend = LocalState(tmp_path / "engine-ctl.state.json")
    old = {"id": "1234", "operation": "apply", "who": "ops@box pid 7", "when": "2024-01-01T00:00:00+00:00"}
    backend.lock_path.write_text(json.dumps(dict(old, path=str(backend.path))))
    held = backend.lock_info()
    assert held is not None and held.id == "1234" and held.unreadable is None and held.pid is None
    with pytest.raises(LockHeld, match="locked by ops@box pid 7"), backend.lock("apply"):
        pass
    assert run("force-unlock", "1234", "--state", str(backend.path)).exit_code == 0


def test_a_postgres_lock_whose_process_died_here_is_stale(
    pg: PostgresState, capsys: pytest.CaptureFixture[str]
) -> None:
    """The holder died: its database session ended, so the next lock clears the row and proceeds, no force-unlock."""
    code = (
        "import os, sys; from engine_ctl.state import open_backend; "
        "held = open_backend(sys.argv[1]).lock('apply'); held.__enter__(); os._exit(0)"
    )
    subprocess.run([sys.executable, "-c", code, f"{pg.dsn}#{pg.name}"], check=True)
    held = pg.lock_info()
    assert held is not None and held.pid is not None and held.boot_id == boot_id()
    with pg.lock("apply", timeout=0) as mine:
        assert mine.id != held.id
    assert f"(lock ID {held.id}) was stale" in capsys.readouterr().err
    assert pg.lock_info() is None and held.id in pg.read().operations[-1].result  # type: ignore[operator]


def test_a_row_lock_of_an_older_engine_ctl_whose_process_died_here_is_stale(pg: PostgresState) -> None:
    """A row with no database session in it (an engine-ctl from before advisory locks) is still a lock."""
    import psycopg

    pg.lock_info()  # the tables
    holder = {"host": socket.gethostname(), "boot_id": boot_id(), "pid": 2**22 + 1}
    with psycopg.connect(pg.dsn) as conn:
        conn.execute(
            "INSERT INTO engine_ctl_lock (name, id, operation, who, since, holder) VALUES (%s, 'old', 'apply', "
            "'ops@box pid 4194305', '2024-01-01T00:00:00+00:00', %s)",
            (pg.name, json.dumps(holder)),
        )
    with pytest.raises(LockHeld) as err, pg.lock("apply", timeout=30):
        pass
    assert "the lock is stale" in str(err.value)
    assert pg.location == f"{DSN}#{pg.name}"  # the same state again, never a file path
    assert f"engine-ctl force-unlock old --state {shlex.quote(pg.location)}" in str(err.value)
    assert run("force-unlock", "old", "--state", pg.location).exit_code == 0
    assert pg.lock_info() is None


# --- the postgres extra ---

NO_PSYCOPG = (
    "import sys; sys.modules['psycopg'] = None; sys.argv = ['engine-ctl', *sys.argv[1:]]; "
    "from engine_ctl.cli.main import main; main()"
)


@pytest.mark.parametrize("args", [["status"], ["list"], ["force-unlock", "x"]], ids=["status", "list", "unlock"])
def test_postgres_without_psycopg_says_how_to_install_it(tmp_path: Path, args: list[str]) -> None:
    result = subprocess.run(
        [sys.executable, "-c", NO_PSYCOPG, *args, "--state", "postgresql://ops@db.example/engine#prod"],
        capture_output=True, text=True, cwd=tmp_path, timeout=60,
    )  # fmt: skip
    assert result.returncode == 1, result
    assert "pip install 'engine-ctl[postgres]'" in result.stderr
    assert "internal error" not in result.stderr and "Traceback" not in result.stderr


def test_plan_with_postgres_without_psycopg_says_how_to_install_it(tmp_path: Path) -> None:
    quickstart = ROOT / "examples/quickstart"
    result = subprocess.run(
        [sys.executable, "-c", NO_PSYCOPG, "plan", str(quickstart), "--state", "postgresql:///nowhere"],
        capture_output=True, text=True, cwd=tmp_path, timeout=60,
    )  # fmt: skip
    assert result.returncode == 1 and "pip install 'engine-ctl[postgres]'" in result.stderr, result
    assert "internal error" not in result.stderr


def test_a_lock_table_from_before_the_holder_column_is_upgraded(tmp_path: Path) -> None:
    """A database made by an earlier engine-ctl (no holder column) keeps working, and gains the column."""
    import psycopg

    schema = f"trust_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(DSN.partition("#")[0], autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(
            f"CREATE TABLE {schema}.engine_ctl_lock (name text PRIMARY KEY, id text NOT NULL, "
            "operation text NOT NULL, who text NOT NULL, since text NOT NULL)"
        )
    try:
        b = open_backend(f"{DSN}?options=-csearch_path%3D{schema}#old")
        assert isinstance(b, PostgresState)
        with b.lock("apply") as info:
            held = b.lock_info()
            assert held is not None and held.id == info.id and held.pid == os.getpid()
        assert b.lock_info() is None
    finally:
        with psycopg.connect(DSN.partition("#")[0], autocommit=True) as conn:
            columns = [
                r[0]
                for r in conn.execute(
                    "SELECT column_name FROM information_schema.columns WHERE table_schema = %s "
                    "AND table_name = 'engine_ctl_lock'",
                    (schema,),
                )
            ]
            conn.execute(f"DROP SCHEMA {schema} CASCADE")
    assert "holder" in columns
