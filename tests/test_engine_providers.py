"""Engine knowledge lives only in providers/: an engine added as one provider is validated, fitted, planned and
rendered with no other change, and no module outside providers/ names an engine.

Only providers are imported at this module's top: a subprocess imports TOY from here and registers it before the
documents' models are built (they list the engines when first imported)."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path

from engine_ctl.providers.base import EngineOption, PagedProvider

from engine_ctl.core.fit.runspec import ReplicaRun

ROOT = Path(__file__).resolve().parent.parent
ENGINE_NAME = re.compile(r"llama\.cpp|llamacpp|vllm|sglang", re.IGNORECASE)
SCANNED = ("engine_ctl", "state", "templates")
"""The product outside providers/. bench/ and tests/ drive the real llama-server and name it on purpose."""
ALLOWED: dict[str, str] = {}
"""path -> why it may name an engine. Empty: the documents' engine lists and descriptions are built from the
providers (forms.py), and so are the rules' messages (rules.py)."""


@dataclass(frozen=True)
class ToyServe(PagedProvider):
    """A small engine defined here: a paged KV cache like the GPU engines, its own argv, option and health."""

    def argv(self, run: ReplicaRun) -> list[str]:
        plan = run.plan
        argv = [run.executable, "--weights", run.model_path, "--window", str(plan.context_length)]
        argv += ["--slots", str(plan.parallel), "--listen", f"{run.bind_address}:{run.port}"]
        if run.engine_options.get("turbo") is False:
            argv += ["--no-turbo"]
        return argv + self.engine_args_argv(run.engine_args)


TOY = ToyServe(
    name="toyserve",
    title="ToyServe",
    aliases=("toy",),
    formats=frozenset({"safetensors"}),
    auto_for_format=None,
    platforms=frozenset({"nvidia"}),
    allowed_flags=("--temperature-cap",),
    deployment_flags={"--window": "spec.context_length", "--slots": "spec.parallel"},
    refused_flags={"--fetch": "fetches from the network (not allowed, by design)"},
    default_executable="/opt/toy/bin/toyserve",
    options=(EngineOption(key="turbo", annotation=bool | None, description="ToyServe: turbo decoding."),),
    loading_statuses=frozenset({"425"}),
    serves_decisions=True,
)

MODEL = """
kind: Model
metadata: {name: qwen3-8b}
spec: {format: safetensors, path: /srv/models/qwen3-8b, context_length: 40960}
"""
SPEC_FORM = (
    MODEL
    + """---
metadata: {name: toy-chat}
spec: {model: qwen3-8b, engine: toy, engine_args: [--temperature-cap, "2"]}
"""
)
FLAT_FORM = """
name: toy-flat
engine: toyserve
model: /srv/models/qwen3-8b
engine_config: {turbo: false, accept_extra_args: true, extra_args: [--window, "9"]}
"""
ON_VLLM = "name: other\nengine: vllm\nmodel: /srv/models/qwen3-8b\nengine_config: {turbo: true}\n"

SCRIPT = """
import json, sys, tempfile, textwrap
from pathlib import Path
from engine_ctl import providers
from tests.test_engine_providers import TOY, SPEC_FORM, FLAT_FORM, ON_VLLM, MODEL
providers.register(TOY)

from engine_ctl.core.documents.inventory import Host, Inventory
from engine_ctl.core.fit.modelfacts import ModelFacts
from engine_ctl.core.plan.pipeline import render_deployment
from tests.fleetfacts import h100x8
from tests.helpers import load, messages, run

out = {}
loaded, diags = load(SPEC_FORM)
out["spec_errors"] = messages(diags)
out["spec_engine"] = loaded.desired.deployments[0].deployment.engine
_, diags = load(FLAT_FORM)
out["flat_errors"] = messages(diags)
_, diags = load(ON_VLLM)
out["vllm_warnings"] = messages(diags, "warning")
with tempfile.TemporaryDirectory() as tmp:
    (Path(tmp) / "d.yaml").write_text(textwrap.dedent(SPEC_FORM))
    result = run("validate", tmp)
    out["validate"] = [result.exit_code, result.output]
schema = json.loads(run("schema").stdout)
out["engines"] = schema["$defs"]["DeploymentSpec"]["properties"]["engine"]["enum"]
out["turbo"] = schema["$defs"]["FlatEngineConfig"]["properties"]["turbo"]

facts = h100x8()
host = Host(name=facts.host, address="198.18.0.11", models_dir="/srv/models")
shape = ModelFacts(block_count=36, head_count=32, head_count_kv=8, embedding_length=4096, key_length=128,
                   value_length=128, weights_bytes=16_381_470_720)
flat = FLAT_FORM.replace('extra_args: [--window, "9"]', 'extra_args: [--temperature-cap, "2"]')
loaded, _ = load(flat)
rendered = render_deployment(loaded.desired, "toy-flat", Inventory(hosts=(host,)), {facts.host: facts}, shape)
out["fit"] = rendered.fit.model_dump(mode="json")
out["argv"] = list(rendered.units[0].argv)
out["unit"] = rendered.units[0].text
print(json.dumps(out))
"""


def test_an_engine_added_as_one_provider_is_validated_fitted_planned_and_rendered() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.splitlines()[-1])
    # validate: its name and alias, its allow-list, the flags its deployment sets, its own engine_config key
    assert out["spec_errors"] == [] and out["spec_engine"] == "toyserve"
    assert out["flat_errors"] == [
        "engine_config.extra_args[0] --window: set by the deployment; set it with engine_config.context_length"
    ]
    assert out["vllm_warnings"] == ["engine_config.turbo: vLLM has no such switch; ignored"]
    assert out["validate"][0] == 0, out["validate"][1]
    assert out["engines"] == ["auto", "llama.cpp", "llamacpp", "vllm", "sglang", "toyserve", "toy"]
    assert out["turbo"]["description"] == "ToyServe: turbo decoding."
    # fit and plan: the paged rule, on the GPUs it runs on
    fit = out["fit"]
    assert fit["failed_reason"] is None and fit["pending_reason"] is None, fit
    assert fit["plan"]["engine"] == "toyserve" and fit["plan"]["parallel"] == 256
    # render: its argv (its option read from the deployment), its executable in the unit
    argv = out["argv"]
    assert argv[:3] == ["/opt/toy/bin/toyserve", "--weights", "/srv/models/qwen3-8b"]
    assert argv[-3:] == ["--no-turbo", "--temperature-cap", "2"]
    assert 'ExecStart=/opt/toy/bin/toyserve "--weights" "/srv/models/qwen3-8b"' in out["unit"]


def test_a_name_or_alias_taken_or_a_late_registration_is_refused() -> None:
    from engine_ctl import providers
    from engine_ctl.core.documents import forms  # noqa: F401  (builds the documents' models: seals the registry)

    late = TOY.__class__(**{**TOY.__dict__, "name": "late", "aliases": ()})
    try:
        providers.register(late)
    except RuntimeError as e:
        assert "registered after engine_ctl.core.documents" in str(e)
    else:
        raise AssertionError("a provider registered after the documents' models were built was accepted")
    assert "late" not in providers.PROVIDERS
    script = (
        "from engine_ctl import providers\nfrom tests.test_engine_providers import TOY\n"
        "providers.register(TOY.__class__(**{**TOY.__dict__, 'name': 'x', 'aliases': ('llamacpp',)}))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode != 0 and "is taken" in done.stderr


def _engine_words(path: Path) -> list[str]:
    """'file:line: word' for each engine name in a name, string or comment of a Python file, or in a template."""
    text = path.read_text()
    if path.suffix != ".py":
        return [f"{path}:{text[: m.start()].count(chr(10)) + 1}: {m.group()}" for m in ENGINE_NAME.finditer(text)]
    kinds = {tokenize.NAME, tokenize.STRING, tokenize.COMMENT}
    out = []
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type in kinds or tok.type == getattr(tokenize, "FSTRING_MIDDLE", -1):
            out += [f"{path}:{tok.start[0]}: {m.group()}" for m in ENGINE_NAME.finditer(tok.string)]
    return out


def test_no_module_outside_providers_names_an_engine() -> None:
    found = []
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*")):
            if path.is_file() and path.suffix in (".py", ".j2") and str(path.relative_to(ROOT)) not in ALLOWED:
                found += _engine_words(path)
    assert found == [], "engine names outside providers/ (ask the provider instead):\n" + "\n".join(found)
    # the scan sees names in code, strings and comments alike: it finds them where they belong
    in_providers = _engine_words(ROOT / "providers" / "sglang.py")
    assert any(w.endswith(": sglang") for w in in_providers) and any(w.endswith("SGLang") for w in in_providers)


def test_health_while_loading_is_the_providers_answer() -> None:
    """llama-server answers 503 while it loads its model; vLLM's 503 means its engine died (no loading answer)."""
    from engine_ctl.core.fit.hostfacts import HostFacts, UnitFact
    from engine_ctl.core.fit.runspec import FitPlan
    from engine_ctl.core.plan.status import deployment_status
    from engine_ctl.core.record.model import DeploymentRecord, ReplicaRecord
    from tests.fleetfacts import h100x8

    unit = "engine-ctl-chat-0a.service"
    replica = ReplicaRecord(index=0, host="gpu-h100", unit=unit, port=8001, unit_sha256="0" * 64, revision=1,
                            status="serving")  # fmt: skip
    facts = h100x8().model_copy(
        update={"units": (UnitFact(name=unit, sha256="0" * 64, active_state="active"),), "health": {"8001": "503"}}
    )
    assert isinstance(facts, HostFacts)
    seen = {}
    for engine in ("llama.cpp", "vllm"):
        plan = FitPlan(engine=engine, gpu_vendor="any", accelerator="gpu", kind="chat", gpus=1, min_gpu_memory_gb=10,
                       memory_basis="arch", cpu_cores=4, threads=None, memory_bytes=1 << 30, context_length=4096,
                       parallel=1, weights_bytes=1 << 30, kv_cache_bytes=1 << 28)  # fmt: skip
        record = DeploymentRecord(name="chat", revision=1, plan=plan, replicas=[replica])
        (instance,) = deployment_status(record, {"gpu-h100": facts}).instances
        seen[engine] = (instance.state, instance.last_error)
    assert seen == {"llama.cpp": ("starting", None), "vllm": ("starting", "health check: 503")}
