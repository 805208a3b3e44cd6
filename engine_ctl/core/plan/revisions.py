"""`apply --revision NAME=N`: an apply that goes ahead only while NAME's recorded revision is still N, so two
people editing one deployment cannot overwrite each other's change. Pure."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from engine_ctl.core.diagnostics import Diagnostic, Location

CHECK = re.compile(r"([a-z0-9][a-z0-9-]*)=([0-9]{1,9})")


def parse_checks(values: Iterable[str]) -> tuple[dict[str, int], list[Diagnostic]]:
    """NAME=N pairs -> {NAME: N}, and a diagnostic for each value that is not one."""
    checks: dict[str, int] = {}
    problems = []
    for value in values:
        m = CHECK.fullmatch(value)
        if m is None:
            problems.append(Diagnostic(
                Location("--revision"), "", f"{value!r} is not NAME=N (a deployment name and its revision number)",
                hint="the REVISION column of `engine-ctl list`, e.g. --revision chat=3", code="invalid_revision_check",
            ))  # fmt: skip
        else:
            checks[m.group(1)] = int(m.group(2))
    return checks, problems


def mismatches(checks: Mapping[str, int], recorded: Mapping[str, int], location: str) -> list[Diagnostic]:
    """A revision_mismatch for each deployment whose recorded revision (0: not in the state) is not the one
    checked."""
    out = []
    for name, want in sorted(checks.items()):
        have = recorded.get(name, 0)
        if have == want:
            continue
        now = f"at revision {have}" if have else "not in the state (revision 0)"
        out.append(Diagnostic(
            Location(location), "", f"{name} is {now}, not revision {want}: a change was applied since you read "
            "it; nothing was applied",
            hint=f"run `engine-ctl plan` to see revision {have} and what your edit changes, then apply with "
            f"--revision {name}={have}", code="revision_mismatch",
        ))  # fmt: skip
    return out
