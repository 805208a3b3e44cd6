"""Hypothesis: random documents and random bytes through the real CLI never give a traceback,
and every refusal names a location (file:line:column)."""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from ruamel.yaml import YAML

from tests.helpers import run

pytestmark = pytest.mark.slow  # fuzzing: the fast tier leaves it out (pytest -m 'not fleet and not slow')
EXAMPLES = 1000
LOCATED = re.compile(r"^(?P<file>[^\n]+?):(?P<line>\d+):(?P<col>\d+): (error|warning): ", re.M)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**40), max_value=2**40),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=30),
    st.sampled_from(["auto", "llama.cpp", "vllm", "sglang", "gpu", "cpu", "m", "--temp", "-fa", "0.7", "chat"]),
)
values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=12,
)
FIELDS = ["model", "engine", "replicas", "accelerator", "gpus", "gpu_vendor", "cpu_cores",
          "context_length", "parallel", "engine_args", "priority", "contxt", "host"]  # fmt: skip
engine_args = st.lists(
    st.one_of(
        st.sampled_from(["--temp", "0.7", "--ctx-size", "-fa", "--trust-remote-code", "--flash-attn=on", "--x"]),
        st.text(max_size=12),
    ),
    max_size=6,
)
spec = st.fixed_dictionaries(
    {"model": st.sampled_from(["m", "missing", 3])},
    optional={
        "engine": st.sampled_from(["auto", "llama.cpp", "llamacpp", "vllm", "sglang", "tgi", 1]),
        "replicas": st.fixed_dictionaries(
            {},
            optional={
                "min": st.integers(-2, 70),
                "max": st.integers(-2, 70),
                "idle_minutes": st.integers(-1, 2000),
            },
        ),
        "accelerator": st.sampled_from(["gpu", "cpu", "tpu"]),
        "gpus": st.one_of(st.integers(-1, 9), st.text(max_size=3)),
        "context_length": st.integers(0, 300000),
        "parallel": st.integers(-1, 2000),
        "cpu_cores": st.integers(-1, 2000),
        "engine_args": engine_args,
        "contxt_length": st.integers(),
        "gpu_vendor": st.sampled_from(["any", "nvidia", "amd", "intel"]),
    },
)
documents = st.one_of(
    st.fixed_dictionaries({"metadata": st.fixed_dictionaries({"name": st.text(max_size=45)}), "spec": spec}),
    st.fixed_dictionaries(
        {"name": st.text(max_size=10), "model": st.one_of(st.text(max_size=20), st.just({"hf": "a/b"}))},
        optional={
            "engine": st.sampled_from(["llamacpp", "vllm", "sglang"]),
            "api": st.sampled_from(["chat", "decisions", "x"]),
            "engine_config": st.dictionaries(
                st.sampled_from(["context_length", "extra_args", "bogus"]), values, max_size=2
            ),
        },
    ),
    st.dictionaries(st.sampled_from(["metadata", "spec", "kind", "name", *FIELDS]), values, max_size=4),
    values,
)
MODEL = "kind: Model\nmetadata: {name: m}\nspec: {format: gguf, path: m.gguf, context_length: 4096}\n"


def _check(paths: list[Path], *, as_json: bool = False) -> None:
    args = ["validate", *(["--json"] if as_json else []), *map(str, paths)]
    result = run(*args)  # raises on any uncaught exception
    assert result.exit_code in (0, 1), result.output
    text = result.output + (result.stderr if result.stderr_bytes else "")
    assert "Traceback" not in text and "internal error" not in text
    if as_json:
        doc = json.loads(result.stdout)
        assert doc["format_version"] == 1
        if result.exit_code == 1:
            assert doc["error"]["code"] == "INVALID_DEPLOYMENT"
            for detail in doc["error"]["details"]:
                assert detail["file"] and detail["line"] is not None and detail["column"] is not None
        return
    if result.exit_code == 1:
        errors = [ln for ln in result.stderr.splitlines() if ": error: " in ln]
        assert errors, result.stderr
        for line in errors:
            assert LOCATED.match(line), line


def _dump(data: Any) -> str:
    import io

    buf = io.StringIO()
    YAML().dump(data, buf)
    return buf.getvalue()


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(doc=documents, as_json=st.booleans())
def test_random_documents_never_traceback(doc: Any, as_json: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        m = Path(tmp, "m.yaml")
        m.write_text(MODEL)
        d = Path(tmp, "d.yaml")
        try:
            text = _dump(doc)
        except Exception:  # ruamel cannot represent some keys; JSON always can
            text = json.dumps(doc)
        d.write_text(text)
        _check([m, d], as_json=as_json)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(raw=st.one_of(st.binary(max_size=200), st.text(max_size=200).map(lambda t: t.encode("utf-8", "surrogatepass"))))
@example(raw=b"+_")  # ruamel resolves it as an int and then fails on its empty digits (IndexError)
@example(raw=b"a: -_\n")
def test_random_bytes_never_traceback(raw: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp, "d.yaml")
        d.write_bytes(raw)
        _check([d])
