"""The gateway skips its Lua depth scan for a body that cannot be nested too deep (DEPTH_PRECHECK, a regex HAProxy
runs on the body first). The skip must never let a too-deep body through: every body the Lua scan would refuse
matches the regex. Checked here against a Python copy of hold.lua's scan (the real HAProxy with the real Lua:
tests/test_gateway_hostile.py). Python 3.11's `re` knows possessive quantifiers, as PCRE2 does."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from engine_ctl.core.documents.inventory import Host
from engine_ctl.core.render.gateway import DEPTH_PRECHECK, JSON_DEPTH_LIMIT, render_gateway

PRECHECK = re.compile(DEPTH_PRECHECK)


def too_deep(body: str) -> bool:
    """hold.lua's too_deep, line for line: brackets outside strings, an escaped character skipped."""
    depth, i = 0, 0
    while i < len(body):
        c = body[i]
        if c == '"':
            i += 1
            while i < len(body) and body[i] != '"':
                i += 2 if body[i] == "\\" else 1
        elif c in "[{":
            depth += 1
            if depth > JSON_DEPTH_LIMIT:
                return True
        elif c in "]}":
            depth -= 1
        i += 1
    return False


def nested(depth: int) -> str:
    return '{"model":"chat","stop":' + "[" * depth + "]" * depth + "}"


def test_the_regex_counts_opening_brackets_not_nesting() -> None:
    assert PRECHECK.match(nested(JSON_DEPTH_LIMIT)), "65 levels in all: scanned (and refused by the Lua)"
    assert not PRECHECK.match(nested(JSON_DEPTH_LIMIT - 1)), "64 opening brackets: not scanned"
    many_shallow = '{"stop":[' + ",".join("[]" for _ in range(200)) + "]}"
    assert PRECHECK.match(many_shallow) and not too_deep(many_shallow), "scanned, and served"
    assert not PRECHECK.match('{"model":"chat","messages":[{"role":"user","content":"' + "x" * 200_000 + '"}]}')


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(['[', ']', '{', '}', '"', '\\', 'a', ',', ':', ' ']), max_size=400),
       st.integers(min_value=0, max_value=120))  # fmt: skip
def test_no_body_the_lua_refuses_escapes_the_regex(noise: list[str], extra_depth: int) -> None:
    body = "".join(noise)
    for candidate in (body, "[" * extra_depth + body, body + "{" * extra_depth, nested(extra_depth) + body):
        if too_deep(candidate):
            assert PRECHECK.match(candidate), candidate


def test_the_rendered_gateway_carries_one_limit_in_its_regex_its_lua_and_its_answer() -> None:
    files = render_gateway(Host(name="g", address="10.0.0.9", gateway_port=9000), [], [], internal_key=False).files
    assert f"lua.depth if {{ req.body -m reg {DEPTH_PRECHECK} }}" in files["haproxy.cfg"]
    assert f"nested deeper than {JSON_DEPTH_LIMIT} levels" in files["haproxy.cfg"]
    assert f"local MAX_DEPTH = {JSON_DEPTH_LIMIT}\n" in files["hold.lua"]
