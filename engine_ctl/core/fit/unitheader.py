"""The header engine-ctl writes at the top of each unit (templates/engine.service.j2), read back from a host.

It names what the unit is without any state: the deployment, replica, slot and revision, the engine, host, port
and GPUs, the lineage of the state that made it (units from before lineage headers have none), the deployment's
ID (none in units from before ID headers), and the sha256 of the unit as rendered (with that line's value left
empty). A replica group's head (spec.nodes > 1) adds its runtime port (group-port) and a line per worker: its
unit, host, port and sha256. `engine-ctl import` rebuilds a state from it, and the planner tells another state's
units from this one's by its lineage. Pure."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict

MARK = "# Managed by engine-ctl"
HEADER_LINES = 24
"""The probe sends at most this many leading comment lines of each unit: enough for a group head's whole header
at the most nodes a document may ask (16: seven lines of its own and one per worker), its content-sha256 line
included, so a hand edit of any head reads as an edit (repaired in place), never as a unit that differs."""
LINE_LIMIT = 512
_PAIR = re.compile(r"([a-z][a-z0-9-]*): (\S+)")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_INT = re.compile(r"0|[1-9][0-9]{0,5}")
_ULID = re.compile(r"[0-7][0-9A-HJKMNP-TV-Z]{25}")
_MEMBER = re.compile(r"group member ([1-9][0-9]?): (\S+) on (\S+) port ([0-9]{1,5}) sha256 ([0-9a-f]{64})")
"""templates/engine.service.j2: a head's line for each worker of its group."""


class HeaderMember(BaseModel):
    """A worker of a replica group as its head's header names it."""

    model_config = ConfigDict(frozen=True)

    rank: int
    unit: str
    host: str
    port: int
    sha256: str


class UnitHeader(BaseModel):
    model_config = ConfigDict(frozen=True)

    deployment: str
    replica: int
    slot: str
    revision: int
    engine: str | None = None
    host: str | None = None
    port: int | None = None
    gpus: tuple[str, ...] = ()
    lineage: str | None = None
    """The lineage of the state that wrote the unit; None in units written before engine-ctl recorded it."""
    deployment_id: str | None = None
    """The deployment's ID (a ULID); None in units written before engine-ctl recorded it there."""
    content_sha256: str | None = None
    group_port: int | None = None
    """A replica group's head: its runtime port beside `port` (ReplicaRecord.group_port)."""
    members: tuple[HeaderMember, ...] = ()
    """A replica group's head: its workers, as far as the lines read go (HEADER_LINES: the probe sends the first
    ones only; the unit's text has them all)."""


def header_members(lines: list[str]) -> tuple[HeaderMember, ...]:
    """The worker lines of a head's header among a unit's leading comment lines, rank order."""
    found: dict[int, HeaderMember] = {}
    for line in lines[1:]:
        if not line.startswith("# "):
            break
        m = _MEMBER.fullmatch(line[2:LINE_LIMIT].rstrip())
        if m and 1 <= int(m[4]) <= 65535:
            found.setdefault(int(m[1]), HeaderMember(rank=int(m[1]), unit=m[2], host=m[3], port=int(m[4]),
                                                     sha256=m[5]))  # fmt: skip
    return tuple(found[r] for r in sorted(found))


def _pairs(lines: list[str]) -> tuple[dict[str, str], str | None]:
    """`key: value` pairs of the header's lines (two spaces between pairs), and the lineage line's value."""
    pairs: dict[str, str] = {}
    lineage = None
    for line in lines[1:HEADER_LINES]:
        if not line.startswith("# "):
            break
        body = line[2:LINE_LIMIT].rstrip()
        if body.startswith("lineage: "):
            lineage = body.removeprefix("lineage: ").strip() or None
            continue
        for chunk in body.split("  "):
            m = _PAIR.fullmatch(chunk.strip())
            if m:
                pairs.setdefault(m[1], m[2])
    return pairs, lineage


def _int(text: str | None) -> int | None:
    return int(text) if text is not None and _INT.fullmatch(text) else None


def parse_unit_header(lines: list[str]) -> UnitHeader | None:
    """The header of a unit from its leading lines; None when they are not an engine-ctl header (or lack the
    deployment, replica, slot or revision)."""
    if not lines or not lines[0].startswith(MARK):
        return None
    pairs, lineage = _pairs(lines)
    replica, revision = _int(pairs.get("replica")), _int(pairs.get("revision"))
    deployment, slot = pairs.get("deployment"), pairs.get("slot")
    if deployment is None or slot not in ("a", "b") or replica is None or revision is None:
        return None
    port, group_port = _int(pairs.get("port")), _int(pairs.get("group-port"))
    content = pairs.get("content-sha256")
    ident = pairs.get("id")
    return UnitHeader(
        deployment=deployment, replica=replica, slot=slot, revision=revision, engine=pairs.get("engine"),
        host=pairs.get("host"), port=port if port is not None and 1 <= port <= 65535 else None,
        gpus=tuple(g for g in pairs.get("gpus", "").split(",") if g), lineage=lineage,
        content_sha256=content if content and _SHA256.fullmatch(content) else None,
        deployment_id=ident if ident and _ULID.fullmatch(ident) else None,
        group_port=group_port if group_port is not None and 1 <= group_port <= 65535 else None,
        members=header_members(lines),
    )  # fmt: skip


__all__ = ["HEADER_LINES", "HeaderMember", "UnitHeader", "header_members", "parse_unit_header"]
