"""The scalers' PostgreSQL lock: with PostgreSQL state, a scaler runs on every gateway host and exactly one acts,
the one that holds a session-level advisory lock in the state's database. Pure: from the state's location and the
inventory to what the scalers are told (their configuration's `lock`).

Without PostgreSQL state (or with a local socket or localhost and one gateway host) there is no lock: one scaler
runs, on the first gateway host by name."""

from __future__ import annotations

import hashlib
from urllib.parse import parse_qs, unquote, urlsplit

from pydantic import BaseModel, ConfigDict

from engine_ctl.core.diagnostics import Diagnostic, InputError, Location
from engine_ctl.core.documents.inventory import Inventory

DEFAULT_PORT = 5432
PASSWORD_FILE = "/etc/engine-ctl/scaler/pg-password"
"""On each gateway host (root's, 0600): the scalers' role's password, written by apply; never in a plan, the state
or a log."""
KEY_PREFIX = "engine-ctl scaler "
"""The advisory key's text (the state's own command lock is "engine-ctl state <name>": never the same key)."""
ROLE_PREFIX = "engine_ctl_scaler_"
LOCAL_NAMES = frozenset({"localhost", "127.0.0.1", "::1", "ip6-localhost"})
RETRY_S = 2
"""How often a scaler that does not hold the lock tries for it, and how often the one that holds it checks it
still does: a dead leader's lock is freed by the server within about 11 s (keepalives 5 s + 3 x 2 s)."""


class ScalerLock(BaseModel):
    """Where the scalers take their lock, as whom, and on which key."""

    model_config = ConfigDict(frozen=True)

    host: str
    port: int = DEFAULT_PORT
    dbname: str
    state: str
    """The state's name (the DSN's #fragment, `default` without one)."""
    key: int
    """pg_try_advisory_lock's bigint key."""
    role: str
    password_file: str = PASSWORD_FILE
    managed: bool = True
    """Whether apply creates the role and writes its password (else the inventory names an existing role)."""
    hosts: tuple[str, ...] = ()
    """The gateway hosts, by name: a scaler runs on each."""

    def config(self, name: str) -> dict[str, object]:
        """scaler.json's `lock` on gateway host `name`."""
        return {"host": self.host, "port": self.port, "dbname": self.dbname, "user": self.role, "key": self.key,
                "password_file": self.password_file, "name": name, "retry_s": RETRY_S}  # fmt: skip


def advisory_key(state: str) -> int:
    digest = hashlib.sha256((KEY_PREFIX + state).encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def role_name(dbname: str, state: str) -> str:
    """The scalers' role: roles are the whole cluster's, so one per database and state name."""
    return ROLE_PREFIX + hashlib.sha256(f"{dbname}#{state}".encode()).hexdigest()[:12]


def state_database(location: str) -> tuple[str, int, str, str] | None:
    """(host, port, dbname, state name) of a postgresql:// state location; None for any other state. The host is
    "" for libpq's default local socket, or the socket's directory."""
    if not location.startswith(("postgresql://", "postgres://")):
        return None
    dsn, _, name = location.partition("#")
    parts = urlsplit(dsn)
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    host = unquote(parts.hostname or "") or query.get("host", "")
    try:
        port = parts.port or int(query.get("port") or DEFAULT_PORT)
    except ValueError:
        port = DEFAULT_PORT
    dbname = unquote(parts.path.lstrip("/")) or query.get("dbname") or unquote(parts.username or "") or "postgres"
    return host, port, dbname, name or "default"


def is_local(host: str) -> bool:
    return host == "" or host.startswith("/") or host.lower() in LOCAL_NAMES or host.startswith("127.")


def scaler_lock(location: str, inventory: Inventory) -> ScalerLock | None:
    """The scalers' lock for a state at `location`, or None (one scaler, no lock): a state that is not PostgreSQL,
    no gateway host, or one gateway host that would reach the database on its own socket or loopback (it could
    not be the operator's). Raises InputError when several gateway hosts would each reach their own."""
    found = state_database(location)
    gateways = sorted(h.name for h in inventory.gateways())
    if found is None or not gateways:
        return None
    host, port, dbname, state = found
    given = inventory.scaling.lock
    host, port = given.host or host, given.port or port
    if is_local(host) and len(gateways) == 1:
        return None
    if is_local(host):
        where = Location(inventory.file or "inventory", given.line, given.column) if given.line else Location(location)
        said = "a local socket" if host == "" or host.startswith("/") else host
        raise InputError([Diagnostic(
            where, "scaling.lock.host", f"the scalers on the gateway hosts ({', '.join(gateways)}) take their lock in "
            f"the state's database, which this state reaches at {said}: each host would reach its own",
            hint="give the database's address as the gateway hosts reach it: scaling: {lock: {host: ADDRESS, "
            "port: PORT}} in the inventory", code="scaler_lock_address",
        )])  # fmt: skip
    managed = given.role is None
    return ScalerLock(
        host=host, port=port, dbname=dbname, state=state, key=advisory_key(state),
        role=given.role or role_name(dbname, state), password_file=given.password_file or PASSWORD_FILE,
        managed=managed, hosts=tuple(gateways),
    )  # fmt: skip
