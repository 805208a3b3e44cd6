"""The scaling envelope in the plan (issue 12 §1-2), on synthetic facts built from recorded GPU tools' output
(tests/recordings): every slot up to max placed, always on below min and on demand above it; on-demand slots of
different deployments may share GPUs (the plan says where), always-on replicas never share; priority orders
placement; changing min or max restarts nothing; an on-demand unit's activity is never drift; its gateway server
is in maintenance unless it runs."""

from __future__ import annotations

from pathlib import Path

from engine_ctl.cli.views.plan import plan_text
from engine_ctl.core.documents.inventory import Host, Inventory
from engine_ctl.core.documents.loader import load_documents
from engine_ctl.core.documents.yamlsource import parse_text
from engine_ctl.core.fit.hostfacts import HostFacts, UnitFact
from engine_ctl.core.plan.changes import DeploymentChange, Plan
from engine_ctl.core.plan.envelope import gpu_list
from engine_ctl.core.plan.gateway import blind, gateway_after_apply, gateway_tampering
from engine_ctl.core.plan.planner import make_plan
from engine_ctl.core.plan.scaler import scaler_deployments
from engine_ctl.core.plan.status import deployment_status, recorded_verdict
from engine_ctl.core.record.model import GatewayRecord, OperatorAction, ReplicaRecord, State
from engine_ctl.core.render.gateway import GATEWAY_UNIT
from engine_ctl.core.render.scaler import SCALER_UNIT, ScalerDeployment, deployments_digest, render_config
from engine_ctl.shell.remote.facts_probe import scaler_config as probe_scaler_config
from tests.fleetfacts import cpu_host, h100x8
from tests.test_plan_core import SHAPE, applied

MODEL = "kind: Model\nmetadata: {name: m}\nspec: {format: gguf, path: m/m.gguf, context_length: 32768}\n"


def desired(**specs: str):  # type: ignore[no-untyped-def]
    """Deployments of model m by name -> their spec's fields."""
    text = MODEL + "".join(f"---\nmetadata: {{name: {n}}}\nspec: {{model: m, {s}}}\n" for n, s in specs.items())
    docs, _ = parse_text(text, "d.yaml")
    return load_documents(docs).desired


def world(*facts: HostFacts, gateway: bool = False) -> tuple[Inventory, dict[str, HostFacts]]:
    hosts = [Host(name=f.host, address=f"10.0.0.{i + 5}", models_dir="/srv/models") for i, f in enumerate(facts)]
    out = {f.host: f for f in facts}
    if gateway:
        hosts.append(Host(name="edge", address="10.0.0.2", roles=("gateway",)))
        out["edge"] = cpu_host("edge").model_copy(update={"haproxy_version": "HAProxy version 2.6"})
    return Inventory(hosts=tuple(hosts)), out


def plan(state: State, facts: dict[str, HostFacts], gateway: bool = False, **specs: str) -> Plan:
    inv, _ = world(*[f for n, f in facts.items() if n != "edge"], gateway=gateway)
    return make_plan(desired(**specs), state, inv, facts, {"m": SHAPE})


def change(p: Plan, name: str) -> DeploymentChange:
    return next(c for c in p.changes if c.name == name)


def with_unit(facts: dict[str, HostFacts], host: str, unit: str, active: bool) -> dict[str, HostFacts]:
    """The host's facts with `unit` active (the scaler started it) or inactive."""
    hf = facts[host]
    units = [u for u in hf.units if u.name != unit]
    old = next(u for u in hf.units if u.name == unit)
    units.append(old.model_copy(update={"active_state": "active" if active else "inactive",
                                        "sub_state": "running" if active else "dead"}))  # fmt: skip
    return {**facts, host: hf.model_copy(update={"units": tuple(units)})}


# --- the envelope: every slot placed --------------------------------------------------------------------------


def test_every_slot_up_to_max_is_placed_those_above_min_on_demand_and_listed_in_the_plan() -> None:
    h = h100x8()
    _, facts = world(h)
    p = plan(State(), facts, chat="gpus: 2, replicas: {min: 1, max: 3}")
    c = change(p, "chat")
    assert [(r.index, r.action, r.on_demand) for r in c.replicas] == [
        (0, ["create"], False), (1, ["create"], True), (2, ["create"], True),
    ]  # fmt: skip
    assert [(s.index, s.on_demand, s.gpu_indexes) for s in c.envelope] == [
        (0, False, [0, 1]), (1, True, [2, 3]), (2, True, [4, 5]),
    ]  # fmt: skip
    text = plan_text(p)
    assert "chat: replicas 1..3: 1 always on, 2 on demand (installed; the scaler starts them):" in text
    assert "  replica 0 on gpu-h100 GPUs 0–1: always on" in text
    assert "  replica 2 on gpu-h100 GPUs 4–5: on demand" in text
    assert "installed, not started (the scaler starts it)" in text
    assert text.rstrip().endswith("Replicas: 1 to start, 2 to install.")
    assert len({r.port for r in c.replicas}) == 3  # every unit installed has its own port


def test_min_zero_makes_every_slot_on_demand_and_min_equal_max_shows_no_envelope() -> None:
    _, facts = world(h100x8())
    zero = change(plan(State(), facts, chat="gpus: 1, replicas: {min: 0, max: 2}"), "chat")
    assert [s.on_demand for s in zero.envelope] == [True, True]
    assert all(r.on_demand for r in zero.replicas)
    fixed = change(plan(State(), facts, chat="gpus: 1, replicas: {min: 2, max: 2}"), "chat")
    assert fixed.envelope == [] and not any(r.on_demand for r in fixed.replicas)


def test_gpu_list_names_ranges_with_a_dash() -> None:
    assert (gpu_list([2, 3]), gpu_list([0, 2]), gpu_list([1]), gpu_list([4, 5, 6, 7])) == ("2–3", "0, 2", "1", "4–7")


# --- GPUs free at zero: overlap -------------------------------------------------------------------------------


def test_on_demand_slots_of_two_deployments_share_gpus_always_on_ones_never_do() -> None:
    _, facts = world(h100x8())
    p = plan(
        State(), facts,
        big="gpus: 4, replicas: {min: 1, max: 1}",
        a="gpus: 4, replicas: {min: 0, max: 1}",
        b="gpus: 4, replicas: {min: 0, max: 1}",
    )  # fmt: skip
    big, a, b = (change(p, n).replicas[0] for n in ("big", "a", "b"))
    assert set(big.gpus).isdisjoint(a.gpus) and set(big.gpus).isdisjoint(b.gpus)
    assert a.gpus == b.gpus  # both on demand: they may share the 4 GPUs the always-on replica leaves
    assert a.port != b.port
    (slot_a,) = change(p, "a").envelope
    assert slot_a.shares == ["GPUs 4–7 with b replica 0"]
    assert "  replica 0 on gpu-h100 GPUs 4–7: on demand, shares GPUs 4–7 with a replica 0" in plan_text(p)


def test_always_on_replicas_are_placed_before_any_on_demand_slot_whatever_the_priority() -> None:
    _, facts = world(h100x8())
    p = plan(
        State(), facts,
        hi="gpus: 8, priority: 10, replicas: {min: 0, max: 1}",
        lo="gpus: 8, replicas: {min: 1, max: 1}",
    )  # fmt: skip
    assert change(p, "lo").replicas[0].action == ["create"]
    hi = change(p, "hi")
    assert hi.replicas == [] and hi.pending_reason is None
    # at min 0 with no slot placed hi can never wake: a problem of the plan (issue 24), not a mere warning
    assert any("on-demand replica 0 has no place" in b for b in hi.blocked)


def test_priority_orders_placement_the_higher_first() -> None:
    _, facts = world(h100x8())
    p = plan(State(), facts, alpha="gpus: 8", zeta="gpus: 8, priority: 5")
    assert [c.name for c in p.changes] == ["zeta", "alpha"]
    assert change(p, "zeta").replicas and change(p, "alpha").pending_reason
    # on demand too: both placed (they share), the higher one's slot first
    q = plan(State(), facts, alpha="gpus: 8, replicas: {min: 0, max: 1}",
             zeta="gpus: 8, priority: 5, replicas: {min: 0, max: 1}")  # fmt: skip
    assert change(q, "zeta").envelope[0].shares == ["GPUs 0–7 with alpha replica 0"]


def test_cpu_on_demand_slots_share_host_memory_when_both_do_not_fit() -> None:
    host = cpu_host("cpu-01", cores=16, memory_gib=16)
    _, facts = world(host)
    spec = "accelerator: cpu, cpu_cores: 12, context_length: 2048, replicas: {min: 0, max: 1}"
    p = plan(State(), facts, a=spec, b=spec)
    (slot,) = change(p, "a").envelope
    assert slot.shares == ["host memory and cores with b replica 0"]
    assert "cores" in plan_text(p) and "shares host memory and cores with a replica 0" in plan_text(p)


def test_an_on_demand_slot_moves_off_gpus_a_new_always_on_replica_takes() -> None:
    h = h100x8()
    _, facts = world(h)
    first = plan(State(), facts, od="gpus: 4, replicas: {min: 0, max: 1}")
    state, facts = applied(first, State(), facts)
    before = state.deployments["od"].replicas[0].gpus
    # a new always-on deployment of a higher priority takes the GPUs of the (stopped) on-demand slot
    second = plan(state, facts, od="gpus: 4, replicas: {min: 0, max: 1}", big="gpus: 4, priority: 5")
    big = change(second, "big").replicas[0]
    od = change(second, "od")
    assert big.gpus == before
    (moved,) = od.replicas
    assert moved.on_demand and moved.replaces and set(moved.gpus).isdisjoint(before)


# --- changing min or max restarts nothing ---------------------------------------------------------------------


def test_raising_max_installs_new_on_demand_units_and_touches_no_running_replica() -> None:
    _, facts = world(h100x8())
    first = plan(State(), facts, chat="gpus: 1, replicas: {min: 1, max: 1}")
    state, facts = applied(first, State(), facts)
    more = change(plan(state, facts, chat="gpus: 1, replicas: {min: 1, max: 3}"), "chat")
    assert [(r.index, r.action, r.on_demand) for r in more.replicas] == [(1, ["create"], True), (2, ["create"], True)]
    assert more.action == ["update"] and [f.path for f in more.field_changes] == ["spec.replicas.max"]
    state, facts = applied(plan(state, facts, chat="gpus: 1, replicas: {min: 1, max: 3}"), state, facts)
    assert not plan(state, facts, chat="gpus: 1, replicas: {min: 1, max: 3}").has_changes
    fewer = change(plan(state, facts, chat="gpus: 1, replicas: {min: 1, max: 2}"), "chat")
    assert [(r.index, r.action) for r in fewer.replicas] == [(2, ["delete"])]


def test_lowering_min_makes_a_replica_on_demand_without_stopping_it() -> None:
    _, facts = world(h100x8())
    state, facts = applied(plan(State(), facts, chat="gpus: 1, replicas: {min: 2, max: 2}"), State(), facts)
    c = change(plan(state, facts, chat="gpus: 1, replicas: {min: 1, max: 2}"), "chat")
    (r,) = c.replicas
    assert (r.index, r.action, r.role, r.on_demand, r.active) == (1, ["update"], "on-demand", True, True)
    text = plan_text(plan(state, facts, chat="gpus: 1, replicas: {min: 1, max: 2}"))
    assert "now on demand: disabled, left running" in text and "Replicas:" not in text  # nothing starts or stops


# --- on-demand units: activity is not drift; a spec change rolls only what runs --------------------------------


def test_an_on_demand_unit_active_or_inactive_is_never_drift_but_an_always_on_one_stopped_is() -> None:
    _, facts = world(h100x8())
    spec = "gpus: 1, replicas: {min: 1, max: 2}"
    state, facts = applied(plan(State(), facts, chat=spec), State(), facts)
    od = state.deployments["chat"].replicas[1]
    assert od.on_demand and od.status == "standby"
    for active in (True, False):
        seen = with_unit(facts, "gpu-h100", od.unit, active)
        p = plan(state, seen, chat=spec)
        assert not p.drift and not p.has_changes
    always = state.deployments["chat"].replicas[0]
    stopped = with_unit(facts, "gpu-h100", always.unit, False)
    assert [d.kind for d in plan(state, stopped, chat=spec).drift] == ["stopped"]


def test_a_spec_change_rolls_an_on_demand_replica_the_scaler_runs_and_only_reinstalls_an_idle_one() -> None:
    _, facts = world(h100x8())
    spec = "gpus: 1, context_length: 4096, replicas: {min: 0, max: 2}"
    state, facts = applied(plan(State(), facts, chat=spec), State(), facts)
    running = with_unit(facts, "gpu-h100", state.deployments["chat"].replicas[0].unit, True)
    c = change(plan(state, running, chat=spec.replace("4096", "8192")), "chat")
    assert [(r.index, r.replaces, r.on_demand, r.active) for r in c.replicas] == [
        (0, True, True, True), (1, True, True, False),
    ]  # fmt: skip
    assert "rolled if the scaler runs it, else only installed" in c.replicas[1].reason


# --- the gateway: on-demand servers in maintenance unless they run --------------------------------------------


def gateway_applied(p: Plan, state: State, facts: dict[str, HostFacts]) -> tuple[State, dict[str, HostFacts]]:
    state, facts = applied(p, state, facts)
    inv, _ = world(facts["gpu-h100"], gateway=True)
    for g in p.gateways:
        final = gateway_after_apply(inv.host(g.host), state, {h.name: h for h in inv.hosts}, g)  # type: ignore[arg-type]
        state.gateways[g.host] = GatewayRecord(
            endpoint=g.endpoint, files_sha256=final.file_sha256, unit_sha256=final.unit_sha256,
            config=final.files["haproxy.cfg"],
        )  # fmt: skip
        facts[g.host] = facts[g.host].model_copy(update={
            "gateway_files": final.file_sha256,
            "gateway_maps": {},  # it answers on its admin socket
            "units": (UnitFact(name=GATEWAY_UNIT, sha256=final.unit_sha256, active_state="active"),
                      *([UnitFact(name=SCALER_UNIT, active_state="active")] if p.scaler else [])),
        })  # fmt: skip
    return state, facts


def server_lines(config: str) -> list[str]:
    return [line.strip() for line in config.splitlines() if line.strip().startswith("server ")]


def test_an_on_demand_server_is_in_maintenance_unless_its_unit_runs_and_the_scaler_running_it_changes_nothing() -> None:
    _, facts = world(h100x8(), gateway=True)
    spec = "gpus: 1, replicas: {min: 1, max: 2}"
    p = plan(State(), facts, gateway=True, chat=spec)
    (g,) = p.gateways
    lines = server_lines(g.files["haproxy.cfg"])
    assert not lines[0].endswith(" disabled") and lines[1].endswith(" disabled")
    state, facts = gateway_applied(p, State(), facts)
    assert server_lines(state.gateways["edge"].config)[1].endswith(" disabled")
    unit = state.deployments["chat"].replicas[1].unit
    running = with_unit(facts, "gpu-h100", unit, True)
    again = plan(state, running, gateway=True, chat=spec)
    (g2,) = again.gateways
    assert not server_lines(g2.files["haproxy.cfg"])[1].endswith(" disabled")  # rendered as it runs
    assert g2.action == ["no-op"] and not again.has_changes  # but nothing to apply: the scaler's doing
    assert gateway_tampering(again.gateways, again.changes, state, world(facts["gpu-h100"], gateway=True)[0]) == []


def test_a_scaler_that_does_not_run_is_a_change_apply_makes() -> None:
    """Issue 24's soak (seed 7, step 198): an apply killed before its scaler step left the scaler never started;
    the plan said No changes while every request to the deployment at zero got 503 after the hold."""
    _, facts = world(h100x8(), gateway=True)
    spec = "gpus: 1, replicas: {min: 0, max: 2}"
    state, facts = gateway_applied(plan(State(), facts, gateway=True, chat=spec), State(), facts)
    again = plan(state, facts, gateway=True, chat=spec)
    assert again.scaler is not None and again.scaler.stopped == [] and not again.has_changes
    for active in (None, "inactive", "failed"):
        units = tuple(u for u in facts["edge"].units if u.name != SCALER_UNIT)
        if active is not None:
            units += (UnitFact(name=SCALER_UNIT, active_state=active),)
        gone = {**facts, "edge": facts["edge"].model_copy(update={"units": units})}
        stopped = plan(state, gone, gateway=True, chat=spec)
        assert stopped.scaler is not None and stopped.scaler.stopped == ["edge"], active
        assert stopped.has_changes and stopped.summary() == {"add": 0, "change": 0, "destroy": 0}
    restarting = tuple(u for u in facts["edge"].units if u.name != SCALER_UNIT)
    restarting += (UnitFact(name=SCALER_UNIT, active_state="activating", sub_state="auto-restart"),)
    back = plan(state, {**facts, "edge": facts["edge"].model_copy(update={"units": restarting})}, gateway=True,
                chat=spec)  # fmt: skip
    assert back.scaler is not None and back.scaler.stopped == [] and not back.has_changes  # systemd brings it back


def test_a_deployment_an_operator_stopped_or_deleted_needs_no_scaler_until_it_is_started() -> None:
    """Issue 24's soak (seed 7, steps 168-194 and 244): `delete --stop` of every deployment, then `min: 0` in the
    document of one. apply leaves a held deployment's replicas as they are and configures the scaler from what is
    recorded (no slot on demand: no scaler), while the plan expected a scaler from the document: "The scaler to
    start", exit 2, after every apply that exited 0. The plan now expects what apply leaves."""
    _, facts = world(h100x8(), gateway=True)
    always = "gpus: 1, replicas: {min: 1, max: 1}"
    state, facts = gateway_applied(plan(State(), facts, gateway=True, chat=always), State(), facts)
    assert plan(state, facts, gateway=True, chat=always).scaler is None
    for verb in ("stopped", "deleted"):
        held = state.model_copy(deep=True)
        rec = held.deployments["chat"]
        held.deployments["chat"] = rec.model_copy(update={"operator": OperatorAction(verb=verb, when="2026-12-04")})
        zero = plan(held, facts, gateway=True, chat="gpus: 1, replicas: {min: 0, max: 2}")
        hosts = {h.name: h for h in world(h100x8(), gateway=True)[0].hosts}
        assert scaler_deployments(held, hosts) == []  # what apply's scaler step gives the scaler: nothing
        assert zero.scaler is None, (verb, zero.scaler)
        assert "scaler to start" not in plan_text(zero) and "# scaler on" not in plan_text(zero), plan_text(zero)
    parked_state = state.model_copy(deep=True)  # parked: the scaler wakes it on a request, whatever the document
    rec = parked_state.deployments["chat"]
    parked_state.deployments["chat"] = rec.model_copy(
        update={"operator": OperatorAction(verb="parked", when="2026-12-04", level=1)}
    )
    asleep = plan(parked_state, facts, gateway=True, chat="gpus: 1, replicas: {min: 0, max: 2}")
    assert asleep.scaler is not None and asleep.scaler.deployments == ["chat"]


SCALED = "gpus: 1, replicas: {min: 0, max: 2}"


def scaled_to_zero() -> tuple[str, State, dict[str, HostFacts], list[ScalerDeployment]]:
    """A min-0 deployment behind a gateway, applied: its spec, the state, the facts, and what the scaler is given."""
    _, facts = world(h100x8(), gateway=True)
    state, facts = gateway_applied(plan(State(), facts, gateway=True, chat=SCALED), State(), facts)
    inv = world(h100x8(), gateway=True)[0]
    return SCALED, state, facts, scaler_deployments(state, {h.name: h for h in inv.hosts})


def test_a_scaler_configured_with_other_deployments_than_recorded_is_a_change(tmp_path: Path) -> None:
    """Issue 24's soak (seed 7, step 198): `start` of a deleted min-0 deployment, then an apply killed after it
    installed and routed the replica but before its scaler step. The scaler ran, without the deployment: the plan
    said No changes and every request 503 after the hold. The host's scaler.json is read (its deployments'
    digest, by the facts probe) and compared with what the recorded deployments give."""
    spec, state, facts, recorded = scaled_to_zero()
    config = tmp_path / "scaler.json"
    config.write_text(render_config(recorded))  # what apply writes; the probe reads it back
    digest = probe_scaler_config(str(config))["deployments_sha256"]
    assert digest == deployments_digest(recorded)
    same = {**facts, "edge": facts["edge"].model_copy(update={"scaler_config_sha256": digest})}
    again = plan(state, same, gateway=True, chat=spec)
    assert again.scaler is not None and again.scaler.stale == [] and not again.has_changes
    config.write_text(render_config([]))  # the scaler knows nothing of chat
    other = {**facts, "edge": facts["edge"].model_copy(
        update={"scaler_config_sha256": probe_scaler_config(str(config))["deployments_sha256"]})}  # fmt: skip
    stale = plan(state, other, gateway=True, chat=spec)
    assert stale.scaler is not None and stale.scaler.stale == ["edge"] and stale.has_changes
    text = plan_text(stale)
    assert "The scaler's configuration to rewrite on edge." in text and "apply rewrites its configuration" in text


def test_a_scaler_json_with_other_settings_unreadable_or_gone_is_a_change(tmp_path: Path) -> None:
    """The scaler's whole configuration, not only its deployments: the inventory's scaling.poll_s changed alone,
    a scaler.json edited into something that is not its JSON, or deleted beside its running unit (the scaler then
    restarts again and again, `activating`, which counts as running). Each file is what the probe reads back."""
    spec, state, facts, recorded = scaled_to_zero()
    config = tmp_path / "scaler.json"
    scaler = UnitFact(name=SCALER_UNIT, sha256="c" * 64, active_state="activating")

    def planned(text: str | None) -> Plan:
        if text is None:
            config.unlink(missing_ok=True)
        else:
            config.write_text(text)
        read = probe_scaler_config(str(config)) or {}
        edge = facts["edge"].model_copy(update={
            "scaler_config_sha256": read.get("deployments_sha256"), "scaler_settings": read.get("settings"),
            "scaler_config_unreadable": bool(read.get("unreadable")),
            "units": (*[u for u in facts["edge"].units if u.name != SCALER_UNIT], scaler),
        })  # fmt: skip
        return plan(state, {**facts, "edge": edge}, gateway=True, chat=spec)

    assert not planned(render_config(recorded)).has_changes  # as apply writes it (the inventory's defaults)
    for text in (render_config(recorded, poll_s=7), render_config(recorded, hold_s=5), "{not json", "[]", None):
        p = planned(text)
        assert p.scaler is not None and p.scaler.stale == ["edge"] and p.has_changes, text
        assert "apply rewrites its configuration and restarts it" in plan_text(p)


def test_blind_drops_only_the_named_servers_maintenance_flag() -> None:
    text = "backend d_a\n    server r1a 1.2.3.4:8001 maxconn 1 disabled\n"
    text += "backend d_b\n    server r1a 1:2 maxconn 1 disabled"
    text = "# content-sha256: 00ff\n" + text
    state = "1 d_a 2 r1a 1.2.3.4 0 4 1 1 0 8 2 0 6 0 0 0 - 8001 - 0 0 - - 0"
    assert blind(state, {("d_a", "r1a")}) == blind(state.replace(" 0 4 1 ", " 0 0 1 "), {("d_a", "r1a")})
    assert blind(state, set()) != blind(state.replace(" 0 4 1 ", " 0 0 1 "), set())
    assert blind(text, {("d_a", "r1a")}).splitlines() == [
        "backend d_a", "    server r1a 1.2.3.4:8001 maxconn 1", "backend d_b", "    server r1a 1:2 maxconn 1 disabled",
    ]  # fmt: skip


# --- states -----------------------------------------------------------------------------------------------------


def test_min_zero_with_nothing_running_is_scaled_to_zero_and_idle_on_demand_units_are_not_failures() -> None:
    _, facts = world(h100x8())
    state, facts = applied(plan(State(), facts, chat="gpus: 1, replicas: {min: 0, max: 2}"), State(), facts)
    rec = state.deployments["chat"]
    assert recorded_verdict(rec.replicas, 0, rec.revision).state == "ScaledToZero"
    assert deployment_status(rec, facts).state == "ScaledToZero"
    running = with_unit(facts, "gpu-h100", rec.replicas[0].unit, True)
    live = facts["gpu-h100"].model_copy(update={"health": {str(rec.replicas[0].port): "200"}})
    running["gpu-h100"] = running["gpu-h100"].model_copy(update={"health": live.health})
    shown = deployment_status(rec, running)
    assert (shown.state, shown.ready, shown.replicas) == ("Ready", 1, 1)
    one = [ReplicaRecord(index=0, host="h", unit="engine-ctl-chat-0a.service", port=8000, unit_sha256="",
                         revision=1, status="serving")]  # fmt: skip
    assert recorded_verdict(one, 1, 1).state == "Ready"


def test_the_pull_request_markdown_shows_the_envelope_of_a_changed_deployment() -> None:
    from engine_ctl.cli.views.plan import plan_markdown

    _, facts = world(h100x8())
    md = plan_markdown(plan(State(), facts, chat="gpus: 2, replicas: {min: 1, max: 2}"))
    assert "```text\nchat: replicas 1..2: 1 always on, 1 on demand" in md
    assert "  replica 1 on gpu-h100 GPUs 2–3: on demand\n```" in md


def test_without_a_gateway_host_the_plan_warns_that_only_min_replicas_run() -> None:
    _, facts = world(h100x8())
    alone = change(plan(State(), facts, chat="gpus: 1, replicas: {min: 1, max: 3}"), "chat")
    assert any("only the scaler starts them; it runs on a gateway host" in w and "1 replica will run" in w
               for w in alone.warnings)  # fmt: skip
    _, with_gateway = world(h100x8(), gateway=True)
    served = change(plan(State(), with_gateway, gateway=True, chat="gpus: 1, replicas: {min: 1, max: 3}"), "chat")
    assert not any("gateway host" in w for w in served.warnings)
    fixed = change(plan(State(), facts, chat="gpus: 1, replicas: {min: 2, max: 2}"), "chat")
    assert not any("gateway host" in w for w in fixed.warnings)


def test_the_scaler_unit_on_a_gateway_host_is_never_listed_as_unmanaged() -> None:
    _, facts = world(h100x8(), gateway=True)
    scaler = UnitFact(name="engine-ctl-scaler.service", sha256="0" * 64, active_state="active")
    facts["edge"] = facts["edge"].model_copy(update={"units": (scaler,)})
    p = plan(State(), facts, gateway=True, chat="gpus: 1, replicas: {min: 0, max: 1}")
    assert not [d for d in p.drift if d.unit == "engine-ctl-scaler.service"]


def test_two_on_demand_slots_that_both_become_always_on_do_not_share_the_lower_priority_one_moves() -> None:
    _, facts = world(h100x8())
    both = {"a": "gpus: 8, priority: 5, replicas: {min: 0, max: 1}", "b": "gpus: 4, replicas: {min: 0, max: 1}"}
    state, facts = applied(plan(State(), facts, **both), State(), facts)
    shared = set(state.deployments["a"].replicas[0].gpus) & set(state.deployments["b"].replicas[0].gpus)
    assert len(shared) == 4  # on demand: they overlap
    always = {n: s.replace("min: 0", "min: 1") for n, s in both.items()}
    p = plan(state, facts, **always)
    a, b = change(p, "a"), change(p, "b")
    assert [r.role for r in a.replicas] == ["always-on"]  # the higher priority keeps its GPUs, started in place
    assert b.pending_reason and not any(r.action == ["update"] for r in b.replicas)  # no room left: it waits


def test_an_interrupted_stop_then_start_is_not_a_displacement() -> None:
    _, facts = world(h100x8())
    state, facts = applied(plan(State(), facts, chat="gpus: 8"), State(), facts)
    rec = state.deployments["chat"]
    old = rec.replicas[0].model_copy(update={"slot": "b", "unit": rec.replicas[0].unit.replace("0a", "0b"),
                                             "status": "stopped"})  # fmt: skip
    rec.replicas.append(old)
    p = plan(state, facts, chat="gpus: 8")
    (c,) = p.changes
    assert [(r.action, r.unit) for r in c.replicas] == [(["delete"], old.unit)]  # only the leftover goes
