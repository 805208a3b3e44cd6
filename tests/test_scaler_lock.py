"""The scalers' PostgreSQL lock, its pure parts and its session: where the lock is taken (from the state's
location and the inventory's scaling.lock, with the errors at file:line:column), the plan's line and its refusal
of a gateway host without psql, scaler.json's `lock` and the unit's IPAddressAllow=, the merging of several
scalers' state.json for status; and the scaler's own PgLock (its psql child) against the machine's real
PostgreSQL (ENGINE_CTL_TEST_PG): one holds, the other sees who, fencing sees a session that ended, and the other
takes over. (Two gateway hosts and a PostgreSQL reachable from them: tests/test_fleet_scaler_lock.py.)"""

from __future__ import annotations

import ast
import json
import os
import time
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pytest

from engine_ctl.cli.views.plan import _scaler_lines
from engine_ctl.core.diagnostics import InputError
from engine_ctl.core.documents.inventory import Host, Inventory, load_inventory
from engine_ctl.core.plan.changes import Plan
from engine_ctl.core.plan.scaler import ScalerPlan, lock_refusals, lock_tampering, scaler_views_of
from engine_ctl.core.render.scaler import ScalerDeployment, ScalerSlot, render_scaler
from engine_ctl.core.render.scalerlock import PASSWORD_FILE, ScalerLock, advisory_key, scaler_lock
from engine_ctl.shell.remote import scaler
from engine_ctl.shell.scaler.lock import LockFailure, prepare_lock
from engine_ctl.shell.transport import LocalTransport

DSN = os.environ.get("ENGINE_CTL_TEST_PG", "postgresql:///engine_ctl_test")
GW1 = Host(name="gw-a", address="198.18.0.11", roles=("gateway",))
GW2 = Host(name="gw-b", address="198.18.0.12", roles=("gateway",))
NODE = Host(name="node", address="198.18.0.13")
REMOTE = "postgresql://ops@db.example:6543/fleet?sslmode=require#prod"


def inventory(tmp_path: Path, extra: str = "", gateways: int = 2) -> Inventory:
    roles = ["roles: [gateway]"] * gateways + [""] * (2 - gateways)
    hosts = "".join(f"  - {{name: gw-{c}, address: 198.18.0.1{i + 1}, {r}}}\n"
                    for i, (c, r) in enumerate(zip("ab", roles, strict=True)))  # fmt: skip
    (tmp_path / "hosts.yaml").write_text("hosts:\n" + hosts + "  - {name: node, address: 198.18.0.13}\n" + extra)
    return load_inventory(tmp_path / "hosts.yaml")


# --- where the lock is ------------------------------------------------------------------------------------------
def test_no_lock_without_postgresql_state_or_without_a_gateway(tmp_path: Path) -> None:
    assert scaler_lock(str(tmp_path / "engine-ctl.state.json"), inventory(tmp_path)) is None
    assert scaler_lock(REMOTE, inventory(tmp_path, gateways=0)) is None


def test_postgresql_state_locks_on_its_database_with_a_role_of_its_own(tmp_path: Path) -> None:
    lock = scaler_lock(REMOTE, inventory(tmp_path))
    assert lock is not None
    assert (lock.host, lock.port, lock.dbname, lock.state, lock.hosts) == ("db.example", 6543, "fleet", "prod",
                                                                           ("gw-a", "gw-b"))  # fmt: skip
    assert lock.key == advisory_key("prod") and lock.managed and lock.password_file == PASSWORD_FILE
    assert lock.role.startswith("engine_ctl_scaler_") and lock.role != "ops"  # never the operator's role
    other = scaler_lock(REMOTE.replace("#prod", "#staging"), inventory(tmp_path))
    assert other is not None and other.role != lock.role and other.key != lock.key


def test_the_inventory_names_the_address_the_gateway_hosts_see_and_an_existing_role(tmp_path: Path) -> None:
    inv = inventory(tmp_path, "scaling:\n  lock: {host: 10.1.2.3, port: 5433, role: scalers, password_file: /etc/s}\n")
    lock = scaler_lock("postgresql:///fleet#prod", inv)  # a local socket for the operator, an address for the hosts
    assert lock is not None
    assert (lock.host, lock.port, lock.role, lock.password_file) == ("10.1.2.3", 5433, "scalers", "/etc/s")
    assert not lock.managed


def test_a_local_socket_or_localhost_with_several_gateway_hosts_is_an_error_where_it_is_set(tmp_path: Path) -> None:
    with pytest.raises(InputError) as caught:
        scaler_lock("postgresql:///fleet", inventory(tmp_path))
    d = caught.value.diagnostics[0]
    assert d.code == "scaler_lock_address" and "a local socket" in d.message and "scaling: {lock: {host:" in d.hint
    inv = inventory(tmp_path, "scaling:\n  poll_s: 2\n  lock: {host: localhost}\n")
    with pytest.raises(InputError) as caught:
        scaler_lock(REMOTE, inv)
    d = caught.value.diagnostics[0]
    assert str(d.location) == f"{tmp_path / 'hosts.yaml'}:7:3" and "localhost" in d.message
    # one gateway host on a local socket: no lock, the one scaler (it could not reach the operator's socket)
    assert scaler_lock("postgresql:///fleet", inventory(tmp_path, gateways=1)) is None


@pytest.mark.parametrize(
    ("lock", "where", "code"),
    [
        ("{role: scalers}", "6:9", "scaler_lock_role"),
        ("{port: 70000}", "6:16", "out_of_range"),
        ("{role: Scalers, password_file: /etc/s}", "6:16", "scaler_lock_role"),
        ("{role: scalers, password_file: etc/s}", "6:40", "not_absolute_path"),
    ],
)
def test_scaling_lock_errors_are_located(tmp_path: Path, lock: str, where: str, code: str) -> None:
    with pytest.raises(InputError) as caught:
        inventory(tmp_path, f"scaling:\n  lock: {lock}\n")
    d = caught.value.diagnostics[0]
    assert d.code == code, d
    assert str(d.location) == f"{tmp_path / 'hosts.yaml'}:{where}", d.location


# --- the plan -----------------------------------------------------------------------------------------------------
def test_the_plan_says_which_scaler_acts_and_refuses_a_gateway_host_without_psql(tmp_path: Path) -> None:
    lock = scaler_lock(REMOTE, inventory(tmp_path))
    scaler = ScalerPlan(host="gw-a", poll_s=15, decide_every_s=120, hold_s=120, deployments=["zero"], lock=lock)
    plan = Plan(state_serial=1, state_lineage="l", scaler=scaler)
    line = next(text for _, text in _scaler_lines(plan) if "# scaler on" in text)
    assert line.startswith("  # scaler on gw-a, gw-b (one acts, by a PostgreSQL lock in fleet at db.example:6543")
    alone = Plan(
        state_serial=1,
        state_lineage="l",
        scaler=ScalerPlan(host="gw-a", poll_s=15, decide_every_s=120, hold_s=120, deployments=["zero"]),
    )
    assert "  # scaler on gw-a (the first gateway host by name): zero" in [t for _, t in _scaler_lines(alone)]

    class Facts:
        def __init__(self, psql: str | None) -> None:
            self.psql = psql

    refused = lock_refusals(plan.scaler, {"gw-a": Facts("/usr/bin/psql"), "gw-b": Facts(None)})
    assert len(refused) == 1 and refused[0].startswith("gateway host gw-b has no psql")
    assert "apt install postgresql-client" in refused[0]
    assert lock_refusals(alone.scaler, {"gw-b": Facts(None)}) == []  # no lock: no psql needed


def test_scaler_json_says_the_lock_and_the_unit_may_reach_the_database(tmp_path: Path) -> None:
    inv = inventory(tmp_path, "scaling:\n  lock: {host: 198.18.0.1, port: 5433}\n")
    lock = scaler_lock(REMOTE, inv)
    assert lock is not None
    s = ScalerSlot(index=0, host="node", ssh_host="root@198.18.0.13", address="198.18.0.13", port=8101,
                   unit="engine-ctl-chat-0a.service", server="r0a")  # fmt: skip
    dep = ScalerDeployment(name="chat", id="c", min=0, max=1, parallel=1, slots=(s,))
    rendered = render_scaler(GW2, [dep], "0" * 64, [GW1, GW2, NODE], lock=lock)
    config = json.loads(rendered.config)["lock"]
    assert config == {"host": "198.18.0.1", "port": 5433, "dbname": "fleet", "user": lock.role, "key": lock.key,
                      "password_file": PASSWORD_FILE, "name": "gw-b", "retry_s": 2, "psql": "psql"}  # fmt: skip
    allow = next(ln for ln in rendered.unit_text.splitlines() if ln.startswith("IPAddressAllow="))
    assert "198.18.0.1 " in allow + " " and "198.18.0.11" in allow
    plain = render_scaler(GW2, [dep], "0" * 64, [GW1, GW2, NODE])
    assert "lock" not in json.loads(plain.config)  # no lock: scaler.json as before


def test_status_believes_the_scaler_that_acts_and_shows_every_scalers_decisions() -> None:
    def doc(leader: bool | None, state: str, at: str, action: str) -> dict[str, object]:
        decision = {"at": at, "action": action, "reason": action, "figure": None}
        body: dict[str, object] = {"updated": at, "deployments": {"zero": {"state": state, "decisions": [decision]}}}
        if leader is not None:
            body["lock"] = {"leader": leader}
        return body

    class Facts:
        def __init__(self, host: str, state: dict[str, object]) -> None:
            self.host, self.scaler_state = host, state

    views = scaler_views_of([Facts("gw-b", doc(True, "Ready", "2026-01-01T10:00:05Z", "up")),
                             Facts("gw-a", doc(False, "ScaledToZero", "2026-01-01T10:00:09Z", "follow"))])  # fmt: skip
    view = views["zero"]
    assert view.state == "Ready"  # the leader's word, though the other wrote later
    assert [(d.action, d.scaler) for d in view.decisions] == [("up", "gw-b"), ("follow", "gw-a")]
    single = scaler_views_of([Facts("gw-a", doc(None, "Ready", "2026-01-01T10:00:05Z", "up"))])["zero"]
    assert single.decisions[0].scaler == "gw-a"  # one scaler, no lock: the host that decided is named too


# --- the session, against the real PostgreSQL --------------------------------------------------------------------
def pg_lock(name: str, key: int) -> scaler.PgLock:
    parts = urlsplit(DSN)
    config = {"host": parts.hostname or "/var/run/postgresql", "port": parts.port or 5432,
              "dbname": parts.path.lstrip("/"), "user": parts.username or os.environ.get("USER", "root"),
              "key": key, "password_file": "/nonexistent", "name": name}  # fmt: skip
    return scaler.PgLock(config, lambda _m: None)


def test_one_session_holds_the_lock_the_other_sees_who_and_takes_over_when_it_ends() -> None:
    key = advisory_key(f"test-{os.getpid()}-{time.time()}")
    a, b = pg_lock("gw-a", key), pg_lock("gw-b", key)
    try:
        assert a.try_lead() and a.holds()
        assert not b.try_lead() and b.holder == "gw-a" and not b.holds()
        assert a.try_lead()  # checked, not taken twice
        with psycopg.connect(DSN, autocommit=True) as conn:  # the leader's session ends (its host died)
            pids = conn.execute("SELECT pid FROM pg_stat_activity WHERE application_name = %s",
                                ("engine-ctl-scaler gw-a",)).fetchall()  # fmt: skip
            assert len(pids) == 1
            conn.execute("SELECT pg_terminate_backend(%s)", (pids[0][0],))
        assert not a.holds() and not a.held  # fencing: no action after this
        assert b.try_lead() and b.holds() and b.holder == "gw-b"
        assert not a.try_lead() and a.holder == "gw-b"  # a new session: it only watches now
    finally:
        a.end("the test is done")
        b.end("the test is done")


# --- the scalers' role, made with the operator's DSN (the real PostgreSQL) ----------------------------------------
def test_the_scaler_program_keeps_to_python_3_7s_grammar() -> None:
    ast.parse(Path(scaler.__file__).read_text(), feature_version=(3, 7))


def test_apply_makes_the_role_with_a_scram_verifier_and_writes_the_password_root_only(tmp_path: Path) -> None:
    role = f"engine_ctl_scaler_test{os.getpid()}"
    lock = ScalerLock(host="db", dbname="engine_ctl_test", state="t", key=1, role=role,
                      password_file=str(tmp_path / "scaler" / "pg-password"), hosts=("local",))  # fmt: skip
    here = LocalTransport(Host(name="local", address="127.0.0.1", transport="local"))
    try:
        said = prepare_lock(lock, DSN, [("local", here)])
        assert said.startswith(f"role {role} (a new password")
        password = (tmp_path / "scaler" / "pg-password").read_text().strip()
        assert len(password) == 48 and password not in said
        assert (tmp_path / "scaler" / "pg-password").stat().st_mode & 0o777 == 0o600
        with psycopg.connect(DSN, autocommit=True) as conn:
            stored, login, createrole = conn.execute("SELECT rolpassword, rolcanlogin, rolcreaterole FROM pg_authid "
                                                     "WHERE rolname = %s", (role,)).fetchone()  # fmt: skip
        assert stored.startswith("SCRAM-SHA-256$") and password not in stored and login and not createrole
        assert prepare_lock(lock, DSN, [("local", here)]) == f"role {role}"  # there, with its file: left alone
        assert (tmp_path / "scaler" / "pg-password").read_text().strip() == password
    finally:
        with psycopg.connect(DSN, autocommit=True) as conn:
            conn.execute(f"DROP ROLE IF EXISTS {role}")


def test_an_operator_role_that_may_not_create_roles_gets_the_sql_for_a_dba(tmp_path: Path) -> None:
    weak = f"ectl_weak_{os.getpid()}"
    lock = ScalerLock(host="db", dbname="engine_ctl_test", state="t", key=1, role=f"engine_ctl_scaler_w{os.getpid()}",
                      password_file=str(tmp_path / "pg-password"), hosts=("local",))  # fmt: skip
    here = LocalTransport(Host(name="local", address="127.0.0.1", transport="local"))
    with psycopg.connect(DSN, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {weak} NOLOGIN")
    try:
        as_weak = DSN + ("&" if "?" in DSN else "?") + f"options=-c%20role%3D{weak}"  # the session runs as that role
        with pytest.raises(LockFailure) as caught:
            prepare_lock(lock, as_weak, [("local", here)])
        said = str(caught.value)
        assert f"may not create or change the scalers' role {lock.role}" in said
        assert f"CREATE ROLE {lock.role} LOGIN PASSWORD" in said and "scaling: {lock: {role:" in said
        assert not (tmp_path / "pg-password").exists()  # no password written for a role that is not there
        inv_lock = lock.model_copy(update={"managed": False})
        with pytest.raises(LockFailure, match="is missing or empty on local: put the password of role"):
            prepare_lock(inv_lock, None, [("local", here)])
    finally:
        with psycopg.connect(DSN, autocommit=True) as conn:
            conn.execute(f"DROP ROLE IF EXISTS {weak}")


def test_a_saved_plan_whose_lock_names_another_database_or_role_is_refused(tmp_path: Path) -> None:
    """apply PLANFILE hands the scalers' password to where the saved lock says: an edited plan file must not move
    it (the same check refuses a plan saved against another state or inventory)."""
    inv = inventory(tmp_path)
    lock = scaler_lock(REMOTE, inv)
    assert lock is not None
    saved = ScalerPlan(host="gw-a", poll_s=15, decide_every_s=120, hold_s=120, lock=lock)
    assert lock_tampering(saved, REMOTE, inv) == []
    assert lock_tampering(None, REMOTE, inv) == []
    for forged in (lock.model_copy(update={"host": "203.0.113.9"}), lock.model_copy(update={"role": "postgres"}),
                   lock.model_copy(update={"password_file": "/tmp/pw"}), None):  # fmt: skip
        (problem,) = lock_tampering(saved.model_copy(update={"lock": forged}), REMOTE, inv)
        assert "scaler lock" in problem and "not the one this state and inventory give" in problem
    (other_state,) = lock_tampering(saved, REMOTE.replace("#prod", "#staging"), inv)
    assert "scaler lock" in other_state
