"""The documents' reader has two paths: ruamel's pure round-trip loader (the reference, and every error's message)
and the same composer and constructor on libyaml's events (yamlsource._fast_documents). What a user sees never
depends on which ran: the fast path gives exactly the pure one's documents, values and positions, or steps aside."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ruamel.yaml import YAML

from engine_ctl.core.documents import yamlsource
from engine_ctl.core.documents.yamlsource import SourceDocument, parse_text

ROOT = Path(__file__).resolve().parent.parent

TRICKY = {
    "anchors and merge keys": "base: &b {a: 1, b: [x, y]}\nderived:\n  <<: *b\n  c: *b\n",
    "tags": "a: !!str 12\nb: !!binary aGVsbG8=\nc: !custom {x: 1}\nd: !!set {p, q}\ne: !!omap [{k: 1}]\n",
    "scalars": "i: [0x1F, 0o17, 1_000, -3, +4]\nf: [.inf, -.inf, .nan, 1e3, 1.5]\nb: [true, True, yes, no, ~, null]\n",
    "dates": "d: 2026-12-04\nt: 2026-12-04T09:30:00Z\n",
    "block scalars": "chat_template: |\n  {{ x }}\n    more\nfolded: >-\n  one\n  two\n",
    "quoted": "'k 1': \"tab\\there\"\n\"k2\": 'it''s'\nu: \"\\u00e9\\U0001F600\"\n",
    "keys not strings": "1: one\n2.5: x\nnull: n\n",
    "empty values": "a:\nb:   \nc:\nd:\n# own line\ne:\n  # indented\nf: [1, ]\ng: {h: , i}\nj:\n  - \n  -\n",
    "documents": "---\na: 1\n---\n---\n# only a comment\n---\n- 1\n- 2\n...\n",
    "flow": "{a: [1, {b: 2}], c: {d: [], e: {}}}\n",
    "unicode": "name: café\nlabels: {emoji: 😀, cjk: 漢字}\n",
    "bom": "\ufeffa: 1\n",
    "comments": "a: 1  # one\n# between\nb:\n  - 2  # two\n",
    "json": '{"metadata": {"name": "x"}, "spec": {"replicas": {"min": 1, "max": 2}, "engine_args": ["--temp", "0.7"]}}',
    "crlf": "a: 1\r\nb:\r\n  - 2\r\n",
}
REFUSED = {
    "duplicate key": "a: 1\na: 2\n",
    "syntax": "a: [1, 2\n",
    "tab indent": "a:\n\t- 1\n",
    "directive 1.1": "%YAML 1.1\n---\na: yes\n",
    "surrogate pair": '{"a": "\\ud83d\\ude00"}',
    "lone surrogate": '{"a": "\\ud83d"}',
    "control": "a: \x07\n",
    "undefined alias": "a: *nope\n",
    "recursive": "a: &a [*a]\n",
    "deep": "a: " + "[" * 70 + "]" * 70 + "\n",
}


def _seen(docs: list[SourceDocument]) -> list[tuple[Any, ...]]:
    return [(d.index, d.data, d.line, d.column, d.value_positions, d.key_positions) for d in docs]


def _same(text: str) -> bool:
    """Whether the fast path ran; either way, parse_text's answer is the pure loader's."""
    fast = yamlsource._fast_documents(text, "f.yaml")
    pure, problems = yamlsource._pure_documents(text, "f.yaml")
    if fast is not None:
        assert problems == [] and _seen(fast) == _seen(pure), text
    return fast is not None


def test_the_fast_path_reads_every_shipped_and_tested_document_exactly_as_the_pure_one() -> None:
    files = [
        p
        for d in ("examples", "tests", "schema")
        for p in (ROOT / d).rglob("*")
        if p.suffix in {".yaml", ".yml", ".json"}
    ]
    assert len(files) > 10
    texts = [p.read_text(encoding="utf-8", errors="surrogateescape") for p in files if p.stat().st_size < 1 << 20]
    fast = [_same(t) for t in texts if t[:0] < "\udc80" and not any("\udc80" <= c <= "\udcff" for c in t)]
    assert sum(fast) >= 0.9 * len(fast), "the fast path steps aside for documents it should read"


def test_tricky_yaml_reads_the_same_on_both_paths_and_the_fast_path_reads_it() -> None:
    stepped_aside = [name for name, text in TRICKY.items() if not _same(text)]
    assert stepped_aside == []


def test_empty_values_in_every_place_are_where_the_pure_loader_puts_them() -> None:
    for text in ("{h:\n , i}\n", "[a: , b:]\n", "a: {b: }\n", "a:\n  b:\n    c:\n", "- a:\n- b: # c\n", "? a\n: \n"):
        _same(text)


def test_what_the_fast_path_refuses_is_said_by_the_pure_loader_with_its_place() -> None:
    for name, text in REFUSED.items():
        assert yamlsource._fast_documents(text, "f.yaml") is None, name
        docs, problems = parse_text(text, "f.yaml")
        assert (docs, problems) == yamlsource._pure_documents(text, "f.yaml"), name
        assert name in ("directive 1.1", "surrogate pair", "lone surrogate") or problems, name


def test_a_thousand_documents_take_the_fast_path() -> None:
    text = "".join(
        f"---\nmetadata: {{name: d{i}}}\nspec: {{model: m, replicas: {{min: 1, max: 2}}}}\n" for i in range(1000)
    )
    assert _same(text)
    docs, problems = parse_text(text, "f.yaml")
    assert problems == [] and len(docs) == 1000 and docs[-1].locate(("spec", "replicas", "max")).line == 3000


values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(value=values, flow=st.sampled_from([None, True, False]), width=st.sampled_from([20, 80, 4096]))
def test_random_documents_read_the_same_on_both_paths(value: Any, flow: bool | None, width: int) -> None:
    yaml = YAML(typ="rt")
    yaml.default_flow_style = flow
    yaml.width = width
    out = io.StringIO()
    yaml.dump({"v": value}, out)
    _same(out.getvalue())  # where the fast path reads it, exactly as the pure one
