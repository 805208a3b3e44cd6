"""The facts probe: runs on a host as ONE process (`python3 -I - ARGS_JSON`, this file on stdin), stdlib only,
and prints one JSON document. It reports raw tool output; engine-ctl parses it locally (engine_ctl.facts).
A missing tool is a fact (null), never an error."""

import hashlib
import json
import os
import platform
import shutil
import socket
import subprocess
import sys


def run(argv, timeout=10):
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        return {"code": p.returncode, "out": p.stdout, "err": p.stderr}
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"code": -1, "out": "", "err": str(exc)}


def read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def os_release():
    text = read("/etc/os-release") or ""
    for line in text.splitlines():
        if line.startswith("PRETTY_NAME="):
            return line.split("=", 1)[1].strip().strip('"')
    return None


def cpu():
    text = read("/proc/cpuinfo") or ""
    model, flags = None, []  # type: ignore[var-annotated]
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and model is None:
            model = value.strip()
        elif key == "flags" and not flags:
            flags = value.split()
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    wanted = ("avx", "avx2", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_tile", "fma", "f16c", "neon")
    return {"cores": cores, "model": model, "flags": [f for f in flags if f in wanted]}


def memory():
    info = {}
    for line in (read("/proc/meminfo") or "").splitlines():
        key, _, value = line.partition(":")
        parts = value.split()
        if parts:
            info[key] = int(parts[0]) * 1024
    return {"total": info.get("MemTotal", 0), "available": info.get("MemAvailable", info.get("MemFree", 0))}


def disk(path):
    probe, exists = path, os.path.isdir(path)
    while probe and not os.path.isdir(probe):
        probe = os.path.dirname(probe.rstrip("/")) or "/"
    try:
        st = os.statvfs(probe)
    except OSError:
        return {"path": path, "exists": exists, "total": None, "free": None}
    return {"path": path, "exists": exists, "total": st.f_blocks * st.f_frsize, "free": st.f_bavail * st.f_frsize}


def gpus():
    out = {}
    smi = shutil.which("nvidia-smi")
    if smi:
        out["nvidia_smi"] = run(
            [
                smi,
                "--query-gpu=index,uuid,name,memory.total,memory.used,driver_version",
                "--format=csv,noheader,nounits",
            ]
        )
    amd = shutil.which("amd-smi")
    if amd:
        out["amd_smi_static"] = run([amd, "static", "--asic", "--vram", "--driver", "--json"])
        out["amd_smi_metric"] = run([amd, "metric", "--mem-usage", "--json"])
    elif shutil.which("rocm-smi"):
        out["rocm_smi"] = run(
            [
                shutil.which("rocm-smi"),
                "--showuniqueid",
                "--showproductname",
                "--showmeminfo",
                "vram",
                "--showdriverversion",
                "--json",
            ]
        )
    return out


def engines(spec):
    found = {}
    for name, entry in spec.items():
        path = None
        for candidate in entry.get("candidates", []):
            resolved = candidate if "/" in candidate else shutil.which(candidate)
            if resolved and os.path.isfile(resolved) and os.access(resolved, os.X_OK):
                path = resolved
                break
        if path is None:
            continue
        probe = entry.get("probe") or {}
        version = None
        if probe.get("kind") == "argv":
            result = run([path, *probe.get("args", [])], timeout=15)
            version = (result["out"] + result["err"]).strip()
        elif probe.get("kind") == "python_dist":
            python = path
            try:
                with open(path, "rb") as f:
                    first = f.readline().decode("utf-8", "replace")
                if first.startswith("#!"):
                    python = first[2:].strip().split()[0]
            except OSError:
                pass
            code = "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))"
            result = run([python, "-c", code, probe.get("dist", name)], timeout=15)
            version = result["out"].strip() or None
            if version is None:
                continue  # the interpreter is there, the engine's package is not
        found[name] = {"path": path, "version": (version or "")[:400] or None}
    return found


def units(prefix):
    unit_dir = "/etc/systemd/system"
    names, hashes = set(), {}
    try:
        for entry in os.listdir(unit_dir):
            if entry.startswith(prefix) and entry.endswith(".service"):
                names.add(entry)
                with open(os.path.join(unit_dir, entry), "rb") as f:
                    hashes[entry] = hashlib.sha256(f.read()).hexdigest()
    except OSError:
        pass
    listed = run(["systemctl", "list-units", "--all", "--plain", "--no-legend", "--no-pager", prefix + "*"])
    for line in listed["out"].splitlines():
        parts = line.split()
        if parts and parts[0].startswith(prefix) and parts[0].endswith(".service"):
            names.add(parts[0])
    out = []
    if names:
        ordered = sorted(names)
        props = "Id,ActiveState,SubState,NRestarts,MainPID,ExecMainStatus,Result"
        shown = run(["systemctl", "show", "-p", props, "--no-pager", *ordered])
        blocks = shown["out"].strip().split("\n\n") if shown["out"].strip() else []
        for block in blocks:
            fields = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
            name = fields.get("Id")
            if name:
                fields["sha256"] = hashes.get(name)
                out.append(fields)
        seen = {u.get("Id") for u in out}
        out += [{"Id": n, "sha256": hashes.get(n)} for n in ordered if n not in seen]
    return out


def listening_ports():
    ports = set()
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in (read(path) or "").splitlines()[1:]:
            parts = line.split()
            if len(parts) > 3 and parts[3] == "0A":
                ports.add(int(parts[1].rsplit(":", 1)[1], 16))
    return sorted(ports)


def model_files(root, limit=5000):
    files = []  # type: ignore[var-annotated]
    if not os.path.isdir(root):
        return files
    base_depth = root.rstrip("/").count("/")
    for dirpath, dirnames, filenames in os.walk(root):
        if dirpath.count("/") - base_depth >= 5:
            dirnames[:] = []
        for name in filenames:
            if name.endswith((".gguf", ".safetensors")) or name in ("config.json", "model.safetensors.index.json"):
                full = os.path.join(dirpath, name)
                try:
                    files.append({"path": full, "size": os.path.getsize(full)})
                except OSError:
                    continue
                if len(files) >= limit:
                    return files
    return files


def main():
    args = json.loads(sys.argv[1])
    haproxy = shutil.which("haproxy")
    systemd = run(["systemctl", "--version"])
    doc = {
        "probe_version": 1,
        "hostname": socket.gethostname(),
        "os": os_release(),
        "kernel": platform.release(),
        "arch": platform.machine(),
        "systemd": (systemd["out"].splitlines() or [None])[0],
        "cpu": cpu(),
        "memory": memory(),
        "disks": {"models_dir": disk(args["models_dir"]), "cache_dir": disk(args["cache_dir"])},
        "gpus": gpus(),
        "engines": engines(args.get("engines", {})),
        "units": units(args.get("unit_prefix", "engine-ctl-")),
        "ports": listening_ports(),
        "model_files": model_files(args["models_dir"]),
        "haproxy": (run([haproxy, "-v"])["out"].splitlines() or [None])[0] if haproxy else None,
        "curl": shutil.which("curl"),
        "python": platform.python_version(),
    }
    sys.stdout.write(json.dumps(doc))


main()
