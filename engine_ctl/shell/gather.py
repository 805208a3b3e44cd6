"""Gathering host facts: one probe script, one SSH session, one remote process per host."""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from engine_ctl.core.documents.inventory import Host
from engine_ctl.core.fit.hostfacts import (
    CheckoutFact,
    Cpu,
    Disk,
    EngineInstall,
    Gpu,
    HostFacts,
    Memory,
    ModelFile,
    UnitFact,
    parse_amd_smi,
    parse_nvidia_smi,
    parse_rocm_smi,
    parse_system_profiler,
)
from engine_ctl.core.fit.modelfacts import ModelFacts, facts_from_gguf_fields, facts_from_hf_config
from engine_ctl.core.fit.unitheader import parse_unit_header
from engine_ctl.core.names import UNIT_PREFIX
from engine_ctl.core.plan.internalkey import key_files
from engine_ctl.core.plan.unitdiff import hide_argv, hide_secrets_in
from engine_ctl.core.render.units import bind_address, local_address
from engine_ctl.core.unitsetup import outranking_files, own_drop_ins, shared_drop_ins
from engine_ctl.providers import PROVIDERS
from engine_ctl.shell import shipped
from engine_ctl.shell.transport import (
    Ahead,
    HostFailure,
    Kept,
    SSHOptions,
    Transport,
    fan_out,
    python_argv,
)


def probe_source() -> str:
    return shipped.script("facts_probe.py")


def probe_args(
    host: Host,
    model_paths: Sequence[str] = (),
    health: Sequence[tuple[int, str]] = (),
    known_versions: Mapping[str, Any] | None = None,
    decisions: Sequence[Mapping[str, Any]] = (),
    key_checks: Sequence[Mapping[str, Any]] = (),
    links: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    return {
        "decisions": [dict(d) for d in decisions],
        "key_checks": [dict(c) for c in key_checks],
        "links": [dict(link) for link in links],
        "key_files": key_files(),
        "known_versions": dict(known_versions or {}),
        "model_paths": list(model_paths),
        "health": [{"port": port, "path": path} for port, path in health],
        "models_dir": host.models_dir,
        "cache_dir": host.cache_dir,
        "unit_prefix": UNIT_PREFIX,
        "bind": local_address(bind_address(host)),
        "builds": {
            f"{name}\t{platform}": {"candidates": [path], "probe": PROVIDERS[name].version_probe()}
            for name, paths in host.engine_builds.items()
            if name in PROVIDERS
            for platform, path in paths.items()
        },
        "engines": {
            name: {"candidates": p.executable_candidates(host.engines.get(name)), "probe": p.version_probe()}
            for name, p in PROVIDERS.items()
        },
        "workers": worker_binaries(host),
        "scaler_authorization": scaler_authorization(),
    }


@functools.cache  # the shipped program is read and hashed once a process, not once a host
def scaler_authorization() -> dict[str, str]:
    """What a replica host's authorization of the scaler's key must be: each of its authorized_keys lines starts
    with these options (the forced command), and the forced command is this program (its sha256)."""
    import hashlib

    from engine_ctl.shell.scaler.apply import authorized_line, command_text  # the shipped program

    digest = hashlib.sha256(command_text().encode()).hexdigest()
    return {"options": authorized_line("KEY").split(" KEY ")[0] + " ", "command_sha256": digest}


def worker_binaries(host: Host) -> dict[str, dict[str, Any]]:
    """path -> how to read it, for each binary a replica group's worker may run on this host beside an engine
    executable it may run (engines.build_for's choice: the builds the inventory names, else its one executable,
    else the provider's default), as the provider names them (provider.worker_executables)."""
    out: dict[str, dict[str, Any]] = {}
    for name, p in PROVIDERS.items():
        builds = host.engine_builds.get(name)
        executables = set(builds.values()) if builds else {host.engines.get(name) or p.default_executable}
        for executable in sorted(e for e in executables if e):
            for path, probe in p.worker_executables(executable).items():
                out[path] = {"candidates": [path], "probe": probe}
    return out


def _checkout(raw: dict[str, Any]) -> CheckoutFact:
    path, repo, commit = str(raw["path"]), str(raw["repo"]), str(raw["commit"])
    return CheckoutFact(path=path, repo=repo, commit=commit, bytes=int(raw["bytes"]), freed_bytes=int(raw["freed"]))


def _int(value: object) -> int | None:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return None


def _ok_output(result: dict[str, Any] | None) -> str | None:
    return result["out"] if result and result.get("code") == 0 else None


def _gpus(raw: dict[str, Any]) -> tuple[list[Gpu], list[str]]:
    """Parse whichever GPU tools answered; a tool that failed is a warning, never an error."""
    tools: list[tuple[str, str, Callable[[str], list[Gpu]]]] = [
        ("nvidia_smi", "nvidia-smi", parse_nvidia_smi),
        ("amd_smi_static", "amd-smi", lambda out: parse_amd_smi(out, _ok_output(raw.get("amd_smi_metric")))),
        ("rocm_smi", "rocm-smi", parse_rocm_smi),
        (
            "system_profiler",
            "system_profiler",
            lambda out: parse_system_profiler(out, _ok_output(raw.get("hw_memsize"))),
        ),
    ]
    gpus: list[Gpu] = []
    warnings: list[str] = []
    for key, tool, parse in tools:
        result = raw.get(key)
        if not result:
            continue
        if result["code"] == 0:
            gpus += parse(result["out"])
        else:
            warnings.append(f"{tool} failed (exit {result['code']}): {result['err'].strip()[:200]}")
    return gpus, warnings


def _builds(raw: dict[str, Any]) -> dict[str, dict[str, EngineInstall]]:
    out: dict[str, dict[str, EngineInstall]] = {}
    for key, v in raw.items():
        name, _, platform = key.partition("\t")
        out.setdefault(name, {})[platform] = EngineInstall(path=v["path"], version=v.get("version"),
                                                           sha256=v.get("sha256"))  # fmt: skip
    return out


def writable_problem(path: str) -> str:
    """Seed 003: a model's directory must not be writable by other users (they could swap the weights)."""
    return f"{path} is writable by other users: refused; remove their write access (chmod o-w {path})"


def facts_from_probe(host: str, doc: dict[str, Any]) -> HostFacts:
    """Pure: the probe's JSON -> HostFacts."""
    gpus, warnings = _gpus(doc.get("gpus") or {})
    scaler_config = doc["scaler_config"] if isinstance(doc.get("scaler_config"), dict) else {}
    disks = {
        key: Disk(path=d["path"], total_bytes=d.get("total"), free_bytes=d.get("free"), exists=bool(d.get("exists")))
        for key, d in (doc.get("disks") or {}).items()
    }
    units = tuple(
        UnitFact(
            name=u["Id"],
            sha256=u.get("sha256"),
            active_state=u.get("ActiveState"),
            sub_state=u.get("SubState"),
            n_restarts=_int(u.get("NRestarts")),
            main_pid=_int(u.get("MainPID")),
            exec_main_status=_int(u.get("ExecMainStatus")),
            unit_file_state=u.get("UnitFileState") or None,
            drop_ins=own_drop_ins(u["Id"], str(u.get("DropInPaths") or "").split())
            + outranking_files(u["Id"], u.get("FragmentPath")),
            shared_drop_ins=shared_drop_ins(u["Id"], str(u.get("DropInPaths") or "").split()),
            text=hide_secrets_in(u["text"]) if isinstance(u.get("text"), str) else None,  # never a token kept
            header=parse_unit_header([str(x) for x in u.get("header") or []]),
            body_sha256=u.get("body_sha256"),
            exits=tuple(str(x) for x in u.get("exits") or []),
            started_at=u.get("started_at") if isinstance(u.get("started_at"), (int, float)) else None,
            file_changed_at=u["file_changed_at"] if isinstance(u.get("file_changed_at"), (int, float)) else None,
            process_state=str(u["process_state"]) if u.get("process_state") else None,
            stop_job=bool(u.get("stop_job")),
            proc_argv=hide_argv([str(x) for x in u["proc_argv"]]) if isinstance(u.get("proc_argv"), list) else None,
            proc_env=tuple(str(x) for x in u["proc_env"]) if isinstance(u.get("proc_env"), list) else None,
            proc_exe=str(u["proc_exe"]) if u.get("proc_exe") else None,
        )
        for u in doc.get("units") or []
    )
    version = doc.get("systemd") or ""
    if not doc.get("curl"):
        warnings.append("curl is not installed: engine units' health gate needs /usr/bin/curl")
    models: dict[str, ModelFacts] = {}
    problems: dict[str, str] = {}
    checkpoints: dict[str, str] = {}
    mtimes: dict[str, float] = {}
    for path, entry in (doc.get("models") or {}).items():
        found = facts_from_model_probe(entry)
        if entry.get("writable"):
            problems[path] = writable_problem(str(entry["writable"]))
        elif found is not None:
            models[path] = found
        else:
            problems[path] = "not found" if entry.get("missing") else str(entry.get("error"))
        if isinstance(entry.get("mtime"), (int, float)):
            mtimes[path] = float(entry["mtime"])
        measured = entry.get("checkpoint") or {}
        if measured.get("digest"):
            checkpoints[str(measured["dir"])] = str(measured["digest"])
    return HostFacts(
        host=host,
        models=models,
        model_problems=problems,
        checkpoints=checkpoints,
        model_mtimes=mtimes,
        health={str(k): str(v) for k, v in (doc.get("health") or {}).items()},
        decisions={
            str(k): {"status": str(v.get("status")), "body": str(v.get("body", ""))}
            for k, v in (doc.get("decisions") or {}).items()
            if isinstance(v, dict)
        },
        hostname=doc.get("hostname"),
        os=doc.get("os"),
        kernel=doc.get("kernel"),
        arch=doc.get("arch"),
        systemd_version=version.split()[1] if len(version.split()) > 1 else None,
        cpu=Cpu(
            cores=int(doc["cpu"]["cores"]), model=doc["cpu"].get("model"), flags=tuple(doc["cpu"].get("flags", ()))
        ),
        memory=Memory(total_bytes=int(doc["memory"]["total"]), available_bytes=int(doc["memory"]["available"])),
        disks=disks,
        gpus=tuple(gpus),
        engine_builds=_builds(doc.get("engine_builds") or {}),
        worker_engines={
            str(k): EngineInstall(path=v["path"], version=v.get("version"), sha256=v.get("sha256"))
            for k, v in (doc.get("workers") or {}).items()
        },
        engines={
            k: EngineInstall(path=v["path"], version=v.get("version"), sha256=v.get("sha256"))
            for k, v in (doc.get("engines") or {}).items()
        },
        units=units,
        ports_in_use=tuple(doc.get("ports") or ()),
        model_files=tuple(ModelFile(path=f["path"], size_bytes=int(f["size"])) for f in doc.get("model_files") or []),
        checkouts=tuple(_checkout(c) for c in doc.get("checkouts") or []),
        haproxy_version=doc.get("haproxy"),
        gateway_files=(doc.get("gateway") or {}).get("files") if doc.get("gateway") else None,
        gateway_servers=dict((doc.get("gateway") or {}).get("servers") or {}),
        gateway_addresses=dict((doc.get("gateway") or {}).get("addresses") or {}),
        gateway_maps=(doc.get("gateway") or {}).get("maps"),
        gateway_weights=dict((doc.get("gateway") or {}).get("weights") or {}),
        gateway_unloaded=tuple((doc.get("gateway") or {}).get("changed_since_load") or ()),
        gateway_missing_sockets=tuple(str(p) for p in (doc.get("gateway") or {}).get("missing_sockets") or ()),
        gateway_frontends=dict((doc.get("gateway") or {}).get("frontends") or {}),
        gateway_rate_limits=dict((doc.get("gateway") or {}).get("rate_limits") or {}),
        gateway_runtime=dict((doc.get("gateway") or {}).get("runtime") or {}),
        gateway_lineage=(doc.get("gateway") or {}).get("lineage"),
        loose_secrets={str(k): str(v) for k, v in (doc.get("loose_secrets") or {}).items()},
        gateway_key=(doc.get("gateway") or {}).get("internal_key"),
        replica_keys={
            str(k): None if v is None else tuple(str(x) for x in v) for k, v in (doc.get("replica_keys") or {}).items()
        },
        key_checks={str(k): str(v) for k, v in (doc.get("key_checks") or {}).items()},
        member_links={str(k): str(v) for k, v in (doc.get("links") or {}).items()},
        scaler_state=doc["scaler"] if isinstance(doc.get("scaler"), dict) else None,
        scaler_config_sha256=scaler_config.get("deployments_sha256"),
        scaler_program_sha256=doc.get("scaler_program_sha256"),
        scaler_authorization=doc.get("scaler_authorization")
        if isinstance(doc.get("scaler_authorization"), dict)
        else None,
        scaler_settings=scaler_config.get("settings") if isinstance(scaler_config.get("settings"), dict) else None,
        scaler_config_unreadable=bool(scaler_config.get("unreadable")),
        scaler_files_changed_at=doc["scaler_files_changed_at"]
        if isinstance(doc.get("scaler_files_changed_at"), (int, float))
        else None,
        psql=doc.get("psql", ""),
        ip_filtering=doc.get("cgroup2"),
        warnings=tuple(warnings),
        machine_id=str(doc["machine_id"]) if doc.get("machine_id") else None,
    )


def gather_one(
    transport: Transport,
    model_paths: Sequence[str] = (),
    health: Sequence[tuple[int, str]] = (),
    decisions: Sequence[Mapping[str, Any]] = (),
    key_checks: Sequence[Mapping[str, Any]] = (),
    links: Sequence[Mapping[str, Any]] = (),
) -> HostFacts:
    host = transport.host
    cache = VersionCache.for_host(host.name)
    args = probe_args(host, model_paths, health, cache.known, decisions, key_checks, links)
    argv = python_argv("-I", "-S", "-", json.dumps(args, separators=(",", ":")))
    result = transport.run(argv, stdin=probe_source())
    if result.exit_code != 0:
        if result.exit_code == 127:
            raise HostFailure(host.name, "command", "python3 is not installed on the host; the facts probe needs it")
        raise HostFailure(host.name, "command", f"facts probe failed (exit {result.exit_code}): {result.stderr[-500:]}")
    try:
        doc = json.loads(result.stdout)
    except json.JSONDecodeError as exc:
        raise HostFailure(host.name, "command", f"facts probe printed no JSON: {exc}") from None
    cache.remember({**(doc.get("engines") or {}), **(doc.get("engine_builds") or {}), **(doc.get("workers") or {})})
    return facts_from_probe(host.name, doc)


class VersionCache:
    """Engine versions and sha256 digests already read on a host, keyed by the binary's path, mtime, size, ctime
    and inode (path -> {"stat", "version", "sha256"}), so that the probe runs the engine's version probe (its
    provider's) and hashes the binary only when it changed. Kept in ~/.cache/engine-ctl/ (or $ENGINE_CTL_CACHE_DIR);
    losing it only costs a re-read."""

    def __init__(self, path: Path, known: dict[str, Any]) -> None:
        self.path, self.known = path, known

    @classmethod
    def for_host(cls, host: str) -> VersionCache:
        base = Path(os.environ.get("ENGINE_CTL_CACHE_DIR") or Path.home() / ".cache" / "engine-ctl")
        path = base / "engine-versions" / f"{host}.json"
        try:
            known = json.loads(path.read_text())
        except (OSError, ValueError):
            known = {}
        return cls(path, known if isinstance(known, dict) else {})

    def remember(self, engines: dict[str, Any]) -> None:
        fresh = {
            e["path"]: {"stat": e["stat"], "version": e.get("version"), "sha256": e.get("sha256")}
            for e in engines.values()
            if e.get("stat")
        }
        if fresh == self.known:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(fresh))
            tmp.replace(self.path)
        except OSError:
            pass


def gather(
    hosts: Sequence[Host],
    options: SSHOptions | None = None,
    parallel: int = 32,
    model_paths: Mapping[str, Sequence[str]] | None = None,
    health: Mapping[str, Sequence[tuple[int, str]]] | None = None,
    ahead: Ahead | None = None,
    decisions: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    keep: Kept | None = None,
    key_checks: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    links: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
) -> tuple[dict[str, HostFacts], dict[str, HostFailure]]:
    """Facts of every host in parallel (and the metadata of the model files asked for, per host, in the same
    round trip), over the connections `ahead` began (transport.connect_ahead) or new ones, left open in `keep`
    when given (fan_out); failures are returned by host, never raised."""
    paths = model_paths or {}
    checks = health or {}
    return fan_out(
        hosts,
        lambda t: gather_one(
            t,
            paths.get(t.host.name, ()),
            checks.get(t.host.name, ()),
            (decisions or {}).get(t.host.name, ()),
            (key_checks or {}).get(t.host.name, ()),
            (links or {}).get(t.host.name, ()),
        ),
        options=options,
        parallel=parallel,
        ahead=ahead,
        keep=keep,
    )


def facts_from_model_probe(entry: dict[str, Any]) -> ModelFacts | None:
    """Pure: one path's probe result -> ModelFacts (None when missing or unreadable)."""
    if entry.get("missing") or entry.get("error"):
        return None
    if entry.get("format") == "gguf":
        return facts_from_gguf_fields(entry.get("fields") or {}, weights_bytes=entry.get("data_bytes"))
    return facts_from_hf_config(entry.get("config") or {}, entry.get("data_bytes"), None)
