"""The forced command of the scaler's SSH key on a replica host (authorized_keys: `restrict,command="python3 -I -S
/usr/local/lib/engine-ctl/scaler-command"`). Stdlib only; Python 3.7's grammar and library.

The key can do exactly this, read from SSH_ORIGINAL_COMMAND and nothing else:
- `start UNIT`, `stop UNIT`, `is-active UNIT` where UNIT is one of engine-ctl's replica units installed here
  (engine-ctl-<deployment>-<index><slot>.service, with engine-ctl's header);
- `reset-failed UNIT`, such a unit: systemd's failed state and start limit reset, only when the unit is failed
  (a failed start drove it into the start limit: no later start would run for StartLimitIntervalSec). The scaler
  asks before each start; a unit that is not failed is left as it is (its crash-loop limit still holds);
- `is-active stop-UNIT`, `is-active park-UNIT`: whether a park's job on such a unit still runs (exit 0 while it
  is active or activating, as a oneshot job is);
- `status`: the replica units in use here with the devices each takes, the GPUs with a process (nvidia-smi, when
  present), the cores and memory of the host. Read-only;
- `wake UNIT`: a parked replica's engine woken, the wake calls made on loopback (its guard passes no sleep control
  on). The calls are those apply wrote into the unit (its `# wake:` header line, from the engine's provider, for
  the unit's residency): the caller names the unit and nothing else, so the key can wake that unit and no more.
On a gateway host (the scaler drives every gateway's HAProxy, not only its own), over this host's admin socket:
- `gateway-set BACKEND SERVER ready|drain|maint`: one server of one engine-ctl backend (d_<deployment>, r<index><slot>)
  into service (ready, and its health up: the scaler's health gate passed), to drain, or into maintenance;
- `gateway-stat`: HAProxy's `show stat`, the engine-ctl backends' rows only. Read-only.
Anything else is refused with exit status 126 and a line on stderr; no shell ever sees the command."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request

from engine_ctl.shell.remote.haproxy_admin import haproxy_ask  # shipped: this line becomes haproxy_admin.py

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

UNIT = re.compile(r"^engine-ctl-[a-z0-9](?:[a-z0-9-]*[a-z0-9])?-(?:0|[1-9][0-9]{0,2})[ab]\.service\Z")
UNIT_DIR = "/etc/systemd/system"
HEADER = "# Managed by engine-ctl"
DEVICES = re.compile(r"\b(?:CUDA|ROCR|HIP)_VISIBLE_DEVICES=([A-Za-z0-9,_-]+)")
IN_USE = ("active", "activating", "deactivating", "reloading")
REFUSED = 126
BACKEND = re.compile(r"^d_[a-z0-9](?:[a-z0-9-]{0,38}[a-z0-9])?\Z")
SERVER = re.compile(r"^r(?:0|[1-9][0-9]{0,2})[ab]\Z")
SERVER_STATES = ("ready", "drain", "maint")
ADMIN_SOCKET = "/run/engine-ctl-gateway/admin.sock"
WAKE_LINE = "# wake: "
REPLICA_KEY = "/etc/engine-ctl/replica-key"
CALL_TIMEOUT_S = 600
CHECK_S = 60
METHODS = ("GET", "POST")


def refuse(command: str) -> int:
    sys.stderr.write("engine-ctl scaler key: refused: %r (only start, stop, is-active, reset-failed, wake of a "
                     "replica unit, status, gateway-set of an engine-ctl server, gateway-stat)\n"
                     % command[:200])  # fmt: skip
    return REFUSED


def replica_unit(name: str, unit_dir: str = UNIT_DIR) -> bool:
    """One of engine-ctl's replica units, installed here by engine-ctl (not the gateway's, not the scaler's)."""
    if UNIT.match(name) is None or name in ("engine-ctl-gateway.service", "engine-ctl-scaler.service"):
        return False
    try:
        with open(os.path.join(unit_dir, name)) as f:
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
    return active_state(name) in IN_USE


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


def active_state(name: str) -> str:
    p = subprocess.run(["systemctl", "show", "-p", "ActiveState", "--value", "--", name], stdout=subprocess.PIPE,
                       text=True, check=False)  # fmt: skip
    return p.stdout.strip()


def reset_failed(name: str) -> int:
    """A failed replica unit reset (its failed state and its start limit), so that the next start runs; one that
    is not failed is left alone. Says which on stdout."""
    if active_state(name) != "failed":
        sys.stdout.write("%s is not failed\n" % name)
        return 0
    code = subprocess.run(["systemctl", "reset-failed", "--", name], check=False).returncode
    sys.stdout.write("%s reset (it had failed)\n" % name if code == 0 else "")
    return code


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


def gateway_commands(words: list[str]) -> list[str] | None:
    """The admin-socket commands a gateway verb stands for, or None when it is not one (names checked strictly)."""
    if words == ["gateway-stat"]:
        return ["show stat"]
    if len(words) != 4 or words[0] != "gateway-set" or words[3] not in SERVER_STATES:
        return None
    if BACKEND.match(words[1]) is None or SERVER.match(words[2]) is None:
        return None
    where = "%s/%s" % (words[1], words[2])
    out = ["set server %s state %s" % (where, words[3])]
    return out + (["set server %s health up" % where] if words[3] == "ready" else [])


def engine_ctl_rows(text: str) -> str:
    """`show stat` cut to its header and the engine-ctl backends' rows (d_*): nothing else leaves the host."""
    lines = text.splitlines()
    keep = [ln for ln in lines[1:] if ln.startswith("d_")]
    return "\n".join(lines[:1] + keep) + "\n" if lines and lines[0].startswith("#") else ""


def admin(command: str, path: str = ADMIN_SOCKET, timeout: float = 10) -> str:
    return haproxy_ask(path, command, timeout)


def gateway(commands: list[str]) -> int:
    """Run them on this host's admin socket: `show stat` printed (engine-ctl's rows), a `set` that HAProxy answers
    with anything (an unknown backend or server) fails with exit status 1."""
    try:
        for command in commands:
            said = admin(command)
            if command == "show stat":
                sys.stdout.write(engine_ctl_rows(said))
            elif said.strip():
                sys.stderr.write("%s: %s\n" % (command, said.strip()[:300]))
                return 1
    except OSError as exc:
        sys.stderr.write("the gateway's admin socket: %s\n" % exc)
        return 1
    return 0


# --- wake: a parked replica's engine, on loopback (engine_ctl.core.render.guard) ----------------------------------
def is_path(value: Any) -> bool:
    return isinstance(value, str) and value.startswith("/") and not any(c.isspace() for c in value)


def valid_wake(spec: Any) -> bool:
    """The `# wake:` line's JSON as render wrote it: a port, the calls (method, path, body) and the check."""
    if not isinstance(spec, dict) or not isinstance(spec.get("port"), int) or not 0 < spec["port"] < 65536:
        return False
    calls, check = spec.get("calls"), spec.get("check")
    if not isinstance(calls, list) or not calls:
        return False
    for c in calls:
        if not isinstance(c, dict) or c.get("method") not in METHODS or not is_path(c.get("path")):
            return False
        if c.get("body") is not None and not isinstance(c.get("body"), str):
            return False
    return check is None or (isinstance(check, dict) and is_path(check.get("path")) and
                             isinstance(check.get("key"), str))  # fmt: skip


def wake_spec(name: str, unit_dir: str = UNIT_DIR) -> dict[str, Any] | None:
    """The wake calls apply wrote into the replica's unit header (None: it has no sleep controls)."""
    try:
        with open(os.path.join(unit_dir, name)) as f:
            head = f.read(8192).splitlines()[:8]
    except OSError:
        return None
    for line in head:
        if line.startswith(WAKE_LINE):
            try:
                spec = json.loads(line[len(WAKE_LINE) :])
            except ValueError:
                return None
            return spec if valid_wake(spec) else None
    return None


def read_replica_key(path: str = REPLICA_KEY) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def engine_call(port: int, method: str, path: str, body: str | None, key: str, timeout: float) -> tuple[int, str]:
    """One call to the engine on loopback: its HTTP status (0 when unreachable) and body."""
    headers = {"Authorization": "Bearer " + key} if key else {}
    if body is not None:
        headers["Content-Type"] = "application/json"
    data = body.encode() if body is not None else (b"" if method == "POST" else None)
    request = urllib.request.Request("http://127.0.0.1:%d%s" % (port, path), data=data, method=method,
                                     headers=headers)  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
    except (OSError, ValueError) as exc:
        return 0, str(exc)


def awake(spec: dict[str, Any], key: str) -> bool:
    """The engine's own word that it is awake (its check, where it has one), within CHECK_S."""
    check = spec.get("check")
    deadline = time.monotonic() + CHECK_S
    while check:
        code, text = engine_call(spec["port"], "GET", check["path"], None, key, 10)
        try:
            asleep = json.loads(text).get(check["key"]) if code == 200 else None
        except (ValueError, AttributeError):
            asleep = None
        if asleep is False:
            return True
        if time.monotonic() > deadline:
            sys.stderr.write("GET %s: %s is %r, not false\n" % (check["path"], check["key"], asleep))
            return False
        time.sleep(0.5)
    return True


def wake(name: str, unit_dir: str = UNIT_DIR, key_path: str = REPLICA_KEY) -> int:
    """The unit's wake calls in order on loopback, then its check: 0 once awake, 1 (with why) otherwise."""
    spec = wake_spec(name, unit_dir)
    if spec is None:
        return refuse("wake " + name)
    key = read_replica_key(key_path)
    for c in spec["calls"]:
        code, said = engine_call(spec["port"], c["method"], c["path"], c.get("body"), key, CALL_TIMEOUT_S)
        if not 200 <= code < 300:
            sys.stderr.write("%s %s: HTTP %d %s\n" % (c["method"], c["path"], code, said[:200]))
            return 1
        sys.stdout.write("%s %s: %d\n" % (c["method"], c["path"], code))
    return 0 if awake(spec, key) else 1


def main(command: str | None = None, unit_dir: str = UNIT_DIR) -> int:
    command = os.environ.get("SSH_ORIGINAL_COMMAND", "") if command is None else command
    words = command.split()
    commands = gateway_commands(words)
    if commands is not None:
        return gateway(commands)
    if words == ["status"]:
        sys.stdout.write(json.dumps(status()) + "\n")
        return 0
    if len(words) == 2 and words[0] == "wake" and replica_unit(words[1], unit_dir):
        return wake(words[1], unit_dir)
    if len(words) == 2 and words[0] == "reset-failed" and replica_unit(words[1], unit_dir):
        return reset_failed(words[1])
    if len(words) == 2 and words[0] == "is-active" and operator_job(words[1]):
        return 0 if job_running(words[1]) else 3
    if len(words) != 2 or words[0] not in ("start", "stop", "is-active") or not replica_unit(words[1]):
        return refuse(command)
    verb = ["is-active", "--quiet"] if words[0] == "is-active" else [words[0]]
    return subprocess.run(["systemctl", *verb, "--", words[1]], check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
