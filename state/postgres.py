"""The PostgreSQL state backend, for teams and CI sharing one state: `--state postgresql://…[#name]`.

One row per named state (its JSON, serial and lineage) with the previous version kept in a history table;
writes compare-and-swap on the serial inside a transaction, so two writers can never both win; the lock is a
row (ID, operation, who, when, and the holder's machine, boot and pid) whose insert either succeeds or shows
who holds it. psycopg is an extra (`pip install 'engine-ctl[postgres]'`); without it every use says so."""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

from engine_ctl.state.base import LockHeld, new_lock, stale_reason, unlock_command
from engine_ctl.state.local import writable
from engine_ctl.state.model import FORMAT_VERSION, LockInfo, State, StateError, parse_state

from engine_ctl import __version__

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
INSTALL_HINT = "pip install 'engine-ctl[postgres]'"
HISTORY_KEPT = 20


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


def _connect(dsn: str) -> Any:
    psycopg = _psycopg()
    try:
        return psycopg.connect(dsn, autocommit=False, connect_timeout=10)
    except psycopg.Error as exc:
        raise StateError(f"cannot connect to the state database: {str(exc).strip()}") from None


class PostgresState:
    """A named state in a PostgreSQL database."""

    def __init__(self, url: str) -> None:
        dsn, _, name = url.partition("#")
        self.dsn, self.name = dsn, name or "default"
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

    def _insert_lock(self, info: LockInfo) -> tuple[str, tuple[str, ...]]:
        """The lock row's insert, with the holder when the table has the column."""
        columns = ["name", "id", "operation", "who", "since"]
        values = [self.name, info.id, info.operation, info.who, info.when]
        if self._holder:
            columns.append("holder")
            values.append(json.dumps(info.model_dump(include=set(HOLDER_FIELDS))))
        marks = ", ".join(["%s"] * len(values))
        query = f"INSERT INTO engine_ctl_lock ({', '.join(columns)}) VALUES ({marks}) ON CONFLICT (name) DO NOTHING"
        return query, tuple(values)

    def _prepare(self, conn: Any, psycopg: Any) -> None:
        """The tables, once per command; the lock's holder column added to an older table when this role owns
        it (without it, locks still work but are never called stale)."""
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

    def read(self) -> State:
        with self._tx() as cur:
            cur.execute("SELECT format_version, body FROM engine_ctl_state WHERE name = %s", (self.name,))
            row = cur.fetchone()
        if row is None:
            return State(engine_ctl_version=__version__)
        version, body = row
        if version > FORMAT_VERSION:
            raise StateError(
                f"{self.location}: written by a newer engine-ctl (state format {version}, this one reads "
                f"{FORMAT_VERSION} and older); upgrade engine-ctl. The state was not changed."
            )
        return parse_state(body, self.location, self._recovery())

    def _recovery(self) -> str | None:
        """Where the previous version is, only when the history holds one."""
        with self._tx() as cur:
            cur.execute("SELECT max(serial) FROM engine_ctl_state_history WHERE name = %s", (self.name,))
            row = cur.fetchone()
        if row is None or row[0] is None:
            return None
        return (
            f"The previous version (serial {row[0]}) is kept in the table engine_ctl_state_history "
            f"(name {self.name!r}, serial {row[0]})."
        )

    def write(self, state: State) -> State:
        new = state.model_copy(update={"serial": state.serial + 1, "engine_ctl_version": __version__})
        writable(new, self.location)
        body = json.dumps(new.model_dump(mode="json"), sort_keys=True)
        with self._tx() as cur:
            cur.execute("SELECT serial, lineage, body FROM engine_ctl_state WHERE name = %s FOR UPDATE", (self.name,))
            row = cur.fetchone()
            if row is not None:
                serial, lineage, old = row
                if lineage != state.lineage or serial != state.serial:
                    raise StateError(
                        f"{self.location}: the state changed under this command (serial {state.serial} → {serial}); "
                        "nothing was overwritten"
                    )
                cur.execute(
                    "INSERT INTO engine_ctl_state_history (name, serial, body) VALUES (%s, %s, %s) "
                    "ON CONFLICT DO NOTHING",
                    (self.name, serial, json.dumps(old)),
                )
                cur.execute(
                    "DELETE FROM engine_ctl_state_history WHERE name = %s AND serial <= %s",
                    (self.name, serial - HISTORY_KEPT),
                )
                cur.execute(
                    "UPDATE engine_ctl_state SET serial = %s, body = %s, format_version = %s, updated_at = now() "
                    "WHERE name = %s",
                    (new.serial, body, FORMAT_VERSION, self.name),
                )
            else:
                cur.execute(
                    "INSERT INTO engine_ctl_state (name, serial, lineage, format_version, body) "
                    "VALUES (%s, %s, %s, %s, %s)",
                    (self.name, new.serial, new.lineage, FORMAT_VERSION, body),
                )
        return new

    def lock_info(self) -> LockInfo | None:
        with self._tx() as cur:
            holder_column = "holder" if self._holder else "NULL"
            cur.execute(
                f"SELECT id, operation, who, since, {holder_column} FROM engine_ctl_lock WHERE name = %s", (self.name,)
            )
            row = cur.fetchone()
        if row is None:
            return None
        holder = row[4] if isinstance(row[4], dict) else {}
        known = {k: holder[k] for k in HOLDER_FIELDS if k in holder}
        try:
            return LockInfo(id=row[0], operation=row[1], who=row[2], when=row[3], path=self.location, **known)
        except ValueError:  # a holder column someone wrote by hand: the lock is still shown, never stale
            return LockInfo(id=row[0], operation=row[1], who=row[2], when=row[3], path=self.location)

    @contextlib.contextmanager
    def lock(self, operation: str, timeout: float = 0.0) -> Iterator[LockInfo]:
        info = new_lock(str(uuid.uuid4()), operation, self.location)
        deadline = time.monotonic() + timeout
        while True:
            with self._tx() as cur:
                cur.execute(*self._insert_lock(info))
                got = cur.rowcount == 1
            if got:
                break
            held = self.lock_info()
            if held is None:  # released between the two looks: try again at once
                continue
            if stale_reason(held) is not None or time.monotonic() >= deadline:
                raise LockHeld(held, self.location)
            time.sleep(0.2)
        try:
            yield info
        finally:
            with self._tx() as cur:
                cur.execute("DELETE FROM engine_ctl_lock WHERE name = %s AND id = %s", (self.name, info.id))

    def force_unlock(self, lock_id: str) -> LockInfo:
        held = self.lock_info()
        if held is None:
            raise StateError(f"{self.location}: the state is not locked")
        if held.id != lock_id:
            raise StateError(
                f"the lock's ID is {held.id} (held by {held.who} since {held.when}), not {lock_id}; "
                f"to clear it, once its command is no longer running: {unlock_command(held.id, self.location)}"
            )
        with self._tx() as cur:
            cur.execute("DELETE FROM engine_ctl_lock WHERE name = %s AND id = %s", (self.name, lock_id))
        return held
