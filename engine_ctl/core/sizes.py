"""Byte sizes as people write them: 16GiB, 42.5GB, 2048MiB, 1073741824."""

from __future__ import annotations

import math
import re

GIB = 1024**3
MIB = 1024**2
GB = 1000**3

_FACTORS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str | int) -> int:
    """Parse a size into bytes; raise ValueError with what is accepted."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise ValueError("a size is not negative")
        return text
    match = _SIZE.match(str(text))
    if not match or match.group(2).lower() not in _FACTORS:
        raise ValueError(f"{text!r} is not a size; write it like 16GiB, 512MiB or 42.5GB")
    return int(float(match.group(1)) * _FACTORS[match.group(2).lower()])


def gib(n_bytes: int) -> str:
    return f"{n_bytes / GIB:.1f} GiB"


# --- in messages: a need rounded up, a size rounded down ------------------------------------------------


def gb_up(n_bytes: int) -> str:
    """A need, in GB rounded up to 0.1: never shows less than is needed."""
    return f"{math.ceil(n_bytes / GB * 10) / 10:g} GB"


def gb_down(n_bytes: int) -> str:
    """A size, in GB rounded down to 0.1: never shows more than there is."""
    return f"{math.floor(n_bytes / GB * 10) / 10:g} GB"


def gib_up(n_bytes: int) -> str:
    return f"{math.ceil(n_bytes / GIB * 10) / 10:.1f} GiB"


def gib_down(n_bytes: int) -> str:
    return f"{math.floor(max(n_bytes, 0) / GIB * 10) / 10:.1f} GiB"


def human_bytes(n_bytes: int) -> str:
    """A size people read at any scale, never `0.0 GiB` for something that is there: GiB from 1 GiB, MiB from
    1 MiB, KiB from 1 KiB, else bytes (17 MB reads `16.2 MiB`)."""
    for unit, factor in (("GiB", GIB), ("MiB", MIB), ("KiB", 1024)):
        if n_bytes >= factor:
            return f"{n_bytes / factor:.1f} {unit}"
    return f"{n_bytes} B"


_DURATION = re.compile(r"^\s*(\d+)\s*(s|m|h)?\s*$")


def parse_seconds(text: str | int) -> int:
    """A duration in whole seconds: 600, 600s, 10m or 1h; raise ValueError with what is accepted."""
    match = None if isinstance(text, bool) else _DURATION.match(str(text))
    if match is None or int(match.group(1)) <= 0:
        raise ValueError(f"{text!r} is not a duration; write it like 600, 600s, 10m or 1h (more than 0)")
    return int(match.group(1)) * {"s": 1, "m": 60, "h": 3600}[match.group(2) or "s"]
