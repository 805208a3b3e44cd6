"""The facts probe: runs on a host as ONE process (`python3 -I - ARGS_JSON`, this file on stdin), stdlib only,
and prints one JSON document. It reports raw tool output; engine-ctl parses it locally (engine_ctl.core.fit.hostfacts).
A missing tool is a fact (null), never an error."""

import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys

UNIT_TEXT_LIMIT = 256 * 1024  # engine_ctl.core.fit.hostfacts.UNIT_TEXT_LIMIT: a unit's text past it is not sent


def run(argv, timeout=10):
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        return {"code": p.returncode, "out": p.stdout, "err": p.stderr}
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"code": -1, "out": "", "err": str(exc)}


def start(argv):
    """Start a command now and collect it later (finish), so the probe's slow tools run side by side."""
    try:
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    except OSError as exc:
        return exc


def finish(proc, timeout=15):
    if isinstance(proc, Exception):
        return {"code": -1, "out": "", "err": str(proc)}
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        return {"code": -1, "out": out, "err": "timed out"}
    return {"code": proc.returncode, "out": out, "err": err}


def systemd_version():
    """The version from libsystemd-shared's file name (no process); `systemctl --version` otherwise."""
    import glob

    for path in glob.glob("/usr/lib/systemd/libsystemd-shared-*.so") + glob.glob("/lib/systemd/libsystemd-shared-*.so"):
        version = path.rsplit("libsystemd-shared-", 1)[1][: -len(".so")]
        if version[:1].isdigit():
            return "systemd " + version
    return (run(["systemctl", "--version"])["out"].splitlines() or [None])[0]


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


def engines(spec, known):
    """Find each engine and start its version probe, unless the binary is unchanged since engine-ctl last read
    its version (`known`: path -> [mtime_ns, size, version]); returns {name: (path, probe or version, kind, stat)}."""
    started = {}  # type: dict[str, tuple]
    for name, entry in spec.items():
        path = None
        for candidate in entry.get("candidates", []):
            resolved = candidate if "/" in candidate else shutil.which(candidate)
            if resolved and os.path.isfile(resolved) and os.access(resolved, os.X_OK):
                path = resolved
                break
        if path is None:
            continue
        st = os.stat(path)
        stat = [st.st_mtime_ns, st.st_size]
        seen = known.get(path)
        if seen and seen[:2] == stat:
            started[name] = (path, seen[2], "known", stat)  # type: ignore[assignment]
            continue
        probe = entry.get("probe") or {}
        proc = None
        if probe.get("kind") == "argv":
            proc = start([path, *probe.get("args", [])])
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
            proc = start([python, "-c", code, probe.get("dist", name)])
        started[name] = (path, proc, probe.get("kind"), stat)
    return started


def engine_versions(started):
    found = {}
    for name, (path, proc, kind, stat) in started.items():
        version = None
        if kind == "known":
            version = proc
        elif proc is not None:
            result = finish(proc)
            version = (result["out"] + result["err"]).strip() if kind == "argv" else result["out"].strip() or None
            if kind == "python_dist" and version is None:
                continue  # the interpreter is there, the engine's package is not
        found[name] = {"path": path, "version": (version or "")[:400] or None, "stat": stat}
    return found


def with_sha256(found):
    """Each engine found, with the sha256 of its binary: what runs, whatever its version says."""
    for entry in found.values():
        h = hashlib.sha256()
        try:
            with open(entry["path"], "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
            entry["sha256"] = h.hexdigest()
        except OSError:
            entry["sha256"] = None
    return found


def units(prefix):
    unit_dir = "/etc/systemd/system"
    names, hashes, texts = set(), {}, {}
    try:
        for entry in os.listdir(unit_dir):
            if entry.startswith(prefix) and entry.endswith(".service"):
                names.add(entry)
                with open(os.path.join(unit_dir, entry), "rb") as f:
                    data = f.read()
                hashes[entry] = hashlib.sha256(data).hexdigest()
                if len(data) <= UNIT_TEXT_LIMIT:  # the text, so a hand edit is shown as a diff
                    texts[entry] = data.decode("utf-8", "replace")
    except OSError:
        pass
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
                fields["text"] = texts.get(name)
                out.append(fields)
        seen = {u.get("Id") for u in out}
        out += [{"Id": n, "sha256": hashes.get(n), "text": texts.get(n)} for n in ordered if n not in seen]
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


# GGUF value types (ggml's gguf.h): 0 u8, 1 i8, 2 u16, 3 i16, 4 u32, 5 i32, 6 f32, 7 bool, 8 string, 9 array,
# 10 u64, 11 i64, 12 f64
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


class Reader:
    def __init__(self, f):
        self.f = f

    def take(self, fmt):
        size = struct.calcsize(fmt)
        data = self.f.read(size)
        if len(data) != size:
            raise ValueError("truncated GGUF file")
        return struct.unpack(fmt, data)[0]

    def string(self):
        n = self.take("<Q")
        if n > 1 << 24:
            raise ValueError("implausible string length")
        return self.f.read(n).decode("utf-8", "replace")

    def value(self, vtype, keep):
        if vtype in SCALARS:
            return self.take(SCALARS[vtype])
        if vtype == 8:
            return self.string()
        if vtype == 9:
            item_type = self.take("<I")
            count = self.take("<Q")
            if not keep:  # skip the tokenizer's large arrays without building them
                if item_type in SCALARS:
                    self.f.seek(count * struct.calcsize(SCALARS[item_type]), 1)
                else:
                    for _ in range(count):
                        self.value(item_type, False)
                return None
            return [self.value(item_type, True) for _ in range(min(count, 4096))]
        raise ValueError("unknown GGUF value type %d" % vtype)


def gguf(path):
    with open(path, "rb") as f:
        r = Reader(f)
        if f.read(4) != b"GGUF":
            return {"error": "not a GGUF file (bad magic)"}
        version = r.take("<I")
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
        for _ in range(n_tensors):
            r.string()
            n_dims = r.take("<I")
            f.seek(8 * n_dims + 4 + 8, 1)
        alignment = int(fields.get("general.alignment", 32))
        offset = f.tell()
        offset += (alignment - offset % alignment) % alignment
        size = os.path.getsize(path)
        return {"format": "gguf", "version": version, "fields": fields, "size": size, "data_bytes": size - offset}


def checkpoint(path):
    out = {"format": "safetensors"}  # type: dict[str, object]
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


def model_metadata(path):
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


def checkpoint_digest(path):
    """The checkpoint digest of an hf: checkout engine-ctl fetched (the marker beside its files), measured now:
    a file whose size or mtime differs from what the fetch recorded is hashed again. None for other models."""
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
            if (st.st_size, st.st_mtime_ns) == (entry["size"], entry["mtime_ns"]):
                digests[name] = entry["sha256"]
                continue
            h = hashlib.sha256()
            with open(full, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
            digests[name] = h.hexdigest()
        text = "".join("%s  %s\n" % (digests[p], p) for p in sorted(digests))
        return {"dir": root, "digest": hashlib.sha256(text.encode()).hexdigest()}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return {"dir": root, "error": str(exc)}


def writable_by_others(path):
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


def model_entry(path):
    out = model_metadata(path)
    found = checkpoint_digest(path) if not out.get("missing") else None
    if found is not None:
        out["checkpoint"] = found
    if not out.get("missing") and not out.get("error"):
        loose = writable_by_others(path)
        if loose:
            out["writable"] = loose
    return out


def health(checks, address="127.0.0.1"):
    """GET each engine's health endpoint on loopback: the HTTP status, or why there was none."""
    if not checks:
        return {}
    import urllib.error
    import urllib.request

    out = {}
    for check in checks:
        url = "http://%s:%d%s" % (address, int(check["port"]), check["path"])
        try:
            with urllib.request.urlopen(url, timeout=3) as response:
                out[str(check["port"])] = str(response.status)
        except urllib.error.HTTPError as exc:
            out[str(check["port"])] = str(exc.code)
        except (OSError, ValueError) as exc:
            out[str(check["port"])] = "down: " + str(getattr(exc, "reason", exc))
    return out


def gateway():
    """engine-ctl's gateway on this host: its files' sha256 and each server's state as HAProxy sees it."""
    directory = "/etc/engine-ctl/gateway"
    files = {}
    try:
        for entry in sorted(os.listdir(directory)):
            path = os.path.join(directory, entry)
            if os.path.isfile(path) and not entry.endswith(".env"):
                with open(path, "rb") as f:
                    files[entry] = hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None
    servers = {}
    try:
        import socket

        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(3)
        s.connect("/run/engine-ctl-gateway/admin.sock")
        s.sendall(b"show stat\n")
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        s.close()
        lines = data.decode().splitlines()
        header = lines[0].lstrip("# ").split(",") if lines else []
        for line in lines[1:]:
            row = dict(zip(header, line.split(","), strict=False))
            if row.get("svname") not in (None, "FRONTEND", "BACKEND"):
                servers[row["pxname"] + "/" + row["svname"]] = row.get("status", "")
    except (OSError, ValueError, IndexError):
        pass
    return {"files": files, "servers": servers}


def main():
    args = json.loads(sys.argv[1])
    started = engines(args.get("engines", {}), args.get("known_versions", {}))
    builds = engines(args.get("builds", {}), args.get("known_versions", {}))  # "engine\tplatform" -> one path
    haproxy = shutil.which("haproxy")
    haproxy_probe = start([haproxy, "-v"]) if haproxy else None
    doc = {
        "probe_version": 1,
        "hostname": os.uname().nodename,
        "os": os_release(),
        "kernel": os.uname().release,
        "arch": os.uname().machine,
        "systemd": systemd_version(),
        "cpu": cpu(),
        "memory": memory(),
        "disks": {"models_dir": disk(args["models_dir"]), "cache_dir": disk(args["cache_dir"])},
        "gpus": gpus(),
        "units": units(args.get("unit_prefix", "engine-ctl-")),
        "ports": listening_ports(),
        "model_files": model_files(args["models_dir"]),
        "curl": shutil.which("curl"),
        "python": "%d.%d.%d" % sys.version_info[:3],
        "models": {p: model_entry(p) for p in args.get("model_paths", [])},
        "health": health(args.get("health", []), args.get("bind") or "127.0.0.1"),
        "gateway": gateway(),
        "cgroup2": os.path.exists("/sys/fs/cgroup/cgroup.controllers"),
    }
    doc["engines"] = with_sha256(engine_versions(started))
    doc["engine_builds"] = with_sha256(engine_versions(builds))
    doc["haproxy"] = (finish(haproxy_probe)["out"].splitlines() or [None])[0] if haproxy_probe else None
    sys.stdout.write(json.dumps(doc))


main()
