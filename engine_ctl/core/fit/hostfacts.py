"""Host facts as typed values, and the pure parsers of the tools' real output formats."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from engine_ctl.core.fit.modelfacts import ModelFacts
from engine_ctl.core.fit.unitheader import UnitHeader

FORMAT_VERSION = 1
MIB = 1024**2
BUSY_BYTES = 1024 * MIB
"""A GPU with more than this in use by processes engine-ctl did not start counts as held."""


class Fact(BaseModel):
    model_config = ConfigDict(frozen=True)


class Gpu(Fact):
    index: int
    uuid: str
    name: str
    vendor: Literal["nvidia", "amd", "apple"]
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    driver_version: str | None = None
    gfx_target: str | None = None
    """An AMD GPU's LLVM target (gfx942 for an MI300X): which build of an engine runs on it (seed 001)."""


class Cpu(Fact):
    cores: int
    model: str | None = None
    flags: tuple[str, ...] = ()


class Memory(Fact):
    total_bytes: int
    available_bytes: int


class Disk(Fact):
    path: str
    total_bytes: int | None = None
    free_bytes: int | None = None
    exists: bool = True


class EngineInstall(Fact):
    path: str
    version: str | None = None
    sha256: str | None = None
    """The sha256 of the binary (what runs, whatever its version says)."""


class UnitFact(Fact):
    name: str
    sha256: str | None = None
    active_state: str | None = None
    sub_state: str | None = None
    n_restarts: int | None = None
    main_pid: int | None = None
    exec_main_status: int | None = None
    unit_file_state: str | None = None
    """systemd's UnitFileState: `enabled` (apply enables an always-on replica), `disabled` (an on-demand one: installed,
    never enabled), None from an older probe."""
    drop_ins: tuple[str, ...] = ()
    """The drop-in files under /etc or /run that change this engine-ctl unit (engine_ctl.core.dropins): drift."""
    shared_drop_ins: tuple[str, ...] = ()
    """The drop-in files that change it from a directory shared with other units (`service.d/`): a warning."""
    text: str | None = None
    """The unit file's text (up to UNIT_TEXT_LIMIT bytes), so a hand edit is shown as a diff; values that look
    secret are hidden in it (engine_ctl.core.plan.unitdiff.hide_secrets). sha256 is the file's own."""
    header: UnitHeader | None = None
    """What the unit's engine-ctl header says (deployment, revision, lineage, …); None without one."""
    stop_job: bool = False
    """A stop verb's job for it is loaded on the host (queued or running: it drains, then stops the unit)."""
    process_state: str | None = None
    """The state letter of its main process in /proc/PID/stat (R, S, D; T: stopped by a signal); None: no process,
    or an older probe."""
    started_at: float | None = None
    """When its main process started (Unix time, from systemd's ExecMainStartTimestampMonotonic); None: never, or
    an older probe."""
    file_changed_at: float | None = None
    """When its unit file last changed (Unix time: the later of its mtime and its ctime, which a copy that keeps
    the old mtime still moves); None: no file, or an older probe."""
    proc_argv: tuple[str, ...] | None = None
    """Its main process's command line (/proc/PID/cmdline); None: no process, or not readable."""
    proc_env: tuple[str, ...] | None = None
    proc_exe: str | None = None
    """The executable its main process runs (/proc/PID/exe): a wrapper at the unit's path exec'd another one."""
    """The names (never the values) of its main process's environment variables; None: not read."""
    exits: tuple[str, ...] = ()
    """Its last exits other than a stop, oldest first, as its unit records them: `epoch result code status`
    (`1733312345 signal killed SEGV`: a crash by SIGSEGV). Kept until the host reboots."""
    body_sha256: str | None = None
    """sha256 of the file with its content-sha256 value left empty: equal to the header's content_sha256 when
    nobody edited the unit since engine-ctl wrote it."""

    @property
    def stopped_by_signal(self) -> bool:
        """Active, its main process stopped by a signal (SIGSTOP, SIGTSTP) or a tracer: it answers nothing."""
        return self.active_state == "active" and self.process_state in ("T", "t")

    @property
    def last_crash(self) -> str | None:
        """The last exit other than a stop, in words: `killed by signal SEGV at 2026-12-04 10:40:05 UTC`."""
        if not self.exits:
            return None
        epoch, result, code, status = ([*self.exits[-1].split(), "", "", "", ""])[:4]
        how = {"killed": "killed by signal", "dumped": "killed by signal (core dumped)", "exited": "exited with status"}
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(int(epoch))) if epoch.isdigit() else "?"
        return f"{how.get(code, code or result)} {status} ({result}) at {when}".replace("  ", " ")

    @property
    def edited(self) -> bool:
        """The file is not what engine-ctl wrote: its content hash does not match its header's."""
        claimed = self.header.content_sha256 if self.header else None
        return claimed is not None and self.body_sha256 is not None and claimed != self.body_sha256


UNIT_TEXT_LIMIT = 256 * 1024
"""A unit file engine-ctl writes is a few KiB; past this its text is not sent (its hash still is)."""


class ModelFile(Fact):
    path: str
    size_bytes: int


class CheckoutFact(Fact):
    """An hf: checkout a fetch left on the host, whole: <models_dir>/sources/<repo>/<commit>."""

    path: str
    repo: str
    commit: str
    bytes: int
    freed_bytes: int
    """What deleting it frees: its files no other checkout links to."""


class HostFacts(Fact):
    host: str
    hostname: str | None = None
    os: str | None = None
    kernel: str | None = None
    arch: str | None = None
    systemd_version: str | None = None
    cpu: Cpu
    memory: Memory
    disks: dict[str, Disk] = Field(default_factory=dict)
    gpus: tuple[Gpu, ...] = ()
    engines: dict[str, EngineInstall] = Field(default_factory=dict)
    engine_builds: dict[str, dict[str, EngineInstall]] = Field(default_factory=dict)
    """engine -> platform (cuda, rocm, vulkan, metal, cpu) -> the build the inventory names there, as found."""
    worker_engines: dict[str, EngineInstall] = Field(default_factory=dict)
    """path -> a binary a replica group's worker runs beside an engine build (provider.worker_executables), as
    found: its sha256 (and version, where it has a version flag)."""
    units: tuple[UnitFact, ...] = ()
    ports_in_use: tuple[int, ...] = ()
    model_files: tuple[ModelFile, ...] = ()
    checkouts: tuple[CheckoutFact, ...] = ()
    haproxy_version: str | None = None
    gateway_files: dict[str, str] | None = None
    """engine-ctl's gateway files on the host (name -> sha256), None where there are none."""
    gateway_servers: dict[str, str] = Field(default_factory=dict)
    """backend/server -> its state as the host's gateway sees it (UP, DOWN, DRAIN, MAINT, ...)."""
    gateway_addresses: dict[str, str] = Field(default_factory=dict)
    """backend/server -> address:port the host's gateway sends its requests to now (`show stat`'s addr)."""
    gateway_weights: dict[str, str] = Field(default_factory=dict)
    """backend/server -> its weight in the running gateway (`show stat`'s weight; the configuration gives 1)."""
    gateway_frontends: dict[str, str] = Field(default_factory=dict)
    """frontend -> its status in the running gateway (OPEN; PAUSED once `disable frontend` paused it)."""
    gateway_rate_limits: dict[str, str] = Field(default_factory=dict)
    """`show info`'s ConnRateLimit, SessRateLimit, SslRateLimit (0: none, as the configuration sets)."""
    gateway_unloaded: tuple[str, ...] = ()
    gateway_missing_sockets: tuple[str, ...] = ()
    """The UNIX sockets the gateway's haproxy.cfg binds that are no file (deleted under the running gateway)."""
    """The gateway's files (not its runtime maps) changed after the running gateway loaded its configuration."""
    loose_secrets: dict[str, str] = Field(default_factory=dict)
    """path -> its mode and owner, for each file holding the internal key that others may read (facts_probe.
    loose_secrets): none, as apply writes them (0600, root's)."""
    gateway_lineage: str | None = None
    """The state lineage the gateway's haproxy.cfg names (whose gateway it is); None where it names none."""
    gateway_runtime: dict[str, Any] = Field(default_factory=dict)
    """What admin commands can change in the running gateway beyond maps, weights and states (facts_probe.
    gateway_runtime): "acls" ([line, fetch, entries] of each ACL its haproxy.cfg declares), "maxconn" (show info),
    "slim" (each frontend's and server's connection limit), "checks" (each server's check port and address)."""
    gateway_maps: dict[str, dict[str, str]] | None = None
    """The running gateway's key maps in memory (map name -> key -> value), None when it does not answer."""
    gateway_key: dict[str, str | None] | None = None
    """The internal key on a gateway host, as fingerprints (core.internalkey.key_fingerprint; never the key): "file"
    (its key file), "copy" (its run directory's copy) and "running" (the running gateway's map). A place with None
    has no key; a place left out was not read (not running, not readable). None where there is no gateway."""
    replica_keys: dict[str, tuple[str, ...] | None] = Field(default_factory=dict)
    """path -> the fingerprints of the keys in each engine form of the internal key on this host (None: no such
    file); a path left out was not read."""
    key_checks: dict[str, str] = Field(default_factory=dict)
    """port -> the HTTP status a replica behind a gateway answers GET core.internalkey.KEY_CHECK_PATH sent with the
    key its host holds, or 'down: why' (for the ports asked for)."""
    scaler_state: dict[str, Any] | None = None
    scaler_authorization: dict[str, Any] | None = None
    """On a host that authorizes the scaler's key (facts_probe.scaler_authorization): "loose", the options of its
    authorized_keys lines that are not the forced command engine-ctl writes; "command", whether the forced command
    is engine-ctl's ("ok", "changed", "missing"). None: no such line and no command there."""
    scaler_program_sha256: str | None = None
    """The sha256 of the scaler's program on this host (core.render.scaler.SCALER_PROGRAM); None: none there."""
    scaler_config_sha256: str | None = None
    """sha256 of the deployments in the scaler's scaler.json on this host (render.scaler.deployments_digest); None
    where there is none or it was not read."""
    scaler_settings: dict[str, Any] | None = None
    """scaler.json's poll_s, decide_every_s and hold_s on this host; None where there is none."""
    scaler_config_unreadable: bool = False
    """The host has a scaler.json that is not the scaler's JSON (edited, cut short): its scaler cannot run."""
    scaler_files_changed_at: float | None = None
    """When scaler.json or scaler.py last changed (the later of the two files' mtime and ctime, epoch seconds): the
    scaler reads both at its start only. None: neither there, or a time ahead of the host's clock."""
    psql: str | None = ""
    """psql's path (the scaler's PostgreSQL lock needs it on a gateway host); None: not installed; "": not asked."""
    """The scaler's state.json, on the gateway host that runs it (engine_ctl.core.plan.scaler reads it)."""
    ip_filtering: bool | None = None
    """Whether systemd's IPAddressAllow=/IPAddressDeny= are enforced (cgroup v2); None when not known."""
    models: dict[str, ModelFacts] = Field(default_factory=dict)
    """Model metadata read on the host, by path (for the paths asked for)."""
    model_problems: dict[str, str] = Field(default_factory=dict)
    model_mtimes: dict[str, float] = Field(default_factory=dict)
    """path -> when the weights there were last written (Unix time; the newest file of a directory), for the paths
    asked for: weights written after a replica started are not the weights it serves."""
    checkpoints: dict[str, str] = Field(default_factory=dict)
    """An hf: checkout's directory -> its checkpoint digest, measured on the host (for the paths asked for)."""
    health: dict[str, str] = Field(default_factory=dict)
    """port -> HTTP status of GET /health on loopback, or 'down: why' (for the ports asked for)."""
    decisions: dict[str, dict[str, str]] = Field(default_factory=dict)
    """port -> a decisions replica's answer to the readiness request: {"status": HTTP status or 'down: why',
    "body": …}, judged by engine_ctl.core.decisions (for the ports asked for)."""
    warnings: tuple[str, ...] = ()
    member_links: dict[str, str] = Field(default_factory=dict)
    """From this host (a replica group's head's), each worker's unit -> whether a connection to its port opened
    (`ok`, else why not); only for engines whose head dials its workers (provider.head_dials_members)."""
    machine_id: str | None = None
    """/etc/machine-id: which machine answered at the host's address (the state records it at each apply); None
    from an older probe."""

    @property
    def gpu_vendor(self) -> str | None:
        return self.gpus[0].vendor if self.gpus else None

    def fingerprint(self) -> str:
        """A hash of the facts that placement and rendering depend on (not volatile counters)."""
        stable = self.model_dump(
            include={"host", "arch", "cpu", "gpus", "engines", "units", "model_files", "models"},
            exclude={
                "gpus": {"__all__": {"memory_used_bytes"}},
                # the text: its sha256 is there; unit_file_state: only import reads it, no plan depends on it
                "units": {
                    "__all__": {
                        "main_pid",
                        "n_restarts",
                        "text",
                        "unit_file_state",
                        "exits",
                        "started_at",
                        "process_state",
                        "proc_argv",
                        "proc_env",
                    }
                },
            },
        )
        stable["memory_total"] = self.memory.total_bytes
        return hashlib.sha256(json.dumps(stable, sort_keys=True, default=str).encode()).hexdigest()

    @model_validator(mode="after")
    def _unified_memory_is_the_hosts(self) -> HostFacts:
        """A unified-memory GPU (a GB10) shares the machine's memory, and nvidia-smi reports no memory.total for it
        ([N/A]): its memory is the machine's (seed 003, unified-memory machines), so it can be placed and sized."""
        if not any(unified_memory(g) and g.memory_total_bytes is None for g in self.gpus):
            return self
        gpus = tuple(g.model_copy(update={"memory_total_bytes": self.memory.total_bytes})
                     if unified_memory(g) and g.memory_total_bytes is None else g for g in self.gpus)  # fmt: skip
        object.__setattr__(self, "gpus", gpus)
        return self


def unified_memory(gpu: Gpu) -> bool:
    """A GPU that shares the machine's memory: a GB10 (DGX Spark) or Apple silicon."""
    return gpu.vendor == "apple" or "GB10" in gpu.name.upper()


def _num(text: str) -> float | None:
    text = text.strip()
    if not text or text.startswith("[") or text.upper() in ("N/A", "NA"):
        return None  # [N/A], [Not Supported], [Unknown Error]
    try:
        return float(text)
    except ValueError:
        return None


def parse_nvidia_smi(text: str) -> list[Gpu]:
    """`nvidia-smi --query-gpu=index,uuid,name,memory.total,memory.used,driver_version
    --format=csv,noheader,nounits`: one line per GPU, memory in MiB, `[N/A]` where unknown."""
    gpus: list[Gpu] = []
    for row in csv.reader(io.StringIO(text), skipinitialspace=True):
        if len(row) < 6 or not row[0].strip():
            continue
        index = _num(row[0])
        total, used = _num(row[3]), _num(row[4])
        gpus.append(
            Gpu(
                index=int(index) if index is not None else len(gpus),
                uuid=row[1].strip(),
                name=row[2].strip(),
                vendor="nvidia",
                memory_total_bytes=int(total * MIB) if total is not None else None,
                memory_used_bytes=int(used * MIB) if used is not None else None,
                driver_version=None if row[5].strip().startswith("[") else row[5].strip(),
            )
        )
    return gpus


def _bytes_of(value: Any) -> int | None:
    """amd-smi JSON gives {"value": 196592, "unit": "MB"}; older versions a bare number or 'N/A'."""
    if isinstance(value, dict):
        amount = value.get("value")
        unit = str(value.get("unit", "MB")).upper()
        if not isinstance(amount, int | float):
            return None
        factor = {"B": 1, "KB": 1024, "MB": MIB, "MIB": MIB, "GB": 1024 * MIB, "GIB": 1024 * MIB}.get(unit, MIB)
        return int(amount * factor)
    if isinstance(value, int | float):
        return int(value * MIB)
    return None


def _gfx(value: object) -> str | None:
    """amd-smi's target_graphics_version / rocm-smi's GFX Version: gfx942, gfx1100, … (None when not given)."""
    text = str(value or "").strip().lower()
    return text if text.startswith("gfx") and text[3:].isalnum() else None


# Metal's default working-set limit on Apple silicon (MTLDevice.recommendedMaxWorkingSetSize, what an engine's Metal
# backend may use): about two thirds of the machine's memory up to 36 GiB, three quarters above.
APPLE_SMALL_MACHINE_BYTES = 36 * 1024 * MIB


def apple_gpu_bytes(memsize: int) -> int:
    return memsize * 2 // 3 if memsize <= APPLE_SMALL_MACHINE_BYTES else memsize * 3 // 4


def parse_system_profiler(text: str, memsize_text: str | None = None) -> list[Gpu]:
    """`system_profiler SPDisplaysDataType -json` on macOS: {"SPDisplaysDataType": [one object per GPU]}, each with
    `sppci_model` ("Apple M2 Max"), `spdisplays_vendor` ("sppci_vendor_Apple" on Apple silicon), `sppci_cores`
    and, where Metal runs, `spdisplays_mtlgpufamilysupport` ("spdisplays_metal3"). Apple silicon's GPU has no VRAM
    of its own: its memory is Metal's share of `sysctl -n hw.memsize`. Only Apple-silicon GPUs with Metal are
    reported (an Intel Mac's discrete GPU has no engine build here)."""
    try:
        rows = json.loads(text).get("SPDisplaysDataType") or []
    except (ValueError, AttributeError):
        return []
    memsize = _num(memsize_text or "")
    gpus: list[Gpu] = []
    for row in rows:
        if not isinstance(row, dict) or row.get("spdisplays_vendor") != "sppci_vendor_Apple":
            continue
        if not row.get("spdisplays_mtlgpufamilysupport"):
            continue
        name = str(row.get("sppci_model") or row.get("_name") or "Apple GPU")
        cores = str(row.get("sppci_cores") or "")
        gpus.append(
            Gpu(
                index=len(gpus),
                uuid=f"metal{len(gpus)}",
                name=f"{name} ({cores}-core GPU)" if cores.isdigit() else name,
                vendor="apple",
                memory_total_bytes=apple_gpu_bytes(int(memsize)) if memsize else None,
                driver_version=str(row["spdisplays_mtlgpufamilysupport"]).removeprefix("spdisplays_"),
            )
        )
    return gpus


def parse_amd_smi(static_json: str, vram_json: str | None = None) -> list[Gpu]:
    """`amd-smi static --asic --vram --driver --json` (+ optional `amd-smi metric --mem-usage --json`)."""
    data = json.loads(static_json)
    if isinstance(data, dict) and "gpu_data" in data:
        data = data["gpu_data"]
    used: dict[int, int | None] = {}
    if vram_json:
        metrics = json.loads(vram_json)
        if isinstance(metrics, dict) and "gpu_data" in metrics:
            metrics = metrics["gpu_data"]
        for entry in metrics:
            usage = entry.get("mem_usage") or {}
            used[int(entry.get("gpu", 0))] = _bytes_of(usage.get("used_vram"))
    gpus: list[Gpu] = []
    for entry in data:
        idx = int(entry.get("gpu", len(gpus)))
        asic = entry.get("asic") or {}
        vram = entry.get("vram") or {}
        driver = entry.get("driver") or {}
        serial = str(asic.get("asic_serial") or "")
        uuid = str(entry.get("uuid") or asic.get("uuid") or "")
        if not uuid and serial and serial != "N/A":
            uuid = "GPU-" + (serial[2:] if serial.lower().startswith("0x") else serial).lower()
        uuid = uuid or f"amd-gpu-{idx}"
        gpus.append(
            Gpu(
                index=idx,
                uuid=uuid,
                name=str(asic.get("market_name") or "AMD GPU"),
                vendor="amd",
                memory_total_bytes=_bytes_of(vram.get("size")),
                memory_used_bytes=used.get(idx),
                driver_version=str(driver.get("version")) if driver.get("version") not in (None, "N/A") else None,
                gfx_target=_gfx(asic.get("target_graphics_version")),
            )
        )
    return gpus


def parse_rocm_smi(text: str) -> list[Gpu]:
    """`rocm-smi --showuniqueid --showproductname --showmeminfo vram --showdriverversion --json`:
    {"card0": {"Unique ID": "0x…", "Card series": …, "VRAM Total Memory (B)": "…", …}, "system": {…}}."""
    data = json.loads(text)
    driver = (data.get("system") or {}).get("Driver version")
    gpus = []
    for key in sorted((k for k in data if k.startswith("card")), key=lambda k: int(k[4:] or 0)):
        card = data[key]
        total = _num(str(card.get("VRAM Total Memory (B)", "")))
        used = _num(str(card.get("VRAM Total Used Memory (B)", "")))
        uid = str(card.get("Unique ID", "")).strip()
        gpus.append(
            Gpu(
                index=int(key[4:] or 0),
                uuid=f"GPU-{(uid[2:] if uid.startswith('0x') else uid).lower()}" if uid and uid != "N/A" else key,
                name=str(card.get("Card Series") or card.get("Card series") or card.get("Device Name") or "AMD GPU"),
                vendor="amd",
                memory_total_bytes=int(total) if total is not None else None,
                memory_used_bytes=int(used) if used is not None else None,
                driver_version=str(driver) if driver else None,
                gfx_target=_gfx(card.get("GFX Version")),
            )
        )
    return gpus
