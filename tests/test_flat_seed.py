"""Seed 003's flat form, pure: the host decides the accelerator, validate shows what the flat form fills in (the
GPU, the memory the engine may use, how the model parks), the default residency parks, and a decisions deployment
refuses to park."""

from __future__ import annotations

import json
from pathlib import Path

from engine_ctl.core.fit.fitting import host_decides
from tests.fleetfacts import cpu_host, h100x8
from tests.helpers import load, messages, run, write

FLAT = "name: my-model\nengine: llamacpp\nmodel: Qwen3-4B-GGUF/qwen3-4b.gguf\n"


def _flat(text: str = FLAT):  # type: ignore[no-untyped-def]
    result, diags = load(text)
    assert messages(diags) == []
    return result.desired.deployments[0].deployment, result.desired.models[0].model


def test_the_host_decides_gpus_where_it_has_them_else_its_cpu() -> None:
    d, model = _flat()
    assert d.accelerator == "host"
    assert host_decides(d, model, [cpu_host()]).accelerator == "cpu"
    assert host_decides(d, model, [cpu_host(), h100x8()]).accelerator == "gpu"
    # host: narrows the hosts that decide; a pinned device means GPUs
    pinned = d.model_copy(update={"host": "cpu-01"})
    assert host_decides(pinned, model, [cpu_host(), h100x8()]).accelerator == "cpu"
    assert host_decides(d.model_copy(update={"devices": ("gpu0",)}), model, [cpu_host()]).accelerator == "gpu"
    # vLLM runs on no CPU: it waits for GPUs as before
    vllm, vmodel = _flat("name: q\nengine: vllm\nmodel: Qwen3-4B\n")
    assert host_decides(vllm, vmodel, [cpu_host()]).accelerator == "gpu"


def test_the_spec_form_keeps_its_accelerator() -> None:
    result, _ = load(
        "kind: Model\nmetadata: {name: m}\nspec: {format: gguf, path: m.gguf}\n---\n"
        "metadata: {name: chat}\nspec: {model: m}\n"
    )
    d = result.desired.deployments[0].deployment
    assert d.accelerator == "gpu" and host_decides(d, result.desired.models[0].model, [cpu_host()]) is d


def test_the_flat_default_residency_parks_and_decisions_restart() -> None:
    assert _flat()[0].residency == "parked"
    assert _flat(FLAT + "api: decisions\n")[0].residency == "restart_only"
    assert _flat(FLAT + "residency: restart_only\n")[0].residency == "restart_only"
    _, diags = load(FLAT)
    assert messages(diags, "warning") == []  # the default is not a written choice llama.cpp ignores


def test_parked_on_a_decisions_deployment_is_refused_with_the_seeds_reason() -> None:
    for residency in ("parked", "deep", "host_backed"):
        _, diags = load(FLAT + f"api: decisions\nresidency: {residency}\n")
        assert messages(diags) == [
            f"residency {residency}: a decisions deployment restarts instead of parking (restart_only)"
        ]


def test_validate_shows_what_the_flat_form_fills_in(tmp_path: Path) -> None:
    path = write(tmp_path, "my-model.yaml", FLAT)
    result = run("validate", str(path))
    assert result.exit_code == 0, result.output
    assert f"{path} is a valid deployment document" in result.output
    out = result.output
    assert "residency                    parked   (how the model parks: llama.cpp has no sleep mode, so a park" in out
    assert "devices                      the host decides: the fewest of 1, 2, 4, 8 of its GPUs that hold the " in out
    assert "or its CPU when it has no GPU llama.cpp runs on" in out
    assert "engine_config.memory.request sized from the checkpoint and the GPU: the weights, the KV cache" in out
    doc = json.loads(run("validate", "--json", str(path)).stdout)
    filled = {x["field"]: x for x in doc["deployments"][0]["defaults"]}
    assert filled["residency"]["value"] == "parked" and filled["residency"]["resolved_at"] == "load"
    assert filled["devices"]["resolved_at"] == filled["engine_config.memory.request"]["resolved_at"] == "plan"
    # what the document states is not filled in
    stated = write(tmp_path, "stated.yaml", FLAT + "residency: deep\nengine_config: {memory: {request: 16GiB}}\n")
    doc = json.loads(run("validate", "--json", str(stated)).stdout)
    assert {x["field"] for x in doc["deployments"][0]["defaults"]}.isdisjoint(
        {"residency", "engine_config.memory.request"}
    )


SEED_NOT_CHECKED = [
    "resolution against a host: pass --inventory <hosts.yaml> to check the runtime profile, placement, the host's "
    "devices and capacity, and timeouts, and to see the host's defaults",
    "whether each allowed host is enrolled, online and has published (host_unpublished)",
    "which runtime profiles the host's role accepted and published after measuring each installation "
    "(profile_not_published)",
    "the host's current resource policy as the server stores it (resource_policy_unavailable)",
    "route and deployment-name conflicts with existing deployments (route_conflict)",
    "a new checkpoint's digest, measured on the host after acceptance (checkpoint_digest_pending)",
]


def test_not_checked_is_the_seeds_six_items_with_their_codes(tmp_path: Path) -> None:
    path = write(tmp_path, "my-model.yaml", FLAT)
    out = run("validate", str(path)).output
    assert out.split("\nNot checked\n")[1].splitlines() == [f"  {line}" for line in SEED_NOT_CHECKED]
    doc = json.loads(run("validate", "--json", str(path)).stdout)
    assert [x["code"] for x in doc["not_checked"]] == [
        None, "host_unpublished", "profile_not_published", "resource_policy_unavailable", "route_conflict",
        "checkpoint_digest_pending",
    ]  # fmt: skip


def test_validate_with_an_inventory_checks_the_runtime_profile_offline(tmp_path: Path) -> None:
    (tmp_path / "inv").mkdir()
    (tmp_path / "docs").mkdir()
    inv = write(
        tmp_path, "inv/hosts.yaml",
        "kind: Inventory\nhosts:\n  - name: gpu-box\n    address: 198.18.0.11\n"
        "    engines: {llama.cpp: {cuda: /opt/llama/cuda/llama-server}}\n",
    )  # fmt: skip
    model = "kind: Model\nmetadata: {name: m}\nspec: {format: gguf, path: m.gguf}\n---\n"
    cpu = write(tmp_path, "docs/d.yaml", model + "metadata: {name: chat}\nspec: {model: m, accelerator: cpu, "
                "host: gpu-box}\n")  # fmt: skip
    refused = run("validate", "--inventory", str(inv), str(cpu))
    assert refused.exit_code == 1
    assert 'spec.host "gpu-box": the inventory names no llama.cpp build for cpu there (it names: cuda)' in (
        refused.output
    )
    assert "hint: add engines.llama.cpp.cpu to gpu-box in the inventory" in refused.output
    cpu.write_text(model + "metadata: {name: chat}\nspec: {model: m, gpu_vendor: nvidia, host: gpu-box}\n")
    checked = run("validate", "--inventory", str(inv), str(cpu))
    assert checked.exit_code == 0, checked.output
    assert f"  resolution against a host: checked against {inv} offline: the hosts named and the runtime " in (
        checked.output
    )


# --- seed 003's flat fields: engine_config.memory.startup and timeouts ------------------------------------


def test_memory_startup_alone_is_valid_and_is_what_a_start_sets_aside() -> None:
    from engine_ctl.core.fit.fitting import fit
    from engine_ctl.core.sizes import GIB
    from tests.test_fit_seeds import SMALL

    d, model = _flat(FLAT + "engine_config: {memory: {startup: 28GiB}}\n")  # no request: not required
    assert (d.startup_bytes, d.gpu_memory_bytes) == (28 * GIB, None)
    plan = fit(d.model_copy(update={"accelerator": "gpu"}), model, SMALL, [h100x8()])
    assert not isinstance(plan, str) and plan.memory_bytes == 28 * GIB  # type: ignore[union-attr]
    both, _ = _flat(FLAT + "engine_config: {memory: {request: 16GiB, startup: 20GiB}}\n")
    assert (both.gpu_memory_bytes, both.startup_bytes) == (16 * GIB, 20 * GIB)


def test_timeouts_startup_is_the_units_start_up_budget() -> None:
    from tests.test_fit_seeds import rendered_unit

    spec = "kind: Model\nmetadata: {name: t}\nspec: {format: gguf, path: t/t.gguf}\n---\n"
    d, _ = _flat(FLAT + "timeouts: {startup: 15m}\n")
    assert d.startup_timeout_s == 900
    own = rendered_unit(spec + "name: chat\nengine: llamacpp\nmodel: t/t.gguf\ntimeouts: {startup: 15m}\n").text
    default = rendered_unit(spec + "name: chat\nengine: llamacpp\nmodel: t/t.gguf\n").text
    assert "no healthy answer within 900 s" in own and "no healthy answer within 600 s" in default


def test_bad_startup_values_are_located_and_unset_ones_leave_digests_alone() -> None:
    _, diags = load(FLAT + "timeouts: {startup: soon}\nengine_config: {memory: {startup: lots}}\n")
    assert sorted(d.render().splitlines()[0] for d in diags) == [
        "0-d.yaml:4:21: error: timeouts.startup: 'soon' is not a duration; write it like 600, 600s, 10m or 1h (more "
        "than 0)",
        "0-d.yaml:5:35: error: engine_config.memory.startup: 'lots' is not a size; write it like 16GiB, 512MiB or "
        "42.5GB",
    ]
    d, _ = _flat()
    assert "startup_bytes" not in d.model_dump() and "startup_timeout_s" not in d.model_dump()


def test_the_2_gib_floor_holds_after_a_measured_peak() -> None:
    """B42: a 41 MiB measurement reserved 41 MiB; seed 000's memory per replica is at least 2 GiB."""
    from engine_ctl.core.plan.deployment import with_measured_startup
    from engine_ctl.core.record.model import DeploymentRecord, StartupRecord
    from engine_ctl.core.sizes import GIB, MIB
    from tests.test_records import FIT

    small = StartupRecord(revision=1, host="cpu-01", host_peak_bytes=41 * MIB)
    fitted, provenance = with_measured_startup(FIT, DeploymentRecord(name="chat", revision=1, startup=small), 1)
    assert provenance == "measured" and fitted.memory_bytes == 2 * GIB
    big = small.model_copy(update={"host_peak_bytes": 5 * GIB})
    assert with_measured_startup(FIT, DeploymentRecord(name="chat", revision=1, startup=big), 1)[0].memory_bytes == (
        5 * GIB
    )


def test_capabilities_llamacpp_lacks_are_refused() -> None:
    """Seed 001: llama.cpp serves no speech to text and no video (vLLM: Whisper; videos in a conversation)."""
    for cap, words in (("transcription", "speech to text"), ("video", "video")):
        _, diags = load(
            f"kind: Model\nmetadata: {{name: w}}\nspec: {{format: gguf, path: w.gguf, capabilities: [chat, {cap}]}}\n"
            "---\nmetadata: {name: chat}\nspec: {model: w}\n"
        )
        assert messages(diags) == [
            f"capability_missing:{cap}: llama.cpp does not serve {words} (model w has capability {cap}); no engine "
            f"here serves {cap} for this model"
        ]
    _, diags = load(
        "kind: Model\nmetadata: {name: w}\nspec: {format: safetensors, path: /w, capabilities: [transcription]}\n"
        "---\nmetadata: {name: chat}\nspec: {model: w, engine: vllm}\n"
    )
    assert messages(diags) == []
    _, diags = load("kind: Model\nmetadata: {name: w}\nspec: {format: gguf, path: w.gguf, capabilities: [vision]}\n"
                    "---\nmetadata: {name: chat}\nspec: {model: w}\n")  # fmt: skip
    assert messages(diags) == []


def test_a_model_whose_weights_are_gone_is_failed_not_pending() -> None:
    """Seed 000's Failed: "the model is gone". A first deployment whose weights are not there yet stays Pending."""
    from engine_ctl.core.record.model import State
    from tests.test_plan_core import applied
    from tests.test_plan_promise import SHAPE, desired, plan

    hosts = {h.host: h for h in (cpu_host("h1"), cpu_host("h2"))}
    state, hosts = applied(plan(desired("path: m/m.gguf"), State(), hosts, SHAPE), State(), hosts)
    gone = {n: h.model_copy(update={"model_problems": {"/srv/models/m/m.gguf": "not found"}}) for n, h in hosts.items()}
    p = plan(desired("path: m/m.gguf"), state, gone, None)
    (change,) = p.changes
    assert change.failed_reason == (
        "the model is gone: the weights of m are on no reachable host (/srv/models/m/m.gguf on h1, "
        "/srv/models/m/m.gguf on h2: not found); put them back, or point the model's path at where they are"
    )
    assert change.pending_reason is None and p.problems == [f"chat is Failed: {change.failed_reason}"]
    # on one host only: the other still has them, nothing is gone
    one = {**hosts, "h2": gone["h2"]}
    assert plan(desired("path: m/m.gguf"), state, one, SHAPE).changes[0].failed_reason is None
    # never served: waiting for the weights (Pending)
    first = plan(desired("path: m/m.gguf"), State(), gone, None).changes[0]
    assert first.failed_reason is None and first.pending_reason is not None


# --- issue 25 point 21: messages that mislead ---------------------------------------------------------------


def test_a_host_no_build_runs_on_is_never_told_to_add_engines_none() -> None:
    """B29: vLLM on a CPU-only host said `add engines.vllm.None`."""
    from engine_ctl.providers import provider

    from engine_ctl.core.documents.inventory import Host
    from engine_ctl.core.plan.engines import engine_refusals

    host = Host(name="cpu-01", address="198.18.0.11")
    refused = engine_refusals(provider("vllm"), "gpu", [cpu_host()], {"cpu-01": host})
    assert refused == {"cpu-01": "no vLLM build runs on cpu-01: vLLM needs a GPU"}


def test_the_recorded_engine_version_is_the_version_not_the_whole_output() -> None:
    """B38: the engine version was recorded as the whole multi-line `--version` output."""
    from engine_ctl.core.fit.hostfacts import EngineInstall
    from engine_ctl.core.plan.engines import with_engines
    from engine_ctl.core.record.model import State
    from tests.test_plan_promise import SHAPE, desired, plan

    said = "ggml_cuda_init: found 0 devices\nversion: 0.6.0-dev (build 0, commit unknown)\nbuilt with cc"
    p = plan(desired("path: m/m.gguf"), State(), {"h1": cpu_host("h1")}, SHAPE)
    found = EngineInstall(path=p.changes[0].replicas[0].argv[0], version=said, sha256="ab" * 32)
    facts = cpu_host("h1").model_copy(update={"engines": {"llama.cpp": found}})
    p = with_engines(p, {"h1": facts})
    (step,) = p.changes[0].replicas
    assert step.engine_version == "0.6.0-dev"


def test_render_json_output_saved_among_the_documents_is_skipped(tmp_path: Path) -> None:
    """B45: `render --json > docs/x.json` broke the next command ("not an engine-ctl document")."""
    from engine_ctl.cli.render_cmd import render_json
    from engine_ctl.core.plan.pipeline import render_deployment
    from tests.test_fit_seeds import SMALL, desired, world

    docs = "kind: Model\nmetadata: {name: t}\nspec: {format: gguf, path: t/t.gguf}\n---\n" + FLAT.replace(
        "Qwen3-4B-GGUF/qwen3-4b.gguf", "t/t.gguf"
    )
    write(tmp_path, "d.yaml", docs)
    inv, facts = world(h100x8())
    rendered = render_deployment(desired(docs.split("---\n")[1]), "my-model", inv, facts, SMALL)
    saved = write(tmp_path, "render.json", json.dumps(render_json(rendered, None, {})))
    result = run("validate", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert f"{saved} is a `render --json` output, engine-ctl's own file, not a document: skipped" in result.output


def test_a_version_without_a_dotted_number_records_its_first_line() -> None:
    from engine_ctl.core.plan.engines import recorded_version

    assert recorded_version("version: 1\nbuilt with cc") == "version: 1"
    assert recorded_version("b\n") == "b" and recorded_version(" ") is None and recorded_version(None) is None


def test_two_flat_checkpoints_with_one_directory_name_or_two_commits_are_two_models() -> None:
    """B11: /a/qwen and /b/qwen, or org/repo@c1 and org/repo@c2, are two models, not a duplicate."""
    c1, c2 = "a" * 40, "b" * 40
    for first, second, names in (
        ("/a/qwen", "/b/qwen", {"one": "/a/qwen", "two": "/b/qwen"}),
        (f"Qwen/Qwen3-4B@{c1}", f"Qwen/Qwen3-4B@{c2}", {"one": f"Qwen/Qwen3-4B@{c1}", "two": f"Qwen/Qwen3-4B@{c2}"}),
    ):
        result, diags = load(
            f"name: one\nengine: vllm\nmodel: {first}\n", f"name: two\nengine: vllm\nmodel: {second}\n"
        )
        assert messages(diags) == []
        desired = result.desired
        assert {d.deployment.name: d.deployment.model for d in desired.deployments} == names
        for d in desired.deployments:
            model = desired.model(d.deployment.model)
            assert model is not None and (model.path or str(model.hf)) == names[d.deployment.name]
    # one checkpoint named twice is still one model, under its directory name
    result, diags = load("name: one\nengine: vllm\nmodel: /a/qwen\n", "name: two\nengine: vllm\nmodel: /a/qwen\n")
    assert messages(diags) == [] and {d.deployment.model for d in result.desired.deployments} == {"qwen"}


def test_a_per_platform_build_in_place_is_never_warned_as_not_installed() -> None:
    """B30: with per-platform builds (engines: {llama.cpp: {cpu: …}}) the plan warned "llama.cpp is not installed on
    h1 …; apply fails there until it is" although the build the replica runs was there."""
    from engine_ctl.core.documents.inventory import Host, Inventory
    from engine_ctl.core.fit.hostfacts import EngineInstall
    from engine_ctl.core.plan.planner import make_plan
    from engine_ctl.core.record.model import State
    from tests.test_plan_promise import SHAPE, desired

    build = "/opt/llama-cpu/llama-server"
    inv = Inventory(hosts=(Host(name="h1", address="h1", models_dir="/srv/models",
                                engine_builds={"llama.cpp": {"cpu": build}},
                                engine_pins={"llama.cpp": {"version": "0.6.0-dev"}}),))  # fmt: skip
    there = EngineInstall(path=build, version="version: 0.6.0-dev", sha256="ab" * 32)
    facts = cpu_host("h1").model_copy(update={"engine_builds": {"llama.cpp": {"cpu": there}}})
    p = make_plan(desired("path: m/m.gguf"), State(), inv, {"h1": facts}, {"m": SHAPE})
    (change,) = p.changes
    assert change.replicas and change.replicas[0].argv[0] == build
    assert not [w for w in change.warnings if "not installed" in w], change.warnings
    gone = cpu_host("h1")  # the build is not there (nor its pin, which would leave the host out): the warning stays
    unpinned = Inventory(hosts=(inv.hosts[0].model_copy(update={"engine_pins": {}}),))
    p = make_plan(desired("path: m/m.gguf"), State(), unpinned, {"h1": gone}, {"m": SHAPE})
    assert any("llama.cpp is not installed on h1" in w for w in p.changes[0].warnings), p.changes[0].warnings
