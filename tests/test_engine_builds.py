"""Engine builds, pinned per platform: the seed's GPU-vendors table (001, "GPU vendors") down to the AMD gfx
target, the inventory's builds and pins, the facts of each build (the real probe, the real llama-server), the
hosts left out with their reason, and an engine changed under a replica."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
from engine_ctl.providers import PROVIDERS

from engine_ctl.core.diagnostics import InputError
from engine_ctl.core.documents.inventory import Host, load_inventory
from engine_ctl.core.fit.hostfacts import Cpu, EngineInstall, Gpu, HostFacts, Memory, parse_amd_smi
from engine_ctl.core.plan.engines import engine_drift_detail, engine_refusals
from engine_ctl.core.record.model import ReplicaRecord
from engine_ctl.shell.gather import gather_one
from engine_ctl.shell.transport import LocalTransport
from tests.helpers import write
from tests.llama import llama_rpc_dir, llama_server_dir

RECORDINGS = Path(__file__).parent / "recordings"
LLAMA, VLLM, SGLANG = PROVIDERS["llama.cpp"], PROVIDERS["vllm"], PROVIDERS["sglang"]


def amd(name: str, gfx: str | None) -> Gpu:
    return Gpu(index=0, uuid="GPU-1", name=name, vendor="amd", gfx_target=gfx)


# The seed's table: machine -> (llama.cpp's build, vLLM's build); None is the table's "—".
TABLE = [
    (Gpu(index=0, uuid="GPU-n", name="NVIDIA H100 80GB HBM3", vendor="nvidia"), "cuda", "cuda"),
    (amd("AMD Instinct MI300X", "gfx942"), "rocm", "rocm"),
    (amd("AMD Instinct MI250X", "gfx90a"), "rocm", "rocm"),
    (amd("AMD Instinct MI100", "gfx908"), "rocm", None),
    (amd("AMD Instinct MI355X", "gfx950"), None, "rocm"),
    (amd("AMD Radeon RX 7900 XTX", "gfx1100"), "rocm", "rocm"),
    (amd("AMD Radeon RX 7800 XT", "gfx1101"), "rocm", "rocm"),
    (amd("AMD Radeon RX 9070 XT", "gfx1201"), "rocm", "rocm"),
    (amd("AMD Ryzen AI Max+ 395", "gfx1151"), "rocm", "rocm"),
    (amd("AMD Radeon RX 7600", "gfx1102"), "rocm", None),
    (amd("AMD Radeon RX 6900 XT", "gfx1030"), "rocm", None),
    (amd("AMD Radeon RX 6700 XT", "gfx1031"), "vulkan", None),
    (amd("AMD Radeon RX 5700", "gfx1010"), "vulkan", None),
    (amd("AMD Radeon RX 6700 XT", None), "vulkan", None),  # no target reported: the name's row
    (amd("AMD Instinct MI300X", None), "rocm", "rocm"),
]


@pytest.mark.parametrize(("gpu", "llama", "vllm"), TABLE, ids=[f"{g.name}-{g.gfx_target}" for g, _, _ in TABLE])
def test_each_machine_runs_the_build_the_seeds_gpu_vendors_table_gives(gpu: Gpu, llama: str, vllm: str) -> None:
    assert LLAMA.build_platform(gpu) == llama
    assert VLLM.build_platform(gpu) == vllm and SGLANG.build_platform(gpu) == vllm
    assert (LLAMA.gpu_refusal(gpu) is None) == (llama is not None)


def test_cpus_run_the_cpu_build_of_llama_cpp_only() -> None:
    assert LLAMA.build_platform(None) == "cpu" and VLLM.build_platform(None) is None


def test_apple_silicon_runs_the_metal_build_of_llama_cpp_only() -> None:
    from engine_ctl.core.fit.hostfacts import parse_system_profiler

    (gpu,) = parse_system_profiler((RECORDINGS / "system-profiler-displays-M2Max.json").read_text())
    assert LLAMA.build_platform(gpu) == "metal" and LLAMA.gpu_refusal(gpu) is None
    assert VLLM.build_platform(gpu) is None and VLLM.gpu_refusal(gpu) == "vLLM does not run on apple GPUs"
    assert SGLANG.build_platform(gpu) is None


def test_the_gfx_target_comes_from_amd_smis_real_output() -> None:
    static = (RECORDINGS / "amd-smi-static-2xMI300X.json").read_text()
    assert {g.gfx_target for g in parse_amd_smi(static)} == {"gfx942"}


def test_the_inventory_names_one_build_per_platform_with_pins(tmp_path: Path) -> None:
    digest = "a" * 64
    inv = load_inventory(write(tmp_path, "hosts.yaml", f"""
        defaults:
          engines:
            llama.cpp: {{cuda: /opt/llama-cuda/llama-server, vulkan: /opt/llama-vk/llama-server, version: b5000}}
        hosts:
          - {{name: a, address: 198.18.0.11}}
          - name: b
            address: 198.18.0.12
            engines: {{llamacpp: {{cpu: /opt/llama-cpu/llama-server, sha256: {digest}}}, vllm: /opt/vllm/bin/vllm}}
        """))  # fmt: skip
    a, b = inv.hosts
    assert a.engine_builds == {"llama.cpp": {"cuda": "/opt/llama-cuda/llama-server",
                                             "vulkan": "/opt/llama-vk/llama-server"}}  # fmt: skip
    assert a.engine_pins == {"llama.cpp": {"version": "b5000"}} and a.engines == {}
    assert b.engine_builds == {"llama.cpp": {"cpu": "/opt/llama-cpu/llama-server"}}
    assert b.engine_pins == {"llama.cpp": {"sha256": digest}} and b.engines == {"vllm": "/opt/vllm/bin/vllm"}


@pytest.mark.parametrize(
    ("entry", "said"),
    [
        ("{cuda: /opt/a$b/llama-server}", "hosts[0].engines.llama.cpp.cuda: executable '/opt/a$b/llama-server'"),
        ("{cpu: /opt/l/llama-server, sha256: abc}", "hosts[0].engines.llama.cpp.sha256: 'abc': a sha256 is 64"),
        ("{version: b1}", "hosts[0].engines.llama.cpp: no build: name one per platform"),
        ("{rocm6: /opt/l/llama-server}", "rocm6"),
    ],
)
def test_a_wrong_build_entry_is_refused_at_its_place(tmp_path: Path, entry: str, said: str) -> None:
    path = write(tmp_path, "hosts.yaml", f"hosts:\n  - {{name: a, engines: {{llama.cpp: {entry}}}}}\n")
    with pytest.raises(InputError) as refused:
        load_inventory(path)
    text = "\n".join(d.render() for d in refused.value.diagnostics)
    assert said in text and "hosts.yaml:2" in text


def _facts(name: str, gpus: tuple[Gpu, ...] = (), **engines: EngineInstall) -> HostFacts:
    return HostFacts(host=name, cpu=Cpu(cores=8), memory=Memory(total_bytes=64 << 30, available_bytes=60 << 30),
                     gpus=gpus, engine_builds={"llama.cpp": dict(engines)})  # fmt: skip


def test_a_host_without_a_build_for_its_gpus_or_with_another_than_the_pinned_is_left_out_with_why() -> None:
    mi300 = (amd("AMD Instinct MI300X", "gfx942"),)
    cuda = EngineInstall(path="/opt/cuda/llama-server", version="version: 5000 (abc)", sha256="c" * 64)
    rocm = EngineInstall(path="/opt/rocm/llama-server", version="version: 4990 (def)", sha256="d" * 64)
    builds = {"llama.cpp": {"cuda": cuda.path, "rocm": rocm.path}}
    hosts = {
        "nv": Host(name="nv", address="x1", engine_builds={"llama.cpp": {"cuda": cuda.path}}),
        "amd-none": Host(name="amd-none", address="x2", engine_builds={"llama.cpp": {"cuda": cuda.path}}),
        "amd-pinned": Host(name="amd-pinned", address="x3", engine_builds=builds,
                           engine_pins={"llama.cpp": {"version": "5000"}}),
        "amd-sha": Host(name="amd-sha", address="x4", engine_builds=builds,
                        engine_pins={"llama.cpp": {"sha256": "d" * 64}}),
    }  # fmt: skip
    nvidia = (Gpu(index=0, uuid="GPU-n", name="NVIDIA H100", vendor="nvidia"),)
    facts = [
        _facts("nv", nvidia, cuda=cuda), _facts("amd-none", mi300, cuda=cuda),
        _facts("amd-pinned", mi300, cuda=cuda, rocm=rocm), _facts("amd-sha", mi300, cuda=cuda, rocm=rocm),
    ]  # fmt: skip
    refused = engine_refusals(LLAMA, "gpu", facts, hosts)
    assert set(refused) == {"amd-none", "amd-pinned"}
    assert refused["amd-none"] == ("no llama.cpp build for rocm on amd-none (the inventory names: cuda); add "
                                   "engines.llama.cpp.rocm")  # fmt: skip
    assert refused["amd-pinned"] == ("llama.cpp at /opt/rocm/llama-server on amd-pinned is version version: 4990 "
                                     "(def), not the pinned 5000")  # fmt: skip
    other = {"amd-sha": hosts["amd-sha"].model_copy(update={"engine_pins": {"llama.cpp": {"sha256": "e" * 64}}})}
    assert (
        "has sha256 dddddddddddd…, not the pinned eeeeeeeeeeee…"
        in engine_refusals(LLAMA, "gpu", [facts[3]], other)["amd-sha"]
    )


def test_an_engine_changed_under_a_replica_is_named_with_its_path_versions_and_digests() -> None:
    record = ReplicaRecord(index=0, host="h", unit="engine-ctl-d-0a.service", port=8000, unit_sha256="", revision=1,
                           argv=["/opt/l/llama-server", "--model", "m"], engine_version="version: 1",
                           engine_sha256="1" * 64)  # fmt: skip
    same = _facts("h", cpu=EngineInstall(path="/opt/l/llama-server", version="version: 1", sha256="1" * 64))
    assert engine_drift_detail(record, same) is None
    moved = _facts("h", cpu=EngineInstall(path="/opt/l/llama-server", version="version: 2", sha256="2" * 64))
    assert engine_drift_detail(record, moved) == (
        "the engine at /opt/l/llama-server on h changed: version version: 1 (sha256 111111111111…) → version: 2 "
        "(sha256 222222222222…); the replica restarts onto it"
    )
    # vLLM's console script, SGLang's python3: the same bytes whatever release the environment holds
    vllm = record.model_copy(update={"argv": ["/opt/v/bin/vllm", "serve"], "engine_version": "0.30.0"})
    upgraded = _facts("h", cpu=EngineInstall(path="/opt/v/bin/vllm", version="0.31.0", sha256="1" * 64))
    assert engine_drift_detail(vllm, upgraded) == (
        "the engine at /opt/v/bin/vllm on h changed: version 0.30.0 (sha256 111111111111…) → 0.31.0 "
        "(sha256 111111111111…); the replica restarts onto it"
    )
    for said in (None, "0.30.0", "load_backend: cut short"):  # not read this time, the same, no version in it
        now = _facts("h", cpu=EngineInstall(path="/opt/v/bin/vllm", version=said, sha256="1" * 64))
        assert engine_drift_detail(vllm, now) is None, said


def test_the_facts_report_each_builds_version_and_binary_sha256(tmp_path: Path) -> None:
    """The real probe, on this machine, with the real llama-server as the cpu build and a copy as the cuda one."""
    real = llama_server_dir() / "bin" / "llama-server"
    copy = tmp_path / "bin" / "llama-server"
    shutil.copytree(real.parent, copy.parent)
    with copy.open("ab") as f:  # another build: other bytes, the same program
        f.write(b"\0")
    host = Host(name="here", address="127.0.0.1", transport="local",
                engine_builds={"llama.cpp": {"cpu": str(real), "cuda": str(copy)}})  # fmt: skip
    facts = gather_one(LocalTransport(host))
    found = facts.engine_builds["llama.cpp"]
    assert found["cpu"].path == str(real) and found["cpu"].sha256 == hashlib.sha256(real.read_bytes()).hexdigest()
    assert found["cuda"].sha256 == hashlib.sha256(copy.read_bytes()).hexdigest() != found["cpu"].sha256
    assert "0.6.0-dev" in (found["cpu"].version or "") and "0.6.0-dev" in (found["cuda"].version or "")
    assert os.access(copy, os.X_OK)


def test_the_facts_report_the_sha256_of_the_rpc_server_a_group_worker_runs_beside_each_build() -> None:
    """The real probe, on this machine, with the real RPC build (llama.cpp's -DGGML_RPC=ON): ggml-rpc-server
    beside each llama-server the inventory names is hashed (never started: it has no version flag), so that a
    worker's binary changed under a replica group is drift (tests/test_multinode.py)."""
    from engine_ctl.core.plan.engines import engine_at
    from engine_ctl.shell.gather import worker_binaries

    rpc = llama_rpc_dir() / "bin"
    host = Host(name="here", address="127.0.0.1", transport="local",
                engine_builds={"llama.cpp": {"cpu": str(rpc / "llama-server")}})  # fmt: skip
    server = str(rpc / "ggml-rpc-server")
    assert worker_binaries(host) == {server: {"candidates": [server], "probe": {}}}
    assert worker_binaries(Host(name="x", address="x")) == {
        "/usr/local/bin/ggml-rpc-server": {"candidates": ["/usr/local/bin/ggml-rpc-server"], "probe": {}}
    }
    facts = gather_one(LocalTransport(host))
    found = engine_at(facts, server)
    assert found is not None and found.path == server and found.version is None
    assert found.sha256 == hashlib.sha256((rpc / "ggml-rpc-server").read_bytes()).hexdigest()


def test_a_mac_with_apple_silicon_runs_the_metal_build_the_inventory_names() -> None:
    from engine_ctl.core.fit.hostfacts import parse_system_profiler
    from engine_ctl.core.plan.engines import build_for, host_platform

    gpus = tuple(parse_system_profiler((RECORDINGS / "system-profiler-displays-M2Max.json").read_text()))
    metal = EngineInstall(path="/opt/llama-metal/llama-server", version="version: 5000 (abc)", sha256="f" * 64)
    named = {"llama.cpp": {"metal": metal.path, "cuda": "/opt/cuda/llama-server"}}
    mac = Host(name="mac", address="x5", engine_builds=named)
    facts = _facts("mac", gpus, metal=metal)
    assert host_platform(LLAMA, "gpu", facts) == "metal" and build_for(LLAMA, mac, "metal") == metal.path
    assert engine_refusals(LLAMA, "gpu", [facts], {"mac": mac}) == {}
    cuda_only = Host(name="mac", address="x5", engine_builds={"llama.cpp": {"cuda": "/opt/cuda/llama-server"}})
    assert engine_refusals(LLAMA, "gpu", [facts], {"mac": cuda_only})["mac"] == (
        "no llama.cpp build for metal on mac (the inventory names: cuda); add engines.llama.cpp.metal"
    )


def test_a_binarys_sha256_is_read_again_only_when_the_binary_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real probe on this machine: the digest is cached by path, mtime, size, ctime and inode (issue 10), so an
    unchanged engine is not hashed on every facts; a rewrite is noticed even with its mtime and size put back."""
    monkeypatch.setenv("ENGINE_CTL_CACHE_DIR", str(tmp_path / "cache"))
    real = llama_server_dir() / "bin" / "llama-server"
    copy = tmp_path / "bin" / "llama-server"
    shutil.copytree(real.parent, copy.parent)
    host = Host(name="here", address="127.0.0.1", transport="local", engine_builds={"llama.cpp": {"cpu": str(copy)}})
    first = gather_one(LocalTransport(host)).engine_builds["llama.cpp"]["cpu"]
    assert first.sha256 == hashlib.sha256(copy.read_bytes()).hexdigest()
    cache = tmp_path / "cache" / "engine-versions" / "here.json"
    known = json.loads(cache.read_text())
    assert known[str(copy)]["sha256"] == first.sha256 and known[str(copy)]["version"] == first.version
    known[str(copy)]["sha256"] = "0" * 64  # what the cache says is what the facts say while the file is unchanged
    cache.write_text(json.dumps(known))
    assert gather_one(LocalTransport(host)).engine_builds["llama.cpp"]["cpu"].sha256 == "0" * 64
    before = copy.stat()
    data = bytearray(copy.read_bytes())
    data[-1] ^= 0xFF  # the same size, other bytes, written in place; then the old mtime put back
    copy.write_bytes(bytes(data))
    os.utime(copy, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert copy.stat().st_size == before.st_size and copy.stat().st_mtime_ns == before.st_mtime_ns
    again = gather_one(LocalTransport(host)).engine_builds["llama.cpp"]["cpu"]
    assert again.sha256 == hashlib.sha256(bytes(data)).hexdigest() != first.sha256


# --- issue 25 point 10: engine list and engine add (seed 003, "Add an engine") --------------------------------


def test_engine_rows_group_hosts_by_the_version_and_digest_their_build_reports() -> None:
    from engine_ctl.core.plan.enginelist import engine_rows

    old = EngineInstall(path="/opt/l/llama-server", version="version: 0.5.0 (b1)", sha256="a" * 64)
    new = EngineInstall(path="/opt/l/llama-server", version="version: 0.6.0-dev (b2)", sha256="b" * 64)
    builds = {"llama.cpp": {"cpu": "/opt/l/llama-server"}}
    hosts = [Host(name=n, address=n, engine_builds=builds) for n in ("h1", "h2", "h3", "h4", "h5")]
    hosts.append(Host(name="h6", address="h6", engines={"vllm": "/opt/v/vllm"}))
    facts = {"h1": _facts("h1", cpu=old), "h2": _facts("h2", cpu=new), "h3": _facts("h3", cpu=new),
             "h4": _facts("h4"), "h6": _facts("h6")}  # fmt: skip
    rows = engine_rows(hosts, facts)
    assert [(r.engine, r.build, r.version, r.hosts) for r in rows] == [
        ("llama.cpp", "cpu", "0.5.0", ("h1",)), ("llama.cpp", "cpu", "0.6.0-dev", ("h2", "h3")),
        ("vllm", "any", None, ()),
    ]  # fmt: skip
    assert rows[0].missing == ("h4",) and rows[0].unknown == ("h5",) and rows[2].missing == ("h6",)


def test_engine_add_pins_the_version_only_when_every_build_of_the_engine_reports_it() -> None:
    from engine_ctl.core.plan.enginelist import registration

    made = registration(LLAMA, "/opt/n/llama-server", None, ["cpu"], ["version: 0.6.0-dev (b2)"])
    assert not isinstance(made, str) and made.entry == {"cpu": "/opt/n/llama-server", "version": "0.6.0-dev"}
    existing = {"cuda": "/opt/c/llama-server", "version": "0.5.0", "sha256": "c" * 64}
    mixed = registration(LLAMA, "/opt/n/llama-server", existing, ["cpu"], ["version: 0.6.0-dev"], ["version: 0.5.0"],
                         ["d" * 64])  # fmt: skip
    assert not isinstance(mixed, str) and "version" not in mixed.entry and "sha256" not in mixed.entry
    assert mixed.entry == {"cuda": "/opt/c/llama-server", "cpu": "/opt/n/llama-server"}
    assert registration(LLAMA, "/opt/n/llama-server", "/opt/other/llama-server", ["cpu"], []) == (
        "engines.llama.cpp is /opt/other/llama-server, one executable for every platform; remove it, or write its "
        "builds per platform, before adding another"
    )
    assert registration(LLAMA, "/opt/n/x", None, ["tpu"], []) == "--build tpu: one of cuda, rocm, vulkan, metal, cpu"


# --- issue 25 point 15: the seed's releases by default (seed 001: llama.cpp v0.5.0, vLLM v0.30.0) ------------------


def test_a_build_of_another_version_than_the_seeds_release_runs_only_where_the_inventory_pins_it(
    tmp_path: Path,
) -> None:
    inv = load_inventory(write(tmp_path, "hosts.yaml", """
        hosts:
          - {name: plain, address: 198.18.0.11, engines: {llama.cpp: /opt/l/llama-server, vllm: /opt/v/vllm}}
          - name: pinned
            address: 198.18.0.12
            engines: {llama.cpp: {path: /opt/l/llama-server, version: 0.6.0-dev}}
        """))  # fmt: skip
    plain, pinned = inv.hosts
    assert plain.engines == {"llama.cpp": "/opt/l/llama-server", "vllm": "/opt/v/vllm"} and not plain.engine_pins
    assert pinned.engines == {"llama.cpp": "/opt/l/llama-server"} and not pinned.engine_builds
    assert pinned.engine_pins == {"llama.cpp": {"version": "0.6.0-dev"}}
    assert (LLAMA.release, VLLM.release) == ("0.5.0", "0.30.0")

    def facts(name: str, said: str | None, engine: str = "llama.cpp", path: str = "/opt/l/llama-server") -> HostFacts:
        found = EngineInstall(path=path, version=said, sha256="a" * 64)
        gpus = (TABLE[0][0],) if engine == "vllm" else ()
        return HostFacts(host=name, cpu=Cpu(cores=8), memory=Memory(total_bytes=64 << 30, available_bytes=60 << 30),
                         gpus=gpus, engines={engine: found})  # fmt: skip

    hosts = {"plain": plain, "pinned": pinned}
    dev = "version: 0.6.0-dev (build 0, commit unknown)"
    assert engine_refusals(LLAMA, "cpu", [facts("plain", dev), facts("pinned", dev)], hosts) == {
        "plain": "llama.cpp at /opt/l/llama-server on plain is version 0.6.0-dev, not the release engine-ctl runs by "
        "default (0.5.0): pin it in the inventory to run it (engines.llama.cpp.version: 0.6.0-dev)"
    }  # fmt: skip
    # the seed's release runs unpinned; a pin is the pinned version only, the release included
    release = "version: 0.5.0 (build 1, commit abc)"
    assert engine_refusals(LLAMA, "cpu", [facts("plain", release)], hosts) == {}
    assert "not the pinned 0.6.0-dev" in engine_refusals(LLAMA, "cpu", [facts("pinned", release)], hosts)["pinned"]
    # vLLM: the same rule, its release 0.30.0 (vllm --version prints the bare version)
    vllm = {"plain": facts("plain", "0.31.0", "vllm", "/opt/v/vllm")}
    assert "is version 0.31.0, not the release engine-ctl runs by default (0.30.0)" in engine_refusals(
        VLLM, "gpu", list(vllm.values()), hosts
    )["plain"]  # fmt: skip
    assert engine_refusals(VLLM, "gpu", [facts("plain", "0.30.0", "vllm", "/opt/v/vllm")], hosts) == {}


def test_the_plan_names_the_version_of_the_build_it_found(tmp_path: Path) -> None:
    from engine_ctl.cli.views.plan import _replica_lines
    from engine_ctl.core.documents.inventory import Inventory
    from engine_ctl.core.plan.engines import with_engines
    from engine_ctl.core.plan.planner import make_plan
    from engine_ctl.core.record.model import State
    from tests.fleetfacts import cpu_host
    from tests.test_plan_promise import SHAPE, desired

    build = "/opt/l/llama-server"
    host = Host(name="h1", address="h1", models_dir="/srv/models", engines={"llama.cpp": build},
                engine_pins={"llama.cpp": {"version": "0.6.0-dev"}})  # fmt: skip
    found = EngineInstall(path=build, version="version: 0.6.0-dev (build 0, commit unknown)", sha256="ab" * 32)
    facts = {"h1": cpu_host("h1").model_copy(update={"engines": {"llama.cpp": found}})}
    p = with_engines(make_plan(desired("path: m/m.gguf"), State(), Inventory(hosts=(host,)), facts, {"m": SHAPE}),
                     facts)  # fmt: skip
    (step,) = p.changes[0].replicas
    assert f"    engine: version 0.6.0-dev (sha256 {'ab' * 6}…)" in _replica_lines(step)
    unpinned = Inventory(hosts=(host.model_copy(update={"engine_pins": {}}),))
    refused = make_plan(desired("path: m/m.gguf"), State(), unpinned, facts, {"m": SHAPE})
    assert not refused.changes[0].replicas
    assert "not the release engine-ctl runs by default (0.5.0)" in json.dumps(refused.changes[0].model_dump())
