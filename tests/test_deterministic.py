"""A plan means the same thing every time: deterministic placement that render shares, spec.host honoured on a
change, weights missing on a host make the replica wait, no documents is an error, engine-ctl's own files are
never documents, and destroying by absence is shown first (refused for prevent_destroy)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from engine_ctl.cli.views.plan import plan_text
from engine_ctl.core.documents.inventory import Host, Inventory
from engine_ctl.core.documents.loader import load_documents, load_paths
from engine_ctl.core.documents.yamlsource import parse_text
from engine_ctl.core.fit.hostfacts import HostFacts
from engine_ctl.core.fit.modelfacts import ModelFacts
from engine_ctl.core.model import DesiredState
from engine_ctl.core.plan.pipeline import render_deployment
from engine_ctl.core.plan.planner import Plan, make_plan
from engine_ctl.core.record.model import State
from engine_ctl.core.sizes import GIB
from tests.fleetfacts import cpu_host
from tests.helpers import plan_without_offered_lineage, run, write
from tests.llama import tiny_model
from tests.test_plan_core import applied

ROOT = Path(__file__).resolve().parents[1]
MODEL = "kind: Model\nmetadata: {name: m}\nspec: {format: gguf, path: m/m.gguf, context_length: 4096}\n"
SHAPE = ModelFacts(block_count=2, head_count=4, head_count_kv=2, embedding_length=64, weights_bytes=17_000_000)
WEIGHTS = "/srv/models/m/m.gguf"


def docs(*deployments: str) -> DesiredState:
    """The model and one spec-form CPU deployment per `name: extra` string."""
    text = MODEL
    for d in deployments:
        name, _, extra = d.partition(":")
        cores = "" if "cpu_cores" in extra else ", cpu_cores: 2"
        text += f"---\nmetadata: {{name: {name}}}\nspec: {{model: m, accelerator: cpu{cores}{extra}}}\n"
    found, problems = parse_text(text, "d.yaml")
    assert not problems
    return load_documents(found).desired


def host(name: str, available_gib: int = 60, cores: int = 16, missing: bool = False) -> HostFacts:
    h = cpu_host(name, cores=cores)
    h = h.model_copy(update={"memory": h.memory.model_copy(update={"available_bytes": available_gib * GIB})})
    return h.model_copy(update={"model_problems": {WEIGHTS: "not found"}}) if missing else h


def inventory(*facts: HostFacts) -> Inventory:
    return Inventory(hosts=tuple(Host(name=f.host, address=f.host, models_dir="/srv/models") for f in facts))


def plan(desired: DesiredState, state: State, *facts: HostFacts) -> Plan:
    return make_plan(desired, state, inventory(*facts), {f.host: f for f in facts}, {"m": SHAPE})


def applied_state(
    desired: DesiredState, *facts: HostFacts, state: State | None = None
) -> tuple[State, tuple[HostFacts, ...]]:
    """What a successful apply records, and the hosts' facts afterwards (with the units it wrote)."""
    first = plan(desired, state or State(), *facts)
    new, after = applied(first, state or State(), {f.host: f for f in facts})
    return new, tuple(after[f.host] for f in facts)


def hosts_of(p: Plan, name: str) -> list[str]:
    change = next(c for c in p.changes if c.name == name)
    return [r.host for r in change.replicas if r.action != ["delete"]]


# --- deterministic placement -------------------------------------------------------------------------------


def test_the_memory_available_now_never_moves_a_replica() -> None:
    """Identical hosts, no state: the replica goes to the first host of the inventory, however much memory
    each host has available at the moment the facts are gathered; the plans are the same byte for byte."""
    fresh = State()
    plans = [plan(docs("chat:"), fresh, host("h1", a), host("h2", b)) for a, b in ((10, 50), (50, 10), (30, 31))]
    assert [hosts_of(p, "chat") for p in plans] == [["h1"]] * 3
    texts = {p.model_dump_json(exclude={"created_at"}) for p in plans}
    assert len(texts) == 1


def test_spread_is_fewest_replicas_of_the_deployment_then_most_free_room_then_inventory_order() -> None:
    three = plan(docs("chat:, replicas: {min: 3, max: 3}"), State(), host("h1", 10), host("h2", 50))
    assert hosts_of(three, "chat") == ["h1", "h2", "h1"]
    big = plan(docs("chat:"), State(), host("h1"), host("h2", cores=64))  # more free cores: h2
    assert hosts_of(big, "chat") == ["h2"]


def test_render_places_where_plan_places_given_the_state() -> None:
    """Another deployment recorded on h1 takes cores there: plan puts the new one on h2, and render (the same
    planning path, the same state) shows the unit plan would write, on h2."""
    state, facts = applied_state(docs("other:, cpu_cores: 8"), host("h1"), host("h2"))
    assert state.deployments["other"].replicas[0].host == "h1"
    both = docs("other:, cpu_cores: 8", "chat:")
    planned = plan(both, state, *facts)
    (step,) = next(c for c in planned.changes if c.name == "chat").replicas
    assert step.host == "h2"
    rendered = render_deployment(both, "chat", inventory(*facts), {f.host: f for f in facts}, SHAPE, state=state)
    (unit,) = rendered.units
    assert (unit.host, unit.sha256, list(unit.argv)) == ("h2", step.unit_sha256, step.argv)
    # Once applied, render shows what runs (the recorded unit), not a fresh placement.
    after, facts = applied_state(both, *facts, state=state)
    again = render_deployment(both, "chat", inventory(*facts), {f.host: f for f in facts}, SHAPE, state=after)
    (kept,) = again.units
    assert (kept.host, kept.sha256) == ("h2", after.deployments["chat"].replicas[0].unit_sha256)


# --- spec.host ------------------------------------------------------------------------------------------


def test_changing_spec_host_replaces_the_replica_onto_the_new_host() -> None:
    state, facts = applied_state(docs("chat:, host: h1"), host("h1"), host("h2"))
    assert state.deployments["chat"].replicas[0].host == "h1"
    moved = plan(docs("chat:, host: h2"), state, *facts)
    (change,) = moved.changes
    assert change.action == ["create", "delete"]  # a surge: the new replica serves before the old one goes
    (step,) = change.replicas
    assert (step.old_host, step.host, step.strategy, step.action) == ("h1", "h2", "surge", ["create", "delete"])
    assert "spec.host" in step.reason
    assert "h1 → h2" in plan_text(moved)


def test_a_host_move_onto_a_full_host_waits_and_the_old_replica_keeps_serving() -> None:
    state, facts = applied_state(docs("chat:, host: h1", "other:, host: h2"), host("h1"), host("h2", cores=2))
    moved = plan(docs("chat:, host: h2", "other:, host: h2"), state, *facts)
    change = next(c for c in moved.changes if c.name == "chat")
    assert change.pending_reason is not None and not change.replicas  # h2 is full: it waits, h1 keeps serving


SPEC_HOST = """
    kind: Model
    metadata: {name: m}
    spec: {format: gguf, path: m/m.gguf, context_length: 4096}
    ---
    metadata: {name: chat}
    spec: {model: m, accelerator: cpu, host: gpu-3}
"""
FLAT_HOST = "name: flat\nengine: llamacpp\nmodel: m/m.gguf\nhost: gpu-3\n"
HOSTS = "hosts:\n  - {name: gpu-1, address: 127.0.0.1, port: 9}\n  - {name: gpu-2, address: 127.0.0.2, port: 9}\n"


def test_a_host_not_in_the_inventory_is_an_error_at_validate_plan_and_apply(tmp_path: Path) -> None:
    write(tmp_path, "d.yaml", SPEC_HOST)
    write(tmp_path, "flat.yaml", FLAT_HOST)
    hosts = write(Path(tmp_path.parent), f"{tmp_path.name}-hosts.yaml", HOSTS)
    for args in (["validate", str(tmp_path)], ["plan", str(tmp_path)], ["apply", str(tmp_path), "--auto-approve"]):
        result = run(*args, "--inventory", str(hosts))
        assert result.exit_code == 1, result.output
        assert 'spec.host "gpu-3": no host of that name in the inventory' in result.stderr
        assert "d.yaml:7:" in result.stderr and "flat.yaml:4:" in result.stderr  # located, in each form's words
        assert 'error: host "gpu-3": no host' in result.stderr
        assert "did you mean 'gpu-" in result.stderr and "unreachable" not in result.output
    assert run("validate", str(tmp_path)).exit_code == 0  # without an inventory it cannot be checked


# --- weights ----------------------------------------------------------------------------------------------


def test_a_host_without_the_weights_is_not_chosen() -> None:
    p = plan(docs("chat:"), State(), host("h1", missing=True), host("h2"))
    assert hosts_of(p, "chat") == ["h2"]
    assert not any("weights" in w for c in p.changes for w in c.warnings)


def test_weights_on_no_host_make_the_replica_pending_with_the_seeds_reason() -> None:
    p = plan(docs("chat:"), State(), host("h1", missing=True), host("h2", missing=True))
    (change,) = p.changes
    assert change.action == ["create"] and not change.replicas
    assert change.pending_reason == f"Waiting for the weights of m at {WEIGHTS} (not found)"
    assert change.waiting == {"h1": change.pending_reason, "h2": change.pending_reason}
    # the promise of a plan: the document cannot be served now, so plan exits 1 (never "No changes", never 0)
    assert p.problems == [f"chat is Pending: {change.pending_reason}"]
    assert f"Pending: chat: Waiting for the weights of m at {WEIGHTS}" in plan_text(p)


def test_a_pinned_host_without_the_weights_waits_for_them() -> None:
    p = plan(docs("chat:, host: h1"), State(), host("h1", missing=True), host("h2"))
    (change,) = p.changes
    assert not change.replicas and change.pending_reason == f"Waiting for the weights of m at {WEIGHTS} (not found)"


# --- no documents, engine-ctl's own files -------------------------------------------------------------------

PLAN_FILE = json.dumps({"format_version": 1, "state_lineage": "x", "state_serial": 0, "changes": []})


def test_no_documents_is_an_error_that_says_what_was_searched(tmp_path: Path) -> None:
    hosts = write(tmp_path, "hosts.yaml", HOSTS)
    for args in (["plan", str(tmp_path)], ["apply", str(tmp_path), "--auto-approve"], ["render", "x", str(tmp_path)]):
        result = run(*args, "--inventory", str(hosts))
        assert result.exit_code == 1, result.output
        assert f"no deployment or model document was loaded from {tmp_path}" in result.stderr
        assert "(an inventory)" in result.stderr
        assert "No changes" not in result.output and "unreachable" not in result.output
    plan_file = write(tmp_path, "saved.json", PLAN_FILE)
    result = run("plan", str(plan_file), "--inventory", str(hosts))
    assert result.exit_code == 1 and "no deployment or model document was loaded" in result.stderr
    assert f"{plan_file} (a saved plan)" in result.stderr


def test_validate_of_a_plan_file_says_what_it_is(tmp_path: Path) -> None:
    plan_file = write(tmp_path, "plan.json", PLAN_FILE)
    result = run("validate", str(plan_file))
    assert result.exit_code == 1
    assert f"{plan_file} is a saved plan, engine-ctl's own file, not a document: skipped" in result.stdout
    assert f"engine-ctl apply {plan_file}" in result.stdout


def test_a_directory_skips_plans_and_state_files_and_says_so(tmp_path: Path) -> None:
    write(tmp_path, "d.yaml", MODEL + "---\nmetadata: {name: chat}\nspec: {model: m, accelerator: cpu}\n")
    write(tmp_path, "plan.json", PLAN_FILE)
    write(tmp_path, "other-state.json", json.dumps(State().model_dump(mode="json")))
    for name in ("engine-ctl.state.json", "engine-ctl.state.json.backup", "engine-ctl.state.json.lock"):
        write(tmp_path, name, json.dumps(State().model_dump(mode="json")))
    loaded = load_paths([tmp_path])
    assert not loaded.diagnostics and [d.deployment.name for d in loaded.desired.deployments] == ["chat"]
    assert {Path(f).name: w for f, w in loaded.skipped.items()} == {
        "plan.json": "a saved plan", "other-state.json": "an engine-ctl state", "engine-ctl.state.json": "the state",
        "engine-ctl.state.json.backup": "the state's backup", "engine-ctl.state.json.lock": "the state's lock",
    }  # fmt: skip
    result = run("validate", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert f"{tmp_path / 'plan.json'} is a saved plan" in result.stdout


LOCAL = """
    defaults: {{models_dir: {models}}}
    hosts:
      - {{name: localhost, transport: local}}
"""


def _local_project(tmp_path: Path) -> Path:
    project = tmp_path / "project"
    project.mkdir()
    write(project, "d.yaml", MODEL + "---\nmetadata: {name: chat}\nspec: {model: m, accelerator: cpu}\n")
    write(project, "hosts.yaml", LOCAL.format(models=tmp_path / "models"))
    (tmp_path / "models" / "m").mkdir(parents=True)  # the weights are there: the plan is not Pending (exit 0)
    shutil.copy(tiny_model(), tmp_path / "models" / "m" / "m.gguf")
    return project


def test_plan_json_into_a_file_of_the_directory_works_twice_in_a_row(tmp_path: Path) -> None:
    """`engine-ctl plan . --json > plan.json`: the shell creates plan.json (empty) before engine-ctl reads the
    directory, and the second time it holds the first plan: neither is read as a document."""
    project = _local_project(tmp_path)
    outputs = []
    for _ in range(2):
        with (project / "plan.json").open("w") as out:
            proc = subprocess.run(
                [sys.executable, "-m", "engine_ctl", "plan", ".", "--json"], cwd=project, stdout=out,
                stderr=subprocess.PIPE, text=True, timeout=120, check=False,
            )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert "plan.json (this command's own output)" in proc.stderr
        saved = json.loads((project / "plan.json").read_text())
        assert [c["name"] for c in saved["changes"]] == ["chat"]
        saved.pop("created_at")
        # no state yet: each plan offers a new lineage (apply PLANFILE adopts it), which the units' headers carry
        outputs.append(plan_without_offered_lineage(saved))
    assert outputs[0] == outputs[1]  # the same plan, apart from the time


# --- destroying by absence, prevent_destroy ---------------------------------------------------------------


def test_destroying_by_absence_is_stated_first() -> None:
    state, facts = applied_state(docs("a:", "b:", "c:"), host("h1"), host("h2"))
    p = plan(docs("a:"), state, *facts)
    assert p.absent == ["b", "c"]
    first = plan_text(p).splitlines()[0]
    assert first == "This plan destroys 2 deployments because their documents are absent: b, c (pass the documents " \
        "to keep them)"  # fmt: skip
    assert p.summary()["destroy"] == 2
    assert plan(docs("a:", "b:", "c:"), state, *facts).absent == []


def test_prevent_destroy_is_recorded_without_a_new_revision() -> None:
    plain, facts = applied_state(docs("b:"), host("h1"))
    guarded = plan(docs("b:, prevent_destroy: true"), plain, *facts)
    (change,) = guarded.changes
    assert change.action == ["update"] and change.state_only and change.revision == change.old_revision
    assert change.spec_hash == plain.deployments["b"].spec_hash
    assert change.spec is not None and change.spec.prevent_destroy
    assert "records spec.prevent_destroy: true; nothing changes on the hosts" in change.reasons
    after, facts = applied_state(docs("b:, prevent_destroy: true"), *facts, state=plain)
    assert not plan(docs("b:, prevent_destroy: true"), after, *facts).has_changes


def test_a_plan_that_destroys_a_prevent_destroy_deployment_is_refused() -> None:
    state, facts = applied_state(docs("a:", "b:, prevent_destroy: true"), host("h1"))
    p = plan(docs("a:"), state, *facts)
    assert p.refused and "b has prevent_destroy: true, and this plan destroys it" in p.refused[0]
    assert p.refused[0] in p.problems  # plan exits 1
    assert "Refused: b has prevent_destroy: true" in plan_text(p).splitlines()[1]


def test_the_flat_form_carries_prevent_destroy() -> None:
    found, _ = parse_text("name: flat\nengine: llamacpp\nmodel: m/m.gguf\nprevent_destroy: true\n", "f.yaml")
    (loaded,) = load_documents(found).desired.deployments
    assert loaded.deployment.prevent_destroy is True


def test_destroy_and_apply_do_nothing_when_refused(tmp_path: Path) -> None:
    project = _local_project(tmp_path)
    local = cpu_host("localhost")
    state, _ = applied_state(docs("b:, prevent_destroy: true"), local)
    state_file = project / "engine-ctl.state.json"
    state_file.write_text(state.model_dump_json())
    before = state_file.read_bytes()
    write(project, "d.yaml", MODEL)  # b's document is absent
    for args in (["apply", str(project), "--auto-approve"], ["destroy", str(project), "--auto-approve"]):
        proc = subprocess.run(
            [sys.executable, "-m", "engine_ctl", *args], cwd=project, capture_output=True, text=True, timeout=120,
            check=False,
        )  # fmt: skip
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert "b has prevent_destroy: true" in proc.stdout + proc.stderr
        assert "Traceback" not in proc.stderr and "Apply" not in proc.stdout
    assert state_file.read_bytes() == before


def test_the_docs_document_the_placement_order() -> None:
    text = (ROOT / "docs" / "plan-apply.md").read_text()
    assert "fewest replicas of this deployment" in text and "inventory order" in text
    assert textwrap.dedent("prevent_destroy") in text
