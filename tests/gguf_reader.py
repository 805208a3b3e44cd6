"""A local GGUF file's facts read with the `gguf` package (a test-only extra): the reference the product's own
reader (engine_ctl/shell/remote/facts_probe.py, stdlib only) is checked against."""

from __future__ import annotations

from pathlib import Path

import gguf

from engine_ctl.core.fit.modelfacts import ModelFacts, facts_from_gguf_fields


def read_gguf(path: Path) -> ModelFacts:
    """Read a local GGUF file's metadata with the gguf package."""
    reader = gguf.GGUFReader(str(path))
    fields: dict[str, object] = {}
    for name, field in reader.fields.items():
        if name.startswith("tokenizer.") or not field.types:
            continue
        try:
            fields[name] = field.contents()
        except (ValueError, IndexError, TypeError):
            continue
    weights = sum(int(t.n_bytes) for t in reader.tensors)
    facts = facts_from_gguf_fields(fields, weights_bytes=weights or path.stat().st_size)
    if facts.parameters is None:
        facts = facts.model_copy(update={"parameters": sum(int(t.n_elements) for t in reader.tensors)})
    return facts
