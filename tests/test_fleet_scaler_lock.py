"""The scalers' PostgreSQL lock on the real fleet: TWO gateway hosts (hosts[0] and hosts[3]) with HAProxy under
engine-ctl's gateway unit, the real llama-server on hosts[1], the real scaler under its hardened unit on BOTH
gateway hosts, and a real PostgreSQL that the fleet reaches: a private cluster started for this module (Debian's
initdb and pg_ctl, as the `postgres` user, listening on the fleet's bridge address 198.18.N.1 on a free port,
scram-sha-256 for the fleet's subnet, every statement logged). The state is in it (`--state postgresql://…`,
an operator role with CREATEROLE, not a superuser), the official `openai` package is the client.

Exactly one scaler holds the lock and acts; the scalers' role (made by apply, its password only on the gateway
hosts) reads nothing of the state; the leader killed, the other takes the lock within seconds and wakes a
request at zero that arrives through the dead leader's own gateway (whose restarted scaler passes the wake on);
the leader's network cut (its link on the bridge down), it stops acting on its own and the server frees its lock
(the session's keepalives) within seconds, and the other takes it. (The project, its short timings and the
second gateway: tests/test_fleet_scaler.py, tests/test_fleet_scaler_gateways.py.)"""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from engine_ctl.state import PostgresState

from engine_ctl.core.record.model import State
from engine_ctl.core.render.scaler import SCALER_STATE, SCALER_UNIT
from engine_ctl.core.render.scalerlock import PASSWORD_FILE, advisory_key
from engine_ctl.shell.remote.scaler import key_parts
from tests.fleet import SUBNET, Fleet, FleetHost
from tests.ports import free_port
from tests.test_fleet_scaler import HOLD_S, ask
from tests.test_fleet_scaler_gateways import TwoGateways, zero_on

pytestmark = pytest.mark.fleet
PG_BIN = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))[-1].parent
STATE_NAME = "locktest"


@dataclass
class Cluster:
    data: Path
    port: int
    operator_password: str

    @property
    def address(self) -> str:
        return f"{SUBNET}.1"

    @property
    def url(self) -> str:
        return f"postgresql://operator:{self.operator_password}@{self.address}:{self.port}/enginectl#{STATE_NAME}"

    def dsn(self, user: str = "operator", password: str | None = None) -> str:
        return f"postgresql://{user}:{password or self.operator_password}@{self.address}:{self.port}/enginectl"

    def superuser(self, sql: str) -> str:
        argv = ["runuser", "-u", "postgres", "--", str(PG_BIN / "psql"), "-X", "-A", "-t", "-h", str(self.data),
                "-p", str(self.port), "-d", "enginectl", "-c", sql]  # fmt: skip
        return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip()

    def log(self) -> str:
        return (self.data / "server.log").read_text(errors="replace")


def as_postgres(*argv: str) -> None:
    subprocess.run(["runuser", "-u", "postgres", "--", *argv], capture_output=True, text=True, check=True)


def start_cluster(address: str) -> Cluster:
    """initdb (superuser `postgres`, trust on its own socket only), listening on `address`, scram for the
    fleet's subnet, every statement logged; then an operator role with CREATEROLE and its database."""
    data = Path(tempfile.mkdtemp(prefix="engine-ctl-pg-"))
    shutil.chown(data, "postgres", "postgres")
    as_postgres(str(PG_BIN / "initdb"), "-D", str(data), "-U", "postgres", "--auth-local=trust",
                "--auth-host=scram-sha-256")  # fmt: skip
    cluster = Cluster(data, free_port(address), secrets.token_hex(12))
    with (data / "postgresql.conf").open("a") as f:
        f.write(f"listen_addresses = '{address}'\nport = {cluster.port}\nunix_socket_directories = '{data}'\n"
                "password_encryption = 'scram-sha-256'\nlog_statement = 'all'\nlog_connections = on\n")  # fmt: skip
    with (data / "pg_hba.conf").open("a") as f:
        f.write(f"host all all {SUBNET}.0/24 scram-sha-256\n")
    as_postgres(str(PG_BIN / "pg_ctl"), "-D", str(data), "-l", str(data / "server.log"), "-w", "start")
    argv = ["runuser", "-u", "postgres", "--", str(PG_BIN / "psql"), "-X", "-h", str(data), "-p", str(cluster.port),
            "-d", "postgres", "-v", "ON_ERROR_STOP=1"]  # fmt: skip
    sql = (f"CREATE ROLE operator LOGIN CREATEROLE PASSWORD '{cluster.operator_password}';\n"
           "CREATE DATABASE enginectl OWNER operator;\n")  # fmt: skip
    subprocess.run(argv, input=sql, capture_output=True, text=True, check=True)
    return cluster


def stop_cluster(cluster: Cluster) -> None:
    subprocess.run(["runuser", "-u", "postgres", "--", str(PG_BIN / "pg_ctl"), "-D", str(cluster.data), "-m",
                    "immediate", "stop"], capture_output=True, check=False)  # fmt: skip
    shutil.rmtree(cluster.data, ignore_errors=True)


class LockedGateways(TwoGateways):
    """Two gateway hosts, the state in the cluster."""

    def __init__(self, path: Path, fleet: Fleet, cluster: Cluster) -> None:
        super().__init__(path, fleet)
        self.cluster = cluster

    def cli(self, *args: str, check: bool = False, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        with_state = (*args, "--state", self.cluster.url) if args[0] in ("plan", "apply", "destroy", "status") else args
        return super().cli(*with_state, check=check, timeout=timeout)

    def state(self) -> State:
        return PostgresState(self.cluster.url).read()

    def holder(self) -> str | None:
        """The gateway host whose scaler's session holds the lock, as the server's pg_locks says."""
        high, low = key_parts(advisory_key(STATE_NAME))
        said = self.cluster.superuser(
            "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid WHERE "
            f"l.locktype = 'advisory' AND l.granted AND l.classid = {high} AND l.objid = {low}"
        )
        names = [line.removeprefix("engine-ctl-scaler ") for line in said.splitlines() if line]
        assert len(names) <= 1, names
        return names[0] if names else None

    def scaler_state_of(self, host: FleetHost) -> dict:  # type: ignore[type-arg]
        return json.loads(self.fleet.ssh(host, f"cat {SCALER_STATE} 2>/dev/null || echo '{{}}'").stdout)

    def decisions_on(self, host: FleetHost, action: str) -> list[dict]:  # type: ignore[type-arg]
        found = self.scaler_state_of(host).get("deployments", {}).get("zero", {}).get("decisions", [])
        return [d for d in found if d["action"] == action]


@pytest.fixture(scope="module")
def lp(fleet: Fleet, weights: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LockedGateways]:
    cluster = start_cluster(f"{SUBNET}.1")
    p = LockedGateways(tmp_path_factory.mktemp("scaler-lock"), fleet, cluster)
    p.write(zero_on(fleet.hosts[1]))
    try:
        with p.applied():
            yield p
    finally:
        p.cli("destroy", "--auto-approve")  # (applied() destroys a state file's deployments only)
        for g in (p.gateway, p.second):
            fleet.ssh(g, f"systemctl disable --now {SCALER_UNIT} engine-ctl-gateway.service; rm -rf "
                      f"/var/lib/engine-ctl/scaler {PASSWORD_FILE}", check=False)  # fmt: skip
        stop_cluster(cluster)


def test_a_scaler_runs_on_each_gateway_host_and_exactly_one_holds_the_lock(lp: LockedGateways) -> None:
    plan = lp.cli("plan", check=True).stdout
    assert f"# scaler on {lp.gateway.name}, {lp.second.name} (one acts, by a PostgreSQL lock in enginectl at " in plan
    for g in (lp.gateway, lp.second):
        assert lp.fleet.ssh(g, f"systemctl is-active {SCALER_UNIT}").stdout.strip() == "active"
    lp.wait("a scaler holds the lock", lambda: lp.holder() is not None, 20)
    leader = lp.holder()
    both = (lp.gateway, lp.second)
    lp.wait("both say who leads", lambda: all(lp.scaler_state_of(g).get("lock", {}).get("holder") == leader
                                              for g in both), 20)  # fmt: skip
    says = {g.name: lp.scaler_state_of(g)["lock"] for g in (lp.gateway, lp.second)}
    assert [n for n, s in says.items() if s["leader"]] == [leader], says


def test_the_scalers_role_reads_nothing_of_the_state_and_its_password_is_only_on_the_gateway_hosts(
    lp: LockedGateways,
) -> None:
    files = {g.name: lp.fleet.ssh(g, f"stat -c '%U %a' {PASSWORD_FILE} && cat {PASSWORD_FILE}").stdout.split("\n")
             for g in (lp.gateway, lp.second)}  # fmt: skip
    assert all(f[0] == "root 600" for f in files.values()), files
    password = files[lp.gateway.name][1]
    assert len(password) >= 32 and files[lp.second.name][1] == password
    assert lp.fleet.ssh(lp.fleet.hosts[1], f"test -e {PASSWORD_FILE}", check=False).returncode != 0
    role = lp.cluster.superuser("SELECT rolname FROM pg_roles WHERE rolname LIKE 'engine_ctl_scaler_%'")
    assert role and "\n" not in role
    attributes = lp.cluster.superuser(
        f"SELECT rolsuper, rolcreaterole, rolcreatedb FROM pg_roles WHERE rolname = '{role}'"
    )
    assert attributes == "f|f|f"
    with psycopg.connect(lp.cluster.dsn(role, password), autocommit=True) as conn:
        for table in ("engine_ctl_state", "engine_ctl_state_history", "engine_ctl_lock"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(f"SELECT * FROM {table}")
    body = lp.cluster.superuser(f"SELECT body::text FROM engine_ctl_state WHERE name = '{STATE_NAME}'")
    assert body and password not in body
    assert password not in lp.cli("plan").stdout and password not in lp.cluster.log()  # not even as SQL


def test_the_leader_killed_the_other_takes_over_and_wakes_a_request_at_zero(lp: LockedGateways) -> None:
    assert not lp.active("zero", 0) and not lp.decisions_on(lp.gateway, "up") + lp.decisions_on(lp.second, "up")
    leader = lp.host_of(str(lp.holder()))
    other = lp.second if leader.name == lp.gateway.name else lp.gateway
    # SIGKILL to the scaler's process (its psql child then reads the end of its input and ends its session)
    lp.fleet.ssh(leader, f"kill -KILL $(systemctl show -p MainPID --value {SCALER_UNIT})")
    killed = time.monotonic()
    lp.wait("the other scaler holds the lock", lambda: lp.holder() == other.name, 20)
    took = time.monotonic() - killed
    print(f"the lock taken over {took:.1f} s after the leader was killed")
    assert took < 10, took  # the session ended with the process: freed at once, taken within its retry (2 s)
    lp.wait("the restarted scaler watches", lambda: lp.scaler_state_of(leader).get("lock", {}).get("holder")
            == other.name, 20)  # fmt: skip
    assert lp.decisions_on(other, "lead")
    # a request at zero through the old leader's own gateway: its Lua pokes its own scaler, which passes it on
    started = time.monotonic()
    assert ask(lp.client_via(leader), "zero") == "zero"
    assert time.monotonic() - started < HOLD_S
    up = lp.decisions_on(other, "up")
    assert len(up) == 1 and up[0]["reason"].startswith("a request at zero"), up
    assert lp.decisions_on(leader, "up") == []  # exactly one acted
    status = json.loads(lp.cli("status", "zero", "--json", "--decisions").stdout)["deployments"][0]
    assert [d["scaler"] for d in status["decisions"] if d["action"] == "up"] == [other.name]


def test_the_leaders_network_dies_it_stops_acting_and_the_server_frees_its_lock_within_seconds(
    lp: LockedGateways,
) -> None:
    lp.wait("a scaler holds the lock", lambda: lp.holder() is not None, 20)
    leader = lp.host_of(str(lp.holder()))
    other = lp.second if leader.name == lp.gateway.name else lp.gateway
    veth = f"{leader.name}-v"  # the leader's link on the fleet's bridge (tests/fleet.py): down, as a dead network
    subprocess.run(["ip", "link", "set", veth, "down"], check=True)
    try:
        cut = time.monotonic()
        # the server hears nothing more from the leader's session: its keepalives (5 s + 3 x 2 s) or its user
        # timeout (10 s) end it, which frees the lock; the other scaler takes it within its retry
        lp.wait("the other scaler holds the lock", lambda: lp.holder() == other.name, 30)
        took = time.monotonic() - cut
        print(f"the lock taken over {took:.1f} s after the leader's network died")
        assert took < 25, took
    finally:
        subprocess.run(["ip", "link", "set", veth, "up"], check=True)
    # the link back up, the first SSH connection may still fail (exit 255: one CI run); the test reads the leader's
    # state over SSH, so it waits for it first (what it checks is the scaler's, not the link's)
    back = time.monotonic()
    lp.wait("the leader's host answers SSH again", lambda: lp.fleet.ssh(leader, "true", check=False).returncode == 0,
            60)  # fmt: skip
    print(f"the leader's host answered SSH {time.monotonic() - back:.1f} s after its link came back")
    # the cut-off leader found its session dead on its own (no answer within 5 s) and stopped acting
    lp.wait("the old leader watches", lambda: lp.scaler_state_of(leader).get("lock", {}).get("holder") == other.name
            and not lp.scaler_state_of(leader)["lock"]["leader"], 30)  # fmt: skip
    lost = [d for d in lp.decisions_on(leader, "follow") if d["reason"].startswith("lost the PostgreSQL lock")]
    assert lost, lp.scaler_state_of(leader)
    assert lp.holder() == other.name  # and it did not take the lock back
