"""The seeds' rules, with their exact messages. Pure: DesiredState in, diagnostics out."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterator, Sequence

from engine_ctl.core.diagnostics import Diagnostic, Location
from engine_ctl.core.documents.engine_args import check_engine_args
from engine_ctl.core.documents.inventory import Host
from engine_ctl.core.model import (
    FORMAT_TITLES,
    Deployment,
    DesiredState,
    HfRef,
    LoadedDeployment,
    LoadedModel,
    Model,
    Origin,
)
from engine_ctl.providers import (
    AUTO,
    PROVIDERS,
    Provider,
    cpu_provider,
    decision_providers,
    deployment_option_keys,
    provider,
    provider_for_format,
    titles,
)
from engine_ctl.providers.base import split_flags

NAME_RULE = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
NAME_MESSAGE = "lowercase letters, digits and -, not starting or ending with -, at most 40 characters"
MODEL_NAME_RULE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,127}$")


COMMIT_RULE = re.compile(r"^[0-9a-f]{40}$")

SPEC_NAMES = {
    "name": "metadata.name",
    "replicas_min": "spec.replicas.min",
    "replicas_max": "spec.replicas.max",
    "idle_minutes": "spec.replicas.idle_minutes",
}
FLAT_NAMES = {
    "replicas_min": "replicas",
    "replicas_max": "replicas",
    "context_length": "engine_config.context_length",
    "engine_args": "engine_config.extra_args",
    "accept_extra_args": "engine_config.accept_extra_args",
    "gpu_memory_bytes": "engine_config.memory.request",
    "ram_bytes": "resources.ram",
    "startup_bytes": "engine_config.memory.startup",
    "startup_timeout_s": "timeouts.startup",
    "hf": "model",
    "path": "model",
}


def field_name(origin: Origin, internal: str) -> str:
    """An internal field as the document's own form names it: spec.replicas.max, or the flat form's replicas."""
    if origin.form == "flat":
        if internal in deployment_option_keys():
            return f"engine_config.{internal}"  # a provider's own key (an EngineOption)
        return FLAT_NAMES.get(internal, internal)
    return SPEC_NAMES.get(internal, f"spec.{internal}")


def where(origin: Origin, internal: str) -> tuple[Location, str]:
    """The location and written path of an internal field (the document's start when not written)."""
    if internal in origin.fields:
        path, line, column = origin.fields[internal]
        return Location(origin.file, line, column), path
    return Location(origin.file, origin.line, origin.column), field_name(origin, internal)


def _err(origin: Origin, internal: str, message: str, hint: str | None = None, *, code: str) -> Diagnostic:
    location, path = where(origin, internal)
    return Diagnostic(location, path, message, hint=hint, code=code)


def _warn(origin: Origin, internal: str, message: str, hint: str | None = None, *, code: str) -> Diagnostic:
    location, path = where(origin, internal)
    return Diagnostic(location, path, message, hint=hint, severity="warning", code=code)


def resolve_engine(deployment: Deployment, model: Model | None) -> Provider | None:
    """The engine a deployment runs: its own choice, or auto's pick from the model's format."""
    if deployment.engine != AUTO:
        return provider(deployment.engine)
    if deployment.accelerator == "cpu":
        return cpu_provider()
    if model is None:
        return None
    return provider_for_format(model.format)


def written(origin: Origin, internal: str) -> bool:
    return internal in origin.fields and origin.fields[internal][0] != ""


def check_deployment(
    loaded: LoadedDeployment, model: Model | None, broken_models: frozenset[str] = frozenset()
) -> Iterator[Diagnostic]:
    d, o = loaded.deployment, loaded.origin
    if len(d.name) > 40 or not NAME_RULE.match(d.name):
        yield _err(o, "name", f"{field_name(o, 'name')} {d.name!r}: {NAME_MESSAGE}", code="invalid_name")
    if model is None and d.model not in broken_models:
        yield _err(
            o,
            "model",
            f'spec.model "{d.model}": a model of the deployment\'s own workspace',
            hint=f"no Model document named {d.model!r} was loaded; add one (kind: Model) or pass its file too",
            code="unknown_model",
        )
    yield from _check_replicas(loaded)
    yield from _check_numbers(loaded, model)
    engine = resolve_engine(d, model)
    if engine is None:
        return
    if d.accelerator == "cpu" and not engine.runs_on("cpu"):
        yield _err(
            o,
            "accelerator",
            f"spec.accelerator: cpu is served by {cpu_provider().title}; {_engine_title(engine)} needs a GPU",
            code="accelerator_mismatch",
        )
    if model is not None and model.format not in engine.formats:
        yield _format_mismatch(loaded, engine, model)
    yield from _check_capabilities(loaded, engine, model)
    yield from _check_args(loaded, engine)
    yield from _check_flat(loaded, engine)
    yield from _check_decisions(loaded, engine, model)
    yield from _check_nodes(loaded, engine)


MAX_NODES = 16


def _check_nodes(loaded: LoadedDeployment, engine: Provider) -> Iterator[Diagnostic]:
    """spec.nodes (issue 30): a replica group needs an engine with its own distributed runtime, always-on
    replicas (the scaler starts one machine's unit, not a group) and a restart residency."""
    d, o = loaded.deployment, loaded.origin
    if d.nodes is None:
        return
    if not 1 <= d.nodes <= MAX_NODES:
        yield _err(o, "nodes", f"spec.nodes: between 1 and {MAX_NODES} machines per replica", code="out_of_range")
        return
    if not engine.multi_node:
        yield _err(
            o, "nodes", f"spec.nodes {d.nodes}: {_engine_title(engine)} does not spread a replica over machines",
            hint="leave nodes out (1), or choose an engine with a distributed runtime: "
            + ", ".join(p.title for p in PROVIDERS.values() if p.multi_node),
            code="nodes_unsupported",
        )  # fmt: skip
    if d.replicas_min != d.replicas_max:
        yield _err(
            o, "nodes", f"spec.nodes {d.nodes}: a replica group is always on; spec.replicas.min must equal max",
            hint="scaling replica groups on demand is not supported yet", code="nodes_unsupported",
        )  # fmt: skip
    if d.api == "decisions":
        yield _err(
            o, "nodes", f"spec.nodes {d.nodes}: a decisions deployment runs on one machine (seed 003)",
            hint="leave nodes out (1)", code="nodes_unsupported",
        )  # fmt: skip
    if d.host is not None:
        yield _err(
            o, "nodes", f"spec.nodes {d.nodes}: a replica group spans machines; spec.host names one",
            hint="leave spec.host out", code="nodes_unsupported",
        )  # fmt: skip


def _check_replicas(loaded: LoadedDeployment) -> Iterator[Diagnostic]:
    d, o = loaded.deployment, loaded.origin
    if not 1 <= d.replicas_max <= 64:
        yield _err(o, "replicas_max", f"{field_name(o, 'replicas_max')}: between 1 and 64", code="out_of_range")
    if o.form == "flat":
        return  # one number: min = max
    if d.replicas_min < 0:
        yield _err(o, "replicas_min", "spec.replicas.min: at least 0", code="out_of_range")
    elif d.replicas_min > d.replicas_max:
        yield _err(o, "replicas_min", "spec.replicas.min: at most spec.replicas.max", code="out_of_range")
    if d.idle_minutes is not None and not 1 <= d.idle_minutes <= 1440:
        yield _err(o, "idle_minutes", "spec.replicas.idle_minutes: between 1 and 1440", code="out_of_range")
    if d.replicas_min > 0 and written(o, "idle_minutes"):
        yield _warn(
            o,
            "idle_minutes",
            "spec.replicas.idle_minutes: ignored (cleared) because spec.replicas.min is above 0",
            hint="idle_minutes applies only with min: 0 (scale to zero)",
            code="ignored_field",
        )


def _check_numbers(loaded: LoadedDeployment, model: Model | None) -> Iterator[Diagnostic]:
    d, o = loaded.deployment, loaded.origin
    if d.context_length is not None:
        ctx = field_name(o, "context_length")
        if d.context_length < 256:
            yield _err(o, "context_length", f"{ctx}: at least 256 tokens", code="out_of_range")
        elif model is not None and model.context_length is not None and d.context_length > model.context_length:
            yield _err(
                o,
                "context_length",
                f"{ctx} {d.context_length}: model {model.name} takes at most {model.context_length} tokens",
                code="context_too_long",
            )
    if d.parallel is not None and not 1 <= d.parallel <= 1024:
        yield _err(o, "parallel", "spec.parallel: between 1 and 1024", code="out_of_range")
    if d.cpu_cores is not None and not 1 <= d.cpu_cores <= 1024:
        yield _err(o, "cpu_cores", "spec.cpu_cores: between 1 and 1024", code="out_of_range")
    if d.gpus is not None:
        if d.accelerator == "cpu":
            yield _err(o, "gpus", "spec.gpus: a CPU-only deployment has none", code="out_of_range")
        elif d.gpus not in (1, 2, 4, 8):
            yield _err(o, "gpus", "spec.gpus: 1, 2, 4 or 8 GPUs of one machine per replica", code="out_of_range")
    if d.priority < -1000 or d.priority > 1000:
        yield _err(o, "priority", "spec.priority: between -1000 and 1000", code="out_of_range")


def _engine_title(engine: Provider) -> str:
    return engine.title


SERVED = {"gguf": "GGUF", "safetensors": "safetensors checkpoints"}
"""A format as an engine serves it ("<engine> serves safetensors checkpoints")."""
ONE = {"gguf": "GGUF", "safetensors": "a safetensors checkpoint"}
"""A format as one model is it ("model qwen is a safetensors checkpoint")."""


def _serves(engine: Provider) -> str:
    return " and ".join(SERVED[f] for f in sorted(engine.formats))


def _format_mismatch(loaded: LoadedDeployment, engine: Provider, model: Model) -> Diagnostic:
    """The seed's message, at the deployment's model line; a CPU deployment is never pointed at a GPU engine.
    The engines named are the providers' answers: which engine serves what, and which one `auto` picks."""
    o = loaded.origin
    if model.format == "gguf":
        message = (
            f"model {model.name} is GGUF: serve it with {provider_for_format(model.format).title} "
            f"({_engine_title(engine)} serves {_serves(engine)} here)"
        )
        return _err(o, "model", message, code="format_mismatch")
    if loaded.deployment.accelerator == "cpu":
        cpu = cpu_provider()
        wanted = sorted(cpu.formats)[0]
        return _err(
            o,
            "model",
            f"{_engine_title(engine)} serves {_serves(engine)}; model {model.name} is {ONE[model.format]}: a "
            f"CPU-only deployment is served by {cpu.title}, so it needs a {FORMAT_TITLES[wanted]} model",
            hint=f"point the deployment at a {FORMAT_TITLES[wanted]} build of the model (kind: Model with format: "
            f"{wanted})",
            code="format_mismatch",
        )
    return _err(
        o,
        "model",
        f"{_engine_title(engine)} serves {_serves(engine)}; model {model.name} is {ONE[model.format]}: serve it "
        f"with {provider_for_format(model.format).name}",
        code="format_mismatch",
    )


CAPABILITY_TITLES = {"transcription": "speech to text", "video": "video"}
"""A capability as seed 001's table names it."""


def _check_capabilities(loaded: LoadedDeployment, engine: Provider, model: Model | None) -> Iterator[Diagnostic]:
    """A capability of the model the engine does not serve is refused, naming an engine that serves it."""
    for cap in [c for c in (model.capabilities if model else ()) if c in engine.lacks]:
        others = [p for p in providers_serving(cap) if model is not None and model.format in p.formats]
        todo = f"serve it with {titles(others, ' or ')}" if others else f"no engine here serves {cap} for this model"
        yield _err(
            loaded.origin,
            "engine" if written(loaded.origin, "engine") else "model",
            f"capability_missing:{cap}: {engine.title} does not serve {CAPABILITY_TITLES.get(cap, cap)} "
            f"(model {model.name if model else ''} has capability {cap}); {todo}",
            hint=f"leave {cap} out of the model's capabilities, or choose another engine",
            code="capability_missing",
        )


def providers_serving(cap: str) -> list[Provider]:
    from engine_ctl.providers import PROVIDERS

    return [p for p in PROVIDERS.values() if cap not in p.lacks]


def _check_args(loaded: LoadedDeployment, engine: Provider) -> Iterator[Diagnostic]:
    d, o = loaded.deployment, loaded.origin
    for problem in check_engine_args(d.engine_args, engine, field_name(o, "engine_args")):
        internal = "engine_args" if problem.index is None else f"engine_args[{problem.index}]"
        yield _err(o, internal, _set_it_with(o, problem.message), problem.hint, code=problem.code)


SET_IT_WITH = re.compile(r"set it with spec\.([a-z_]+)")


def _set_it_with(origin: Origin, message: str) -> str:
    """The flat form's own name in "set it with spec.context_length" (or that the field is the spec form's)."""
    if origin.form != "flat":
        return message

    def name(match: re.Match[str]) -> str:
        internal = match.group(1)
        if internal in FLAT_NAMES:
            return f"set it with {FLAT_NAMES[internal]}"
        return f"set it with spec.{internal} (a field of the metadata/spec form)"

    return SET_IT_WITH.sub(name, message)


def _check_flat(loaded: LoadedDeployment, engine: Provider) -> Iterator[Diagnostic]:
    d, o = loaded.deployment, loaded.origin
    if o.form != "flat":
        return
    if d.engine_args and not written(o, "accept_extra_args"):
        yield _err(
            o,
            "engine_args",
            "engine_config.extra_args: set engine_config.accept_extra_args: true to pass extra engine arguments",
            code="extra_args_not_accepted",
        )
    if (
        written(o, "residency")
        and d.residency != "restart_only"
        and d.api == "chat"
        and not engine.parks_asleep(d.residency)
    ):
        yield _warn(
            o,
            "residency",
            f"residency {d.residency}: {engine.title} has no sleep mode; a park stops it (treated as restart_only)",
            code="ignored_field",
        )
    own = {option.key for option in engine.options}
    for key in sorted(d.engine_options.keys() - own):
        yield _warn(o, key, f"engine_config.{key}: {engine.title} has no such switch; ignored", code="ignored_field")


def _check_decisions(loaded: LoadedDeployment, engine: Provider, model: Model | None) -> Iterator[Diagnostic]:
    """Seed 003, Decision models: the engine serves them; restart_only; no tool-call or reasoning parser."""
    d, o = loaded.deployment, loaded.origin
    if d.api != "decisions":
        return
    if not engine.serves_decisions:
        yield _err(
            o,
            "engine",
            f"capability_missing:decisions: {_engine_title(engine)} does not serve decision models here",
            hint=f"serve decision models with {titles(decision_providers(), ' or ')}",
            code="capability_missing",
        )
    if d.residency in ("deep", "host_backed") or (d.residency == "parked" and written(o, "residency")):
        yield _err(
            o,
            "residency",
            f"residency {d.residency}: a decisions deployment restarts instead of parking (restart_only)",
            code="decisions_conflict",
        )
    parser_flags = {*engine.parser_flags.values(), *(f for p in decision_providers() for f in p.parser_flags.values())}
    for flag in [f for f, _ in split_flags(d.engine_args) if f in parser_flags]:
        yield _err(
            o,
            "engine_args",
            f"engine_config.extra_args {flag}: a decisions deployment has no {flag[2:]}",
            code="decisions_conflict",
        )
    for key in ("tool_call_parser", "reasoning_parser"):
        if model is not None and getattr(model, key):
            yield _err(
                o,
                "api",
                f"api: decisions: model {model.name!r} sets {key}; a decisions deployment has no "
                f"{key.removesuffix('_parser').replace('_', '-')} parser",
                hint=f"leave {key} out of the Model document, or serve the model as chat",
                code="decisions_conflict",
            )


def check_model(loaded: LoadedModel) -> Iterator[Diagnostic]:
    m, o = loaded.model, loaded.origin
    if o.form == "model" and not MODEL_NAME_RULE.match(m.name):
        yield _err(
            o,
            "name",
            f"metadata.name {m.name!r}: letters, digits, '.', '_', '-' and '/', at most 128 characters",
            code="invalid_name",
        )
    if m.path is None and m.hf is None:
        yield _err(
            o,
            "path",
            "spec.path or spec.hf: say where the weights are",
            hint="path: a file or directory on the hosts",
            code="model_source_missing",
        )
    if m.path is not None and m.hf is not None:
        yield _err(o, "hf", "spec.path and spec.hf: give one of them", code="model_source_conflict")
    if m.path is not None and ".." in m.path.split("/"):
        yield _err(o, "path", f"{m.path!r}: '..' is not allowed in a model path", code="path_escapes")
    if m.hf is not None:
        yield from _check_hf(o, m.hf)
    if m.context_length is not None and m.context_length < 256:
        yield _err(o, "context_length", "spec.context_length: at least 256 tokens", code="out_of_range")
    if m.parameters is not None and m.parameters <= 0:
        yield _err(o, "parameters", "spec.parameters: a positive count", code="out_of_range")


def _check_hf(o: Origin, hf: HfRef) -> Iterator[Diagnostic]:
    """An hf: reference is org/repo pinned to a full commit (validate works offline: nothing resolves it)."""
    field = where(o, "hf")[1]
    if hf.repo.count("/") != 1:
        yield _err(o, "hf", f"{field} {hf.repo!r}: a Hugging Face repository is org/repo", code="invalid_hf_repo")
    if not hf.commit:
        yield _err(
            o,
            "hf",
            f"{field} {hf.repo}: no commit; validate works offline, so it refuses an hf: reference without a commit",
            hint=f"pin it: {hf.repo}@<commit>",
            code="unpinned_hf",
        )
    elif not COMMIT_RULE.match(hf.commit):
        at = "commit" if "commit" in o.fields else "hf"
        written_as = hf.commit if at == "commit" else str(hf)
        yield _err(
            o,
            at,
            f"{where(o, at)[1]} {written_as}: a commit is 40 hexadecimal digits (0-9, a-f), not {hf.commit!r}",
            hint=f"pin the full commit id from {hf.repo}'s history on huggingface.co; "
            "a branch, a tag or a short id is not a pin",
            code="invalid_commit",
        )


def check(desired: DesiredState, broken_models: frozenset[str] = frozenset()) -> list[Diagnostic]:
    """Every rule over every document, plus duplicate names across files."""
    out: list[Diagnostic] = []
    seen_models: dict[str, LoadedModel] = {}
    for loaded in desired.models:
        out.extend(check_model(loaded))
        first = seen_models.get(loaded.model.name)
        if first is not None and not (
            first.origin.form == "flat" and loaded.origin.form == "flat" and first.model == loaded.model
        ):
            out.append(
                _err(
                    loaded.origin,
                    "name",
                    f"duplicate model name {loaded.model.name!r} (first defined at {where(first.origin, 'name')[0]})",
                    code="duplicate_name",
                )
            )
        seen_models.setdefault(loaded.model.name, loaded)
    seen: dict[str, LoadedDeployment] = {}
    for loaded_d in desired.deployments:
        model = desired.model(loaded_d.deployment.model)
        out.extend(check_deployment(loaded_d, model, broken_models))
        first_d = seen.get(loaded_d.deployment.name)
        if first_d is not None:
            out.append(
                _err(
                    loaded_d.origin,
                    "name",
                    f"duplicate deployment name {loaded_d.deployment.name!r} (first defined at "
                    f"{where(first_d.origin, 'name')[0]})",
                    hint="deployment names are unique across all files: clients call a deployment by its name",
                    code="duplicate_name",
                )
            )
        seen.setdefault(loaded_d.deployment.name, loaded_d)
    return out


def check_hosts(desired: DesiredState, hosts: Sequence[str], inventory_file: str | None = None) -> list[Diagnostic]:
    """spec.host (the flat form's host:) names a host of the inventory; otherwise an error with a did-you-mean."""
    out: list[Diagnostic] = []
    where_from = f" ({inventory_file})" if inventory_file else ""
    for loaded in desired.deployments:
        d, o = loaded.deployment, loaded.origin
        if d.host is None or d.host in hosts:
            continue
        close = difflib.get_close_matches(d.host, list(hosts), n=1)
        known = ", ".join(hosts) or "(none)"
        hint = (f"did you mean {close[0]!r}? " if close else "") + f"the inventory's hosts: {known}"
        message = f'{field_name(o, "host")} "{d.host}": no host of that name in the inventory{where_from}'
        out.append(_err(o, "host", message, hint=hint, code="unknown_host"))
    return out


PLATFORMS_BY_VENDOR = {"nvidia": ("cuda",), "amd": ("rocm", "vulkan")}
"""The builds a vendor's GPUs run (seed 001, GPU vendors): what a host must name for gpu_vendor."""


def check_profiles(desired: DesiredState, hosts: Sequence[Host]) -> list[Diagnostic]:
    """validate --inventory, offline: a deployment that names its host (host:) finds there a build of its engine
    for what it runs on, where the inventory names that engine's builds per platform (a CPU-only deployment: cpu;
    gpu_vendor nvidia: cuda; amd: rocm or vulkan). The host's devices and capacity are in its facts (plan)."""
    by_name = {h.name: h for h in hosts}
    out: list[Diagnostic] = []
    for loaded in desired.deployments:
        d, o = loaded.deployment, loaded.origin
        host = by_name.get(d.host or "")
        engine = resolve_engine(d, desired.model(d.model))
        builds = host.engine_builds.get(engine.name) if host is not None and engine is not None else None
        if not builds or engine is None:
            continue
        wanted = ("cpu",) if d.accelerator == "cpu" else PLATFORMS_BY_VENDOR.get(d.gpu_vendor, ())
        if not wanted or set(wanted) & builds.keys():
            continue
        named = ", ".join(sorted(builds))
        out.append(_err(o, "host", f"{field_name(o, 'host')} \"{d.host}\": the inventory names no {engine.title} "
                        f"build for {' or '.join(wanted)} there (it names: {named})",
                        hint=f"add engines.{engine.name}.{wanted[0]} to {d.host} in the inventory",
                        code="profile_not_published"))  # fmt: skip
    return out
