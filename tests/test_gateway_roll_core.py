"""The gateway's plan through kills and lifecycle moves (pure core, and the real `haproxy -c` on what it renders):
one server per name when a kill left a replica's slot on two hosts (issue 24, point 1), and a deployment an
operator deleted is not routed at all (point 6: 404 model_not_found at once, never held)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from engine_ctl.core.documents.inventory import Host, Inventory
from engine_ctl.core.model import ApiKey
from engine_ctl.core.plan.changes import DeploymentChange, ReplicaChange
from engine_ctl.core.plan.gateway import backends_from_state, plan_gateways
from engine_ctl.core.record.model import DeploymentRecord, OperatorAction, ReplicaRecord, State
from engine_ctl.core.render.gateway import HAPROXY, RUN_DIR

INVENTORY = Inventory(
    hosts=(
        Host(name="edge", address="10.0.0.2", roles=("gateway",)),
        Host(name="cpu-1", address="10.0.0.5"),
        Host(name="cpu-2", address="10.0.0.6"),
    )
)


def replica(index: int, slot: str, host: str, status: str = "serving") -> ReplicaRecord:
    return ReplicaRecord(index=index, slot=slot, host=host, unit=f"engine-ctl-chat-{index}{slot}.service",
                         port=8000 + index, unit_sha256="", revision=2, status=status)  # fmt: skip


def haproxy_check(files: dict[str, str], where: Path) -> subprocess.CompletedProcess[str]:
    """The real HAProxy's `haproxy -c` on a rendered gateway (its run directory moved under `where`)."""
    run = where / "run"
    run.mkdir(parents=True, exist_ok=True)
    (run / "internal.map").write_text("gateway " + "0" * 64 + "\n")
    for name, text in files.items():
        (where / name).write_text(text.replace(RUN_DIR, str(run)))
    return subprocess.run([HAPROXY, "-c", "-f", str(where / "haproxy.cfg")], capture_output=True, text=True)


def test_a_slot_left_on_another_host_by_a_kill_is_one_server_and_haproxy_accepts_it(tmp_path: Path) -> None:
    """A kill mid-roll left replica 1's new slot `b` recorded on cpu-2 (starting); the recovery plan starts slot
    `b` of replica 1 on cpu-1. The gateway names servers r<index><slot>: one `server r1b`, not two."""
    rec = DeploymentRecord(name="chat", revision=2, replicas=[replica(0, "a", "cpu-1"), replica(1, "a", "cpu-1",
                           "stopped"), replica(1, "b", "cpu-2", "starting")])  # fmt: skip
    again = ReplicaChange(action=["delete", "create"], index=1, slot="b", old_slot="a", host="cpu-1",
                          unit="engine-ctl-chat-1b.service", port=8001, revision=2)  # fmt: skip
    change = DeploymentChange(name="chat", action=["update"], revision=2, replicas=[again])
    (g,), _ = plan_gateways([change], State(deployments={"chat": rec}), INVENTORY, {}, [])
    assert g.interim_files is not None
    for n, files in enumerate((g.interim_files, g.files)):
        config = files["haproxy.cfg"]
        assert config.count("server r1b ") == 1 and "server r1b 10.0.0.5:8001" in config, config
        checked = haproxy_check(files, tmp_path / str(n))
        assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "server r1a " not in g.files["haproxy.cfg"]


def test_a_deleted_deployment_is_not_routed() -> None:
    deleted = DeploymentRecord(name="gone", revision=3, operator=OperatorAction(verb="deleted", when="t"))
    served = DeploymentRecord(name="chat", revision=2, replicas=[replica(0, "a", "cpu-1")])
    state = State(deployments={"gone": deleted, "chat": served})
    keys = [ApiKey(name="all", sha256="a" * 64)]
    (g,), _ = plan_gateways([DeploymentChange(name="gone", action=["no-op"])], state, INVENTORY, {}, keys)
    assert g.maps["models.map"] == {"chat": "d_chat"} and "d_gone" not in g.files["haproxy.cfg"]
    # the delete leaves the key maps as they were (the gateway answers 404 on models.map alone)
    assert g.maps["scopes.map"] == {"all/chat": "1", "all/gone": "1", "@internal/chat": "1", "@internal/gone": "1"}
    assert [b.deployment for b in backends_from_state(state, {h.name: h for h in INVENTORY.hosts})] == ["chat"]


def test_destroy_deletes_every_set_up_gateway_and_clears_only_what_is_this_states() -> None:
    from engine_ctl.cli.plan_cmd import for_destroy
    from engine_ctl.core.plan.changes import Plan
    from engine_ctl.core.plan.gateway import GatewayChange
    from engine_ctl.shell.gateway.teardown import teardown_script

    gateways = [GatewayChange(host="edge", action=["update"], endpoint="e:8800"),
                GatewayChange(host="new", action=["create"], endpoint="n:8800"),
                GatewayChange(host="old", action=["delete"], endpoint="o:8800")]  # fmt: skip
    plan = Plan(state_serial=1, state_lineage="l", gateways=gateways)
    assert [(g.host, g.action) for g in for_destroy(plan).gateways] == [("edge", ["delete"]), ("old", ["delete"])]
    targeted = plan.model_copy(update={"targets": ["chat"]})
    assert for_destroy(targeted).gateways == gateways  # --target: the gateways only lose that deployment
    everything = teardown_script(gateway=True, shared=False)
    assert "engine-ctl-gateway.service" in everything and "/etc/engine-ctl/replica-key" in everything
    assert "engine-ctl-scaler" in everything and "/usr/local/lib/engine-ctl/scaler-command" in everything
    elsewhere = teardown_script(gateway=False, shared=True)  # another state's units (and maybe gateway) there
    assert "engine-ctl-gateway" not in elsewhere and "replica-key" not in elsewhere
    assert "authorized_keys" not in elsewhere
