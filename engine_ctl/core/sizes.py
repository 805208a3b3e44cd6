"""Byte sizes as people write them: 16GiB, 42.5GB, 2048MiB, 1073741824."""

from __future__ import annotations

import re

GIB = 1024**3
MIB = 1024**2

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


def human_bytes(n_bytes: int) -> str:
    """A size people read at any scale, never `0.0 GiB` for something that is there: GiB from 1 GiB, MiB from
    1 MiB, KiB from 1 KiB, else bytes (17 MB reads `16.2 MiB`)."""
    for unit, factor in (("GiB", GIB), ("MiB", MIB), ("KiB", 1024)):
        if n_bytes >= factor:
            return f"{n_bytes / factor:.1f} {unit}"
    return f"{n_bytes} B"


def gb(n_bytes: int) -> str:
    return f"{n_bytes / 1000**3:.1f} GB"
