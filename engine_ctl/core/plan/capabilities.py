"""Seed 000's `capabilities` and the rest of its `plan` object, as status shows them: derived from the model, the
engine and what the replicas run, not copied from the Model document. Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from engine_ctl.core.fit.hostfacts import EngineInstall, HostFacts
from engine_ctl.core.model import Model
from engine_ctl.core.record.model import ReplicaRecord
from engine_ctl.providers import Provider

AMD_PLATFORMS = ("rocm", "vulkan")
"""The builds seed 000 calls amd_images: ROCm, and Vulkan for the Radeon GPUs ROCm has no kernels for."""
EFFORT_PARSERS = frozenset({"gpt_oss", "gptoss", "openai_gptoss", "harmony"})
"""Parsers of models switched by `reasoning_effort` (gpt-oss's harmony format); the others by `enable_thinking`."""


def capabilities(
    model: Model, provider: Provider, api: str = "chat", engine_args: Sequence[str] = ()
) -> dict[str, Any]:
    """What the deployment answers, as seed 000 lists it: chat, embeddings, vision, audio, video, transcription,
    tools (with tools_reason and tools_engine_args when not), reasoning, reasoning_switch, structured_output,
    logprobs, engine, tool_call_parser, reasoning_parser. What the model says it can do counts only where the
    engine serves it as this deployment runs it."""
    said = set(model.capabilities)
    embedding = model.is_embedding
    chat = not embedding and api == "chat"
    served = {c: c in said and c not in provider.lacks for c in ("audio", "video", "transcription")}
    vision = "vision" in said and (not provider.vision_needs_mmproj or model.mmproj is not None)
    parsers = bool(provider.parser_flags)  # an engine names a parser, or reads the model's chat template
    tool_parser = model.tool_call_parser if parsers else None
    reasoning_parser = model.reasoning_parser if parsers else None
    tools, why, add = _tools(said, chat, provider, tool_parser, engine_args)
    reasoning = chat and "reasoning" in said
    out: dict[str, Any] = {
        "chat": chat, "embeddings": embedding, "vision": chat and vision, "audio": chat and served["audio"],
        "video": chat and served["video"], "transcription": served["transcription"], "tools": tools,
    }  # fmt: skip
    if not tools:
        out["tools_reason"] = why
        if add:
            out["tools_engine_args"] = add
    out |= {
        "reasoning": reasoning,
        "reasoning_switch": _switch(model, reasoning_parser) if reasoning else None,
        "structured_output": chat, "logprobs": chat, "engine": provider.name,
        "tool_call_parser": tool_parser if tools else None, "reasoning_parser": reasoning_parser if reasoning else None,
    }  # fmt: skip
    return out


def _tools(
    said: set[str], chat: bool, provider: Provider, parser: str | None, engine_args: Sequence[str]
) -> tuple[bool, str | None, list[str]]:
    """(tools, why not, the engine_args that would turn them on)."""
    if not chat:
        return False, "not a chat deployment", []
    if "tools" not in said:
        return False, "the model's capabilities do not list tools", []
    if not provider.parser_flags:  # the model's chat template says how tools are called
        return True, None, []
    flag = provider.parser_flags["tool_call_parser"]
    if parser or flag in engine_args:
        return True, None, []
    add = [*provider.tool_choice_flags, flag, "<parser>"]
    return False, f"{provider.title} needs a tool-call parser for this model: set the model's tool_call_parser", add


def _switch(model: Model, parser: str | None) -> str:
    """How a request turns reasoning on and off: `reasoning_effort` (gpt-oss) or `enable_thinking` (the rest)."""
    harmony = (parser or "").lower() in EFFORT_PARSERS or "gpt-oss" in model.name.lower()
    return "reasoning_effort" if harmony else "enable_thinking"


def build_identity(e: EngineInstall | None, path: str | None = None) -> dict[str, Any] | None:
    """An engine build as seed 000's `image` names one: its path and digest (the binary's sha256), with its version."""
    if e is None and path is None:
        return None
    return {"path": e.path if e else path, "sha256": e.sha256 if e else None, "version": e.version if e else None}


def plan_extras(
    provider: Provider, replicas: Sequence[ReplicaRecord], facts: Mapping[str, HostFacts]
) -> dict[str, Any]:
    """Seed 000's plan fields beyond the fit's: `image` (the build the first replica runs: path, sha256, version),
    `amd_images` (the ROCm and Vulkan builds the hosts have, by platform), `cpu_burst` (its cores are a share, not
    a ceiling: always true, no unit has a CPU quota) and `port` (the first replica's; each member has its own)."""
    ordered = sorted(replicas, key=lambda r: (r.index, r.slot))
    first = next((r for r in ordered if r.argv), None)
    image = None
    if first is not None:
        image = {"path": first.argv[0], "sha256": first.engine_sha256 or None, "version": first.engine_version}
    amd: dict[str, dict[str, Any]] = {}
    for host in sorted(facts):
        for platform, e in sorted(facts[host].engine_builds.get(provider.name, {}).items()):
            if platform in AMD_PLATFORMS and platform not in amd:
                amd[platform] = build_identity(e) or {}
    return {"image": image, "amd_images": amd, "cpu_burst": True, "port": ordered[0].port if ordered else None}
