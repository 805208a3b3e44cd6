"""The scalers' PostgreSQL role, for their lock (engine_ctl.core.render.scalerlock): created by apply with the
operator's state DSN, least privilege (LOGIN, nothing granted: an advisory lock needs no grant, and the role
reads no table of the state), its password generated here and written only to the gateway hosts.

The password reaches the server as a SCRAM-SHA-256 verifier computed here (libpq's PQencryptPasswordConn), so
not even the server's statement log sees it; on the gateway hosts it is a root-only 0600 file that the scaler
hands to its psql. It is never in a plan, the state or a log. A role that exists and whose password file is on
every gateway host is left as it is; otherwise apply sets a new password and writes it everywhere."""

from __future__ import annotations

import secrets
import shlex
from collections.abc import Sequence
from typing import Any

from engine_ctl.core.render.scalerlock import ScalerLock
from engine_ctl.shell.transport import LocalTransport, SSHTransport

Transport = SSHTransport | LocalTransport


class LockFailure(Exception):
    pass


def dba_hint(lock: ScalerLock) -> str:
    """What to do where the state's role may not create roles: the SQL for a DBA, and the inventory's option."""
    return (
        f"ask a DBA to run: CREATE ROLE {lock.role} LOGIN PASSWORD '<a new password>'; then put that password on "
        f"the first line of a file (root's, mode 0600) on every gateway host and name both in the inventory: "
        f"scaling: {{lock: {{role: {lock.role}, password_file: /etc/engine-ctl/scaler/role-password}}}}"
    )


def has_password(t: Transport, path: str) -> bool:
    return t.run(["test", "-s", path]).exit_code == 0


def write_password(t: Transport, path: str, password: str) -> None:
    """Root's, 0600 from its first byte (umask), the password on stdin (never in an argv), renamed into place."""
    q = shlex.quote(path)
    script = f"umask 077 && mkdir -p {shlex.quote(path.rsplit('/', 1)[0])} && cat > {q}.new && mv {q}.new {q}"
    result = t.run(["sh", "-c", script], stdin=password + "\n")
    if result.exit_code != 0:
        raise LockFailure(f"writing the scalers' password file: {(result.stderr or result.stdout).strip()[-200:]}")


def set_role(dsn: str, lock: ScalerLock, password: str) -> None:
    """CREATE ROLE (or ALTER ROLE, when it exists) with LOGIN and the password's SCRAM verifier; nothing more."""
    import psycopg
    from psycopg import sql

    try:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
            verifier = conn.pgconn.encrypt_password(password.encode(), lock.role.encode(), b"scram-sha-256").decode()
            exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (lock.role,)).fetchone() is not None
            verb = "ALTER" if exists else "CREATE"  # a new role has no attribute but LOGIN: no superuser, no grant
            statement = sql.SQL(verb + " ROLE {} LOGIN PASSWORD {}")
            conn.execute(statement.format(sql.Identifier(lock.role), sql.Literal(verifier)))
    except psycopg.errors.InsufficientPrivilege as exc:
        raise LockFailure(f"the state's role may not create or change the scalers' role {lock.role} "
                          f"({str(exc).strip()}): {dba_hint(lock)}") from None  # fmt: skip
    except psycopg.Error as exc:
        raise LockFailure(f"the scalers' role {lock.role}: {str(exc).strip()}") from None


def role_exists(dsn: str, role: str) -> bool:
    import psycopg

    try:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
            return conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone() is not None
    except psycopg.Error as exc:
        raise LockFailure(f"the state's database: {str(exc).strip()}") from None


def prepare_lock(lock: ScalerLock, dsn: str | None, transports: Sequence[tuple[str, Transport]]) -> str:
    """The role and its password file on every gateway host (`transports`: name, connection). Returns what was
    done, for apply's progress (never the password)."""
    lacking = [name for name, t in transports if not has_password(t, lock.password_file)]
    if not lock.managed:
        if lacking:
            raise LockFailure(f"{lock.password_file} is missing or empty on {', '.join(lacking)}: put the password "
                              f"of role {lock.role} there (root's, 0600), as scaling.lock.password_file "
                              "says")  # fmt: skip
        return f"role {lock.role} (the inventory's)"
    if dsn is None:
        raise LockFailure("the scalers' role needs the state's PostgreSQL DSN")
    if not lacking and role_exists(dsn, lock.role):
        return f"role {lock.role}"
    password = secrets.token_hex(24)
    set_role(dsn, lock, password)
    for _name, t in transports:
        write_password(t, lock.password_file, password)
    return f"role {lock.role} (a new password, on {', '.join(n for n, _ in transports)})"


def operator_dsn(backend: Any) -> str | None:
    """The state backend's DSN when it is PostgreSQL (its `dsn`), else None."""
    dsn = getattr(backend, "dsn", None)
    return dsn if isinstance(dsn, str) else None
