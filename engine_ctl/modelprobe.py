"""Reading model facts on a host through its transport (one process, stdlib probe)."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

from engine_ctl.modelfacts import ModelFacts, facts_from_gguf_fields, facts_from_hf_config
from engine_ctl.transport import HostFailure, LocalTransport, SSHTransport


def facts_from_model_probe(entry: dict[str, Any]) -> ModelFacts | None:
    """Pure: one path's probe result -> ModelFacts (None when missing or unreadable)."""
    if entry.get("missing") or entry.get("error"):
        return None
    if entry.get("format") == "gguf":
        return facts_from_gguf_fields(entry.get("fields") or {}, weights_bytes=entry.get("data_bytes"))
    return facts_from_hf_config(entry.get("config") or {}, entry.get("data_bytes"), None)


def read_model_facts(
    transport: SSHTransport | LocalTransport, paths: list[str]
) -> dict[str, tuple[ModelFacts | None, str | None]]:
    """path -> (facts, problem) for each path on the host."""
    source = resources.files("engine_ctl.remote").joinpath("model_probe.py").read_text()
    argv = ["python3", "-I", "-", json.dumps(paths)]
    result = transport.run(argv if isinstance(transport, LocalTransport) else ["exec", *argv], stdin=source)
    if result.exit_code != 0:
        raise HostFailure(transport.host.name, "command", f"model probe failed: {result.stderr[-300:]}")
    doc = json.loads(result.stdout)
    out: dict[str, tuple[ModelFacts | None, str | None]] = {}
    for path in paths:
        entry = doc.get(path) or {"missing": True}
        problem = "not found" if entry.get("missing") else entry.get("error")
        out[path] = (facts_from_model_probe(entry), problem)
    return out
