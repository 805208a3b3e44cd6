"""The names engine-ctl gives what it manages: deployments, and the systemd unit of each replica. Pure.

One place for the rule, so that what engine-ctl renders and what it accepts back from a state are the same:
`engine-ctl-<deployment>-<index><slot>.service`, the deployment a name of lowercase letters, digits and -,
the index a replica's number from 0, the slot a or b (b while a surge runs beside a)."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from dataclasses import dataclass

from engine_ctl.core.diagnostics import Diagnostic, Location

UNIT_PREFIX = "engine-ctl-"
UNIT_SUFFIX = ".service"
UNIT_FORM = "engine-ctl-<deployment>-<index><slot>.service"
SLOTS = ("a", "b")
MAX_DEPLOYMENT_NAME = 40
MAX_REPLICA_INDEX = 999
"""Far above the 64 replicas a deployment may ask for, so a state from a later engine-ctl still reads."""

# \Z, not $: "chat\n" is not a name
NAME_RULE = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?\Z")
NAME_MESSAGE = "lowercase letters, digits and -, not starting or ending with -, at most 40 characters"
_UNIT_RULE = re.compile(
    r"^" + re.escape(UNIT_PREFIX) + r"(?P<deployment>[a-z0-9](?:[a-z0-9-]*[a-z0-9])?)"
    r"-(?P<index>0|[1-9][0-9]{0,2})(?P<slot>[ab])" + re.escape(UNIT_SUFFIX) + r"\Z"
)


@dataclass(frozen=True)
class UnitName:
    deployment: str
    index: int
    slot: str


def deployment_name_ok(name: str) -> bool:
    return len(name) <= MAX_DEPLOYMENT_NAME and NAME_RULE.match(name) is not None


def unit_name(deployment: str, index: int, slot: str = "a") -> str:
    """Stable per replica; the slot (a/b) lets a surge run the new unit beside the old one."""
    return f"{UNIT_PREFIX}{deployment}-{index}{slot}{UNIT_SUFFIX}"


def parse_unit_name(name: str) -> UnitName | None:
    """The deployment, index and slot of a unit engine-ctl names; None for any other name.

    The split is unique: the index has no '-' and the deployment cannot end with one."""
    m = _UNIT_RULE.match(name)
    if m is None or not deployment_name_ok(m["deployment"]):
        return None
    return UnitName(m["deployment"], int(m["index"]), m["slot"])


__all__ = [
    "MAX_DEPLOYMENT_NAME",
    "MAX_REPLICA_INDEX",
    "NAME_MESSAGE",
    "NAME_RULE",
    "SLOTS",
    "UNIT_FORM",
    "UNIT_PREFIX",
    "UnitName",
    "deployment_name_ok",
    "parse_unit_name",
    "unit_name",
    "unknown_targets",
]


def unknown_targets(targets: Iterable[str], known: Iterable[str], where: str) -> list[Diagnostic]:
    """One error per `--target` that names no deployment of the documents or the state, with a did-you-mean
    and the names there are."""
    names = sorted(set(known))
    out = []
    for t in targets:
        if t in names:
            continue
        close = difflib.get_close_matches(t, names, n=1, cutoff=0.6)
        listed = f"the deployments: {', '.join(names)}" if names else "there are no deployments"
        hint = (f"did you mean {close[0]!r}? " if close else "") + listed
        out.append(Diagnostic(Location(where), "--target", f"no deployment named {t!r}", hint=hint))
    return out
