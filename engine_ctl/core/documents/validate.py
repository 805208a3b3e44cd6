"""The offline `validate` report: what is valid, the defaults filled in, what waits for hosts. Pure."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine_ctl.core.diagnostics import Diagnostic
from engine_ctl.core.documents.loader import LoadResult
from engine_ctl.core.documents.rules import field_name, resolve_engine, written
from engine_ctl.core.model import LoadedDeployment, Model
from engine_ctl.providers import Provider

MARGIN_RULE = ("on a unified-memory machine such as a GB10 the margin is 8 GiB, or the weights x 0.15 plus 4 GiB "
               "for checkpoints above 26.7 GiB; on a discrete GPU it is the weights x 0.10")  # fmt: skip
"""Seed 003's words for the flat form's memory margin (engine_ctl.core.fit.fitting.memory_margin_bytes)."""

FORMAT_VERSION = 1

RESOLUTION = (
    "resolution against a host: pass --inventory <hosts.yaml> to check the runtime profile, placement, the host's "
    "devices and capacity, and timeouts, and to see the host's defaults"
)
"""Seed 003's first "Not checked" line (its --host is engine-ctl's --inventory)."""
NOT_CHECKED = (
    ("host_unpublished", "whether each allowed host is enrolled, online and has published"),
    (
        "profile_not_published",
        "which runtime profiles the host's role accepted and published after measuring each installation",
    ),
    ("resource_policy_unavailable", "the host's current resource policy as the server stores it"),
    ("route_conflict", "route and deployment-name conflicts with existing deployments"),
    ("checkpoint_digest_pending", "a new checkpoint's digest, measured on the host after acceptance"),
)
"""Seed 003's "Not checked" list after its first line, verbatim, each with its code: what needs a host."""


def resolution_line(inventory: str | None) -> str:
    """The first "Not checked" line: with an inventory, what was checked offline and what still needs the hosts."""
    if inventory is None:
        return RESOLUTION
    return (
        f"resolution against a host: checked against {inventory} offline: the hosts named and the runtime profile "
        "(the engine builds each host registers); the host's devices and capacity are in its facts: run "
        "`engine-ctl plan`"
    )


def not_checked(inventory: str | None = None) -> list[dict[str, str | None]]:
    """The "Not checked" list as --json gives it: each line with its code (None for the first)."""
    first: dict[str, str | None] = {"what": "resolution against a host", "detail": resolution_line(inventory),
                                    "code": None}  # fmt: skip
    rest: list[dict[str, str | None]] = [{"what": code, "detail": text, "code": code} for code, text in NOT_CHECKED]
    return [first, *rest]


def not_checked_lines(inventory: str | None = None) -> list[str]:
    """The "Not checked" list as validate prints it (seed 003's words)."""
    return [resolution_line(inventory), *(f"{text} ({code})" for code, text in NOT_CHECKED)]


@dataclass
class Default:
    field: str
    value: object
    why: str
    at_plan: bool = False


@dataclass
class DeploymentReport:
    name: str
    file: str
    engine: str | None
    defaults: list[Default] = field(default_factory=list)


def _defaults(loaded: LoadedDeployment, model: Model | None) -> list[Default]:
    d, o = loaded.deployment, loaded.origin
    engine = resolve_engine(d, model)
    out: list[Default] = []
    if not written(o, "engine") and engine is not None:
        why = "the model's format" if model else "cpu"
        out.append(
            Default(
                field_name(o, "engine"), f"auto → {engine.name}", f"from {why} ({model.format if model else 'cpu'})"
            )
        )
    if o.form == "flat" and not written(o, "replicas_max"):
        out.append(Default("replicas", d.replicas_max, "default"))
    if o.form == "flat":
        out += flat_defaults(loaded, engine)
    if o.form == "spec":
        out += _spec_form_defaults(loaded)
    return out + _sizing_defaults(loaded, model, engine) + _parallel_default(loaded, engine)


def _spec_form_defaults(loaded: LoadedDeployment) -> list[Default]:
    """The spec form's fields left out: replicas, accelerator, GPU vendor, priority."""
    d, o = loaded.deployment, loaded.origin
    out = []
    if not written(o, "replicas_min"):
        out.append(Default("spec.replicas.min", d.replicas_min, "default"))
    if not written(o, "replicas_max"):
        out.append(Default("spec.replicas.max", d.replicas_max, "default"))
    if d.replicas_min == 0 and not written(o, "idle_minutes"):
        out.append(Default("spec.replicas.idle_minutes", 15, "default with min: 0"))
    if not written(o, "accelerator"):
        out.append(Default("spec.accelerator", d.accelerator, "default"))
    if not written(o, "gpu_vendor"):
        out.append(Default("spec.gpu_vendor", d.gpu_vendor, "any GPU the engine runs on"))
    if not written(o, "priority"):
        out.append(Default("spec.priority", d.priority, "default"))
    return out


def flat_defaults(loaded: LoadedDeployment, engine: Provider | None) -> list[Default]:
    """What the flat form fills in (seed 003): the GPU, the memory the engine may use, and how the model parks."""
    d, o = loaded.deployment, loaded.origin
    title = engine.title if engine else "the engine"
    out = []
    if not d.devices and d.accelerator == "host":
        cpu = f", or its CPU when it has no GPU {title} runs on" if engine is None or engine.runs_on("cpu") else ""
        why = f"the host decides: the fewest of 1, 2, 4, 8 of its GPUs that hold the model{cpu}"
        out.append(Default("devices", None, why, True))
    if d.gpu_memory_bytes is None:
        why = ("sized from the checkpoint and the GPU: the weights, the KV cache and a margin for the engine's own "
               f"memory ({MARGIN_RULE})")  # fmt: skip
        out.append(Default("engine_config.memory.request", None, why, True))
    if not written(o, "residency"):
        out.append(Default("residency", d.residency, _parks(d.residency, d.api, engine)))
    return out


def _parks(residency: str, api: str, engine: Provider | None) -> str:
    if api == "decisions":
        return "a decisions deployment restarts instead of parking"
    if engine is not None and not engine.parks_asleep(residency):
        return f"how the model parks: {engine.title} has no sleep mode, so a park stops it"
    return "how the model parks: off the GPU without stopping it, woken by the next request"


def _sizing_defaults(loaded: LoadedDeployment, model: Model | None, engine: Provider | None) -> list[Default]:
    """context_length, gpus and cpu_cores left out: what they will be, or how they are chosen."""
    d, o = loaded.deployment, loaded.origin

    def name(internal: str) -> str:
        return field_name(o, internal)

    out = []
    if d.context_length is None and engine is not None:
        cap = engine.default_context_cap
        if model is not None and model.context_length is not None:
            out.append(Default(name("context_length"), min(cap, model.context_length), f"the model's, at most {cap}"))
        else:
            out.append(Default(name("context_length"), None, f"the model's (read from its files), at most {cap}", True))
    if d.accelerator == "host":  # the flat form: flat_defaults says what the host decides
        return out
    if d.accelerator == "gpu" and d.gpus is None:
        why = "the fewest of 1, 2, 4, 8 that hold the model on the largest-GPU host"
        out.append(Default(name("gpus"), None, why, True))
    if d.cpu_cores is None and d.accelerator == "gpu":
        if d.gpus is not None:
            out.append(Default(name("cpu_cores"), 4 * d.gpus, "4 per GPU"))
        else:
            out.append(Default(name("cpu_cores"), None, "4 per GPU, once gpus is chosen", True))
    elif d.cpu_cores is None:
        why = "by size: 2 up to 2B parameters, 4 up to 9B, 6 above, at most the largest host's cores"
        out.append(Default(name("cpu_cores"), None, why, True))
    return out


def _parallel_default(loaded: LoadedDeployment, engine: Provider | None) -> list[Default]:
    d = loaded.deployment
    if d.parallel is not None or engine is None:
        return []
    options = engine.parallel_candidates("cpu" if d.accelerator == "cpu" else "gpu")
    where = "on a CPU" if d.accelerator == "cpu" else "on GPUs"
    name = field_name(loaded.origin, "parallel")
    if d.accelerator == "host" and engine.runs_on("cpu"):
        where += f" ({engine.parallel_candidates('cpu')[0]} on a CPU)"
    if len(options) == 1:
        return [Default(name, options[0], f"{engine.title} {where}")]
    first, *rest = options
    lowered = " or ".join(map(str, rest))
    return [Default(name, None, f"{first} {where}, lowered to {lowered} when that is what fits", True)]


def build_report(result: LoadResult) -> list[DeploymentReport]:
    reports = []
    for loaded in result.desired.deployments:
        model = result.desired.model(loaded.deployment.model)
        engine = resolve_engine(loaded.deployment, model)
        reports.append(
            DeploymentReport(
                name=loaded.deployment.name,
                file=loaded.origin.file,
                engine=engine.name if engine else None,
                defaults=_defaults(loaded, model),
            )
        )
    return reports


def report_json(
    result: LoadResult, diagnostics: list[Diagnostic], valid: bool, inventory: str | None = None
) -> dict[str, object]:
    errors = [d for d in diagnostics if d.severity == "error"]
    doc: dict[str, object] = {
        "format_version": FORMAT_VERSION,
        "valid": valid,
        "files": [
            {
                "file": f,
                "documents": result.documents.get(f, []),
                "valid": not any(d.location.file == f for d in errors),
            }
            for f in result.files
        ],
        "deployments": [
            {
                "name": r.name,
                "file": r.file,
                "engine": r.engine,
                "defaults": [
                    {
                        "field": x.field,
                        "value": x.value,
                        "why": x.why,
                        "resolved_at": "plan" if x.at_plan else "load",
                    }
                    for x in r.defaults
                ],
            }
            for r in build_report(result)
        ],
        "warnings": [d.as_json() for d in diagnostics if d.severity == "warning"],
        "not_checked": not_checked(inventory),
    }
    if not valid:
        doc["error"] = {
            "status": 400,
            "code": "INVALID_DEPLOYMENT",
            "message": f"{len(errors)} problem(s) in the documents",
            "details": [d.as_json() for d in errors],
        }
    return doc
