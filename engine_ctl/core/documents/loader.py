"""Load documents of either form into the internal model, keeping where every field was written.

`load_documents` is pure: it takes parsed documents and returns values and diagnostics.
"""

from __future__ import annotations

import difflib
import os
import posixpath
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from engine_ctl.core.diagnostics import Diagnostic, Location
from engine_ctl.core.documents.apikey import api_key_from
from engine_ctl.core.documents.forms import (
    DeploymentDocument,
    FlatDeploymentDocument,
    FlatEngineConfig,
    HfSource,
    ModelDocument,
)
from engine_ctl.core.documents.inventory import Inventory, inventory_from
from engine_ctl.core.documents.shape import diagnostics_from
from engine_ctl.core.documents.yamlsource import SourceDocument, expand_paths, read_path, text_problems
from engine_ctl.core.model import (
    ApiKey,
    Architecture,
    Deployment,
    DesiredState,
    HfRef,
    LoadedDeployment,
    LoadedModel,
    Model,
    Origin,
    distinct_flat_models,
)
from engine_ctl.core.sizes import parse_seconds, parse_size
from engine_ctl.providers import canonical_engine, deployment_option_keys, engine_options, provider

KINDS = ("Deployment", "Model", "Inventory", "ApiKey")
STATE_NAME = "engine-ctl.state.json"
OWN_KINDS = {"Plan": "a saved plan", "State": "an engine-ctl state", "Render": "a `render --json` output"}
OWN_NAMES = {
    STATE_NAME: "the state",
    STATE_NAME + ".backup": "the state's backup",
    STATE_NAME + ".lock": "the state's lock",
}


@dataclass
class LoadResult:
    desired: DesiredState
    inventory: Inventory | None
    diagnostics: list[Diagnostic] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    broken_models: set[str] = field(default_factory=set)
    """Names of models whose documents did not load (so "model exists" is not reported twice)."""
    documents: dict[str, list[str]] = field(default_factory=dict)
    """file -> the names of what it defines ('deployment chat', 'model llama-3-2-3b', 'inventory')."""
    skipped: dict[str, str] = field(default_factory=dict)
    """file -> what engine-ctl file it is ('a saved plan', 'the state's backup'): never read as documents."""
    searched: list[str] = field(default_factory=list)
    """The paths the documents were looked for in, as given."""
    inventories: dict[str, Inventory] = field(default_factory=dict)
    """file -> the inventory it holds: every one loaded (`inventory` is the last); an environment's is chosen
    by its file name (hosts.staging.yaml)."""

    @property
    def has_documents(self) -> bool:
        """Whether any deployment or model document was loaded (an inventory alone is not a set of documents)."""
        return bool(self.desired.deployments or self.desired.models or self.broken_models) or any(
            k != ["inventory"] for k in self.documents.values()
        )

    def skipped_note(self) -> str | None:
        """The one line that says which of engine-ctl's own files were left out, or None."""
        if not self.skipped:
            return None
        listed = ", ".join(f"{f} ({what})" for f, what in sorted(self.skipped.items()))
        return f"Skipped engine-ctl's own files, not documents: {listed}"


def _fields(doc: SourceDocument, mapping: dict[str, tuple[str | int, ...]]) -> dict[str, tuple[str, int, int]]:
    """internal field -> (path as written, line, column) for the parts present in the document."""
    from engine_ctl.core.diagnostics import format_path

    out: dict[str, tuple[str, int, int]] = {}
    for internal, path in mapping.items():
        if path not in doc.value_positions and path not in doc.key_positions:
            continue
        loc = doc.locate(path)
        out[internal] = (format_path(path), loc.line or doc.line, loc.column or doc.column)
    return out


def _items(internal: str, path: tuple[str | int, ...], n: int) -> dict[str, tuple[str | int, ...]]:
    return {f"{internal}[{i}]": (*path, i) for i in range(n)}


def parse_hf(text: str) -> HfRef:
    repo, _, commit = text.partition("@")
    return HfRef(repo=repo, commit=commit or None)


def _hf_from(value: str | HfSource) -> HfRef:
    if isinstance(value, str):
        return parse_hf(value)
    ref = parse_hf(value.hf)
    return HfRef(repo=ref.repo, commit=value.commit or ref.commit)


def _spec_deployment(doc: SourceDocument, parsed: DeploymentDocument) -> LoadedDeployment:
    spec = parsed.spec
    rep = spec.replicas
    deployment = Deployment(
        name=parsed.metadata.name,
        labels=dict(parsed.metadata.labels),
        model=spec.model,
        engine=canonical_engine(spec.engine),
        replicas_min=rep.min,
        replicas_max=rep.max,
        idle_minutes=(15 if rep.idle_minutes is None else rep.idle_minutes) if rep.min == 0 else None,
        accelerator=spec.accelerator,
        gpus=spec.gpus,
        gpu_vendor=spec.gpu_vendor,
        cpu_cores=spec.cpu_cores,
        context_length=spec.context_length,
        parallel=spec.parallel,
        engine_args=tuple(spec.engine_args),
        priority=spec.priority,
        host=spec.host,
        prevent_destroy=spec.prevent_destroy,
        api=spec.api,
        nodes=spec.nodes if spec.nodes != 1 else None,
    )
    paths: dict[str, tuple[str | int, ...]] = {
        "name": ("metadata", "name"),
        "api": ("spec", "api"),
        "model": ("spec", "model"),
        "engine": ("spec", "engine"),
        "replicas_min": ("spec", "replicas", "min"),
        "replicas_max": ("spec", "replicas", "max"),
        "idle_minutes": ("spec", "replicas", "idle_minutes"),
        "accelerator": ("spec", "accelerator"),
        "gpus": ("spec", "gpus"),
        "gpu_vendor": ("spec", "gpu_vendor"),
        "cpu_cores": ("spec", "cpu_cores"),
        "context_length": ("spec", "context_length"),
        "parallel": ("spec", "parallel"),
        "engine_args": ("spec", "engine_args"),
        "priority": ("spec", "priority"),
        "host": ("spec", "host"),
        "prevent_destroy": ("spec", "prevent_destroy"),
        "nodes": ("spec", "nodes"),
        **_items("engine_args", ("spec", "engine_args"), len(spec.engine_args)),
    }
    origin = Origin(file=doc.file, form="spec", line=doc.line, column=doc.column, fields=_fields(doc, paths))
    return LoadedDeployment(deployment=deployment, origin=origin)


def _option_values(cfg: FlatEngineConfig) -> dict[str, Any]:
    """The engine-only keys of a flat engine_config that were written (their providers declare them)."""
    return {o.key: getattr(cfg, o.key) for o in engine_options() if getattr(cfg, o.key, None) is not None}


def _model_file(cfg: FlatEngineConfig) -> tuple[str | None, str | None]:
    """(file, format) when an engine-only key names the model's file (its EngineOption's model_file)."""
    values = _option_values(cfg)
    for o in engine_options():
        if o.model_file is not None and o.key in values:
            return o.model_file(values[o.key]), o.model_format
    return None, None


def _flat_model(parsed: FlatDeploymentDocument) -> Model:
    cfg = parsed.engine_config
    model_file, file_format = _model_file(cfg)
    engine = canonical_engine(parsed.engine)
    raw = parsed.model
    hf: HfRef | None = None
    path: str | None = None
    if isinstance(raw, HfSource) or ("@" in raw and not raw.startswith("/")):
        hf = _hf_from(raw)
        name = hf.repo
    else:
        path = raw
        name = posixpath.basename(raw.rstrip("/")) or raw
    only = sorted(provider(engine).formats) if engine != "auto" else []
    if file_format:
        fmt = file_format
    elif (path or "").endswith(".gguf"):
        fmt = "gguf"
    elif len(only) == 1:
        fmt = only[0]  # the engine serves one format only
    else:
        fmt = "safetensors"
    return Model(
        name=name,
        format=fmt,
        path=path,
        hf=hf,
        file=model_file,
        context_length=None,
        capabilities=("chat",),
    )


def _flat_deployment(doc: SourceDocument, parsed: FlatDeploymentDocument) -> tuple[LoadedDeployment, LoadedModel]:
    cfg = parsed.engine_config
    model = _flat_model(parsed)
    res = parsed.resources
    request = cfg.memory.request if cfg.memory else None
    gpu_mem = request if request is not None else (res.gpu if res else None)
    deployment = Deployment(
        name=parsed.name,
        model=model.name,
        engine=canonical_engine(parsed.engine),
        replicas_min=parsed.replicas,
        replicas_max=parsed.replicas,
        accelerator="host",
        context_length=cfg.context_length,
        engine_args=tuple(cfg.extra_args),
        host=parsed.host,
        api=parsed.api,
        residency=parsed.residency,
        devices=tuple(d.id for d in parsed.devices),
        gpu_memory_bytes=_size_or_none(gpu_mem),
        ram_bytes=_size_or_none(res.ram if res else None),
        engine_options={k: v for k, v in _option_values(cfg).items() if k in deployment_option_keys()},
        prevent_destroy=parsed.prevent_destroy,
        startup_bytes=_size_or_none(cfg.memory.startup if cfg.memory else None),
        startup_timeout_s=_seconds_or_none(parsed.timeouts.startup if parsed.timeouts else None),
    )
    paths: dict[str, tuple[str | int, ...]] = {
        "name": ("name",),
        "model": ("model",),
        "engine": ("engine",),
        "replicas_min": ("replicas",),
        "replicas_max": ("replicas",),
        "context_length": ("engine_config", "context_length"),
        "engine_args": ("engine_config", "extra_args"),
        "accept_extra_args": ("engine_config", "accept_extra_args"),
        "host": ("host",),
        "api": ("api",),
        "residency": ("residency",),
        "devices": ("devices",),
        "gpu_memory_bytes": ("engine_config", "memory", "request") if request is not None else ("resources", "gpu"),
        "startup_bytes": ("engine_config", "memory", "startup"),
        "startup_timeout_s": ("timeouts", "startup"),
        "ram_bytes": ("resources", "ram"),
        **{o.key: ("engine_config", o.key) for o in engine_options()},
        "prevent_destroy": ("prevent_destroy",),
        **_items("engine_args", ("engine_config", "extra_args"), len(cfg.extra_args)),
    }
    fields = _fields(doc, paths)
    origin = Origin(file=doc.file, form="flat", line=doc.line, column=doc.column, fields=fields)
    model_origin = Origin(
        file=doc.file,
        form="flat",
        line=doc.line,
        column=doc.column,
        fields=_fields(doc, _flat_model_paths(parsed.model)),
    )
    return LoadedDeployment(deployment=deployment, origin=origin), LoadedModel(model=model, origin=model_origin)


def _flat_model_paths(raw: str | HfSource) -> dict[str, tuple[str | int, ...]]:
    if isinstance(raw, HfSource):
        return {"name": ("model",), "hf": ("model", "hf"), "commit": ("model", "commit")}
    return {"name": ("model",), "path": ("model",), "hf": ("model",)}


def _hf_problems(doc: SourceDocument, path: tuple[str | int, ...], value: object) -> list[Diagnostic]:
    """{hf: org/repo@a, commit: b} names two commits: refused as ambiguous rather than one silently winning."""
    from engine_ctl.core.diagnostics import format_path

    if not isinstance(value, HfSource) or value.commit is None:
        return []
    pinned = parse_hf(value.hf).commit
    if pinned is None or pinned == value.commit:
        return []
    return [
        Diagnostic(
            doc.locate((*path, "commit")),
            format_path((*path, "commit")),
            f"{format_path((*path, 'commit'))} {value.commit}: ambiguous, {format_path((*path, 'hf'))} "
            f"{value.hf} already names commit {pinned}",
            hint="give the commit once: org/repo@<commit>, or hf: org/repo with commit: <commit>",
            code="ambiguous_commit",
        )
    ]


def _architecture_problems(doc: SourceDocument, model: Model) -> list[Diagnostic]:
    """spec.architecture: positive counts, a whole shape (a head size), KV heads that divide the heads."""
    from engine_ctl.core.diagnostics import format_path

    if model.architecture is None:
        return []
    out = []
    for name, message, hint in model.architecture.problems():
        path = ("spec", "architecture", name)
        field = format_path(path)
        at = doc.locate(path) if path in doc.value_positions else doc.locate(path[:-1], key=True)
        out.append(Diagnostic(at, field, f"{field} {message}", hint=hint, code="invalid_architecture"))
    return out


def _size_or_none(value: str | int | None) -> int | None:
    if value is None:
        return None
    try:
        return parse_size(value)
    except ValueError:
        return None  # reported by rules.check_sizes


def _seconds_or_none(value: str | int | None) -> int | None:
    try:
        return None if value is None else parse_seconds(value)
    except ValueError:
        return None  # reported by _size_problems


def _size_problems(doc: SourceDocument, parsed: FlatDeploymentDocument) -> list[Diagnostic]:
    from engine_ctl.core.diagnostics import format_path

    candidates: list[tuple[tuple[str | int, ...], str | int | None]] = [
        (
            ("engine_config", "memory", "request"),
            parsed.engine_config.memory.request if parsed.engine_config.memory else None,
        ),
        (("resources", "gpu"), parsed.resources.gpu if parsed.resources else None),
        (("resources", "ram"), parsed.resources.ram if parsed.resources else None),
        (
            ("engine_config", "memory", "startup"),
            parsed.engine_config.memory.startup if parsed.engine_config.memory else None,
        ),
        (("timeouts", "startup"), parsed.timeouts.startup if parsed.timeouts else None),
    ]
    out = []
    for path, value in candidates:
        if value is None:
            continue
        try:
            (parse_seconds if path[0] == "timeouts" else parse_size)(value)
        except ValueError as exc:
            out.append(Diagnostic(doc.locate(path), format_path(path), str(exc), code="invalid_size"))
    return out


def _model(doc: SourceDocument, parsed: ModelDocument) -> LoadedModel:
    spec = parsed.spec
    model = Model(
        name=parsed.metadata.name,
        format=spec.format,
        path=spec.path,
        hf=_hf_from(spec.hf) if spec.hf is not None else None,
        file=spec.file,
        context_length=spec.context_length,
        parameters=spec.parameters,
        weights_bytes=spec.weights_bytes,
        chat_template=spec.chat_template,
        mmproj=spec.mmproj,
        capabilities=tuple(spec.capabilities),
        pooling=spec.pooling,
        tool_call_parser=spec.tool_call_parser,
        reasoning_parser=spec.reasoning_parser,
        architecture=Architecture(**spec.architecture.model_dump()) if spec.architecture else None,
    )
    paths: dict[str, tuple[str | int, ...]] = {
        "name": ("metadata", "name"),
        "format": ("spec", "format"),
        "path": ("spec", "path"),
        "hf": ("spec", "hf"),
        "commit": ("spec", "hf", "commit"),
        "context_length": ("spec", "context_length"),
        "parameters": ("spec", "parameters"),
        "architecture": ("spec", "architecture"),
    }
    origin = Origin(file=doc.file, form="model", line=doc.line, column=doc.column, fields=_fields(doc, paths))
    return LoadedModel(model=model, origin=origin)


def classify(doc: SourceDocument) -> tuple[str | None, Diagnostic | None]:
    """Which kind of document this is: Deployment, FlatDeployment, Model or Inventory."""
    data = doc.data
    where = Location(doc.file, doc.line, doc.column)
    if not isinstance(data, dict):
        what = "a list" if isinstance(data, list) else f"a scalar ({data!r})"[:80]
        return None, Diagnostic(
            where,
            "",
            f"a document is a mapping (a deployment, a model or an inventory); this one is {what}",
            hint="start with metadata:/spec:, name:/engine:/model:, or kind: Model",
            code="not_a_mapping",
        )
    own = own_file_kind(data)
    if own is not None:
        return own, None  # an engine-ctl state or plan file beside the documents
    kind = data.get("kind")
    if kind is not None:
        if kind in KINDS:
            return str(kind), None
        close = difflib.get_close_matches(str(kind), KINDS, n=1)
        return None, Diagnostic(
            doc.locate(("kind",)),
            "kind",
            f"unknown kind {kind!r}; one of {', '.join(KINDS)}",
            hint=f"did you mean {close[0]!r}?" if close else None,
            code="unknown_kind",
        )
    if "metadata" in data or "spec" in data:
        return "Deployment", None
    if "hosts" in data or "defaults" in data:
        return "Inventory", None
    if "name" in data:
        return "FlatDeployment", None
    keys = ", ".join(map(str, list(data)[:5]))
    return None, Diagnostic(
        where,
        "",
        f"not an engine-ctl document (keys: {keys})",
        hint="a deployment has metadata: and spec: (or name:, engine:, model:); a model has kind: Model",
        code="not_a_document",
    )


_SCHEMAS: dict[str, type[BaseModel]] = {
    "Deployment": DeploymentDocument,
    "FlatDeployment": FlatDeploymentDocument,
    "Model": ModelDocument,
}


def load_documents(docs: list[SourceDocument]) -> LoadResult:
    """Parsed documents -> the internal model and shape diagnostics (rules come after, in rules.py)."""
    models: list[LoadedModel] = []
    deployments: list[LoadedDeployment] = []
    inventory: Inventory | None = None
    inventories: dict[str, Inventory] = {}
    api_keys: list[ApiKey] = []
    problems: list[Diagnostic] = []
    described: dict[str, list[str]] = {}
    broken: set[str] = set()
    skipped: dict[str, str] = {}
    for doc in docs:
        kind, problem = classify(doc)
        if problem is not None or kind is None:
            problems.extend([problem] if problem else [])
            continue
        if kind in OWN_KINDS:
            skipped[doc.file] = OWN_KINDS[kind]
            continue
        unsafe = text_problems(doc)
        if unsafe:  # refused whole: no part of it may reach a unit, an argv or the state
            problems.extend(unsafe)
            broken.update(_model_name(doc) if kind == "Model" else ())
            continue
        if kind == "Inventory":
            inventory, found = inventory_from(doc)
            inventories[doc.file] = inventory
            problems.extend(found)
            described.setdefault(doc.file, []).append("inventory")
            continue
        if kind == "ApiKey":
            problems.extend(_add_api_key(doc, api_keys, described))
            continue
        schema = _SCHEMAS[kind]
        parsed, found = _validate_shape(doc, schema)
        problems.extend(found)
        if parsed is None:
            broken.update(_model_name(doc) if kind == "Model" else ())
            continue
        if isinstance(parsed, DeploymentDocument):
            deployments.append(_spec_deployment(doc, parsed))
            described.setdefault(doc.file, []).append(f"deployment {parsed.metadata.name}")
        elif isinstance(parsed, FlatDeploymentDocument):
            problems.extend(_size_problems(doc, parsed) + _hf_problems(doc, ("model",), parsed.model))
            loaded, model = _flat_deployment(doc, parsed)
            deployments.append(loaded)
            models.append(model)
            described.setdefault(doc.file, []).append(f"deployment {parsed.name}")
        else:
            problems.extend(_hf_problems(doc, ("spec", "hf"), parsed.spec.hf))
            loaded_model = _model(doc, parsed)
            problems.extend(_architecture_problems(doc, loaded_model.model))
            models.append(loaded_model)
            described.setdefault(doc.file, []).append(f"model {parsed.metadata.name}")
    models, deployments = distinct_flat_models(models, deployments)
    desired = DesiredState(models=tuple(models), deployments=tuple(deployments), api_keys=tuple(api_keys))
    return LoadResult(
        desired=desired, inventory=inventory, diagnostics=problems, documents=described, broken_models=broken,
        skipped=skipped, inventories=inventories,
    )  # fmt: skip


def _add_api_key(doc: SourceDocument, api_keys: list[ApiKey], described: dict[str, list[str]]) -> list[Diagnostic]:
    """An ApiKey document into `api_keys` (its problems returned), unless it is invalid or a duplicate's."""
    key, found = api_key_from(doc)
    if key is not None:
        found = [*found, *_duplicate_key(doc, key, api_keys)]
        api_keys.append(key)
        described.setdefault(doc.file, []).append(f"api key {key.name}")
    return found


def _duplicate_key(doc: SourceDocument, key: ApiKey, seen: list[ApiKey]) -> list[Diagnostic]:
    """Two ApiKey documents with one name, or one key listed twice under two names."""
    out = []
    for other in seen:
        if other.name == key.name:
            out.append(Diagnostic(doc.locate(("metadata", "name")), "metadata.name",
                                  f"a second ApiKey named {key.name!r} (also in {other.file})",
                                  code="duplicate_name"))  # fmt: skip
        elif other.sha256 == key.sha256:
            out.append(Diagnostic(doc.locate(("spec", "sha256")), "spec.sha256",
                                  f"the same key as ApiKey {other.name!r}: give each user its own key",
                                  code="duplicate_name"))  # fmt: skip
    return out


def _model_name(doc: SourceDocument) -> set[str]:
    """The name a Model document gives itself, if it gives one (to mark it broken, not missing)."""
    metadata = doc.data.get("metadata")
    name = metadata.get("name") if isinstance(metadata, dict) else None
    return {name} if isinstance(name, str) else set()


def _strip(data: Any, path: tuple[Any, ...]) -> Any:
    if not path:
        return data
    head, rest = path[0], path[1:]
    if isinstance(data, dict):
        if not rest:
            return {k: v for k, v in data.items() if k != head}
        return {k: (_strip(v, rest) if k == head else v) for k, v in data.items()}
    if isinstance(data, list) and isinstance(head, int):
        return [(_strip(v, rest) if i == head else v) for i, v in enumerate(data)]
    return data


def _validate_shape(doc: SourceDocument, schema: type[BaseModel]) -> tuple[Any, list[Diagnostic]]:
    """Validate; when the only problems are unknown fields, report them and go on without them,
    so that the rules still run and the user sees every problem at once."""
    try:
        return schema.model_validate(doc.data), []
    except ValidationError as exc:
        found = diagnostics_from(exc, doc, schema)
        raw = exc.errors(include_url=False)
        if not all(e["type"] == "extra_forbidden" for e in raw):
            return None, found
        data = doc.data
        for e in raw:
            data = _strip(data, tuple(e["loc"]))
        try:
            return schema.model_validate(data), found
        except ValidationError:
            return None, found


def own_file_kind(data: dict[Any, Any]) -> str | None:
    """'Plan' for a saved plan (`plan --out`, `plan --json`: format_version with changes or state_lineage, as
    savedplan.decode_plan reads it), 'State' for a state file, 'Render' for `render --json` output; None for
    anything else."""
    if "format_version" in data and ("changes" in data or "state_lineage" in data):
        return "Plan"
    if "state_lineage" in data and "changes" in data:
        return "Plan"
    if "lineage" in data and "serial" in data:
        return "State"
    if "format_version" in data and "units" in data and "placements" in data:  # B45: render --json saved beside
        return "Render"
    return None


def _own_names(paths: list[Path]) -> dict[str, str]:
    """The state file, its backup and its lock in the directories given (never read as documents)."""
    out = {}
    for path in paths:
        if path.is_dir():
            for name, what in OWN_NAMES.items():
                if (path / name).exists():
                    out[str(path / name)] = what
    return out


def _is_own_output(path: Path) -> bool:
    """Whether `path` is this process's stdout or stderr (`plan . --json > plan.json` creates it, empty, first)."""
    try:
        st = path.stat()
    except OSError:
        return False
    for fd in (1, 2):
        try:
            out = os.fstat(fd)
        except OSError:
            continue
        if (out.st_dev, out.st_ino) == (st.st_dev, st.st_ino) and stat.S_ISREG(out.st_mode):
            return True
    return False


def load_paths(paths: list[Path]) -> LoadResult:
    """Read files and directories (imperative shell), then load them. engine-ctl's own files (saved plans,
    state files, their backups and locks, this command's own output) are skipped and listed in `skipped`."""
    files, problems = expand_paths(paths)
    skipped = _own_names(paths)
    docs: list[SourceDocument] = []
    read: list[Path] = []
    for path in files:
        if _is_own_output(path):
            skipped[str(path)] = "this command's own output"
            continue
        found, file_problems = read_path(path)
        docs.extend(found)
        problems.extend(file_problems)
        read.append(path)
    result = load_documents(docs)
    result.diagnostics = problems + result.diagnostics
    result.skipped = {**skipped, **result.skipped}
    result.files = [str(f) for f in read if str(f) not in result.skipped]
    result.searched = [str(p) for p in paths]
    return result
