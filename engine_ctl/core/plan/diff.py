"""What changed in a deployment's specification: its revision digest, and the fields that differ, named as its
document names them. Pure."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from engine_ctl.core.model import Deployment, Model
from engine_ctl.core.plan.changes import FieldChange

Names = Callable[[str], str]
"""An internal field's name in the deployment's own document form (rules.field_name)."""


def spec_fields(d: Deployment) -> dict[str, Any]:
    """The specification as the revision digest and the field diff see it: prevent_destroy only when true (it is
    recorded, so a plan without the document still refuses, but never makes a new revision)."""
    spec = d.model_dump(mode="json", exclude={"prevent_destroy"})
    if d.prevent_destroy:
        spec["prevent_destroy"] = True
    return spec


def spec_digest(d: Deployment, model: Model) -> str:
    """The revision's identity: the specification (without prevent_destroy) and the model. The hash of
    json.dumps({"spec": spec, "model": model}, sort_keys=True), written from its two parts: a plan asks for the
    same few models once per deployment (bench.scale: 1,000 deployments, 2 models)."""
    spec = json.dumps(d.model_dump(mode="json", exclude={"prevent_destroy"}), sort_keys=True)
    return hashlib.sha256(('{"model": ' + _model_json(model) + ', "spec": ' + spec + "}").encode()).hexdigest()


def _model_json(model: Model) -> str:
    try:
        return _hashable_model_json(model)
    except TypeError:  # pragma: no cover - a model with an unhashable field: written each time
        return json.dumps(model.model_dump(mode="json"), sort_keys=True)


@lru_cache(maxsize=256)
def _hashable_model_json(model: Model) -> str:
    return json.dumps(model.model_dump(mode="json"), sort_keys=True)


def field_changes(
    old: dict[str, Any], new: dict[str, Any], prefix: str = "spec", names: Names | None = None
) -> list[FieldChange]:
    """The fields that differ, named as the document names them (`names` maps an internal field to that)."""
    changes = _field_changes(old, new, prefix)
    if names is None:
        return changes
    out = []
    for c in changes:
        head, dot, rest = c.path.removeprefix(prefix + ".").partition(".")
        key, bracket, index = head.partition("[")
        out.append(c.model_copy(update={"path": names(key) + bracket + index + dot + rest}))
    return sorted(out, key=lambda c: c.path)


def _field_changes(old: dict[str, Any], new: dict[str, Any], prefix: str) -> list[FieldChange]:
    from deepdiff import DeepDiff  # imported here: it pulls in numpy (~0.1 s), which only a diff needs

    diff = DeepDiff(old, new, ignore_order=False, verbose_level=2)
    out: list[FieldChange] = []
    for kind in ("values_changed", "type_changes"):
        for path, change in diff.get(kind, {}).items():
            out.append(FieldChange(path=_path(path, prefix), old=change.get("old_value"), new=change.get("new_value")))
    for path, value in diff.get("dictionary_item_added", {}).items():
        out.append(FieldChange(path=_path(path, prefix), new=value))
    for path, value in diff.get("dictionary_item_removed", {}).items():
        out.append(FieldChange(path=_path(path, prefix), old=value))
    for kind in ("iterable_item_added", "iterable_item_removed"):
        for path in diff.get(kind, {}):
            base = _path(path, prefix).split("[")[0]
            if not any(c.path == base for c in out):
                out.append(FieldChange(path=base, old=old.get(base.removeprefix(prefix + ".")),
                                       new=new.get(base.removeprefix(prefix + "."))))  # fmt: skip
    return sorted(out, key=lambda c: c.path)


def _path(deepdiff_path: str, prefix: str) -> str:
    text = deepdiff_path.removeprefix("root")
    text = text.replace("']['", ".").replace("['", ".").replace("']", "")
    return prefix + text


def changed_fields(
    old_spec: Deployment | None, old_model: Model | None, d: Deployment, model: Model, names: Names | None
) -> list[FieldChange]:
    """The specification's and the model's fields that differ from the recorded ones."""
    old = spec_fields(old_spec) if old_spec is not None else {}
    was = old_model.model_dump(mode="json") if old_model is not None else {}
    return field_changes(old, spec_fields(d), names=names) + field_changes(was, model.model_dump(mode="json"), "model")
