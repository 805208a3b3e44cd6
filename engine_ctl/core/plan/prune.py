"""Which hf: checkouts a plan prunes (issue 29): a whole checkout on a host (<models_dir>/sources/<repo>/<commit>,
as the facts list it) that no deployment uses any more. Pure.

A checkout is kept when
- any document asks for its repository at its commit (wherever that deployment is placed: it may move here), or
- a unit on the host names its path, except the units of deployments this apply converges (replaced or removed by
  the roll, they will name the documents' commits, or nothing). A deployment the roll does not converge (held by
  an operator's stop or park, Pending, Failed, blocked, outside --target, another state's) keeps what its units
  name, so `start` finds its weights; or
- the host has a unit whose text was not read (nothing can be said of what it names).
Apply deletes them last, once every other step succeeded, and checks on the host first that no unit file names
the path by then (engine_ctl.shell.systemd.prune_checkout)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from engine_ctl.core.fit.hostfacts import HostFacts
from engine_ctl.core.model import DesiredState
from engine_ctl.core.names import parse_unit_name
from engine_ctl.core.plan.changes import DeploymentChange, Prune


def converged(changes: Iterable[DeploymentChange]) -> set[str]:
    """The deployments whose units after this apply are exactly what the plan renders (or none)."""
    return {
        c.name for c in changes if c.operator is None and not c.pending_reason and not c.failed_reason and not c.blocked
    }


def wanted_commits(desired: DesiredState) -> set[tuple[str, str]]:
    return {(m.model.hf.repo, m.model.hf.commit) for m in desired.models if m.model.hf and m.model.hf.commit}


def names_path(text: str, path: str) -> bool:
    """Whether a unit's text names the path: the directory itself or a file in it (not a longer sibling name)."""
    return re.search(re.escape(path.rstrip("/")) + r"(?=[/\s\"']|$)", text, re.MULTILINE) is not None


def _deployment_of(unit: str) -> str | None:
    parsed = parse_unit_name(unit)
    return parsed.deployment if parsed else None


def prunes(desired: DesiredState, changes: list[DeploymentChange], facts: Mapping[str, HostFacts]) -> list[Prune]:
    wanted, rolled = wanted_commits(desired), converged(changes)
    out: list[Prune] = []
    for host, f in sorted(facts.items()):
        staying = [u for u in f.units if _deployment_of(u.name) not in rolled]
        if any(u.text is None for u in staying):
            continue
        for c in f.checkouts:
            named = any(names_path(u.text or "", c.path) for u in staying)
            if (c.repo, c.commit) not in wanted and not named:
                out.append(Prune(host=host, repo=c.repo, commit=c.commit, path=c.path, freed_bytes=c.freed_bytes))
    return out
