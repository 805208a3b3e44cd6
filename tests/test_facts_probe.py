"""The facts probe's parts, run here: each fact's parser on real output (this machine's own files and tools, and
recordings in tests/recordings/), and the whole probe as a host runs it (`python3 -I -S -` with the file on stdin).
The fleet tests (test_fleet_facts.py) run it over SSH on real hosts."""

from __future__ import annotations

import http.server
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import gguf
import pytest

from engine_ctl.core.documents.inventory import Host
from engine_ctl.shell import gather
from engine_ctl.shell.remote import facts_probe as probe
from tests.fleetfacts import RECORDINGS, recording

PROBE_FILE = Path(probe.__file__)


def test_importing_the_probe_runs_nothing() -> None:
    out = subprocess.run(
        [sys.executable, "-c", "import engine_ctl.shell.remote.facts_probe"], capture_output=True, text=True, check=True
    )
    assert out.stdout == "" and out.stderr == ""


def test_the_probe_keeps_to_python_3_7() -> None:
    import ast

    ast.parse(PROBE_FILE.read_text(), feature_version=(3, 7))


def test_os_release_of_this_machine() -> None:
    text = Path("/etc/os-release").read_text()
    expected = next(line.split("=", 1)[1].strip('"') for line in text.splitlines() if line.startswith("PRETTY_NAME="))
    assert probe.parse_os_release(text) == expected
    assert probe.parse_os_release('NAME=x\nPRETTY_NAME="Ubuntu 24.04.1 LTS"\n') == "Ubuntu 24.04.1 LTS"
    assert probe.parse_os_release("NAME=x\n") is None


def test_cpuinfo_of_this_machine() -> None:
    model, flags = probe.parse_cpuinfo(Path("/proc/cpuinfo").read_text())
    assert model and model in Path("/proc/cpuinfo").read_text()
    assert set(flags) <= set(probe.CPU_FLAGS)
    lscpu = subprocess.run(["grep", "-m1", "^flags", "/proc/cpuinfo"], capture_output=True, text=True).stdout.split()
    assert flags == [f for f in lscpu if f in probe.CPU_FLAGS]
    assert probe.cpu_cores() == len(os.sched_getaffinity(0))


def test_meminfo_of_this_machine_agrees_with_free() -> None:
    mem = probe.parse_meminfo(Path("/proc/meminfo").read_text())
    free = subprocess.run(["free", "-b"], capture_output=True, text=True, check=True).stdout.splitlines()[1].split()
    assert mem["total"] == int(free[1])
    assert 0 < mem["available"] <= mem["total"]
    assert probe.parse_meminfo("MemTotal:  2048 kB\nMemFree:  1024 kB\n") == {"total": 2097152, "available": 1048576}


def test_disk_of_a_directory_not_yet_made_is_its_parents_file_system(tmp_path: Path) -> None:
    missing = tmp_path / "models" / "deeper"
    d = probe.disk(str(missing))
    st = os.statvfs(tmp_path)
    assert d["exists"] is False and d["total"] == st.f_blocks * st.f_frsize
    assert probe.existing_dir(str(missing)) == str(tmp_path)


def test_listening_ports_agree_with_a_socket_we_open() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert port in probe.listening_ports()
        assert port in probe.parse_proc_net_tcp(Path("/proc/net/tcp").read_text())
    header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    listen = "   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1\n"
    established = "   1: 0100007F:1F91 0100007F:D2F0 01 00000000:00000000 00:00000000 00000000     0        0 2 1\n"
    assert probe.parse_proc_net_tcp(header + listen + established) == {8080}


def test_systemd_version_from_its_library_and_from_systemctl() -> None:
    names = ["libsystemd-core-252.so", "libsystemd-shared-252.so"]
    assert probe.systemd_version_from_library(names) == "systemd 252"
    assert probe.systemd_version_from_library(["libsystemd-shared-x.so"]) is None
    assert probe.parse_systemctl_version("systemd 252 (252.39-1~deb12u2)\n+PAM +AUDIT\n") == (
        "systemd 252 (252.39-1~deb12u2)"
    )
    systemctl = shutil.which("systemctl")
    if systemctl:  # this machine's own: the library's version is systemctl's
        line = subprocess.run([systemctl, "--version"], capture_output=True, text=True).stdout
        assert probe.systemd_version() == "systemd " + line.split()[1]


def test_systemctl_show_blocks() -> None:
    text = (
        "Id=engine-ctl-a.service\nActiveState=active\nSubState=running\nNRestarts=0\nMainPID=42\n"
        "ExecMainStatus=0\nResult=success\n\n"
        "Id=engine-ctl-b.service\nActiveState=failed\nSubState=failed\nNRestarts=3\nMainPID=0\n"
        "ExecMainStatus=1\nResult=exit-code\n"
    )
    a, b = probe.parse_systemctl_show(text)
    assert a["Id"] == "engine-ctl-a.service" and a["MainPID"] == "42"
    assert b["ActiveState"] == "failed" and b["NRestarts"] == "3"
    assert probe.systemctl_show_argv(["x.service"])[:4] == ["systemctl", "show", "-p", ",".join(probe.UNIT_PROPERTIES)]


def test_unit_files_say_what_they_are(tmp_path: Path) -> None:
    import hashlib

    text = "# engine-ctl: chat r3\n# content-sha256: " + "a" * 64 + "\n[Unit]\n"
    (tmp_path / "engine-ctl-a.service").write_text(text)
    (tmp_path / "other.service").write_text("[Unit]\n")
    (tmp_path / "engine-ctl-big.service").write_bytes(b"#" * (probe.UNIT_TEXT_LIMIT + 1))
    found = probe.unit_files("engine-ctl-", str(tmp_path))
    assert set(found) == {"engine-ctl-a.service", "engine-ctl-big.service"}
    a = found["engine-ctl-a.service"]
    assert a["sha256"] == hashlib.sha256(text.encode()).hexdigest() and a["text"] == text
    assert a["header"] == ["# engine-ctl: chat r3", "# content-sha256: " + "a" * 64]
    assert a["body_sha256"] == hashlib.sha256(b"# engine-ctl: chat r3\n# content-sha256: \n[Unit]\n").hexdigest()
    assert found["engine-ctl-big.service"]["text"] is None
    assert probe.unit_files("engine-ctl-", str(tmp_path / "none")) == {}
    # when the file last changed: a copy back that keeps an old mtime (`cp -p`) still moves its inode's ctime
    os.utime(tmp_path / "engine-ctl-a.service", (1_000_000_000, 1_000_000_000))
    ctime = os.stat(tmp_path / "engine-ctl-a.service").st_ctime
    changed = probe.unit_files("engine-ctl-", str(tmp_path))["engine-ctl-a.service"]["file_changed_at"]
    assert changed == round(ctime, 3) and changed > 1_000_000_000
    from engine_ctl.core.fit.hostfacts import UNIT_TEXT_LIMIT

    assert probe.UNIT_TEXT_LIMIT == UNIT_TEXT_LIMIT


def test_haproxy_version_recording() -> None:
    assert probe.parse_haproxy_version(recording("haproxy-v-2.6.txt")) == (
        "HAProxy version 2.6.12-1+deb12u4 2026/10/17 - https://haproxy.org/"
    )
    haproxy = shutil.which("haproxy")
    if haproxy:  # and this machine's own haproxy, when it has one
        out = subprocess.run([haproxy, "-v"], capture_output=True, text=True).stdout
        assert (probe.parse_haproxy_version(out) or "").startswith("HAProxy version ")


def test_gpu_commands_are_found_on_path() -> None:
    found = {"nvidia-smi": "/usr/bin/nvidia-smi", "rocm-smi": "/opt/rocm/bin/rocm-smi"}
    commands = probe.gpu_commands(found.get)
    assert commands["nvidia_smi"][0] == "/usr/bin/nvidia-smi"
    assert "--format=csv,noheader,nounits" in commands["nvidia_smi"]
    assert commands["rocm_smi"][0] == "/opt/rocm/bin/rocm-smi" and "amd_smi_static" not in commands
    assert probe.gpu_commands(lambda _: None) == {}


def test_on_macos_the_probe_asks_system_profiler_for_the_metal_gpus() -> None:
    found = {"system_profiler": "/usr/sbin/system_profiler", "sysctl": "/usr/sbin/sysctl"}
    commands = probe.gpu_commands(found.get, system="Darwin")
    assert commands == {
        "system_profiler": ["/usr/sbin/system_profiler", "SPDisplaysDataType", "-json"],
        "hw_memsize": ["/usr/sbin/sysctl", "-n", "hw.memsize"],
    }
    assert probe.gpu_commands(found.get, system="Linux") == {}  # sysctl is on Linux too; Metal is not


def test_python_dist_version_is_what_importlib_metadata_says() -> None:
    """The probe's light scan of sys.path, run by a real interpreter (this one), against importlib.metadata."""
    for dist in ("click", "pydantic", "ruamel.yaml", "typing_extensions", "Ruamel_Yaml"):
        argv = probe.version_argv(sys.executable, {"kind": "python_dist", "dist": dist}, "x")
        assert argv is not None and argv[0] == sys.executable
        out = subprocess.run(argv, capture_output=True, text=True, check=True)
        assert probe.parse_version_output("python_dist", {"code": 0, "out": out.stdout, "err": ""}) == (
            importlib.metadata.version(dist)
        )
    argv = probe.version_argv(sys.executable, {"kind": "python_dist", "dist": "no-such-engine"}, "x")
    assert argv is not None
    out = subprocess.run(argv, capture_output=True, text=True, check=True)
    assert out.stdout == "" and probe.parse_version_output("python_dist", {"code": 0, "out": "", "err": ""}) is None


def test_a_console_scripts_interpreter_is_its_shebang(tmp_path: Path) -> None:
    script = Path(sys.executable).with_name("pytest")
    assert probe.script_interpreter(str(script)) == script.read_text().splitlines()[0][2:].split()[0]
    assert probe.parse_shebang("#!/opt/vllm/bin/python3 -s") == "/opt/vllm/bin/python3"
    assert probe.parse_shebang("ELF") is None
    assert probe.script_interpreter(sys.executable) == sys.executable  # a binary is its own


def test_find_executable(tmp_path: Path) -> None:
    exe = tmp_path / "engine"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    plain = tmp_path / "plain"
    plain.write_text("")
    assert probe.find_executable([str(tmp_path / "missing"), str(plain), str(exe)]) == str(exe)
    assert probe.find_executable(["sh"]) == shutil.which("sh")


def test_gguf_header_of_a_file_the_gguf_library_writes(tmp_path: Path) -> None:
    import numpy as np

    path = tmp_path / "m.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(2048)
    writer.add_block_count(2)
    writer.add_token_list([b"a", b"b", b"c"])
    writer.add_tensor("token_embd.weight", np.zeros((3, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    meta = probe.model_metadata(str(path))
    assert meta["format"] == "gguf" and meta["version"] == 3
    assert meta["fields"]["llama.context_length"] == 2048 and meta["fields"]["general.architecture"] == "llama"
    assert "tokenizer.ggml.tokens" not in meta["fields"]
    assert meta["data_bytes"] == 3 * 8 * 4 and meta["size"] == path.stat().st_size
    (tmp_path / "bad.gguf").write_bytes(b"GGML" + b"\0" * 20)
    assert probe.model_metadata(str(tmp_path / "bad.gguf")) == {"error": "not a GGUF file (bad magic)"}
    (tmp_path / "short.gguf").write_bytes(path.read_bytes()[:40])
    assert "truncated" in probe.model_metadata(str(tmp_path / "short.gguf"))["error"]
    assert probe.model_metadata(str(tmp_path / "none")) == {"missing": True}


def test_checkpoint_directory(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    (tmp_path / "model-00001.safetensors").write_bytes(b"\0" * 10)
    (tmp_path / "model-00002.safetensors").write_bytes(b"\0" * 5)
    assert probe.checkpoint(str(tmp_path))["data_bytes"] == 15
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 1234}}))
    meta = probe.model_metadata(str(tmp_path))
    assert meta["data_bytes"] == 1234 and meta["config"]["architectures"] == ["LlamaForCausalLM"]


def test_model_files_are_found_below_the_models_dir(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "m.gguf").write_bytes(b"x" * 3)
    (tmp_path / "a" / "readme.txt").write_text("")
    (tmp_path / "config.json").write_text("{}")
    found = {f["path"]: f["size"] for f in probe.model_files(str(tmp_path))}
    assert found == {str(tmp_path / "a" / "b" / "m.gguf"): 3, str(tmp_path / "config.json"): 2}
    assert probe.model_files(str(tmp_path / "none")) == []


def test_health_status_line_of_a_real_llama_server_recording() -> None:
    raw = (RECORDINGS / "llama-server-health-200.http").read_bytes()
    assert probe.parse_status_line(raw) == "200"
    assert probe.parse_status_line(b"garbage").startswith("down: not an HTTP response")


@pytest.fixture
def http_server() -> Iterator[int]:
    """A real HTTP server on loopback (the standard library's) answering 503 on /health, as llama-server does
    while its model loads."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(503 if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def test_health_over_a_real_socket(http_server: int) -> None:
    assert probe.health([{"port": http_server, "path": "/health"}]) == {str(http_server): "503"}
    assert probe.http_status(http_server, "/other") == "404"
    with __import__("socket").socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    assert probe.http_status(closed, "/health").startswith("down: ")


def test_bad_arguments_are_refused_with_a_message() -> None:
    for argv, message in (([], "usage"), (["{"], "not JSON"), (["[]"], "must be an object")):
        with pytest.raises(SystemExit, match=message):
            probe.parse_args(argv)


def test_the_whole_probe_as_a_host_runs_it(tmp_path: Path, http_server: int) -> None:
    """`python3 -I -S - ARGS` with the file on stdin, here: one JSON document, which gather turns into HostFacts."""
    models = tmp_path / "models"
    models.mkdir()
    host = Host(name="here", address="127.0.0.1", models_dir=str(models), cache_dir=str(tmp_path))
    args = gather.probe_args(host, model_paths=[str(models / "none.gguf")], health=[(http_server, "/health")])
    python = shutil.which("python3") or sys.executable
    out = subprocess.run(
        [python, "-I", "-S", "-", json.dumps(args)], input=gather.probe_source(), capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["probe_version"] == probe.PROBE_VERSION and doc["hostname"] == os.uname().nodename
    facts = gather.facts_from_probe("here", doc)
    assert facts.cpu.cores == len(os.sched_getaffinity(0))
    assert facts.memory.total_bytes == probe.parse_meminfo(Path("/proc/meminfo").read_text())["total"]
    assert facts.health == {str(http_server): "503"}
    assert facts.model_problems == {str(models / "none.gguf"): "not found"}
    assert facts.disks["models_dir"].exists is True


def test_a_python_dist_of_the_probes_own_python_is_read_without_starting_another() -> None:
    """The host's python3 (sglang's usual interpreter) runs the probe itself: its site directories are scanned in
    the probe's process, with the answer importlib.metadata gives."""
    assert probe.is_own_python(sys.executable) and not probe.is_own_python("/bin/sh")
    for dist in ("click", "pydantic", "Ruamel_Yaml"):
        assert probe.dist_version(dist, probe.own_site_dirs()) == importlib.metadata.version(dist)
    assert probe.dist_version("no-such-engine", probe.own_site_dirs()) is None
    spec = {
        "present": {"candidates": [sys.executable], "probe": {"kind": "python_dist", "dist": "click"}},
        "absent": {"candidates": [sys.executable], "probe": {"kind": "python_dist", "dist": "no-such-engine"}},
    }
    args = {"models_dir": "/nonexistent", "cache_dir": "/tmp", "engines": spec}
    out = subprocess.run(
        [sys.executable, "-I", "-S", "-", json.dumps(args)], input=gather.probe_source(), capture_output=True, text=True
    )
    engines = json.loads(out.stdout)["engines"]
    assert set(engines) == {"present"} and engines["present"]["version"] == importlib.metadata.version("click")


def test_a_gguf_cut_short_in_its_tensor_data_is_not_valid(tmp_path: Path) -> None:
    """Issue 24 (stateful rule corrupt_weights): a GGUF whose header and metadata read well but whose tensor data
    was cut short (the first 2 MB of the tiny real model) read as valid weights, so the plan rolled onto it and
    every apply failed when llama-server could not load it."""
    from tests.llama import tiny_model

    whole = tiny_model().read_bytes()
    (tmp_path / "tiny.gguf").write_bytes(whole)
    meta = probe.model_metadata(str(tmp_path / "tiny.gguf"))
    assert "error" not in meta and meta["data_bytes"] > 0.9 * len(whole)
    for cut in (2_000_000, len(whole) - 1):
        (tmp_path / "cut.gguf").write_bytes(whole[:cut])
        error = probe.model_metadata(str(tmp_path / "cut.gguf"))["error"]
        assert error == f"not a valid GGUF file (truncated: its tensors need {len(whole)} bytes, the file has {cut})"


def test_an_engine_in_a_virtual_environment_of_the_probes_own_python_is_found(tmp_path: Path) -> None:
    """An engine pip-installed into a virtual environment made from the host's python3 (its bin/python links to
    that very binary): its version is read from the environment's own site-packages, not the probe's, which do
    not have it. The probe took such a venv's python for its own and reported the engine missing."""
    import venv

    root = tmp_path / "engine-venv"
    venv.EnvBuilder(with_pip=False, symlinks=True).create(root)
    python = root / "bin" / "python3"
    assert os.path.realpath(python) == os.path.realpath(sys.executable)  # the same binary, another environment
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    dist = Path(site) / "fake_engine-1.2.3.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-engine\nVersion: 1.2.3\n\n")
    script = root / "bin" / "fake-engine"
    script.write_text(f"#!{python}\nprint('serving')\n")
    script.chmod(0o755)
    assert not probe.is_own_python(str(python)) and probe.is_own_python(sys.executable)
    spec = {"fake": {"candidates": [str(script)], "probe": {"kind": "python_dist", "dist": "fake-engine"}}}
    args = {"models_dir": "/nonexistent", "cache_dir": "/tmp", "engines": spec}
    out = subprocess.run(
        [sys.executable, "-I", "-S", "-", json.dumps(args)], input=gather.probe_source(), capture_output=True, text=True
    )
    engines = json.loads(out.stdout)["engines"]
    assert engines["fake"]["version"] == "1.2.3" and engines["fake"]["path"] == str(script)


def test_an_engine_upgraded_in_its_environment_is_read_again_though_its_launcher_did_not_change(
    tmp_path: Path,
) -> None:
    """vLLM's `bin/vllm` (pip's console script) has the same bytes whatever release the environment holds, so the
    version cache keyed on the launcher's stat alone kept the old version after a `pip install` of another one. The
    environment's site-packages (whose NAME-VERSION.dist-info pip renames) is part of the key now. A real venv;
    the dist-info as pip writes it (METADATA's Version)."""
    env = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True, timeout=120)
    python = env / "bin" / "python3"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               capture_output=True, text=True, check=True, timeout=60).stdout.strip())  # fmt: skip
    launcher = env / "bin" / "vllm"
    launcher.write_text(f"#!{python}\nprint('vllm')\n")
    launcher.chmod(0o755)

    def install(version: str) -> None:
        for old in site.glob("vllm-*.dist-info"):
            shutil.rmtree(old)
        dist = site / f"vllm-{version}.dist-info"
        dist.mkdir()
        (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n\n")

    spec = {"vllm": {"candidates": [str(launcher)], "probe": {"kind": "python_dist", "dist": "vllm"}}}

    def read(known: dict[str, object]) -> dict[str, object]:
        return probe.engine_versions(probe.engines(spec, known))["vllm"]

    install("0.30.0")
    first = read({})
    assert first["version"] == "0.30.0"
    known = {str(launcher): {"stat": first["stat"], "version": "0.30.0"}}
    assert read(known)["version"] == "0.30.0"  # unchanged: the cached version, no interpreter started
    before = launcher.stat()
    install("0.31.0")
    assert launcher.stat().st_mtime_ns == before.st_mtime_ns and launcher.stat().st_ino == before.st_ino
    assert read(known)["version"] == "0.31.0"


def test_the_internal_key_goes_only_to_the_port_its_units_process_holds(tmp_path: Path) -> None:
    """A probe (session 16): with an on-demand replica scaled to zero, any local user bound its port, and every
    plan sent that listener the fleet's internal key. The key check now names its unit, and the probe sends the
    key only where that unit's MainPID (or a child of it) holds the listening socket (/proc/net/tcp's inode among
    /proc/PID/fd). Here a real listener in another process, then in this one."""
    seen: list[str] = []

    class Catch(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.headers.get("Authorization") or "")
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    key_file = tmp_path / "replica-key"
    key_file.write_text("ek-" + "a" * 40 + "\n")
    server = http.server.HTTPServer(("127.0.0.1", 0), Catch)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    check = {"port": port, "path": "/v1/models", "key_file": str(key_file), "unit": "engine-ctl-tz-0a.service"}
    try:
        other = subprocess.Popen(["sleep", "30"])  # a unit whose process is not the listener
        try:
            got = probe.key_checks([check], main_pids={"engine-ctl-tz-0a.service": str(other.pid)})
        finally:
            other.kill()
        assert got == {str(port): probe.NOT_ITS_UNIT} and seen == []
        assert probe.key_checks([check], main_pids={}) == {str(port): probe.NOT_ITS_UNIT} and seen == []  # not running
        mine = probe.key_checks([check], main_pids={"engine-ctl-tz-0a.service": str(os.getpid())})
        assert mine == {str(port): "200"} and seen == ["Bearer ek-" + "a" * 40]
        decided = probe.decisions([{**check, "body": "{}"}], main_pids={"engine-ctl-tz-0a.service": "0"})
        assert decided == {str(port): {"status": probe.NOT_ITS_UNIT, "body": ""}} and len(seen) == 1
    finally:
        server.shutdown()
        server.server_close()


def test_the_gateways_lineage_is_read_from_its_configurations_header() -> None:
    from engine_ctl.core.documents.inventory import Host as GatewayHost
    from engine_ctl.core.render.gateway import render_gateway

    host = GatewayHost(name="edge", address="127.0.0.1", transport="local")
    config = render_gateway(host, [], [], lineage="3f2c-lineage").files["haproxy.cfg"]
    assert probe.config_lineage(config.encode()) == "3f2c-lineage"
    assert probe.config_lineage(render_gateway(host, [], []).files["haproxy.cfg"].encode()) is None  # before lineages
    assert probe.config_lineage(b"global\n# lineage: late\n" + b"\n" * 20) == "late"
