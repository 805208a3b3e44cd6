"""The PostgreSQL state backend, for teams and CI sharing one state: `--state postgresql://…[#name]`.

One row per named state (its JSON, serial and lineage) with the replaced versions kept in a history table;
writes compare-and-swap on the serial inside a transaction, so two writers can never both win.

The lock is a session advisory lock (`pg_try_advisory_lock` on a key derived from the state's name), held on a
connection of its own for as long as the command runs: the server releases it when that connection ends, so a
holder that is killed, crashes or loses its network (TCP keepalives, about 30 s) never leaves the state locked.
The lock row (ID, operation, who, since, and the holder's host, boot, pid and database session) is information
only: it says who holds the lock and since when. A row whose advisory lock nobody holds is stale: the next
command says so on stderr, clears it, proceeds, and records that in the state's operations log.

A row written by an engine-ctl from before advisory locks (no session in it) is still a lock, as it was then.
psycopg is an extra (`pip install 'engine-ctl[postgres]'`); without it every use says so."""

from __future__ import annotations

import contextlib
import hashlib
import json
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

from engine_ctl.state.base import LockHeld, new_lock, now, unlock_command, who
from engine_ctl.state.local import writable

from engine_ctl import __version__
from engine_ctl.core.jsonbounds import MAX_STATE_BYTES, JsonBoundError, bounded_json, size_problem
from engine_ctl.core.record.model import FORMAT_VERSION, LockInfo, Operation, State, StateError, parse_state

READ_BOUNDED = (
    "SELECT format_version, octet_length(body::text), "
    "CASE WHEN octet_length(body::text) <= %s THEN body::text END FROM engine_ctl_state WHERE name = %s"
)
"""The state's text only when it is within the bound (else its size alone), so a huge row is never sent."""

SCHEMA = """
CREATE TABLE IF NOT EXISTS engine_ctl_state (
    name text PRIMARY KEY,
    serial bigint NOT NULL,
    lineage text NOT NULL,
    format_version int NOT NULL,
    body jsonb NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS engine_ctl_state_history (
    name text NOT NULL,
    serial bigint NOT NULL,
    body jsonb NOT NULL,
    replaced_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (name, serial)
);
CREATE TABLE IF NOT EXISTS engine_ctl_lock (
    name text PRIMARY KEY,
    id text NOT NULL,
    operation text NOT NULL,
    who text NOT NULL,
    since text NOT NULL,
    holder jsonb
);
"""
HAS_HOLDER = (
    "SELECT 1 FROM information_schema.columns WHERE table_schema = current_schema() "
    "AND table_name = 'engine_ctl_lock' AND column_name = 'holder'"
)
ADD_HOLDER = "ALTER TABLE engine_ctl_lock ADD COLUMN IF NOT EXISTS holder jsonb"
HOLDER_FIELDS = ("host", "boot_id", "pid", "pid_start")
SESSION = "session"
"""The holder's key for the server pid of the database session that holds the advisory lock. A row without it
was written by an engine-ctl that locked with the row alone."""
INSTALL_HINT = "pip install 'engine-ctl[postgres]'"
HISTORY_KEPT = 20
OPERATIONS_KEPT = 200
POLL = 0.2
ROW_GRACE = 2.0
"""Seconds a held advisory lock may be without its row before a command is refused: the holder writes its row
just after taking the lock, and removes it just before releasing it."""
KEY_PREFIX = "engine-ctl state "
CLIENT_KEEPALIVES = {"keepalives": "1", "keepalives_idle": "15", "keepalives_interval": "5", "keepalives_count": "3"}
SERVER_SETTINGS = (
    ("tcp_keepalives_idle", "15"),
    ("tcp_keepalives_interval", "5"),
    ("tcp_keepalives_count", "3"),
    ("idle_session_timeout", "0"),
    ("idle_in_transaction_session_timeout", "0"),
)
"""The lock's session: the server notices a holder whose network is gone within about 30 s (and then releases
the lock), and never ends the session of a holder that is only busy elsewhere (rolling replicas for minutes)."""
HOLDER_PID = (
    "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1 "
    "AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
    "AND classid = %s::bigint::oid AND objid = %s::bigint::oid LIMIT 1"
)


def _psycopg() -> Any:
    """psycopg, or a StateError that says how to install it (it is the `postgres` extra)."""
    try:
        import psycopg
    except ImportError:
        raise StateError(
            f"a postgresql:// state needs the PostgreSQL driver psycopg, which is not installed; "
            f"install engine-ctl with its postgres extra: {INSTALL_HINT}"
        ) from None
    return psycopg


def _connect(dsn: str, autocommit: bool = False, **extra: str) -> Any:
    psycopg = _psycopg()
    try:
        return psycopg.connect(dsn, autocommit=autocommit, connect_timeout=10, **extra)
    except psycopg.Error as exc:
        raise StateError(f"cannot connect to the state database: {str(exc).strip()}") from None


def advisory_key(name: str) -> int:
    """The advisory lock's key of a named state: the first 8 bytes of a sha256, as PostgreSQL's signed bigint."""
    digest = hashlib.sha256((KEY_PREFIX + name).encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def key_parts(key: int) -> tuple[int, int]:
    """How pg_locks shows a bigint advisory key: classid the high 32 bits, objid the low 32 bits."""
    unsigned = key & 0xFFFF_FFFF_FFFF_FFFF
    return unsigned >> 32, unsigned & 0xFFFF_FFFF


def _stale_line(old: LockInfo) -> str:
    return (
        f"warning: the state lock of {old.who} since {old.when} for `{old.operation}` (lock ID {old.id}) was stale "
        "(its database session has ended: that command is gone); cleared it and went on, and recorded that in "
        "the state's operations log"
    )


def _stale_operation(old: LockInfo, operation: str) -> Operation:
    return Operation(
        id=str(uuid.uuid4()), who=who(), when=now(), command=f"{operation}: cleared a stale lock",
        result=(
            f"the lock {old.id} of {old.who} since {old.when} for `{old.operation}` was stale (its database "
            "session had ended), so it was cleared"
        ),
    )  # fmt: skip


class PostgresState:
    """A named state in a PostgreSQL database."""

    def __init__(self, url: str) -> None:
        dsn, _, name = url.partition("#")
        self.dsn, self.name = dsn, name or "default"
        self.key = advisory_key(self.name)
        parts = urlsplit(dsn)
        netloc = parts.hostname or ""
        if parts.username:
            netloc = f"{parts.username}@{netloc}"
        if parts.port:
            netloc += f":{parts.port}"
        # never the password: libpq finds it in PGPASSWORD or ~/.pgpass when the state is opened again
        # built by hand: urlunsplit drops the // of postgresql:///db (no host), and that would read as a file path
        query = f"?{parts.query}" if parts.query else ""
        self.location = f"{parts.scheme}://{netloc}{parts.path}{query}#{self.name}"
        self._schema_ready = False
        self._holder = False
        """Whether the lock table has the holder column (a table from before it gets it when this role may)."""
        self._session: Any = None
        """The connection that holds the advisory lock, while this backend holds it."""
        self._notes: list[Operation] = []
        """Stale locks cleared, for the operations log: carried by the next write, or written on release."""

    @contextlib.contextmanager
    def _tx(self) -> Iterator[Any]:
        psycopg = _psycopg()
        conn = _connect(self.dsn)
        try:
            if not self._schema_ready:
                self._prepare(conn, psycopg)
            with conn.transaction(), conn.cursor() as cur:
                yield cur
        except psycopg.Error as exc:
            raise StateError(f"{self.location}: {str(exc).strip()}") from None
        finally:
            conn.close()

    def _prepare(self, conn: Any, psycopg: Any) -> None:
        """The tables, once per command; the lock's holder column added to an older table when this role owns
        it (without it, locks still work, and a lock row is stale whenever nobody holds the advisory lock)."""
        with conn.transaction(), conn.cursor() as cur:
            cur.execute(SCHEMA)
            cur.execute(HAS_HOLDER)
            self._holder = cur.fetchone() is not None
        if not self._holder:
            try:
                with conn.transaction(), conn.cursor() as cur:
                    cur.execute(ADD_HOLDER)
                self._holder = True
            except psycopg.Error:
                pass
        self._schema_ready = True

    # --- the state ---

    def read(self) -> State:
        """The state, read within bounds (engine_ctl.core.jsonbounds): its size is asked of the server first, and
        its text is parsed only when it is within it, and within the nesting depth."""
        with self._tx() as cur:
            cur.execute(READ_BOUNDED, (MAX_STATE_BYTES, self.name))
            row = cur.fetchone()
        if row is None:
            return State(engine_ctl_version=__version__)
        version, size, text = row
        if version > FORMAT_VERSION:
            raise StateError(
                f"{self.location}: written by a newer engine-ctl (state format {version}, this one reads "
                f"{FORMAT_VERSION} and older); upgrade engine-ctl. The state was not changed."
            )
        try:
            if text is None:  # the server sent only its size
                raise size_problem(int(size), "state", MAX_STATE_BYTES) or JsonBoundError("too large")
            body = bounded_json(text, "state", MAX_STATE_BYTES)
        except ValueError as exc:  # past a bound, or not JSON Python reads (a number past its digits limit)
            why = f"{exc.where}{exc.message}" if isinstance(exc, JsonBoundError) else str(exc)
            recovery = self._recovery()
            raise StateError(
                f"{self.location}: cannot read the state: {why}" + (f". {recovery}" if recovery else "")
            ) from None
        return parse_state(body, self.location, self._recovery())

    def _recovery(self) -> str | None:
        """Where the previous version is, only when the history holds one."""
        serial = self.last_replaced()
        if serial is None:
            return None
        return (
            f"The previous version (serial {serial}) is kept in the table engine_ctl_state_history "
            f"(name {self.name!r}, serial {serial})."
        )

    def last_replaced(self) -> int | None:
        """The serial of the version replaced last (the backup), when the history holds one."""
        with self._tx() as cur:
            cur.execute(
                "SELECT serial FROM engine_ctl_state_history WHERE name = %s ORDER BY replaced_at DESC, serial DESC "
                "LIMIT 1",
                (self.name,),
            )
            row = cur.fetchone()
        return None if row is None else int(row[0])

    def write(self, state: State) -> State:
        """The state with its serial up by one (compare-and-swap on the serial), carrying any stale lock this
        command cleared into the operations log."""
        operations = [*state.operations, *self._notes][-OPERATIONS_KEPT:]
        update = {"serial": state.serial + 1, "engine_ctl_version": __version__, "operations": operations}
        new = state.model_copy(update=update)
        self._store(new, state)
        self._notes.clear()
        return new

    def put(self, state: State, replacing: State) -> None:
        """`state` exactly as it is (serial and lineage kept), in place of `replacing`, which goes to the
        history; refused if the state is no longer `replacing`."""
        self._store(state, replacing)

    def _store(self, new: State, replacing: State) -> None:
        writable(new, self.location)
        self._check_session()
        body = json.dumps(new.model_dump(mode="json"), sort_keys=True)
        with self._tx() as cur:
            cur.execute(  # the replaced body as text: kept in the history as it is, never parsed here
                "SELECT serial, lineage, body::text FROM engine_ctl_state WHERE name = %s FOR UPDATE", (self.name,)
            )
            row = cur.fetchone()
            if row is None and replacing.serial == 0:
                cur.execute(
                    "INSERT INTO engine_ctl_state (name, serial, lineage, format_version, body) "
                    "VALUES (%s, %s, %s, %s, %s)",
                    (self.name, new.serial, new.lineage, FORMAT_VERSION, body),
                )
                return
            serial, lineage, old = row if row is not None else (0, replacing.lineage, None)
            if lineage != replacing.lineage or serial != replacing.serial:
                raise StateError(
                    f"{self.location}: the state changed under this command (serial {replacing.serial} → {serial}); "
                    "nothing was overwritten"
                )
            self._keep(cur, serial, old)
            cur.execute(
                "UPDATE engine_ctl_state SET serial = %s, lineage = %s, body = %s, format_version = %s, "
                "updated_at = now() WHERE name = %s",
                (new.serial, new.lineage, body, FORMAT_VERSION, self.name),
            )

    def _keep(self, cur: Any, serial: int, body: str | None) -> None:
        """The replaced version (its JSON text) into the history (the latest one replaced at a serial wins), the
        oldest out."""
        cur.execute(
            "INSERT INTO engine_ctl_state_history (name, serial, body) VALUES (%s, %s, %s) "
            "ON CONFLICT (name, serial) DO UPDATE SET body = EXCLUDED.body, replaced_at = now()",
            (self.name, serial, body if body is not None else "null"),
        )
        cur.execute(
            "DELETE FROM engine_ctl_state_history WHERE name = %s AND serial <= %s", (self.name, serial - HISTORY_KEPT)
        )

    # --- the lock ---

    def _row(self, cur: Any, for_update: bool = False) -> tuple[LockInfo, dict[str, Any]] | None:
        """The lock row, and its holder's fields as written."""
        holder_column = "holder" if self._holder else "NULL"
        lock = " FOR UPDATE" if for_update else ""
        cur.execute(
            f"SELECT id, operation, who, since, {holder_column} FROM engine_ctl_lock WHERE name = %s{lock}",
            (self.name,),
        )
        row = cur.fetchone()
        if row is None:
            return None
        holder = row[4] if isinstance(row[4], dict) else {}
        known = {k: holder[k] for k in HOLDER_FIELDS if k in holder}
        try:
            info = LockInfo(id=row[0], operation=row[1], who=row[2], when=row[3], path=self.location, **known)
        except ValueError:  # a holder column someone wrote by hand: the lock is still shown, never stale
            info = LockInfo(id=row[0], operation=row[1], who=row[2], when=row[3], path=self.location)
        return info, holder

    def lock_info(self) -> LockInfo | None:
        with self._tx() as cur:
            found = self._row(cur)
        return found[0] if found else None

    @contextlib.contextmanager
    def lock(self, operation: str, timeout: float = 0.0) -> Iterator[LockInfo]:
        """Hold the state's advisory lock (waiting up to `timeout` seconds) and its row, until the block ends."""
        info = new_lock(str(uuid.uuid4()), operation, self.location)
        psycopg = _psycopg()
        session = self._open_session()
        try:
            try:
                self._acquire(session, info, timeout, psycopg)
            except psycopg.Error as exc:
                raise StateError(f"{self.location}: {str(exc).strip()}") from None
            outer, self._session = self._session, session
            try:
                yield info
            finally:
                try:
                    self._flush_notes()
                finally:
                    self._release(session, info, psycopg)
                    self._session = outer
        finally:
            session.close()

    def _open_session(self) -> Any:
        """The lock's own connection (autocommit), with keepalives on both ends unless the URL sets its own."""
        psycopg = _psycopg()
        given = psycopg.conninfo.conninfo_to_dict(self.dsn)
        extra = {k: v for k, v in CLIENT_KEEPALIVES.items() if k not in given}
        if "application_name" not in given:
            extra["application_name"] = f"engine-ctl lock {self.name}"[:63]
        session = _connect(self.dsn, autocommit=True, **extra)
        for setting, value in SERVER_SETTINGS:
            with contextlib.suppress(psycopg.Error):  # an older server without the setting: keep its default
                session.execute("SELECT set_config(%s, %s, false)", (setting, value))
        if not self._schema_ready:
            try:
                self._prepare(session, psycopg)
            except psycopg.Error as exc:
                session.close()
                raise StateError(f"{self.location}: {str(exc).strip()}") from None
        return session

    def _acquire(self, session: Any, info: LockInfo, timeout: float, psycopg: Any) -> None:
        start = time.monotonic()
        while True:
            if session.execute("SELECT pg_try_advisory_lock(%s)", (self.key,)).fetchone()[0]:
                try:
                    self._take_row(session, info, psycopg)
                    return
                except LockHeld as held:  # an older engine-ctl's row lock: waited for as it was then
                    if held.stale is not None or time.monotonic() - start >= timeout:
                        raise
                time.sleep(POLL)
                continue
            found = self._row(session.cursor())
            waited = time.monotonic() - start
            if waited >= timeout and (found is not None or waited >= ROW_GRACE):
                raise self._busy(session, found)
            time.sleep(POLL)

    def _busy(self, session: Any, found: tuple[LockInfo, dict[str, Any]] | None) -> StateError:
        """Why the lock cannot be had: who holds it and since when, and the session that holds it."""
        if found is None:
            return StateError(
                f"{self.location}: the state is locked by another database session (its lock is held, but no lock "
                "row says who yet: a command starting or ending); try again, or pass --lock-timeout"
            )
        info, holder = found
        row = session.execute(HOLDER_PID, key_parts(self.key)).fetchone()
        pid = int(row[0]) if row else holder.get(SESSION)
        return LockHeld(info, self.location, session=pid if isinstance(pid, int) else None)

    def _take_row(self, session: Any, info: LockInfo, psycopg: Any) -> None:
        """With the advisory lock held: clear a stale row, write ours. A row lock of an older engine-ctl is
        still a lock: refused (the advisory lock let go), as that engine-ctl would refuse ours."""
        try:
            with session.transaction():
                found = self._row(session.cursor(), for_update=True)
                stale = None
                if found is not None:
                    old, holder = found
                    if self._holder and SESSION not in holder:
                        raise LockHeld(old, self.location)
                    session.execute("DELETE FROM engine_ctl_lock WHERE name = %s AND id = %s", (self.name, old.id))
                    stale = old
                if session.execute(*self._insert_lock(info, session.info.backend_pid)).rowcount != 1:
                    again = self._row(session.cursor())
                    raise LockHeld(again[0], self.location) if again else StateError("the lock row changed")
        except BaseException:
            with contextlib.suppress(psycopg.Error):
                session.execute("SELECT pg_advisory_unlock(%s)", (self.key,))
            raise
        if stale is not None:
            print(_stale_line(stale), file=sys.stderr, flush=True)
            self._notes.append(_stale_operation(stale, info.operation))

    def _insert_lock(self, info: LockInfo, session_pid: int) -> tuple[str, tuple[object, ...]]:
        """The lock row's insert, with the holder (and its database session) when the table has the column."""
        columns = ["name", "id", "operation", "who", "since"]
        values: list[object] = [self.name, info.id, info.operation, info.who, info.when]
        if self._holder:
            columns.append("holder")
            holder = {**info.model_dump(include=set(HOLDER_FIELDS)), SESSION: session_pid}
            values.append(json.dumps(holder))
        marks = ", ".join(["%s"] * len(values))
        query = f"INSERT INTO engine_ctl_lock ({', '.join(columns)}) VALUES ({marks}) ON CONFLICT (name) DO NOTHING"
        return query, tuple(values)

    def _check_session(self) -> None:
        """While locked: the lock's session is still there (else the lock is gone, and nothing is written)."""
        if self._session is None:
            return
        psycopg = _psycopg()
        try:
            self._session.execute("SELECT 1")
        except psycopg.Error as exc:
            raise StateError(
                f"{self.location}: the state lock was lost: its database session ended ({str(exc).strip()}); "
                "nothing was written, and another command may hold the lock now"
            ) from None

    def _flush_notes(self) -> None:
        """Stale locks cleared by a command that wrote nothing: into the operations log now (serial up by one)."""
        if not self._notes:
            return
        try:
            self.write(self.read())
        except StateError as exc:
            print(f"warning: the stale lock cleared was not recorded in the operations log: {exc}", file=sys.stderr)
            self._notes.clear()

    def _release(self, session: Any, info: LockInfo, psycopg: Any) -> None:
        delete = "DELETE FROM engine_ctl_lock WHERE name = %s AND id = %s"
        try:
            session.execute(delete, (self.name, info.id))
            session.execute("SELECT pg_advisory_unlock(%s)", (self.key,))
        except psycopg.Error:  # the session is gone, and its advisory lock with it: clear our row over another
            with contextlib.suppress(StateError), self._tx() as cur:
                cur.execute(delete, (self.name, info.id))

    def force_unlock(self, lock_id: str) -> LockInfo:
        """Remove a lock row nobody's session holds (stale, or of an older engine-ctl); a live holder's lock is
        released only by its command ending (or its session being ended), never by removing its row."""
        with self._tx() as cur:
            found = self._row(cur)
            if found is None:
                raise StateError(f"{self.location}: the state is not locked")
            held, holder = found
            if held.id != lock_id:
                raise StateError(
                    f"the lock's ID is {held.id} (held by {held.who} since {held.when}), not {lock_id}; "
                    f"to clear it, once its command is no longer running: {unlock_command(held.id, self.location)}"
                )
            cur.execute(HOLDER_PID, key_parts(self.key))
            live = cur.fetchone()
            if live is not None and SESSION in holder:
                raise StateError(
                    f"the lock {held.id} of {held.who} since {held.when} for `{held.operation}` is held by a live "
                    f"database session (server pid {live[0]}): it is released when that command ends, even if it "
                    f"is killed; if that command hangs, end its session: SELECT pg_terminate_backend({live[0]})"
                )
            cur.execute("DELETE FROM engine_ctl_lock WHERE name = %s AND id = %s", (self.name, lock_id))
        return held
