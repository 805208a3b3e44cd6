"""The facts probe: runs on a host as ONE process (`python3 -I -S - ARGS_JSON`, this file on stdin), stdlib only,
and prints one JSON document. Nothing runs at import: `main()` does the work, so each fact can be imported and
unit-tested locally (tests/test_facts_probe.py, against real recorded output in tests/recordings/).

Each fact is a source (a file, or a tool's argv) and a small parser of that source's real output. GPU tools'
output is shipped raw and parsed locally (engine_ctl.core.fit.hostfacts). A missing tool is a fact (null), never
an error.
Hosts may run an older Python than engine-ctl: this file keeps to Python 3.7's grammar and library."""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import time
from stat import S_ISSOCK

from engine_ctl.shell.remote.haproxy_admin import haproxy_ask  # shipped: this line becomes haproxy_admin.py

TYPE_CHECKING = False  # typing costs import time on every host; mypy still reads the block below
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import IO, Any

    Result = dict[str, Any]  # {"code": exit status or -1, "out": stdout, "err": stderr or why it did not run}
    Started = subprocess.Popen[str] | OSError | None

PROBE_VERSION = 1


# Running tools and reading files ------------------------------------------------------------------------------


def failed(why: str, out: str = "") -> Result:
    return {"code": -1, "out": out, "err": why}


def run(argv: list[str], timeout: float = 10) -> Result:
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return failed(str(exc))
    return {"code": p.returncode, "out": p.stdout, "err": p.stderr}


def start(argv: list[str]) -> Started:
    """Start a command now and collect it later (finish), so the probe's slow tools run side by side."""
    try:
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    except OSError as exc:
        return exc


def finish(proc: Started, timeout: float = 15) -> Result:
    if proc is None:
        return failed("not started")
    if isinstance(proc, OSError):
        return failed(str(proc))
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        return failed("timed out", out)
    return {"code": proc.returncode, "out": out, "err": err}


def read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def first_line(text: str | None) -> str | None:
    lines = (text or "").strip().splitlines()
    return lines[0].strip() if lines else None


# OS, CPU, memory, disk ------------------------------------------------------------------------------------------

OS_RELEASE = "/etc/os-release"
CPUINFO = "/proc/cpuinfo"
MEMINFO = "/proc/meminfo"
CPU_FLAGS = ("avx", "avx2", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_tile", "fma", "f16c", "neon")


def parse_os_release(text: str) -> str | None:
    """os-release(5): KEY=value lines, the value optionally quoted; PRETTY_NAME is the one shown."""
    for line in text.splitlines():
        if line.startswith("PRETTY_NAME="):
            return line.split("=", 1)[1].strip().strip("\"'") or None
    return None


def parse_cpuinfo(text: str) -> tuple[str | None, list[str]]:
    """/proc/cpuinfo: the first processor's `model name` and `flags`, keeping the ISA flags engines care about
    (CPU_FLAGS) in the order the kernel lists them."""
    model: str | None = None
    flags: list[str] = []
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and model is None:
            model = value.strip()
        elif key == "flags" and not flags:
            flags = value.split()
    return model, [f for f in flags if f in CPU_FLAGS]


def cpu_cores() -> int:
    """The CPUs this process may run on (a container's or cgroup's cpuset), not the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def cpu() -> dict[str, Any]:
    model, flags = parse_cpuinfo(read(CPUINFO) or "")
    return {"cores": cpu_cores(), "model": model, "flags": flags}


def parse_meminfo(text: str) -> dict[str, int]:
    """/proc/meminfo: `Key:   N kB` lines; MemAvailable (Linux 3.14+) or MemFree before it, in bytes."""
    info = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        parts = value.split()
        if parts and parts[0].isdigit():
            info[key] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    return {"total": info.get("MemTotal", 0), "available": info.get("MemAvailable", info.get("MemFree", 0))}


def existing_dir(path: str) -> str:
    """`path` itself, or its nearest existing parent: the file system a directory not yet made would be on."""
    probe = path
    while probe and not os.path.isdir(probe):
        probe = os.path.dirname(probe.rstrip("/")) or "/"
    return probe or "/"


def disk(path: str) -> dict[str, Any]:
    """Size and free space (for an unprivileged user, as `df` shows as Avail) of the file system at `path`."""
    exists = os.path.isdir(path)
    try:
        st = os.statvfs(existing_dir(path))
    except OSError:
        return {"path": path, "exists": exists, "total": None, "free": None}
    return {"path": path, "exists": exists, "total": st.f_blocks * st.f_frsize, "free": st.f_bavail * st.f_frsize}


# systemd --------------------------------------------------------------------------------------------------------

UNIT_DIR = "/etc/systemd/system"
UNIT_TEXT_LIMIT = 256 * 1024  # engine_ctl.core.fit.hostfacts.UNIT_TEXT_LIMIT: a unit's text past it is not sent
UNIT_PROPERTIES = (
    "Id", "ActiveState", "SubState", "NRestarts", "MainPID", "ExecMainStatus", "Result", "UnitFileState", "DropInPaths",
    "ExecMainStartTimestampMonotonic", "FragmentPath",
)  # fmt: skip
SYSTEMD_LIBRARY = "libsystemd-shared-"


def systemd_library_dirs() -> list[str]:
    """Where distributions put libsystemd-shared-VERSION.so: /usr/lib/systemd (Fedora, Arch), /lib/systemd,
    and Debian's and Ubuntu's multiarch /usr/lib/ARCH-linux-gnu/systemd."""
    multiarch = getattr(sys.implementation, "_multiarch", None) or os.uname().machine + "-linux-gnu"
    return ["/usr/lib/systemd", "/lib/systemd", "/usr/lib/%s/systemd" % multiarch]


def systemd_version_from_library(names: Iterable[str]) -> str | None:
    """`systemd 252` from a file name `libsystemd-shared-252.so` (systemd's own private library), no process."""
    for name in sorted(names):
        if name.startswith(SYSTEMD_LIBRARY) and name.endswith(".so"):
            version = name[len(SYSTEMD_LIBRARY) : -len(".so")]
            if version[:1].isdigit():
                return "systemd " + version
    return None


def parse_systemctl_version(text: str) -> str | None:
    """`systemctl --version`: its first line, `systemd 252 (252.39-1~deb12u2)`."""
    line = first_line(text)
    return line if line and line.startswith("systemd ") else None


def systemd_version() -> str | None:
    for directory in systemd_library_dirs():
        try:
            found = systemd_version_from_library(os.listdir(directory))
        except OSError:
            continue
        if found:
            return found
    return parse_systemctl_version(run(["systemctl", "--version"])["out"])


HEADER_LINES = 24


def unit_file(data: bytes) -> dict[str, Any]:
    """What a unit file says about itself: its sha256, its text (so a hand edit is shown as a diff; up to
    UNIT_TEXT_LIMIT), its leading comment lines (engine-ctl's header: the deployment, revision, lineage, ...), and
    the sha256 with the content-sha256 value left empty (what that line claims, when nobody edited the file)."""
    import hashlib  # only where there are units: hashlib loads OpenSSL
    import re

    header = []
    for line in data.split(b"\n", HEADER_LINES)[:HEADER_LINES]:
        if not line.startswith(b"#"):
            break
        header.append(line[:512].decode("utf-8", "replace"))
    blank = re.sub(rb"(?m)^# content-sha256: [0-9a-f]{64}$", b"# content-sha256: ", data, count=1)
    return {
        "sha256": hashlib.sha256(data).hexdigest(),
        "header": header,
        "body_sha256": hashlib.sha256(blank).hexdigest(),
        "text": data.decode("utf-8", "replace") if len(data) <= UNIT_TEXT_LIMIT else None,
    }


def unit_files(prefix: str, unit_dir: str = UNIT_DIR) -> dict[str, dict[str, Any]]:
    """engine-ctl's unit files (`prefix*.service` in `unit_dir`) -> what each says about itself (unit_file)."""
    try:
        names = sorted(n for n in os.listdir(unit_dir) if n.startswith(prefix) and n.endswith(".service"))
    except OSError:
        return {}
    found = {}
    for name in names:
        try:
            with open(os.path.join(unit_dir, name), "rb") as f:
                found[name] = unit_file(f.read())
                st = os.fstat(f.fileno())
        except OSError:
            continue
        # when its file last changed, content or inode (a copy back with `cp -p` keeps the mtime, not the ctime)
        found[name]["file_changed_at"] = round(max(st.st_mtime, st.st_ctime), 3)
    return found


def systemctl_show_argv(names: Iterable[str]) -> list[str]:
    return ["systemctl", "show", "-p", ",".join(UNIT_PROPERTIES), "--no-pager", *names]


def parse_systemctl_show(text: str) -> list[dict[str, str]]:
    """`systemctl show -p P1,P2 UNIT...`: one block of `Key=value` lines per unit, blocks split by a blank line,
    each block's keys in systemd's own order; a value may itself hold `=`."""
    out = []
    for block in text.strip().split("\n\n"):
        fields = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        if fields.get("Id"):
            out.append(fields)
    return out


EXITS_DIR = "/run/engine-ctl/exits"  # engine_ctl.core.render.units.EXITS_DIR: a replica's exits other than a stop


def exits(unit: str, limit: int = 20) -> list[str]:
    """The unit's last exits that were not a stop (its ExecStopPost writes `epoch result code status`)."""
    text = read(os.path.join(EXITS_DIR, unit)) or ""
    return [line for line in text.splitlines() if line.strip()][-limit:]


def process_state(pid: str) -> str | None:
    """The state letter /proc/PID/stat gives a unit's main process (R, S, D, T: stopped by a signal, ...), None
    without one; the field after the command's name, which is in parentheses and may hold spaces."""
    if not pid.isdigit() or pid == "0":
        return None
    text = read("/proc/%s/stat" % pid) or ""
    rest = text.rpartition(")")[2].split()
    return rest[0] if rest else None


def process_launch(pid: str) -> dict[str, Any]:
    """What a unit's main process was started with: its command line (/proc/PID/cmdline) and the names of its
    environment's variables (/proc/PID/environ; never a value: a key may be one). Left out where not readable."""
    out: dict[str, Any] = {}
    if not pid.isdigit() or pid == "0":
        return out
    for name, key in (("cmdline", "proc_argv"), ("environ", "proc_env")):
        try:
            with open("/proc/%s/%s" % (pid, name), "rb") as f:
                raw = f.read().split(b"\0")
        except OSError:
            continue
        words = [w.decode("utf-8", "replace") for w in raw if w]
        out[key] = words if key == "proc_argv" else sorted({w.partition("=")[0] for w in words})
    with contextlib.suppress(OSError):
        out["proc_exe"] = os.readlink("/proc/%s/exe" % pid)
    return out


TRANSIENT_DIR = "/run/systemd/transient"


def units(prefix: str, unit_dir: str = UNIT_DIR) -> list[dict[str, Any]]:
    """engine-ctl's units: systemd's view of each (UNIT_PROPERTIES) and what its file says (unit_file); a file
    systemd does not report is listed with its file's facts alone."""
    files = unit_files(prefix, unit_dir)
    if not files:
        return []
    shown = parse_systemctl_show(run(systemctl_show_argv(files))["out"])
    out: list[dict[str, Any]] = [dict(fields, **files.get(fields["Id"], {})) for fields in shown]
    wall_at_zero = time.time() - time.monotonic()  # systemd's monotonic timestamps are CLOCK_MONOTONIC's
    for u in out:
        u["exits"] = exits(u["Id"])
        u["process_state"] = process_state(u.get("MainPID", ""))
        # a stop verb's detached job (systemd-run --collect: its transient file goes once it is done)
        u["stop_job"] = os.path.exists(TRANSIENT_DIR + "/stop-" + str(u["Id"]))
        u.update(process_launch(u.get("MainPID", "")))
        started = u.get("ExecMainStartTimestampMonotonic", "")
        if started.isdigit() and int(started) > 0:
            u["started_at"] = round(wall_at_zero + int(started) / 1e6, 3)
    seen = {u["Id"] for u in out}
    return out + [dict(files[n], Id=n) for n in files if n not in seen]


# Listening ports ------------------------------------------------------------------------------------------------

PROC_NET_TCP = ("/proc/net/tcp", "/proc/net/tcp6")
TCP_LISTEN = "0A"  # the kernel's TCP_LISTEN state, as /proc/net/tcp prints it (hex)


def parse_proc_net_tcp(text: str) -> set[int]:
    """/proc/net/tcp{,6}: a header, then one socket a line, `local_address` as HEXIP:HEXPORT and `st` the state;
    the ports of sockets in LISTEN (what `ss -ltn` lists, without running ss)."""
    ports = set()
    for line in text.splitlines()[1:]:
        parts = line.split()
        if len(parts) > 3 and parts[3] == TCP_LISTEN:
            ports.add(int(parts[1].rsplit(":", 1)[1], 16))
    return ports


def listening_ports() -> list[int]:
    ports: set[int] = set()
    for path in PROC_NET_TCP:
        ports |= parse_proc_net_tcp(read(path) or "")
    return sorted(ports)


def listening_inodes(port: int, texts: Iterable[str] | None = None) -> set[str]:
    """The socket inodes listening on `port` (/proc/net/tcp{,6}: `inode` is the tenth column)."""
    out = set()
    for text in texts if texts is not None else (read(p) or "" for p in PROC_NET_TCP):
        for line in text.splitlines()[1:]:
            parts = line.split()
            if len(parts) > 9 and parts[3] == TCP_LISTEN and int(parts[1].rsplit(":", 1)[1], 16) == port:
                out.add(parts[9])
    return out


def owns_port(pid: str | None, port: int) -> bool:
    """Whether the process `pid` (a unit's MainPID) or a child of it holds the socket listening on `port`: only then
    is the internal key sent there (any local user may bind a replica's port while its engine does not run)."""
    if not pid or pid == "0":
        return False
    wanted = {"socket:[%s]" % inode for inode in listening_inodes(port)}
    pids = [pid]
    try:
        for task in os.listdir("/proc/%s/task" % pid):
            pids += (read("/proc/%s/task/%s/children" % (pid, task)) or "").split()
    except OSError:
        return False
    for p in pids:
        try:
            for fd in os.listdir("/proc/%s/fd" % p):
                if os.readlink("/proc/%s/fd/%s" % (p, fd)) in wanted:
                    return True
        except OSError:
            continue
    return False


NOT_ITS_UNIT = "down: its port is not held by its unit's process (the key is not sent)"
"""A key-bearing check's answer when the process listening on the replica's port is not its unit's."""


# GPUs: raw output, parsed locally by engine_ctl.core.fit.hostfacts (tests/recordings/ has real output of each) ---

NVIDIA_SMI_QUERY = "index,uuid,name,memory.total,memory.used,driver_version"


def gpu_commands(which: Callable[[str], str | None] = shutil.which, system: str = "") -> dict[str, list[str]]:
    """The GPU tools found on PATH -> the argv whose output engine_ctl.core.fit.hostfacts parses, keyed as the probe
    reports it. amd-smi (ROCm 6+) is preferred; rocm-smi only where amd-smi is missing. On macOS (`system` is
    uname's Darwin) the Metal GPUs: system_profiler's SPDisplaysDataType as JSON, and the machine's memory (Apple
    silicon's GPU shares it)."""
    commands = {}
    profiler, sysctl = which("system_profiler"), which("sysctl")
    if system == "Darwin" and profiler:
        commands["system_profiler"] = [profiler, "SPDisplaysDataType", "-json"]
        if sysctl:
            commands["hw_memsize"] = [sysctl, "-n", "hw.memsize"]
    smi = which("nvidia-smi")
    if smi:
        commands["nvidia_smi"] = [smi, "--query-gpu=" + NVIDIA_SMI_QUERY, "--format=csv,noheader,nounits"]
    amd, rocm = which("amd-smi"), which("rocm-smi")
    if amd:
        commands["amd_smi_static"] = [amd, "static", "--asic", "--vram", "--driver", "--json"]
        commands["amd_smi_metric"] = [amd, "metric", "--mem-usage", "--json"]
    elif rocm:
        commands["rocm_smi"] = [rocm, "--showuniqueid", "--showproductname", "--showmeminfo", "vram"]
        commands["rocm_smi"] += ["--showdriverversion", "--json"]
    return commands


# Engines and HAProxy --------------------------------------------------------------------------------------------

# What importlib.metadata.version(NAME) finds, without importing importlib.metadata (which costs that interpreter
# ~40 ms of imports and a scan of every distribution, on every host, on every run): the first `NAME-VERSION.dist-info`
# (or .egg-info) on the interpreter's own sys.path, names compared as PEP 503 normalises them, and its METADATA's
# (PKG-INFO's) `Version:` header. Prints nothing when the distribution is not installed.
PYTHON_DIST_CODE = r"""
import os, re, sys
def norm(n): return re.sub(r"[-_.]+", "-", n).lower()
want = norm(sys.argv[1])
for d in sys.path:
    try:
        names = sorted(os.listdir(d or "."))
    except OSError:
        continue
    for e in names:
        stem, _, ext = e.rpartition(".")
        if ext in ("dist-info", "egg-info") and norm(stem.split("-")[0]) == want:
            p = os.path.join(d or ".", e)
            p = os.path.join(p, "METADATA" if ext == "dist-info" else "PKG-INFO") if os.path.isdir(p) else p
            try:
                with open(p, encoding="utf-8", errors="replace") as f:
                    for line in f:
                        if line.startswith("Version:"):
                            print(line.split(":", 1)[1].strip()); sys.exit(0)
                        if not line.strip():
                            break
            except OSError:
                pass
"""
VERSION_LIMIT = 400


def find_executable(candidates: Iterable[str], which: Callable[[str], str | None] = shutil.which) -> str | None:
    """The first candidate that is an executable file: an absolute path as given, a bare name on PATH."""
    for candidate in candidates:
        resolved = candidate if "/" in candidate else which(candidate)
        if resolved and os.path.isfile(resolved) and os.access(resolved, os.X_OK):
            return resolved
    return None


def parse_shebang(line: str) -> str | None:
    """`#!/opt/engine/bin/python3 -s` -> the interpreter of a console script (pip writes one such line)."""
    if not line.startswith("#!"):
        return None
    words = line[2:].split()
    return words[0] if words else None


def script_interpreter(path: str) -> str:
    """The Python that runs a console script (where its packages are), or `path` itself when it is not one."""
    try:
        with open(path, "rb") as f:
            line = f.readline(4096).decode("utf-8", "replace")
    except OSError:
        return path
    return parse_shebang(line) or path


def version_argv(path: str, probe: dict[str, Any], name: str) -> list[str] | None:
    """The command that prints an engine's version, from its provider's probe: `argv` runs the binary with
    `args`; `python_dist` asks the script's own Python for the installed distribution's version."""
    if probe.get("kind") == "argv":
        return [path, *probe.get("args", [])]
    if probe.get("kind") == "python_dist":
        return [script_interpreter(path), "-c", PYTHON_DIST_CODE, probe.get("dist", name)]
    return None


def parse_version_output(kind: str | None, result: Result) -> str | None:
    """What a version probe printed: a binary's whole output (llama-server prints to stderr), a Python
    distribution's version (stdout; None when the package is not installed)."""
    text = (result["out"] + result["err"]).strip() if kind == "argv" else result["out"].strip()
    return text[:VERSION_LIMIT] or None


def file_stat(path: str) -> list[int]:
    """What says a binary is unchanged: mtime and size, and ctime and inode (which no one can set back: a file
    replaced, rewritten or touched has new ones), so a cached version or digest is never one of another file."""
    st = os.stat(path)
    return [st.st_mtime_ns, st.st_size, st.st_ctime_ns, st.st_ino]


def environment_stat(path: str) -> list[int]:
    """The mtimes of the site-packages of the environment an engine's launcher is in (`<env>/bin/<script>`,
    `<env>/bin/python3` -> `<env>/lib/python*/site-packages` or `dist-packages`): a `pip install` of another
    release into it renames the NAME-VERSION.dist-info there, while the launcher's own bytes, which file_stat
    sees, stay the same."""
    import glob

    env = os.path.dirname(os.path.dirname(os.path.abspath(path)))
    out = []
    sites = glob.glob(os.path.join(env, "lib", "python*", "site-packages"))
    sites += glob.glob(os.path.join(env, "lib", "python*", "dist-packages"))  # Debian's, under /usr/local
    for site in sorted(sites):
        try:
            out.append(os.stat(site).st_mtime_ns)
        except OSError:
            continue
    return out


def known_entry(known: dict[str, Any], path: str, stat: list[int]) -> dict[str, Any] | None:
    """What engine-ctl last read of this binary (gather.VersionCache: path -> {stat, version, sha256}), when it is
    still the same file."""
    seen = known.get(path)
    return seen if isinstance(seen, dict) and seen.get("stat") == stat else None


def engines(spec: dict[str, Any], known: dict[str, Any]) -> dict[str, tuple[str, Any, str | None, list[int]]]:
    """Find each engine and start its version probe, unless the binary is unchanged since engine-ctl last read
    its version (`known`, see known_entry); returns {name: (path, probe or version, kind, stat)}."""
    started: dict[str, tuple[str, Any, str | None, list[int]]] = {}
    for name, entry in spec.items():
        path = find_executable(entry.get("candidates", []))
        if path is None:
            continue
        probe = entry.get("probe") or {}
        stat = file_stat(path)
        if probe.get("kind") == "python_dist":
            stat += environment_stat(path)
        seen = known_entry(known, path, stat)
        if seen is not None:
            started[name] = (path, seen.get("version"), "known", stat)
            continue
        if probe.get("kind") == "python_dist" and is_own_python(script_interpreter(path)):
            version = dist_version(probe.get("dist", name), own_site_dirs())  # no second Python to start
            if version is not None:
                started[name] = (path, version, "known", stat)
            continue
        argv = version_argv(path, probe, name)
        started[name] = (path, start(argv) if argv else None, probe.get("kind"), stat)
    return started


def normalized_dist(name: str) -> str:
    """A distribution's name as PEP 503 compares them: runs of - _ . are one -, lower case."""
    import re

    return re.sub(r"[-_.]+", "-", name).lower()


def dist_version(name: str, dirs: Iterable[str]) -> str | None:
    """What PYTHON_DIST_CODE prints, in this process, for the directories of an interpreter's sys.path: the
    `Version:` of the first NAME-VERSION.dist-info (or .egg-info) found, or None."""
    want = normalized_dist(name)
    for d in dirs:
        try:
            names = sorted(os.listdir(d or "."))
        except OSError:
            continue
        for e in names:
            stem, _, ext = e.rpartition(".")
            if ext in ("dist-info", "egg-info") and normalized_dist(stem.split("-")[0]) == want:
                p = os.path.join(d or ".", e)
                p = os.path.join(p, "METADATA" if ext == "dist-info" else "PKG-INFO") if os.path.isdir(p) else p
                for line in (read(p) or "").splitlines():
                    if line.startswith("Version:"):
                        return line.split(":", 1)[1].strip()
                    if not line.strip():
                        break
    return None


def venv_root(interpreter: str) -> str | None:
    """The virtual environment an interpreter's path belongs to, found as site.py finds it: a pyvenv.cfg in the
    path's directory or the one above, before symlinks are followed (a venv's python is a link to its base's)."""
    exe_dir = os.path.dirname(os.path.abspath(interpreter))
    return next((d for d in (exe_dir, os.path.dirname(exe_dir)) if os.path.isfile(os.path.join(d, "pyvenv.cfg"))), None)


def is_own_python(interpreter: str) -> bool:
    """Whether `interpreter` is the Python running this probe (the host's python3, where pip-installed engines
    live): the same binary in the same environment. A virtual environment's python (an engine pip-installed into
    /opt/engine/bin) links to the host's python3 but finds its own packages: it is not this one."""
    try:
        same = os.path.realpath(interpreter) == os.path.realpath(sys.executable)
    except OSError:
        return False
    return same and venv_root(interpreter) == venv_root(sys.executable)


def own_site_dirs() -> list[str]:
    """Where this Python, started normally, finds installed distributions (what site.main would add; the probe
    runs with -I -S, so sys.path has none of them): the user's site-packages, then the system's (Debian's
    dist-packages included); in a virtual environment its own, and the system's only if its pyvenv.cfg says
    include-system-site-packages = true (and then no user site, as site.py decides)."""
    import site

    venv = venv_root(sys.executable)  # a venv is found as site.venv finds it (under -S it never ran)
    if venv is None:
        user = site.getusersitepackages()
        return [*([user] if isinstance(user, str) else []), *site.getsitepackages()]
    cfg = read(os.path.join(venv, "pyvenv.cfg")) or ""
    system = any(
        line.split("=", 1)[0].strip().lower() == "include-system-site-packages"
        and line.split("=", 1)[1].strip().lower() == "true"
        for line in cfg.splitlines()
        if "=" in line
    )
    return site.getsitepackages([venv]) + (site.getsitepackages([sys.base_prefix]) if system else [])


def engine_versions(started: dict[str, tuple[str, Any, str | None, list[int]]]) -> dict[str, dict[str, Any]]:
    found = {}
    for name, (path, proc, kind, stat) in started.items():
        version = None
        if kind == "known":
            version = proc
        elif proc is not None:
            version = parse_version_output(kind, finish(proc))
            if kind == "python_dist" and version is None:
                continue  # the interpreter is there, the engine's package is not
        found[name] = {"path": path, "version": (version or "")[:VERSION_LIMIT] or None, "stat": stat}
    return found


def file_sha256(path: str) -> str | None:
    import hashlib

    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    except OSError:
        return None
    return h.hexdigest()


def with_sha256(found: dict[str, dict[str, Any]], known: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each engine found, with the sha256 of its binary: what runs, whatever its version says. Read again only
    when the binary changed since engine-ctl last hashed it (`known`, see known_entry): a 500 MB engine is not
    hashed on every facts and plan."""
    for entry in found.values():
        seen = known_entry(known, entry["path"], entry["stat"])
        entry["sha256"] = seen.get("sha256") if seen and seen.get("sha256") else file_sha256(entry["path"])
    return found


def parse_haproxy_version(text: str) -> str | None:
    """`haproxy -v`: its first line, `HAProxy version 2.6.12-1+deb12u4 2026/10/17 - https://haproxy.org/`."""
    return first_line(text)


# Model files ----------------------------------------------------------------------------------------------------

MODEL_FILE_SUFFIXES = (".gguf", ".safetensors")
MODEL_FILE_NAMES = ("config.json", "model.safetensors.index.json")


def model_files(root: str, limit: int = 5000, depth: int = 5) -> list[dict[str, Any]]:
    """GGUF files and checkpoint files under `root`, at most `depth` directories down and `limit` files."""
    files: list[dict[str, Any]] = []
    if not os.path.isdir(root):
        return files
    base_depth = root.rstrip("/").count("/")
    for dirpath, dirnames, filenames in os.walk(root):
        if dirpath.count("/") - base_depth >= depth:
            dirnames[:] = []
        for name in filenames:
            if name.endswith(MODEL_FILE_SUFFIXES) or name in MODEL_FILE_NAMES:
                full = os.path.join(dirpath, name)
                try:
                    files.append({"path": full, "size": os.path.getsize(full)})
                except OSError:
                    continue
                if len(files) >= limit:
                    return files
    return files


# GGUF value types (ggml's gguf.h): 0 u8, 1 i8, 2 u16, 3 i16, 4 u32, 5 i32, 6 f32, 7 bool, 8 string, 9 array,
# 10 u64, 11 i64, 12 f64
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
GGUF_STRING, GGUF_ARRAY = 8, 9
GGUF_VERSIONS = (1, 2, 3)
ARRAY_LIMIT = 4096


class Reader:
    """Little-endian GGUF values from a binary file, skipping (not building) arrays nobody keeps."""

    def __init__(self, f: IO[bytes]) -> None:
        self.f = f

    def take(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        data = self.f.read(size)
        if len(data) != size:
            raise ValueError("truncated GGUF file")
        return struct.unpack(fmt, data)[0]

    def string(self) -> str:
        n = self.take("<Q")
        if n > 1 << 24:
            raise ValueError("implausible string length")
        data = self.f.read(n)
        if len(data) != n:
            raise ValueError("truncated GGUF file")
        return data.decode("utf-8", "replace")

    def value(self, vtype: int, keep: bool) -> Any:
        if vtype in SCALARS:
            return self.take(SCALARS[vtype])
        if vtype == GGUF_STRING:
            return self.string()
        if vtype == GGUF_ARRAY:
            return self.array(keep)
        raise ValueError("unknown GGUF value type %d" % vtype)

    def array(self, keep: bool) -> list[Any] | None:
        item_type = self.take("<I")
        count = self.take("<Q")
        if keep:
            return [self.value(item_type, True) for _ in range(min(count, ARRAY_LIMIT))]
        if item_type in SCALARS:  # the tokenizer's large arrays: seek past them
            self.f.seek(count * struct.calcsize(SCALARS[item_type]), 1)
        else:
            for _ in range(count):
                self.value(item_type, False)
        return None


def read_gguf(f: IO[bytes], size: int) -> dict[str, Any]:
    """A GGUF file's header (ggml's docs/gguf.md): magic, version, tensor count, key/value metadata (tokenizer.*
    arrays skipped), tensor infos; the tensor data starts at the next `general.alignment` boundary after them."""
    r = Reader(f)
    if f.read(4) != b"GGUF":
        return {"error": "not a GGUF file (bad magic)"}
    version = r.take("<I")
    if version not in GGUF_VERSIONS:
        raise ValueError("unknown GGUF version %d" % version)
    n_tensors = r.take("<Q")
    n_kv = r.take("<Q")
    fields = {}
    for _ in range(n_kv):
        key = r.string()
        vtype = r.take("<I")
        keep = not key.startswith("tokenizer.")
        value = r.value(vtype, keep)
        if keep:
            fields[key] = value
    needed = 0
    for _ in range(n_tensors):
        r.string()
        n_dims = r.take("<I")
        dims = [r.take("<Q") for _ in range(n_dims)] if n_dims <= 8 else None
        if dims is None:
            raise ValueError("implausible tensor dimensions (%d)" % n_dims)
        ggml_type, at = r.take("<I"), r.take("<Q")
        needed = max(needed, at + tensor_bytes(ggml_type, dims))
    alignment = int(fields.get("general.alignment", 32))
    offset = f.tell()
    offset += (alignment - offset % alignment) % alignment
    if n_tensors and offset + needed > size:
        raise ValueError("truncated: its tensors need %d bytes, the file has %d" % (offset + needed, size))
    data = size - offset if n_tensors else 0  # a vocabulary-only file has no data (and no padding after it)
    return {"format": "gguf", "version": version, "fields": fields, "size": size, "data_bytes": max(data, 0)}


GGML_TYPES = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34), 9: (32, 36),
              10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210), 15: (256, 292),
              24: (1, 1), 25: (1, 2), 26: (1, 4), 27: (1, 8), 28: (1, 8), 30: (1, 2)}  # fmt: skip
"""ggml type -> (elements per block, bytes per block), from ggml's type traits (F32, F16, Q4_0 … Q8_1, the K
quants, I8 … I64, F64, BF16). A type not listed counts as 0 bytes: only its offset is checked."""


def tensor_bytes(ggml_type: int, dims: list[int]) -> int:
    """The bytes of one tensor's data (0 for a type not in GGML_TYPES)."""
    block, nbytes = GGML_TYPES.get(ggml_type, (1, 0))
    n = 1
    for d in dims:
        n *= d
    return (n // block) * nbytes


def gguf(path: str) -> dict[str, Any]:
    """read_gguf, with a header that cannot be read said as an invalid GGUF file (and why)."""
    with open(path, "rb") as f:
        try:
            return read_gguf(f, os.fstat(f.fileno()).st_size)
        except (ValueError, struct.error, UnicodeDecodeError, OverflowError) as exc:
            return {"error": "not a valid GGUF file (%s)" % exc}


def checkpoint(path: str) -> dict[str, Any]:
    """A Hugging Face checkpoint directory: config.json, and the weights' size from the safetensors index's
    `metadata.total_size` or else the sum of the .safetensors files."""
    out: dict[str, Any] = {"format": "safetensors"}
    with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
        out["config"] = json.load(f)
    index = os.path.join(path, "model.safetensors.index.json")
    total = None
    if os.path.exists(index):
        with open(index, encoding="utf-8") as f:
            total = (json.load(f).get("metadata") or {}).get("total_size")
    if total is None:
        total = sum(os.path.getsize(os.path.join(path, n)) for n in os.listdir(path) if n.endswith(".safetensors"))
    out["data_bytes"] = total
    return out


def model_metadata(path: str) -> dict[str, Any]:
    """What the files at `path` say (a GGUF file, or a checkpoint directory), or why they cannot be read."""
    try:
        if os.path.isdir(path):
            return checkpoint(path)
        if os.path.isfile(path):
            return gguf(path)
        return {"missing": True}
    except (OSError, ValueError, struct.error) as exc:
        return {"error": str(exc)}


MARKER = ".engine-ctl-checkpoint.json"


COMMIT_CHARS = frozenset("0123456789abcdef")


def checkouts(models_dir: str, limit: int = 1000) -> list[dict[str, Any]]:
    """The whole hf: checkouts engine-ctl fetched, <models_dir>/sources/<org>/<repo>/<commit> with the fetch's
    marker: each with its bytes and the bytes deleting it would free (files no other checkout links to: a file a
    newer commit linked from it stays there). A download still under way (<commit>.partial) is not one."""
    found: list[dict[str, Any]] = []
    sources = os.path.join(models_dir, "sources")
    try:
        orgs = sorted(os.listdir(sources))
    except OSError:
        return found
    for org in orgs:
        try:
            repos = sorted(os.listdir(os.path.join(sources, org)))
        except OSError:
            continue
        for repo in repos:
            try:
                commits = sorted(os.listdir(os.path.join(sources, org, repo)))
            except OSError:
                continue
            for commit in commits:
                root = os.path.join(sources, org, repo, commit)
                if (
                    len(commit) != 40
                    or not set(commit) <= COMMIT_CHARS
                    or not os.path.isfile(os.path.join(root, MARKER))
                ):
                    continue
                size = freed = 0
                for dirpath, _dirs, files in os.walk(root):
                    for name in files:
                        try:
                            st = os.lstat(os.path.join(dirpath, name))
                        except OSError:
                            continue
                        size += st.st_size
                        freed += st.st_size if st.st_nlink == 1 else 0
                found.append({"path": root, "repo": org + "/" + repo, "commit": commit, "bytes": size, "freed": freed})
                if len(found) >= limit:
                    return found
    return found


def checkpoint_digest(path: str) -> dict[str, Any] | None:
    """The checkpoint digest of an hf: checkout engine-ctl fetched (the marker beside its files), measured now:
    a file whose size or mtime differs from what the fetch recorded is hashed again. None for other models."""
    import hashlib

    root = path if os.path.isdir(path) else os.path.dirname(path)
    marker = os.path.join(root, MARKER)
    if not os.path.isfile(marker):
        return None
    try:
        with open(marker) as f:
            recorded = json.load(f)
        digests = {}
        for name, entry in recorded["files"].items():
            full = os.path.join(root, name)
            if not os.path.isfile(full):
                digests[name] = "missing"
                continue
            st = os.stat(full)
            same = (st.st_size, st.st_mtime_ns) == (entry["size"], entry["mtime_ns"])
            if same and entry.get("ino", st.st_ino) == st.st_ino:  # another file renamed over it: a new inode
                digests[name] = entry["sha256"]
                continue
            digests[name] = file_sha256(full) or "missing"
        text = "".join("%s  %s\n" % (digests[p], p) for p in sorted(digests))
        return {"dir": root, "digest": hashlib.sha256(text.encode()).hexdigest()}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return {"dir": root, "error": str(exc)}


def writable_by_others(path: str) -> str | None:
    """The first of the model's directory and its files that other users may write (seed 003: refused)."""
    import stat

    root = path if os.path.isdir(path) else os.path.dirname(path)
    names = [root, path] if root != path else [root] + [os.path.join(root, n) for n in sorted(os.listdir(root))]
    for name in names:
        try:
            st = os.stat(name)
        except OSError:
            continue
        if st.st_mode & stat.S_IWOTH and not (stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX):
            return name
    return None


def newest_mtime(path: str, limit: int = 5000) -> float | None:
    """When the weights at `path` were last written: the file's last change, or the newest of a checkpoint
    directory's files (its top level, dot-files left out); None for a time ahead of this host's clock (a file
    server's skewed clock, never a change seen after a start). A change is the later of the mtime and the inode's
    ctime: a copy that keeps the old mtime (`cp -p`, `rsync -a`, `touch -d`) still moves the ctime, which no
    program sets back."""
    try:
        if os.path.isdir(path):
            entries = itertools.islice(os.scandir(path), limit)  # a dot-file (engine-ctl's marker) is no weight
            stats = [e.stat() for e in entries if e.is_file() and not e.name.startswith(".")]
            newest = max(max(st.st_mtime, st.st_ctime) for st in stats) if stats else None
        else:
            st = os.stat(path)
            newest = max(st.st_mtime, st.st_ctime)
    except OSError:
        return None
    return round(newest, 3) if newest is not None and newest <= time.time() else None


def model_entry(path: str) -> dict[str, Any]:
    """model_metadata, with the checkpoint digest of a fetched hf: checkout, a path others may write and when the
    weights were last written."""
    out = model_metadata(path)
    if not out.get("missing"):
        out["mtime"] = newest_mtime(path)
    found = checkpoint_digest(path) if not out.get("missing") else None
    if found is not None:
        out["checkpoint"] = found
    if not out.get("missing") and not out.get("error"):
        loose = writable_by_others(path)
        if loose:
            out["writable"] = loose
    return out


# Engine health --------------------------------------------------------------------------------------------------

HEALTH_TIMEOUT = 3.0
HEAD_LIMIT = 65536


def http_request(port: int, path: str, address: str = "127.0.0.1", key: str | None = None) -> bytes:
    auth = "Authorization: Bearer %s\r\n" % key if key else ""
    return ("GET %s HTTP/1.0\r\nHost: %s:%d\r\n%sConnection: close\r\n\r\n" % (path, address, port, auth)).encode(
        "ascii"
    )


def parse_status_line(head: bytes) -> str:
    """An HTTP response's status line, `HTTP/1.1 503 Service Unavailable` -> `503`; anything else is down."""
    line = head.split(b"\r\n", 1)[0].decode("latin-1")
    parts = line.split()
    if len(parts) >= 2 and parts[0].startswith("HTTP/") and parts[1].isdigit():
        return parts[1]
    return "down: not an HTTP response: %r" % line[:80]


def http_status(
    port: int, path: str, timeout: float = HEALTH_TIMEOUT, address: str = "127.0.0.1", key: str | None = None
) -> str:
    """GET http://ADDRESS:PORT/PATH over a plain socket (urllib costs ~30 ms of imports): the HTTP status, or
    `down: why` (`[Errno 111] Connection refused`, `timed out`). Engines bind the host's inventory address."""
    import socket

    head = b""
    try:
        with socket.create_connection((address, port), timeout=timeout) as s:
            s.sendall(http_request(port, path, address, key))
            while b"\r\n" not in head and len(head) < HEAD_LIMIT:
                chunk = s.recv(4096)
                if not chunk:
                    break
                head += chunk
    except (OSError, ValueError) as exc:
        return "down: " + str(exc)
    return parse_status_line(head)


def health(checks: list[dict[str, Any]], address: str = "127.0.0.1") -> dict[str, str]:
    """GET each engine's health endpoint at the address engines bind: port -> the HTTP status, or why not."""
    return {str(c["port"]): http_status(int(c["port"]), str(c["path"]), address=address) for c in checks}


# The internal key (engine_ctl.core.plan.internalkey): fingerprints, never the key -----------------------------------

FINGERPRINT_CONTEXT = b"engine-ctl internal key fingerprint\0"


def key_fingerprint(key: str) -> str:
    """engine_ctl.core.plan.internalkey.key_fingerprint (the probe imports nothing of engine-ctl's)."""
    return hashlib.sha256(FINGERPRINT_CONTEXT + key.encode()).hexdigest()[:16]


def is_key(word: str) -> bool:
    return len(word) == 64 and all(c in "0123456789abcdef" for c in word)


def keys_in(text: str) -> list[str]:
    """The keys in one of the internal key's forms (a key a line, `NAME=<key>`, `name: <key>`), in
    order: 64 lowercase hex digits each; anything else in the file is no key."""
    found = []
    for line in text.splitlines():
        for word in line.replace("=", " ").replace(":", " ").replace('"', " ").replace("'", " ").split():
            if is_key(word):
                found.append(word)
    return found


def sent_key(text: str) -> str | None:
    """The key a gateway sends, from its key map (`gateway <key>`, `next <key>`) or the older forms
    (engine_ctl.core.render.gateway.parse_gateway_key)."""
    for line in text.splitlines():
        name, _, value = line.strip().replace("=", " ", 1).partition(" ")
        value = value.strip() if value else name
        if is_key(value) and name != "next":
            return value
    return None


def read_secret(path: str) -> str | None:
    """A root-only file's text; None where there is none; raises PermissionError where this user may not read it."""
    try:
        with open(path) as f:
            return f.read(65536)
    except FileNotFoundError:
        return None


def loose_secrets(paths: Iterable[str], owned: Iterable[str] = ()) -> dict[str, str]:
    """path -> its mode and owner, for each file holding the internal key that others may read or write (group or
    other bits), or that is not root's (`owned` files are their folder owner's: only their mode counts). Files
    that are not there are left out."""
    import stat

    out = {}
    owned = set(owned)
    for path in paths:
        try:
            st = os.lstat(path)
        except OSError:
            continue
        loose = (
            stat.S_IMODE(st.st_mode) & 0o077 or (path not in owned and st.st_uid != 0) or not stat.S_ISREG(st.st_mode)
        )
        if loose:
            out[path] = "mode %04o, owner uid %d%s" % (
                stat.S_IMODE(st.st_mode),
                st.st_uid,
                "" if stat.S_ISREG(st.st_mode) else ", not a plain file",
            )
    return out


def replica_keys(paths: Iterable[str]) -> dict[str, list[str] | None]:
    """path -> the fingerprints of the keys in each form of the internal key on this host (None: no such file); a
    file this user may not read is left out."""
    out: dict[str, list[str] | None] = {}
    for path in paths:
        try:
            text = read_secret(path)
        except OSError:
            continue
        out[path] = None if text is None else [key_fingerprint(k) for k in keys_in(text)]
    return out


def member_links(links: list[dict[str, Any]], timeout: float = 2.0) -> dict[str, str]:
    """A replica group's worker unit -> whether a TCP connection from this host (its head's) to its port opens:
    "ok", else why not (a route cut, a firewall: the head's requests would wait on it). Opened and closed at once,
    all at the same time (each waits at most `timeout`)."""
    import socket
    import threading

    out: dict[str, str] = {}

    def one(link: dict[str, Any]) -> None:
        try:
            socket.create_connection((str(link["address"]), int(link["port"])), timeout=timeout).close()
            out[str(link["member"])] = "ok"
        except OSError as exc:
            out[str(link["member"])] = (exc.strerror or type(exc).__name__) if not isinstance(exc, socket.timeout) \
                else "no answer within %g s" % timeout  # fmt: skip

    threads = [threading.Thread(target=one, args=(link,)) for link in links]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 1)
    return out


def key_checks(
    checks: list[dict[str, Any]], address: str = "127.0.0.1", main_pids: dict[str, str] | None = None
) -> dict[str, str]:
    """port -> what a replica behind a gateway answers an authenticated GET sent with the key its host holds (the
    first key of its key file): 200 when it accepts it, 401 when not; nothing for a port whose key is not read. A
    check that names its unit is sent only where that unit's process (`main_pids`) holds the port (NOT_ITS_UNIT)."""
    out = {}
    keys: dict[str, list[str] | None] = {}  # key file -> its words (None: not readable), each file read once
    for check in checks:
        if check.get("unit") and not owns_port((main_pids or {}).get(str(check["unit"])), int(check["port"])):
            out[str(check["port"])] = NOT_ITS_UNIT
            continue
        path = str(check["key_file"])
        if path not in keys:
            try:
                keys[path] = (read_secret(path) or "").split()
            except OSError:
                keys[path] = None
        words = keys[path]
        if words is None:
            continue
        out[str(check["port"])] = http_status(
            int(check["port"]), str(check["path"]), address=address, key=words[0] if words else None
        )
    return out


DECISION_TIMEOUT = 30.0
DECISION_LIMIT = 1 << 20


def decision_request(port: int, path: str, body: str, address: str = "127.0.0.1", key: str | None = None) -> bytes:
    """A POST of a JSON body over HTTP/1.0 (the server closes when done: no chunked answer)."""
    data = body.encode("utf-8")
    head = "POST %s HTTP/1.0\r\nHost: %s:%d\r\nContent-Type: application/json\r\nContent-Length: %d\r\n" % (
        path,
        address,
        port,
        len(data),
    )
    if key:
        head += "Authorization: Bearer %s\r\n" % key
    return (head + "\r\n").encode("ascii") + data


def decision_answer(
    check: dict[str, Any], address: str = "127.0.0.1", timeout: float = DECISION_TIMEOUT
) -> dict[str, str]:
    """A decisions replica's answer to the readiness request (seed 003), judged by engine-ctl, not here:
    {"status": the HTTP status or `down: why`, "body": the answer's body}. The internal key is sent when the
    replica requires it (behind a gateway) and this user can read it."""
    import socket

    key: str | None = None
    if check.get("key_file"):
        try:
            with open(check["key_file"]) as f:
                key = (f.read().split() or [""])[0] or None  # the first line: the key the gateways send
        except OSError:
            key = None
    port = int(check["port"])
    raw = b""
    try:
        with socket.create_connection((address, port), timeout=timeout) as s:
            s.sendall(decision_request(port, str(check["path"]), str(check["body"]), address, key))
            while len(raw) < DECISION_LIMIT:
                chunk = s.recv(65536)
                if not chunk:
                    break
                raw += chunk
    except (OSError, ValueError) as exc:
        return {"status": "down: " + str(exc), "body": ""}
    head, _, body = raw.partition(b"\r\n\r\n")
    return {"status": parse_status_line(head), "body": body.decode("utf-8", "replace")}


def decisions(
    checks: list[dict[str, Any]], address: str = "127.0.0.1", main_pids: dict[str, str] | None = None
) -> dict[str, dict[str, str]]:
    """port -> each decisions replica's answer; one that would carry the key goes only to its unit's process."""
    out = {}
    for c in checks:
        if c.get("key_file") and c.get("unit") and not owns_port((main_pids or {}).get(str(c["unit"])), int(c["port"])):
            out[str(c["port"])] = {"status": NOT_ITS_UNIT, "body": ""}
        else:
            out[str(c["port"])] = decision_answer(c, address)
    return out


# The gateway ----------------------------------------------------------------------------------------------------

GATEWAY_DIR = "/etc/engine-ctl/gateway"
GATEWAY_SOCKET = "/run/engine-ctl-gateway/admin.sock"


def parse_show_stat(data: str, column: str = "status") -> dict[str, str]:
    """HAProxy's `show stat` CSV -> {"backend/server": its `column`} (frontends and backends' own rows left out):
    its state (status), or where it sends requests now (addr)."""
    lines = data.splitlines()
    header = lines[0].lstrip("# ").split(",") if lines else []
    servers = {}
    for line in lines[1:]:
        row = dict(zip(header, line.split(",")))  # noqa: B905 (the probe keeps to Python 3.7: no strict=)
        if row.get("svname") not in (None, "FRONTEND", "BACKEND") and "pxname" in row:
            servers[row["pxname"] + "/" + row["svname"]] = row.get(column, "")
    return servers


def gateway_ask(command: str, path: str = GATEWAY_SOCKET) -> str | None:
    """One command to the gateway's runtime socket: its answer, or None when it does not answer."""
    try:
        return haproxy_ask(path, command, 3)
    except OSError:
        return None


RUNTIME_MAPS = ("keys.map", "expires.map", "scopes.map", "limits.map", "stopped.map")
"""The maps apply changes in a running gateway (engine_ctl.core.render.gateway.RUNTIME_MAPS)."""
SHOWN_MAPS = (*RUNTIME_MAPS, "models.map")
"""The maps read from the running gateway: those, and the routes (models.map), which only a reload changes."""


def parse_show_map(data: str) -> dict[str, str] | None:
    """`show map NAME` -> {key: value} (each line `0x<ref> <key> <value>`); None for a map it does not know. A key
    held twice (`add map` of a key already there) is taken with its first value, the one a lookup finds: what
    requests are checked against."""
    entries: dict[str, str] = {}
    for line in data.splitlines():
        words = line.split(" ", 2)
        if len(words) == 3 and words[0].startswith("0x"):
            entries.setdefault(words[1], words[2])  # a key held twice: a lookup finds the first
        elif line.strip():
            return None  # "Unknown map identifier", or an answer that is not a map
    return entries


def gateway_maps(path: str = GATEWAY_SOCKET) -> dict[str, dict[str, str]] | None:
    """The key maps as the running gateway holds them in memory (what requests are checked against): a map
    changed over the socket, never on disk, shows here. None when the gateway does not answer."""
    out = {}
    for name in SHOWN_MAPS:
        data = gateway_ask("show map " + name, path)
        if data is None:
            return None
        entries = parse_show_map(data)
        if entries is not None:
            out[name] = entries
    return out


GATEWAY_KEY_FILES = (GATEWAY_DIR + "/internal.key", GATEWAY_DIR + "/internal.env", "/etc/engine-ctl/replica-key")
"""Where a gateway host keeps the internal key, newest form first (engine_ctl.shell.gateway.runtime.read_internal_key
reads them in this order)."""
GATEWAY_RUN_DIR = "/run/engine-ctl-gateway"


def gateway_key(
    path: str = GATEWAY_SOCKET, files: Iterable[str] = GATEWAY_KEY_FILES, run_dir: str = GATEWAY_RUN_DIR
) -> dict[str, str | None]:
    """The internal key on this gateway host as fingerprints: "file" (its key file), "copy" (the run directory's
    copy a reload reads) and "running" (the running gateway's map); None: no key there; left out: not read."""
    out: dict[str, str | None] = {}
    try:
        texts = [read_secret(p) for p in files]
        text = next((x for x in texts if x is not None), None)
        sent = sent_key(text) if text is not None else None
        out["file"] = key_fingerprint(sent) if sent else None
    except OSError:
        pass
    internal_map = run_dir + "/internal.map"
    if os.path.isdir(run_dir):
        try:
            text = read_secret(internal_map)
            sent = sent_key(text) if text is not None else None
            out["copy"] = key_fingerprint(sent) if sent else None
        except OSError:
            pass
    answer = gateway_ask("show map " + internal_map, path)
    entries = parse_show_map(answer) if answer is not None else None
    if entries is not None:
        out["running"] = key_fingerprint(entries["gateway"]) if is_key(entries.get("gateway", "")) else None
    return out


def gateway(directory: str = GATEWAY_DIR) -> dict[str, Any] | None:
    """engine-ctl's gateway on this host: its files' sha256 and each server's state; None where there is none."""
    import hashlib

    files = {}
    lineage = None
    sockets: list[str] = []
    try:
        for entry in sorted(os.listdir(directory)):
            path = os.path.join(directory, entry)
            if os.path.isfile(path) and not entry.endswith((".env", ".key")):  # the internal key is no drift
                with open(path, "rb") as f:
                    data = f.read()
                files[entry] = hashlib.sha256(data).hexdigest()
                if entry == "haproxy.cfg":
                    lineage = config_lineage(data)
                    sockets = config_sockets(data)
    except OSError:
        return None
    stat = gateway_ask("show stat") or ""
    info = gateway_ask("show info")
    return {"files": files, "servers": parse_show_stat(stat), "addresses": parse_show_stat(stat, "addr"),
            "weights": parse_show_stat(stat, "weight"), "maps": gateway_maps(), "internal_key": gateway_key(),
            "changed_since_load": changed_since_load(directory, info), "frontends": frontends(stat),
            "rate_limits": rate_limits(info), "runtime": gateway_runtime(stat, info), "lineage": lineage,
            "missing_sockets": [p for p in sockets if not is_socket(p)]}  # fmt: skip


def config_sockets(data: bytes) -> list[str]:
    """The UNIX sockets haproxy.cfg binds (`bind unix@PATH`), as engine_ctl.core.render.gateway.unix_sockets."""
    text = data.decode("utf-8", "replace")
    return [m.group(1) for m in re.finditer(r"^\s*bind\s+unix@(\S+)", text, re.MULTILINE)]


def is_socket(path: str) -> bool:
    try:
        return S_ISSOCK(os.stat(path).st_mode)
    except OSError:
        return False


def config_lineage(data: bytes) -> str | None:
    """The state lineage in haproxy.cfg's header (`# lineage: …`): whose gateway it is; None where it names none."""
    for line in data.split(b"\n", 12)[:12]:
        if line.startswith(b"# lineage: "):
            return line[len(b"# lineage: ") :].decode("utf-8", "replace").strip()
    return None


def gateway_runtime(stat: str, info: str | None, path: str = GATEWAY_SOCKET) -> dict[str, Any]:
    """What an admin command can change in the running gateway beyond its maps, weights and states: each ACL's
    entries (`add acl #N`), the connection limits (`set maxconn`) and where each server's check goes
    (`set server ... check-port`). Compared with the configuration the gateway loaded (core.plan.gatewayruntime)."""
    state = gateway_ask("show servers state", path) or ""
    maxconn = next((line.split(":", 1)[1].strip() for line in (info or "").splitlines() if line.startswith("Maxconn:")),
                   None)  # fmt: skip
    return {"acls": gateway_acls(path), "maxconn": maxconn, "slim": show_stat_limits(stat),
            "checks": check_targets(state)}  # fmt: skip


ACL_ROW = r"^(\d+) \(.*?\) acl '([^']*)' file '([^']*)' line (\d+)\."
"""A row of `show acl`: the ACL's id, its fetch, the file and line that declare it."""


def gateway_acls(path: str = GATEWAY_SOCKET, config: str = "haproxy.cfg") -> list[list[Any]] | None:
    """[line, fetch, entries] of each ACL the gateway's configuration file declares, in the order HAProxy numbered
    them (`show acl`, then `show acl #<id>` for its entries); None when the gateway does not answer."""
    import re

    listing = gateway_ask("show acl", path)
    if listing is None:
        return None
    out: list[list[Any]] = []
    for row in listing.splitlines():
        m = re.match(ACL_ROW, row)
        if not m or os.path.basename(m.group(3)) != config:
            continue
        answer = gateway_ask("show acl #" + m.group(1), path)
        if answer is None:
            return None
        entries = [line.partition(" ")[2] for line in answer.splitlines() if line.startswith("0x")]
        out.append([int(m.group(4)), m.group(2), entries])
    return out


def show_stat_limits(stat: str) -> dict[str, str]:
    """`show stat`'s slim (the connection limit in force) of each frontend ("<frontend>") and server
    ("<backend>/<server>"), which `set maxconn frontend|server` changes."""
    lines = stat.splitlines()
    header = lines[0].lstrip("# ").split(",") if lines else []
    out = {}
    for line in lines[1:]:
        row = dict(zip(header, line.split(",")))  # noqa: B905 (the probe keeps to Python 3.7: no strict=)
        if "pxname" not in row or row.get("svname") == "BACKEND":
            continue
        name = row["pxname"] if row.get("svname") == "FRONTEND" else row["pxname"] + "/" + row.get("svname", "")
        out[name] = row.get("slim", "")
    return out


def check_targets(state: str) -> dict[str, str]:
    """`show servers state` -> {"backend/server": "<check port> <check address>"} ("0 -": the server's own, as the
    configuration gives), which `set server ... check-port|check-addr` changes."""
    lines = [line for line in state.splitlines() if line.strip()]
    header = next((line.lstrip("# ").split() for line in lines if line.startswith("#")), [])
    out = {}
    for line in lines:
        if line.startswith("#") or len(line.split()) != len(header):
            continue
        row = dict(zip(header, line.split()))  # noqa: B905
        out[row["be_name"] + "/" + row["srv_name"]] = row["srv_check_port"] + " " + row["srv_check_addr"]
    return out


def frontends(stat: str) -> dict[str, str]:
    """`show stat`'s frontends -> their status (OPEN; PAUSED once an admin command disabled one)."""
    lines = stat.splitlines()
    header = lines[0].lstrip("# ").split(",") if lines else []
    out = {}
    for line in lines[1:]:
        row = dict(zip(header, line.split(",")))  # noqa: B905 (the probe keeps to Python 3.7: no strict=)
        if row.get("svname") == "FRONTEND" and "pxname" in row:
            out[row["pxname"]] = row.get("status", "")
    return out


RATE_LIMITS = ("ConnRateLimit", "SessRateLimit", "SslRateLimit")
"""`show info`'s process-wide rate limits (the configuration sets none: 0), which `set rate-limit` changes."""


def rate_limits(info: str | None) -> dict[str, str]:
    out = {}
    for line in (info or "").splitlines():
        key, _, value = line.partition(":")
        if key in RATE_LIMITS:
            out[key] = value.strip()
    return out


LOAD_SLACK_S = 1.0
"""`show info`'s Uptime_sec is whole seconds, so the worker loaded its configuration within the second before
now - Uptime_sec: only a file changed more than LOAD_SLACK_S after that latest load time is said changed since
(one written just before a reload is never taken for one changed after it)."""


def changed_since_load(directory: str, info: str | None, now: float | None = None) -> list[str] | None:
    """The gateway's files (not the maps a running gateway takes over its socket) whose inode changed (ctime: a
    write, a rename, a copy that keeps the mtime) after the running worker loaded its configuration (`show info`:
    its Uptime_sec): what runs may not be what the files say (edited, reloaded, then put back). None when the
    gateway does not answer."""
    uptime = next((line.split(":", 1)[1].strip() for line in (info or "").splitlines()
                   if line.startswith("Uptime_sec:")), None)  # fmt: skip
    if uptime is None or not uptime.isdigit():
        return None
    loaded = (time.time() if now is None else now) - int(uptime) + LOAD_SLACK_S
    out = []
    try:
        for entry in sorted(os.listdir(directory)):
            path = os.path.join(directory, entry)
            if entry in RUNTIME_MAPS or entry.endswith((".env", ".key")) or not os.path.isfile(path):
                continue
            if os.stat(path).st_ctime > loaded:
                out.append(entry)
    except OSError:
        return None
    return out


# The probe ------------------------------------------------------------------------------------------------------


def parse_args(argv: list[str]) -> dict[str, Any]:
    """The probe's one argument: gather.probe_args as JSON."""
    if len(argv) != 1:
        raise SystemExit("usage: python3 -I -S - ARGS_JSON  (engine_ctl.shell.gather.probe_args as JSON)")
    try:
        args = json.loads(argv[0])
    except ValueError as exc:
        raise SystemExit("facts probe: ARGS_JSON is not JSON: %s" % exc) from None
    if not isinstance(args, dict) or "models_dir" not in args or "cache_dir" not in args:
        raise SystemExit("facts probe: ARGS_JSON must be an object with models_dir and cache_dir")
    return args


SCALER_STATE = "/var/lib/engine-ctl/scaler/state.json"


def scaler_state(path: str = SCALER_STATE) -> Any:
    """The scaler's state.json on the gateway host that runs it (its decisions, what runs), or None."""
    text = read(path)
    if not text or len(text) > 1000000:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


SCALER_COMMAND = "/usr/local/lib/engine-ctl/scaler-command"  # engine_ctl.core.render.scaler.COMMAND_PATH
SCALER_KEY_LINE = r" engine-ctl-scaler(@[A-Za-z0-9_.-]+)?$"  # an authorized_keys line of a scaler's key


def scaler_authorization(wanted: dict[str, Any] | None) -> dict[str, Any] | None:
    """How this host authorizes the scalers' keys against `wanted` (gather.scaler_authorization): the options of
    each authorized_keys line of a scaler's key that does not start with the forced command (its key material
    left out), and whether the forced command's program is engine-ctl's. None: no such line and no program."""
    import re

    if not wanted:
        return None
    text = read(os.path.expanduser("~/.ssh/authorized_keys")) or ""
    lines = [line for line in text.splitlines() if re.search(SCALER_KEY_LINE, line)]
    found = file_sha256(SCALER_COMMAND)
    if not lines and found is None:
        return None
    loose = []
    for line in lines:
        if not line.startswith(wanted["options"] + "ssh-"):
            kind = re.search(r"(?:^|\s)(?:ssh-|ecdsa-|sk-)", line)  # where the key begins: only its options are said
            loose.append(line[: kind.start()].strip()[:200] if kind else "")
    command = "missing" if found is None else "ok" if found == wanted.get("command_sha256") else "changed"
    return {"loose": loose, "command": command}


SCALER_CONFIG = "/etc/engine-ctl/scaler/scaler.json"
SCALER_PROGRAM = "/etc/engine-ctl/scaler/scaler.py"  # engine_ctl.core.render.scaler.SCALER_PROGRAM


SCALER_SETTINGS = ("poll_s", "decide_every_s", "hold_s")  # engine_ctl.core.render.scaler.render_config's keys


def scaler_config(path: str = SCALER_CONFIG) -> Any:
    """What the scaler on this host was configured with: the sha256 of its deployments (scaler.json's
    `deployments`, dumped as engine_ctl.core.render.scaler.deployments_digest dumps them) and its settings
    (SCALER_SETTINGS); {"unreadable": True} for a file that is not such JSON; None where there is no file."""
    text = read(path)
    if text is None:
        return None
    try:
        body = json.loads(text) if len(text) <= 10000000 else None
    except ValueError:
        body = None
    deployments = body.get("deployments") if isinstance(body, dict) else None
    if not isinstance(body, dict) or not isinstance(deployments, list):
        return {"unreadable": True}
    return {
        "deployments_sha256": hashlib.sha256(json.dumps(deployments, sort_keys=True).encode()).hexdigest(),
        "settings": {key: body.get(key) for key in SCALER_SETTINGS},
    }


def probe(args: dict[str, Any]) -> dict[str, Any]:
    """Every fact of this host. The tools that take time (engines' --version, GPU tools, haproxy -v) start first
    and run side by side while the files are read."""
    started = engines(args.get("engines", {}), args.get("known_versions", {}))
    builds = engines(args.get("builds", {}), args.get("known_versions", {}))  # "engine\tplatform" -> one path
    workers = engines(args.get("workers", {}), args.get("known_versions", {}))  # a group worker's binary, by path
    uname = os.uname()
    gpu_started = {key: start(argv) for key, argv in gpu_commands(system=uname.sysname).items()}
    haproxy = shutil.which("haproxy")
    haproxy_started = start([haproxy, "-v"]) if haproxy else None
    unit_facts = units(args.get("unit_prefix", "engine-ctl-"))
    main_pids = {str(u.get("Id")): str(u.get("MainPID") or "") for u in unit_facts}
    doc: dict[str, Any] = {
        "probe_version": PROBE_VERSION,
        "hostname": uname.nodename,
        "machine_id": (read("/etc/machine-id") or "").strip() or None,
        "os": parse_os_release(read(OS_RELEASE) or ""),
        "kernel": uname.release,
        "arch": uname.machine,
        "systemd": systemd_version(),
        "cpu": cpu(),
        "memory": parse_meminfo(read(MEMINFO) or ""),
        "disks": {"models_dir": disk(args["models_dir"]), "cache_dir": disk(args["cache_dir"])},
        "units": unit_facts,
        "ports": listening_ports(),
        "model_files": model_files(args["models_dir"]),
        "checkouts": checkouts(args["models_dir"]),
        "curl": shutil.which("curl"),
        "psql": shutil.which("psql"),
        "python": "%d.%d.%d" % sys.version_info[:3],
        "models": {p: model_entry(p) for p in args.get("model_paths", [])},
        "health": health(args.get("health", []), args.get("bind") or "127.0.0.1"),
        "decisions": decisions(args.get("decisions", []), args.get("bind") or "127.0.0.1", main_pids),
        "key_checks": key_checks(args.get("key_checks", []), args.get("bind") or "127.0.0.1", main_pids),
        "links": member_links(args.get("links", [])),
        "replica_keys": replica_keys(args.get("key_files", [])),
        "loose_secrets": loose_secrets(
            [*args.get("key_files", []), *GATEWAY_KEY_FILES[:2], GATEWAY_RUN_DIR + "/internal.map"],
            [GATEWAY_RUN_DIR + "/internal.map"],
        ),
        "gateway": gateway(),
        "scaler": scaler_state(),
        "scaler_config": scaler_config(),
        "scaler_program_sha256": file_sha256(SCALER_PROGRAM),
        # when the files the scaler reads once, at its start, last changed (a copy back with `cp -p` moves the ctime)
        "scaler_files_changed_at": max(
            (t for t in map(newest_mtime, (SCALER_CONFIG, SCALER_PROGRAM)) if t), default=None
        ),
        "scaler_authorization": scaler_authorization(args.get("scaler_authorization")),
        "cgroup2": os.path.exists("/sys/fs/cgroup/cgroup.controllers"),
    }
    doc["gpus"] = {key: finish(proc) for key, proc in gpu_started.items()}
    doc["engines"] = with_sha256(engine_versions(started), args.get("known_versions", {}))
    doc["engine_builds"] = with_sha256(engine_versions(builds), args.get("known_versions", {}))
    doc["workers"] = with_sha256(engine_versions(workers), args.get("known_versions", {}))
    doc["haproxy"] = parse_haproxy_version(finish(haproxy_started)["out"]) if haproxy_started else None
    return doc


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    sys.stdout.write(json.dumps(probe(args)))


if __name__ == "__main__":  # `python3 -I -S -` (the probe on stdin) runs as __main__
    main()
