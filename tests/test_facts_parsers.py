"""The GPU recordings parse into the right GPUs, memory and UUIDs."""

from __future__ import annotations

from engine_ctl.core.fit.hostfacts import parse_amd_smi, parse_nvidia_smi, parse_rocm_smi
from tests.fleetfacts import recording

MIB = 1024**2


def test_nvidia_8x_h100() -> None:
    gpus = parse_nvidia_smi(recording("nvidia-smi-8xH100.csv"))
    assert [g.index for g in gpus] == list(range(8))
    assert {g.name for g in gpus} == {"NVIDIA H100 80GB HBM3"}
    assert gpus[0].memory_total_bytes == 81559 * MIB and gpus[0].memory_used_bytes == 0
    assert gpus[7].uuid == "GPU-2f7b6c1e-5a0d-4c3e-9b1f-0a1b2c3d4e57"
    assert gpus[0].driver_version == "550.54.15" and gpus[0].vendor == "nvidia"


def test_nvidia_4x_a100_one_busy() -> None:
    gpus = parse_nvidia_smi(recording("nvidia-smi-4xA100-one-busy.csv"))
    assert [g.memory_used_bytes for g in gpus] == [38712 * MIB, 4 * MIB, 4 * MIB, 4 * MIB]
    assert gpus[0].memory_total_bytes == 40960 * MIB


def test_nvidia_na_fields() -> None:
    a, b = parse_nvidia_smi(recording("nvidia-smi-na-fields.csv"))
    assert a.memory_total_bytes == 24564 * MIB and a.memory_used_bytes is None
    assert b.memory_total_bytes is None and b.driver_version is None
    assert b.uuid == "GPU-5d4c3b2a-1908-4f7e-a6d5-c4b3a2918071"


def test_amd_smi_2x_mi300x() -> None:
    gpus = parse_amd_smi(recording("amd-smi-static-2xMI300X.json"), recording("amd-smi-metric-2xMI300X.json"))
    assert [g.name for g in gpus] == ["AMD Instinct MI300X"] * 2
    assert gpus[0].memory_total_bytes == 196592 * MIB
    assert gpus[0].memory_used_bytes == 283 * MIB and gpus[1].memory_used_bytes is None
    assert [g.uuid for g in gpus] == ["GPU-3a1f6c2d8e4b5970", "GPU-3a1f6c2d8e4b5971"]
    assert gpus[0].vendor == "amd" and gpus[0].driver_version == "6.8.5"


def test_rocm_smi_json() -> None:
    gpus = parse_rocm_smi(recording("rocm-smi-2xMI210.json"))
    assert [g.index for g in gpus] == [0, 1]
    assert gpus[0].memory_total_bytes == 68702699520 and gpus[1].memory_used_bytes is None
    assert gpus[0].uuid == "GPU-8c7e5f4a3b2d1e0f" and gpus[0].name == "AMD Instinct MI210"
    assert gpus[0].driver_version == "6.3.6"


def test_a_failing_gpu_tool_is_a_warning_and_the_others_still_parse() -> None:
    from engine_ctl.shell.gather import _gpus

    gpus, warnings = _gpus(
        {
            "nvidia_smi": {"code": 0, "out": recording("nvidia-smi-8xH100.csv"), "err": ""},
            "amd_smi_static": {"code": 0, "out": recording("amd-smi-static-2xMI300X.json"), "err": ""},
            "amd_smi_metric": {"code": 0, "out": recording("amd-smi-metric-2xMI300X.json"), "err": ""},
            "rocm_smi": {"code": 2, "out": "", "err": "rocm-smi: no devices\n"},
        }
    )
    assert [g.vendor for g in gpus] == ["nvidia"] * 8 + ["amd"] * 2
    assert gpus[8].memory_used_bytes == 283 * MIB
    assert warnings == ["rocm-smi failed (exit 2): rocm-smi: no devices"]


def test_system_profiler_apple_silicon_is_one_metal_gpu_sharing_the_machines_memory() -> None:
    """tests/recordings/README.md names where the format comes from (a test double: no Mac runs here)."""
    from engine_ctl.core.fit.hostfacts import parse_system_profiler

    (gpu,) = parse_system_profiler(
        recording("system-profiler-displays-M2Max.json"), recording("sysctl-hw-memsize-64GiB.txt")
    )
    assert gpu.vendor == "apple" and gpu.name == "Apple M2 Max (38-core GPU)" and gpu.uuid == "metal0"
    assert gpu.memory_total_bytes == 64 * 1024 * MIB * 3 // 4  # Metal's working-set share above 36 GiB
    assert gpu.driver_version == "metal3"
    (small,) = parse_system_profiler(recording("system-profiler-displays-M2Max.json"), "17179869184\n")
    assert small.memory_total_bytes == 16 * 1024 * MIB * 2 // 3
    (unknown,) = parse_system_profiler(recording("system-profiler-displays-M2Max.json"))
    assert unknown.memory_total_bytes is None


def test_system_profiler_skips_gpus_that_are_not_apple_silicon_with_metal() -> None:
    import json

    from engine_ctl.core.fit.hostfacts import parse_system_profiler

    doc = json.loads(recording("system-profiler-displays-M2Max.json"))
    intel_mac_radeon = {"_name": "AMD Radeon Pro 5500M", "spdisplays_vendor": "sppci_vendor_amd",
                        "spdisplays_vram": "8 GB", "sppci_model": "AMD Radeon Pro 5500M",
                        "spdisplays_mtlgpufamilysupport": "spdisplays_metal3"}  # fmt: skip
    no_metal = {**doc["SPDisplaysDataType"][0]}
    del no_metal["spdisplays_mtlgpufamilysupport"]
    assert parse_system_profiler(json.dumps({"SPDisplaysDataType": [intel_mac_radeon, no_metal]})) == []
    assert parse_system_profiler("system_profiler: not JSON") == []
    assert parse_system_profiler("[]") == []


def test_the_gathered_facts_carry_the_metal_gpu() -> None:
    from engine_ctl.shell.gather import _gpus

    gpus, warnings = _gpus(
        {
            "system_profiler": {"code": 0, "out": recording("system-profiler-displays-M2Max.json"), "err": ""},
            "hw_memsize": {"code": 0, "out": recording("sysctl-hw-memsize-64GiB.txt"), "err": ""},
        }
    )
    assert [(g.vendor, g.memory_total_bytes) for g in gpus] == [("apple", 48 * 1024 * MIB)] and warnings == []
