"""The pure core under the trust and fault rules: saved plans (lineage, staleness, tampering), the one verdict
that apply records and status shows, replicas out of reach, failures that clear, kept choices, and the engine's
own words in a failure. Synthetic facts from recorded GPU tool output (tests/recordings/README.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from engine_ctl.cli.views.plan import argv_groups, plan_text
from engine_ctl.core.fit.hostfacts import HostFacts
from engine_ctl.core.plan.planner import Plan, make_plan
from engine_ctl.core.plan.savedplan import decode_plan, stale_reasons, state_for_plan, tampering
from engine_ctl.core.plan.status import verdict
from engine_ctl.core.record.model import State
from engine_ctl.shell.apply import failure_reason
from tests.fleetfacts import cpu_host, gpu_host, h100x8
from tests.test_plan_core import SHAPE, applied, desired, plan_for, world

CPU = "accelerator: cpu, context_length: 1024"


def _fingerprints(facts: dict[str, HostFacts]) -> dict[str, str | None]:
    return {h: f.fingerprint() for h, f in facts.items()}


# --- saved plans -----------------------------------------------------------------------------------------
def test_the_first_plan_of_a_fresh_repository_applies_once_and_then_is_stale() -> None:
    h = cpu_host()
    fresh_at_plan = State()
    saved = plan_for(CPU, fresh_at_plan, h)
    fresh_at_apply = State()  # a second read of the missing state: a new random lineage
    assert fresh_at_apply.lineage != saved.state_lineage
    adopted = state_for_plan(saved, fresh_at_apply)
    assert adopted.lineage == saved.state_lineage
    assert stale_reasons(saved, adopted, _fingerprints({h.host: h})) == []
    # once written (serial 1), the same plan is stale, and a written state never takes a plan's lineage
    written = adopted.model_copy(update={"serial": 1})
    assert state_for_plan(saved, written).lineage == saved.state_lineage
    assert any("serial 0 → 1" in why for why in stale_reasons(saved, written, _fingerprints({h.host: h})))
    other = State(serial=3)
    assert state_for_plan(saved, other).lineage == other.lineage


def test_a_plan_file_round_trips_and_a_newer_format_is_refused() -> None:
    saved = plan_for(CPU, State(), cpu_host())
    text = json.dumps(saved.model_dump(mode="json"))
    again = decode_plan(text)
    assert again is not None and again.digest() == saved.digest()
    assert decode_plan("kind: Model\n") is None
    raw = json.loads(text)
    raw["format_version"] = 99
    try:
        decode_plan(json.dumps(raw))
    except Exception as exc:
        assert "newer engine-ctl" in str(exc)
    else:
        raise AssertionError("a plan from a newer engine-ctl was accepted")


def _saved(spec: str, *facts: HostFacts) -> tuple[Plan, dict[str, object]]:
    inv, _ = world(*facts)
    plan = plan_for(spec, State(), *facts)
    return Plan.model_validate(json.loads(plan.model_dump_json())), {h.name: h for h in inv.hosts}


def test_an_untouched_saved_plan_is_engine_ctls_own() -> None:
    plan, hosts = _saved("gpus: 1, replicas: {min: 2, max: 2}", h100x8())
    assert plan.changes[0].replicas and all(r.placement is not None for r in plan.changes[0].replicas)
    assert tampering(plan, hosts) == []  # type: ignore[arg-type]


def test_an_edited_unit_in_a_saved_plan_is_refused() -> None:
    plan, hosts = _saved(CPU, cpu_host())
    step = plan.changes[0].replicas[0]
    assert step.unit_text is not None
    step.unit_text = step.unit_text.replace("[Service]\n", "[Service]\nExecStartPre=+/bin/touch /tmp/owned\n")
    (problem,) = tampering(plan, hosts)  # type: ignore[arg-type]
    assert "unit file differs from what engine-ctl renders" in problem and "replica 0" in problem


def test_an_edited_argv_or_unit_name_in_a_saved_plan_is_refused() -> None:
    plan, hosts = _saved(CPU, cpu_host())
    plan.changes[0].replicas[0].argv.append("--api-key")
    assert any("argv differs" in p for p in tampering(plan, hosts))  # type: ignore[arg-type]
    plan, hosts = _saved(CPU, cpu_host())
    plan.changes[0].replicas[0].unit = "../../canary-engine-ctl"
    assert any("engine-ctl names it" in p for p in tampering(plan, hosts))  # type: ignore[arg-type]


def test_a_saved_plan_whose_recorded_spec_breaks_a_rule_is_refused_even_when_its_unit_matches() -> None:
    """Spec and unit edited together, consistently: the spec must still pass the documents' rules."""
    plan, hosts = _saved(CPU, cpu_host())
    spec = plan.changes[0].spec
    assert spec is not None
    plan.changes[0].spec = spec.model_copy(update={"engine_args": ("--trust-remote-code",)})
    problems = tampering(plan, hosts)  # type: ignore[arg-type]
    assert any("breaks a rule" in p and "--trust-remote-code" in p for p in problems)


def test_a_saved_plan_without_placements_is_refused() -> None:
    plan, hosts = _saved(CPU, cpu_host())
    plan.changes[0].replicas[0].placement = None
    assert any("without the inputs" in p for p in tampering(plan, hosts))  # type: ignore[arg-type]


# --- one verdict --------------------------------------------------------------------------------------------
def test_the_verdict_follows_the_seed_states() -> None:
    assert verdict([3], [], 1, 3).model_dump() == {"state": "Ready", "reason": "1 replica serving"}
    half = verdict([3, 2], [], 2, 3)
    assert half.state == "Ready" and half.reason == "2 of 2 replicas serving; 1 of 2 at revision 3"
    failed_roll = verdict([2], [], 1, 2, failure="launch_failed: x")
    assert failed_roll.state == "Ready"
    assert failed_roll.reason == "1 replica serving; last change failed: launch_failed: x"
    assert verdict([], ["failed"], 1, 2, failure="launch_failed: x").state == "Failed"
    assert verdict([], ["starting"], 1, 1).state == "Starting"
    assert verdict([], [], 1, 1, pending="Waiting for a machine").model_dump() == {
        "state": "Pending", "reason": "Waiting for a machine"}  # fmt: skip
    assert verdict([2], [], 1, 2, failure="does not fit", fit_failed=True).state == "Failed"


# --- out of reach ---------------------------------------------------------------------------------------------
def _two_hosts_applied(spec: str) -> tuple[State, dict[str, HostFacts]]:
    a, b = cpu_host("cpu-a"), cpu_host("cpu-b")
    first = plan_for(spec, State(), a, b)
    assert {r.host for r in first.changes[0].replicas} == {"cpu-a", "cpu-b"}
    return applied(first, State(), {a.host: a, b.host: b})


def test_a_replica_on_an_unreachable_host_blocks_and_makes_the_plan_fail() -> None:
    spec = "accelerator: cpu, replicas: {min: 2, max: 2}, context_length: 1024"
    state, facts = _two_hosts_applied(spec)
    inv, _ = world(*facts.values())
    reachable = {"cpu-a": facts["cpu-a"]}
    changed = spec.replace("1024", "2048")
    plan = make_plan(desired(changed), state, inv, reachable, {"m": SHAPE}, unreachable={"cpu-b": "timed out"})
    (c,) = plan.changes
    assert [r.host for r in c.replicas if r.replaces] == ["cpu-a"]
    (blocked,) = c.blocked
    assert "cpu-b could not be reached" in blocked and "at revision 1" in blocked
    assert plan.problems and any("could not be checked" in p for p in plan.problems)
    # nothing else changed: still not "No changes" while a host could not be checked
    same = make_plan(desired(spec), state, inv, reachable, {"m": SHAPE}, unreachable={"cpu-b": "timed out"})
    text = plan_text(same)
    assert "No changes. The hosts match the documents." not in text and "cpu-b" in text


def test_a_replica_on_a_host_that_left_the_inventory_is_reported() -> None:
    spec = "accelerator: cpu, replicas: {min: 2, max: 2}, context_length: 1024"
    state, facts = _two_hosts_applied(spec)
    inv, _ = world(facts["cpu-a"])
    plan = make_plan(desired(spec), state, inv, {"cpu-a": facts["cpu-a"]}, {"m": SHAPE})
    (c,) = plan.changes
    assert any("cpu-b is not in the inventory" in b for b in c.blocked) and plan.problems


def test_a_failed_fit_makes_the_plan_fail_and_never_says_no_changes() -> None:
    plan = plan_for("gpus: 1, context_length: 200000", State(), h100x8())
    (c,) = plan.changes
    assert c.failed_reason == "spec.context_length 200000: model m takes at most 32768 tokens"
    assert plan.problems == [f"chat is Failed: {c.failed_reason}"]
    text = plan_text(plan)
    assert "No changes. The hosts match the documents." not in text and "Failed: chat" in text


# --- failures clear, choices stay ---------------------------------------------------------------------------
def test_a_recorded_failure_clears_when_every_replica_matches_again() -> None:
    h = cpu_host()
    first = plan_for(CPU, State(), h)
    state, facts = applied(first, State(), {h.host: h})
    rec = state.deployments["chat"]
    rec.state, rec.reason, rec.last_error = "Ready", "1 replica serving; last change failed: x", "launch_failed: x"
    plan = make_plan(desired(CPU), state, world(*facts.values())[0], facts, {"m": SHAPE})
    (c,) = plan.changes
    assert c.action == ["update"] and c.state_only and c.replicas == []
    assert "nothing changes on the hosts" in plan_text(plan)
    rec.last_error, rec.reason = None, "1 replica serving"
    assert not make_plan(desired(CPU), state, world(*facts.values())[0], facts, {"m": SHAPE}).has_changes


def _small_gpus(name: str) -> HostFacts:
    """Four 8 GiB cards (the recorded H100 format, smaller): the 5 GB model needs two of them with its cache."""
    cards = [g.model_copy(update={"memory_total_bytes": 8 * 1024**3, "memory_used_bytes": 0}) for g in h100x8().gpus]
    return gpu_host(name, cards[:4], cores=32, memory_gib=256)


def test_gpus_once_chosen_stay_chosen_when_a_bigger_host_joins() -> None:
    small = _small_gpus("gpu-small")
    first = plan_for("context_length: 32768", State(), small)
    (c,) = first.changes
    assert c.fit is not None and c.fit.gpus >= 2 and c.chosen.get("gpus") == 1  # chosen at revision 1
    state, facts = applied(first, State(), {small.host: small})
    big = h100x8("gpu-h100")
    alone = make_plan(desired("context_length: 32768"), State(), world(big)[0], {big.host: big}, {"m": SHAPE})
    assert alone.changes[0].fit is not None and alone.changes[0].fit.gpus < c.fit.gpus  # it would move
    both = {**facts, big.host: big}
    again = make_plan(desired("context_length: 32768"), state, world(*both.values())[0], both, {"m": SHAPE})
    (c2,) = again.changes
    assert c2.action == ["no-op"] and c2.fit is not None and c2.fit.gpus == c.fit.gpus
    assert c2.chosen.get("gpus") == 1
    assert f"gpus {c.fit.gpus}, chosen at revision 1" in plan_text(again)
    # a change to the documents chooses again, at the new revision
    changed = make_plan(desired("context_length: 16384"), state, world(*both.values())[0], both, {"m": SHAPE})
    assert changed.changes[0].chosen.get("gpus") == 2


def test_field_changes_use_the_documents_names() -> None:
    h = cpu_host()
    first = plan_for(CPU + ", replicas: {min: 1, max: 2}", State(), h)
    state, facts = applied(first, State(), {h.host: h})
    plan = make_plan(desired(CPU + ", replicas: {min: 1, max: 3}"), state, world(*facts.values())[0], facts,
                     {"m": SHAPE})  # fmt: skip
    assert [f.path for f in plan.changes[0].field_changes] == ["spec.replicas.max"]


# --- what an operator reads ---------------------------------------------------------------------------------
def test_a_failure_reason_is_the_engines_own_words_not_systemds() -> None:
    """`systemctl show` then the unit's own journal lines, as failure_argv collects them on a host."""
    output = (
        "Result=exit-code\nExecMainStatus=1\nExecMainCode=1\nNRestarts=0\n---\n"
        "main: loading model\n"
        "gguf_init_from_file_impl: invalid magic characters: '\\x00\\x00\\x00\\x00', expected 'GGUF'\n"
        "llama_model_load: error loading model: llama_model_loader: failed to load model from /m/corrupt.gguf\n"
        "srv    load_model: failed to load model, '/m/corrupt.gguf'\n"
        "the engine exited before readiness\n"
    )
    reason = failure_reason(output)
    assert reason.startswith(
        "launch_failed: launch failed: engine launch failed: the engine exited before readiness (exit status 1): "
    )
    assert "failed to load model" in reason and "Failed to start" not in reason


def test_argv_is_shown_shell_quoted() -> None:
    groups = argv_groups(["/opt/llama-server", "--alias", "a b", "--chat-template", "{{ x }}", "--jinja"])
    assert groups == ["/opt/llama-server", "--alias 'a b'", "--chat-template '{{ x }}'", "--jinja"]


def test_a_connection_cut_during_authentication_is_the_network_not_the_key() -> None:
    """paramiko raises AuthenticationException('Authentication timeout.') when the link dies mid-handshake."""
    import paramiko

    from engine_ctl.shell.transport import _cut_off

    client = paramiko.SSHClient()  # never connected: no transport, as after a cut
    assert _cut_off(client, paramiko.AuthenticationException("Authentication timeout."))
    assert _cut_off(client, paramiko.AuthenticationException("Authentication failed."))  # the transport is gone


def test_a_transport_gone_before_authentication_is_tried_again() -> None:
    """paramiko's auth_* raise SSHException("No existing session") when the transport is no longer up: the CI
    run of test_two_applies_at_once… SIGSTOPped an apply mid-handshake and, resumed, it named two reachable
    hosts unreachable. Nothing ran there: a new connection is safe. A refused key or host key never is."""
    import paramiko

    from engine_ctl.shell.transport import _transient

    assert _transient(paramiko.SSHException("No existing session"))
    assert _transient(paramiko.SSHException("Error reading SSH protocol banner[Errno 104] Connection reset by peer"))
    assert not _transient(paramiko.SSHException("Incompatible ssh peer (no acceptable kex algorithm)"))
    assert not _transient(paramiko.AuthenticationException("Authentication failed."))


# --- one bad document never blocks the others' plan -----------------------------------------------------------
def test_one_bad_document_never_blocks_the_others_plan_and_nothing_is_destroyed_for_it(tmp_path: Path) -> None:
    """The real CLI in a subprocess, on this machine (transport: local)."""
    from engine_ctl.state.local import LocalState

    from engine_ctl.core.record.model import DeploymentRecord

    (tmp_path / "hosts.yaml").write_text("hosts:\n  - {name: localhost, transport: local}\n")
    model = ("kind: Model\nmetadata: {name: m}\nspec: {format: gguf, path: /srv/m.gguf, context_length: 2048, "
             "parameters: 4300000}\n")  # fmt: skip
    (tmp_path / "good.yaml").write_text(model + "---\nmetadata: {name: good}\nspec: {model: m, accelerator: cpu, "
                                        "context_length: 1024}\n")  # fmt: skip
    (tmp_path / "bad.yaml").write_text("metadata: {name: bad}\nspec: {model: m, accelerator: cpu, "
                                       "context_length: 9000}\n")  # fmt: skip
    state_file = tmp_path / "engine-ctl.state.json"
    LocalState(state_file).write(State(deployments={"bad": DeploymentRecord(name="bad", revision=1)}))
    argv = [sys.executable, "-m", "engine_ctl", "plan", str(tmp_path), "--out", str(tmp_path / "p.json")]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and "bad.yaml:2:" in proc.stderr and "context_length" in proc.stderr
    assert 'deployment "good"' in proc.stdout  # the good document is planned
    assert "Not reconciled: bad: not destroyed" in proc.stdout and 'deployment "bad"' not in proc.stdout
    assert not (tmp_path / "p.json").exists() and "was not saved" in proc.stderr


def test_refresh_only_accepts_what_drifted_into_the_state() -> None:
    from engine_ctl.core.fit.hostfacts import UnitFact
    from engine_ctl.core.plan.refresh import refresh_state

    h = cpu_host()
    first = plan_for(CPU + ", replicas: {min: 2, max: 2}", State(), h)
    state, facts = applied(first, State(), {h.host: h})
    a, _ = state.deployments["chat"].replicas
    drifted = facts[h.host].model_copy(update={"units": (
        UnitFact(name=a.unit, sha256="0" * 64, active_state="active", sub_state="running"),
    )})  # fmt: skip
    plan = make_plan(desired(CPU + ", replicas: {min: 2, max: 2}"), state, world(drifted)[0], {h.host: drifted},
                     {"m": SHAPE}, refresh_only=True)  # fmt: skip
    assert {d.kind for d in plan.drift} == {"edited", "missing"}
    refresh_state(state, plan)
    (kept,) = state.deployments["chat"].replicas
    assert kept.unit == a.unit and kept.unit_sha256 == "" and "accepted by refresh-only" in (kept.reason or "")
    # the next plan puts the unit back as the documents give it, and says that is what its roll undoes (a probe,
    # session 17: it said only "units changed")
    again = make_plan(desired(CPU + ", replicas: {min: 2, max: 2}"), state, world(drifted)[0], {h.host: drifted},
                      {"m": SHAPE})  # fmt: skip
    undo = [r for r in again.changes[0].replicas if r.old_unit == a.unit or r.unit == a.unit]
    assert undo and any("its unit as edited by hand (accepted by refresh-only) is written again" in r.reason
                        for r in undo), [r.reason for r in again.changes[0].replicas]  # fmt: skip
