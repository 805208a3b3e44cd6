"""What may never reach a unit file: control characters and Unicode's noncharacters are refused with the value
named, everything else is written escaped on one line (the fleet's tests/test_fleet_units.py reads every allowed
value back from systemd itself)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine_ctl.core.render.systemd_escape import CONTROL, UnsafeValue, env_assignment, exec_line, path_value

NONCHARACTERS = ["\ufdd0", "\ufdef", "\ufffe", "\uffff", "\U0001fffe", "\U0010ffff"]
"""systemd 252 on a fleet host, a unit line holding one of these: `String is not UTF-8 clean, ignoring
assignment` (systemd's utf8.c unichar_is_valid), and the unit loads with no ExecStart= at all."""


@pytest.mark.parametrize("ch", NONCHARACTERS, ids=[f"U+{ord(c):04X}" for c in NONCHARACTERS])
def test_a_noncharacter_is_refused_wherever_a_value_goes_in_a_unit(ch: str) -> None:
    for write in (lambda v: exec_line(["/bin/engine", v]), lambda v: env_assignment("K", v), path_value):
        with pytest.raises(UnsafeValue, match=f"noncharacter U\\+{ord(ch):04X} cannot go in a unit file"):
            write(f"/a{ch}b")


def test_characters_next_to_the_noncharacters_are_written() -> None:
    for ch in ("\ufdcf", "\ufdf0", "\ufffd", "\U0001fffd", "\U00020000"):
        assert ch in exec_line(["/bin/engine", f"a{ch}b"])


@given(st.text(max_size=30))
def test_any_value_is_either_refused_or_written_on_one_clean_line(value: str) -> None:
    try:
        line = exec_line(["/bin/engine", value])
    except UnsafeValue:
        assert CONTROL.search(value) or any(0xFDD0 <= ord(c) <= 0xFDEF or ord(c) & 0xFFFE == 0xFFFE for c in value)
        return
    assert "\n" not in line and not CONTROL.search(line)
