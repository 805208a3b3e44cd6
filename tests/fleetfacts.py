"""HostFacts for machines of kinds the test machine does not have, built from recorded real tool output
(tests/recordings/README.md says where each format comes from)."""

from __future__ import annotations

from pathlib import Path

from engine_ctl.core.fit.hostfacts import Cpu, Gpu, HostFacts, Memory, parse_amd_smi, parse_nvidia_smi, parse_rocm_smi
from engine_ctl.core.sizes import GIB

RECORDINGS = Path(__file__).parent / "recordings"


def recording(name: str) -> str:
    return (RECORDINGS / name).read_text()


def gpu_host(name: str, gpus: list[Gpu], cores: int = 64, memory_gib: int = 1024) -> HostFacts:
    return HostFacts(
        host=name,
        hostname=name,
        arch="x86_64",
        cpu=Cpu(cores=cores, model="AMD EPYC 9454", flags=("avx2", "avx512f")),
        memory=Memory(total_bytes=memory_gib * GIB, available_bytes=(memory_gib - 16) * GIB),
        gpus=tuple(gpus),
    )


def h100x8(name: str = "gpu-h100") -> HostFacts:
    return gpu_host(name, parse_nvidia_smi(recording("nvidia-smi-8xH100.csv")), cores=96, memory_gib=2048)


def a100x4(name: str = "gpu-a100") -> HostFacts:
    return gpu_host(name, parse_nvidia_smi(recording("nvidia-smi-4xA100-one-busy.csv")), cores=64, memory_gib=512)


def mi300x2(name: str = "gpu-mi300") -> HostFacts:
    gpus = parse_amd_smi(recording("amd-smi-static-2xMI300X.json"), recording("amd-smi-metric-2xMI300X.json"))
    return gpu_host(name, gpus, cores=128, memory_gib=1536)


def mi210x2(name: str = "gpu-mi210") -> HostFacts:
    return gpu_host(name, parse_rocm_smi(recording("rocm-smi-2xMI210.json")), cores=32, memory_gib=256)


def cpu_host(name: str = "cpu-01", cores: int = 16, memory_gib: int = 64) -> HostFacts:
    return HostFacts(
        host=name,
        cpu=Cpu(cores=cores, model="Intel Xeon", flags=("avx2",)),
        memory=Memory(total_bytes=memory_gib * GIB, available_bytes=(memory_gib - 4) * GIB),
    )
