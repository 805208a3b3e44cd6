"""`import` after a lost state, with the real HAProxy gateway and the real scaler (issue 24, point 8): the state
rebuilt from what the hosts carry (the units' headers, the gateway's and the scaler's files) gives an empty, true
plan, with every deployment's ID, revision and scaling envelope kept, and the gateway adopted, not recreated."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from engine_ctl.core.render.scaler import SCALER_UNIT
from tests.fleet import Fleet
from tests.test_fleet_scaler import ScalerProject, ask

pytestmark = pytest.mark.fleet


def _docs(context: int, host: str, idle: int = 5) -> str:
    return f"""
        metadata: {{name: steady}}
        spec: {{model: tiny, accelerator: cpu, cpu_cores: 1, context_length: {context},
                replicas: {{min: 1, max: 2}}}}
        ---
        metadata: {{name: zero}}
        spec: {{model: tiny, accelerator: cpu, cpu_cores: 1, context_length: {context}, host: {host},
                replicas: {{min: 0, max: 1, idle_minutes: {idle}}}}}
        """


@pytest.fixture
def ip(fleet: Fleet, weights: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ScalerProject]:
    p = ScalerProject(tmp_path_factory.mktemp("import"), fleet)
    try:
        yield p
    finally:
        p.on_gateway(f"systemctl disable --now {SCALER_UNIT}", check=False)
        if (p.path / "engine-ctl.state.json").exists():
            p.cli("destroy", "--auto-approve")
        p.on_gateway("systemctl disable --now engine-ctl-gateway.service", check=False)


def _kept(state: dict) -> dict:  # type: ignore[type-arg]
    """What an import must give back: each deployment's ID, revision, state and replicas (their slots, hosts,
    ports, units and roles in the envelope), and each gateway's record."""
    keys = ("index", "slot", "host", "unit", "port", "unit_sha256", "revision", "on_demand", "argv")
    return {
        "deployments": {
            name: {
                "id": d.get("id", ""),
                "revision": d["revision"],
                "spec_hash": d["spec_hash"],
                "replicas": [{k: r.get(k) for k in keys} for r in d["replicas"]],
            }
            for name, d in state["deployments"].items()
        },
        "gateways": {
            name: {k: g[k] for k in ("endpoint", "files_sha256", "unit_sha256")}
            for name, g in state["gateways"].items()
        },
    }


def test_import_after_a_lost_state_adopts_the_gateway_and_keeps_ids_revisions_and_the_envelope(
    ip: ScalerProject,
) -> None:
    one = ip.fleet.hosts[1].name
    # three revisions of zero: two that roll its unit, then one in place (idle_minutes), which reaches no unit:
    # its header says revision 2, the scaler's state carries 3 beside the ID
    for context, idle in ((512, 5), (576, 5), (576, 6)):
        ip.write(_docs(context, one, idle))
        ip.cli("apply", "--auto-approve", check=True)
    ip.installed()
    state_file = ip.path / "engine-ctl.state.json"
    carried = {n: d["revision"] for n, d in json.loads(state_file.read_text())["deployments"].items()}
    assert carried["zero"] == 3, carried
    ip.wait("the scaler's state at the recorded revisions", lambda: {n: d.get("revision") for n, d in
            ip.scaler_state().get("deployments", {}).items()} == carried, 60)  # fmt: skip
    assert ask(ip.client(), "zero") == "zero"  # the scaler wakes the on-demand slot: it runs now
    assert ip.active("zero", 0)
    lost = json.loads(state_file.read_text())
    assert {r["revision"] for r in lost["deployments"]["zero"]["replicas"]} == {2}  # the unit's header: 2
    assert all(d.get("id") for d in lost["deployments"].values())
    before = ip.cli("plan", "--detailed-exitcode")
    assert before.returncode == 0, before.stdout + before.stderr
    pid = ip.on_gateway("systemctl show -p MainPID --value engine-ctl-gateway.service").stdout.strip()

    state_file.unlink()
    state_file.with_name(state_file.name + ".backup").unlink(missing_ok=True)
    imported = ip.cli("import", str(ip.docs), "--inventory", str(ip.inventory), check=True)
    assert "gateway" in imported.stdout and ip.gateway.name in imported.stdout, imported.stdout

    rebuilt = json.loads(state_file.read_text())
    assert rebuilt["lineage"] == lost["lineage"]
    assert _kept(rebuilt) == _kept(lost)
    after = ip.cli("plan", "--detailed-exitcode")
    assert after.returncode == 0, after.stdout + after.stderr
    assert "No changes." in after.stdout, after.stdout
    # and it is true: an apply does nothing, the gateway was not restarted, the woken slot still serves
    applied = ip.cli("apply", "--auto-approve", check=True)
    assert "No changes." in applied.stdout, applied.stdout
    assert ip.on_gateway("systemctl show -p MainPID --value engine-ctl-gateway.service").stdout.strip() == pid
    assert ip.active("zero", 0)
    assert ask(ip.client(), "steady") == "steady"


def test_import_keeps_the_id_of_a_fleet_with_only_always_on_deployments(ip: ScalerProject) -> None:
    """Issue 24 (stateful rule lose_state_then_import): with no deployment that scales there is no scaler, and
    so no scaler's state to carry IDs: import gave every deployment a new ID. Each unit's header carries its
    deployment's ID, as the plan named it before the first apply."""
    ip.write("""
        metadata: {name: always}
        spec: {model: tiny, accelerator: cpu, cpu_cores: 1, context_length: 512, replicas: {min: 1, max: 1}}
        """)
    ip.cli("apply", "--auto-approve", check=True)
    state_file = ip.path / "engine-ctl.state.json"
    lost = json.loads(state_file.read_text())
    ident = lost["deployments"]["always"]["id"]
    (replica,) = lost["deployments"]["always"]["replicas"]
    header = ip.fleet.ssh(ip.host_of(replica["host"]), f"head -8 /etc/systemd/system/{replica['unit']}").stdout
    assert f"# id: {ident}\n" in header, header
    assert ip.on_gateway(f"test -e /etc/systemd/system/{SCALER_UNIT}", check=False).returncode != 0  # no scaler
    state_file.unlink()
    state_file.with_name(state_file.name + ".backup").unlink(missing_ok=True)
    ip.cli("import", str(ip.docs), "--inventory", str(ip.inventory), check=True)
    rebuilt = json.loads(state_file.read_text())
    assert _kept(rebuilt) == _kept(lost)
    after = ip.cli("plan", "--detailed-exitcode")
    assert after.returncode == 0 and "No changes." in after.stdout, after.stdout + after.stderr


def test_import_after_a_stop_keeps_the_deployment_stopped(ip: ScalerProject) -> None:
    """`engine-ctl stop`, then the state lost and imported: the stop is on no unit's header, but the running
    gateway answers the deployment deployment_stopped (its stopped.map) and no unit of it runs. Before, import
    forgot the stop, and the next apply started the deployment and opened it in the gateway again (a probe, session
    17). Now import records it stopped, the plan holds it, and `start` brings it back."""
    ip.write("""
        metadata: {name: halted}
        spec: {model: tiny, accelerator: cpu, cpu_cores: 1, context_length: 512, replicas: {min: 1, max: 1}}
        """)
    ip.cli("apply", "--auto-approve", check=True)
    state_file = ip.path / "engine-ctl.state.json"
    (replica,) = json.loads(state_file.read_text())["deployments"]["halted"]["replicas"]
    host = ip.host_of(replica["host"])
    ip.cli("stop", "deployment", "halted", "--inventory", str(ip.inventory), check=True)
    ip.wait("the stop done", lambda: ip.fleet.ssh(host, f"systemctl is-active {replica['unit']}",
                                                   check=False).stdout.strip() == "inactive", 180)  # fmt: skip
    state_file.unlink()
    state_file.with_name(state_file.name + ".backup").unlink(missing_ok=True)
    imported = ip.cli("import", str(ip.docs), "--inventory", str(ip.inventory), check=True)
    assert f"halted: stopped by an operator (the gateway on {ip.gateway.name} answers it deployment_stopped" \
           in imported.stdout, imported.stdout  # fmt: skip
    assert json.loads(state_file.read_text())["deployments"]["halted"]["operator"]["verb"] == "stopped"
    after = ip.cli("plan", "--detailed-exitcode")
    assert after.returncode == 0 and "apply keeps it stopped" in after.stdout, after.stdout + after.stderr
    ip.cli("apply", "--auto-approve", check=True)
    assert ip.fleet.ssh(host, f"systemctl is-active {replica['unit']}", check=False).stdout.strip() == "inactive"
    ip.cli("start", "deployment", "halted", "--wait", "--inventory", str(ip.inventory), check=True)
    assert ask(ip.client(), "halted") == "halted"
