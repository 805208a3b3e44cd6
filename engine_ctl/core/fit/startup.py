"""Start-up memory, measured on a revision's first start and reused by later fits (seed 003, STARTUP). Pure.

The shell runs, after the engine passed its health gate, one command that prints what the host knows of the
engine unit's peak (`measure_script`); `parse_measurement` reads it:

- host RAM from the unit's cgroup: `memory.peak` (cgroup v2), else `memory.max_usage_in_bytes` (cgroup v1's memory
  controller), else, where the unit has no memory cgroup of its own (cgroup v1 without a delegated memory
  controller, as in an nspawn host), the sum of the peak resident sets (VmHWM) of the unit's processes;
- GPU memory per device from nvidia-smi's per-process figures, sampled while the engine started (COMPUTE_APPS):
  for each sample the unit's processes' `used_memory` summed per GPU UUID, and the peak over the samples.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from engine_ctl.core.model import Deployment, Model

MIB = 1024 * 1024
COMPUTE_APPS = "nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader,nounits"
"""NVIDIA's per-process query (nvidia-smi manual, `nvidia-smi --help-query-compute-apps`): one line per process on a
GPU, `<pid>, <gpu_uuid>, <used_memory in MiB>`; `[N/A]` where the driver does not say."""
SAMPLE_S = 0.5
SOURCES = {
    "cgroup-v2": "cgroup v2 memory.peak",
    "cgroup-v1": "cgroup v1 memory.max_usage_in_bytes",
    "vmhwm": "the peak resident set (VmHWM) of the unit's processes (no memory cgroup of its own)",
}
DEVICE_SOURCE = "nvidia-smi --query-compute-apps (per-process used_memory, sampled while it started)"


def sample_file(unit: str) -> str:
    return f"/run/engine-ctl/startup-{unit}.gpu"


def sampler(unit: str) -> str:
    """Shell text: sample nvidia-smi's per-process figures in the background until `kill $sampler`, each sample
    after a `gpu-sample` line (nothing where there is no nvidia-smi)."""
    out = shlex.quote(sample_file(unit))
    return (f"mkdir -p /run/engine-ctl; : > {out}; sampler=; if command -v nvidia-smi >/dev/null; then "
            f"( while :; do echo gpu-sample; {COMPUTE_APPS} 2>/dev/null; sleep {SAMPLE_S}; done >> {out} ) & "
            "sampler=$!; fi; ")  # fmt: skip


def measure_script(unit: str) -> list[str]:
    """argv: the unit's cgroup peaks, its processes' VmHWM, and the GPU samples taken while it started."""
    q = shlex.quote(unit)
    out = shlex.quote(sample_file(unit))
    script = (
        f"cg=$(systemctl show -p ControlGroup --value {q}); "
        'f=/sys/fs/cgroup$cg/memory.peak; [ -r "$f" ] && echo "cgroup-v2 $(cat "$f")"; '
        'f=/sys/fs/cgroup/memory$cg/memory.max_usage_in_bytes; [ -r "$f" ] && echo "cgroup-v1 $(cat "$f")"; '
        "for p in $(cat /sys/fs/cgroup$cg/cgroup.procs /sys/fs/cgroup/unified$cg/cgroup.procs "
        "/sys/fs/cgroup/systemd$cg/cgroup.procs 2>/dev/null | sort -u); do "
        "echo \"pid $p $(awk '/^VmHWM:/{print $2}' /proc/$p/status 2>/dev/null)\"; done; "
        f"cat {out} 2>/dev/null; rm -f {out}; true"
    )
    return ["sh", "-c", script]


@dataclass(frozen=True)
class Measured:
    host_peak_bytes: int | None = None
    host_source: str = ""
    device_peak_bytes: dict[str, int] = field(default_factory=dict)
    device_source: str = ""


def _int(text: str) -> int | None:
    text = text.strip()
    return int(text) if text.isdigit() else None


def parse_measurement(text: str) -> Measured:
    """measure_script's output -> the host's and each device's peak, and where each came from."""
    cgroup: dict[str, int] = {}
    hwm: dict[str, int] = {}
    samples: list[list[tuple[str, str, int]]] = []
    for line in text.splitlines():
        word, _, rest = line.strip().partition(" ")
        if word in ("cgroup-v2", "cgroup-v1") and (n := _int(rest)) is not None:
            cgroup[word] = n
        elif word == "pid":
            pid, _, kb = rest.partition(" ")
            if (k := _int(kb)) is not None:
                hwm[pid] = k * 1024
        elif word == "gpu-sample":
            samples.append([])
        elif samples and line.count(",") == 2:
            pid, uuid, used = (p.strip() for p in line.split(","))
            if (mib := _int(used)) is not None:
                samples[-1].append((pid, uuid, mib * MIB))
    host, source = next(((cgroup[k], k) for k in ("cgroup-v2", "cgroup-v1") if k in cgroup), (None, ""))
    if host is None and hwm:
        host, source = sum(hwm.values()), "vmhwm"
    devices = device_peaks(samples, set(hwm))
    return Measured(host_peak_bytes=host, host_source=SOURCES.get(source, ""), device_peak_bytes=devices,
                    device_source=DEVICE_SOURCE if devices else "")  # fmt: skip


def device_peaks(samples: list[list[tuple[str, str, int]]], pids: set[str]) -> dict[str, int]:
    """Per GPU UUID, the peak over the samples of the unit's processes' memory summed (every process's, when the
    unit's processes are not known)."""
    peaks: dict[str, int] = {}
    for sample in samples:
        per: dict[str, int] = {}
        for pid, uuid, used in sample:
            if not pids or pid in pids:
                per[uuid] = per.get(uuid, 0) + used
        for uuid, used in per.items():
            peaks[uuid] = max(peaks.get(uuid, 0), used)
    return peaks


COUNT_FIELDS = frozenset({"replicas_min", "replicas_max", "idle_minutes", "priority", "labels", "prevent_destroy"})
"""Fields of a deployment that never change what its engine runs: a revision that changes only these keeps the
engine (no restart), and so keeps its measured start-up."""


def same_engine(
    old: Deployment | None, old_model: Model | None, new: Deployment | None, new_model: Model | None
) -> bool:
    """Whether two specifications run the same engine: they differ at most in COUNT_FIELDS, and the model is the
    same."""
    if old is None or new is None or old_model != new_model:
        return False
    return old.model_dump(exclude=set(COUNT_FIELDS)) == new.model_dump(exclude=set(COUNT_FIELDS))
