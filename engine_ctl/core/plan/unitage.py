"""Whether a running unit started before its file last changed: the process then runs what the file said, not what
it says. Pure: the probe's times (UnitFact.file_changed_at, started_at) in, words out."""

from __future__ import annotations

from datetime import UTC, datetime

from engine_ctl.core.fit.hostfacts import UnitFact

WRITTEN_SLACK_S = 1.0
"""The start time is systemd's monotonic stamp made wall-clock time by the probe: a second either way is noise."""


def written_after_start(fact: UnitFact | None) -> str | None:
    """`changed <when>, started <when>` where a running unit's file changed after its main process started: the
    process runs what the file said then (systemd reads a unit's settings at a start, not at daemon-reload), which
    may not be what it says now. None where it started after (or within WRITTEN_SLACK_S of) its file's last change,
    does not run, or either time is unknown. Every unit engine-ctl writes and runs is checked so (replicas, their
    guards and group workers, the gateway, the scaler): apply starts or restarts each after writing it, except a
    parked replica's (held rewrites: its engine sleeps on), which its callers leave out."""
    return changed_after_start(fact, fact.file_changed_at if fact is not None else None)


def changed_after_start(fact: UnitFact | None, changed: float | None, verb: str = "changed") -> str | None:
    """written_after_start for a file the unit's process reads once, at its start (the scaler's configuration and
    program, a replica's weights): `changed` is when that file last changed, `verb` how the words name it."""
    if fact is None or fact.active_state != "active":
        return None
    started = fact.started_at
    if changed is None or started is None or changed <= started + WRITTEN_SLACK_S:
        return None
    return f"{verb} {utc(changed)}, started {utc(started)}"


def utc(at: float) -> str:
    return datetime.fromtimestamp(at, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
