"""The forced command of the scaler's SSH key on a replica host (authorized_keys: `restrict,command="python3 -I -S
/usr/local/lib/engine-ctl/scaler-command"`). Stdlib only; Python 3.7's grammar and library.

The key can do exactly this, read from SSH_ORIGINAL_COMMAND and nothing else:
- `start UNIT`, `stop UNIT`, `is-active UNIT` where UNIT is one of engine-ctl's replica units installed here
  (engine-ctl-<deployment>-<index><slot>.service, with engine-ctl's header);
- `is-active stop-UNIT`, `is-active park-UNIT`: whether a park's job on such a unit still runs (exit 0 while it
  is active or activating, as a oneshot job is);
- `status`: the replica units in use here with the devices each takes, the GPUs with a process (nvidia-smi, when
  present), the cores and memory of the host. Read-only.
Anything else is refused with exit status 126 and a line on stderr; no shell ever sees the command."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

UNIT = re.compile(r"^engine-ctl-[a-z0-9](?:[a-z0-9-]*[a-z0-9])?-(?:0|[1-9][0-9]{0,2})[ab]\.service\Z")
UNIT_DIR = "/etc/systemd/system"
HEADER = "# Managed by engine-ctl"
DEVICES = re.compile(r"\b(?:CUDA|ROCR|HIP)_VISIBLE_DEVICES=([A-Za-z0-9,_-]+)")
IN_USE = ("active", "activating", "deactivating", "reloading")
REFUSED = 126


def refuse(command: str) -> int:
    sys.stderr.write("engine-ctl scaler key: refused: %r (only start, stop, is-active of a replica unit, and "
                     "status)\n" % command[:200])  # fmt: skip
    return REFUSED


def replica_unit(name: str) -> bool:
    """One of engine-ctl's replica units, installed here by engine-ctl (not the gateway's, not the scaler's)."""
    if UNIT.match(name) is None or name in ("engine-ctl-gateway.service", "engine-ctl-scaler.service"):
        return False
    try:
        with open(os.path.join(UNIT_DIR, name)) as f:
            return f.read(4096).startswith(HEADER)
    except OSError:
        return False


def operator_job(name: str) -> bool:
    """A park's job on a replica unit (`stop-<unit>`, `park-<unit>`: engine-ctl park's transient unit): the scaler
    asks only whether it still runs, so that a wake on a request never races the park it wakes from."""
    verb, _, unit = name.partition("-")
    return verb in ("stop", "park") and replica_unit(unit)


def job_running(name: str) -> bool:
    """Whether a oneshot job runs: `activating` while it does (is-active says 0 only for `active`)."""
    p = subprocess.run(["systemctl", "show", "-p", "ActiveState", "--value", "--", name], stdout=subprocess.PIPE,
                       text=True, check=False)  # fmt: skip
    return p.stdout.strip() in IN_USE


def unit_devices(name: str) -> list[str]:
    try:
        with open(os.path.join(UNIT_DIR, name)) as f:
            text = f.read()
    except OSError:
        return []
    out: list[str] = []
    for m in DEVICES.finditer(text):
        out += [d for d in m.group(1).split(",") if d]
    return sorted(set(out))


def units_in_use() -> list[dict[str, Any]]:
    p = subprocess.run(["systemctl", "list-units", "--all", "--type=service", "--no-legend", "--plain",
                        "--no-pager", "engine-ctl-*"], stdout=subprocess.PIPE, text=True, check=False)  # fmt: skip
    out = []
    for line in p.stdout.splitlines():
        cols = line.split()
        if len(cols) >= 3 and UNIT.match(cols[0]) and cols[2] in IN_USE:
            out.append({"unit": cols[0], "state": cols[2], "devices": unit_devices(cols[0])})
    return out


def gpus_busy() -> list[str]:
    """GPUs (UUIDs) with a compute process, from nvidia-smi when present."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        p = subprocess.run(["nvidia-smi", "--query-compute-apps=gpu_uuid", "--format=csv,noheader"],
                           stdout=subprocess.PIPE, text=True, timeout=20, check=False)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return []
    return sorted({line.strip() for line in p.stdout.splitlines() if line.strip()})


def memory() -> dict[str, int]:
    out = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("MemTotal", "MemAvailable"):
                    out["mem_total" if key == "MemTotal" else "mem_available"] = int(rest.split()[0]) * 1024
    except OSError:
        pass
    return out


def status() -> dict[str, Any]:
    found: dict[str, Any] = {"active": units_in_use(), "gpu_busy": gpus_busy(), "cores": os.cpu_count() or 0}
    found.update(memory())
    return found


def main(command: str | None = None) -> int:
    command = os.environ.get("SSH_ORIGINAL_COMMAND", "") if command is None else command
    words = command.split()
    if words == ["status"]:
        sys.stdout.write(json.dumps(status()) + "\n")
        return 0
    if len(words) == 2 and words[0] == "is-active" and operator_job(words[1]):
        return 0 if job_running(words[1]) else 3
    if len(words) != 2 or words[0] not in ("start", "stop", "is-active") or not replica_unit(words[1]):
        return refuse(command)
    verb = ["is-active", "--quiet"] if words[0] == "is-active" else [words[0]]
    return subprocess.run(["systemctl", *verb, "--", words[1]], check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
