"""Rendered units on real systemd hosts: hardening scores, argv exactness, and a real llama-server serving."""

from __future__ import annotations

import base64
import json
import re
import shlex
import time

import pytest
from engine_ctl.providers import provider
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine_ctl.core.documents.engine_args import SHELL_CHARS
from engine_ctl.core.documents.inventory import Inventory
from engine_ctl.core.documents.yamlsource import NONCHARACTER
from engine_ctl.core.fit.runspec import FitPlan, ReplicaRun
from engine_ctl.core.model import Model
from engine_ctl.core.render.units import render_unit
from engine_ctl.shell.transport import SSHTransport
from tests.fleetfacts import h100x8
from tests.llama import llama_server_dir, tiny_model

pytestmark = pytest.mark.fleet

LLAMA = provider("llama.cpp")


def _plan(accelerator: str, gpus: int = 0, context: int = 1024, parallel: int = 2) -> FitPlan:
    return FitPlan(
        engine="llama.cpp", gpu_vendor="any", accelerator=accelerator, kind="chat", gpus=gpus, min_gpu_memory_gb=1,  # type: ignore[arg-type]
        memory_basis="arch", cpu_cores=2, threads=2 if accelerator == "cpu" else None, memory_bytes=2 << 30,
        context_length=context, parallel=parallel, weights_bytes=17_000_000, kv_cache_bytes=0,
    )  # fmt: skip


def _run(name: str, port: int, args: tuple[str, ...] = (), accelerator: str = "cpu") -> ReplicaRun:
    gpus = h100x8().gpus[:1] if accelerator == "gpu" else ()
    model = Model(name="tiny", format="gguf", path=str(tiny_model()))
    return ReplicaRun(
        deployment=name, model=model, model_path=str(tiny_model()),
        executable=str(llama_server_dir() / "bin" / "llama-server"), port=port,
        plan=_plan(accelerator, gpus=len(gpus)), threads=2, engine_args=args, gpus=gpus,
    )  # fmt: skip


def _install(t: SSHTransport, name: str, text: str) -> None:
    t.put(f"/etc/systemd/system/{name}", text.encode())
    assert t.run(["systemctl", "daemon-reload"]).exit_code == 0


def _exposure(t: SSHTransport, unit: str) -> float:
    out = t.run(["systemd-analyze", "security", "--no-pager", unit])
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", out.stdout + out.stderr)
    assert match, out.stdout[-2000:] + out.stderr
    return float(match.group(1))


def test_hardening_scores_on_a_fleet_host(fleet_inventory: Inventory) -> None:
    t = SSHTransport(fleet_inventory.hosts[0])
    try:
        cpu = render_unit(_run("sec-cpu", 8100), LLAMA, fleet_inventory.hosts[0])
        gpu = render_unit(_run("sec-gpu", 8101, accelerator="gpu"), LLAMA, fleet_inventory.hosts[0])
        _install(t, cpu.name, cpu.text)
        _install(t, gpu.name, gpu.text)
        cpu_score, gpu_score = _exposure(t, cpu.name), _exposure(t, gpu.name)
        assert cpu_score <= 2.0, cpu_score
        assert gpu_score <= 3.0, gpu_score
        # the floor: a unit with only DynamicUser scores far worse (8.2 here)
        _install(t, "engine-ctl-bare-0a.service", "[Service]\nType=exec\nDynamicUser=yes\nExecStart=/usr/bin/true\n")
        assert _exposure(t, "engine-ctl-bare-0a.service") > 7.0
    finally:
        t.run(["sh", "-c", "rm -f /etc/systemd/system/engine-ctl-*.service; systemctl daemon-reload"])
        t.close()


def test_a_rendered_unit_runs_the_real_llama_server_and_passes_its_health_gate(fleet_inventory: Inventory) -> None:
    host = fleet_inventory.hosts[1]
    t = SSHTransport(host)
    unit = render_unit(_run("tiny-chat", 8200, ("--temp", "0.7")), LLAMA, host)
    try:
        _install(t, unit.name, unit.text)
        started = time.monotonic()
        result = t.run(["systemctl", "start", unit.name], timeout=120)  # returns once ExecStartPost saw 200
        assert result.exit_code == 0, (
            result.stderr + t.run(["journalctl", "-u", unit.name, "--no-pager"]).stdout[-3000:]
        )
        assert time.monotonic() - started < 60
        state = t.run(["systemctl", "show", "-p", "ActiveState,SubState,User", unit.name]).stdout
        assert "ActiveState=active" in state and "SubState=running" in state
        # seed 000: its cores are a share, not a ceiling: systemd reads the weight by cores, and there is no quota
        cpu = t.run(["systemctl", "show", "-p", "CPUWeight,CPUQuotaPerSecUSec", unit.name]).stdout.split()
        assert sorted(cpu) == ["CPUQuotaPerSecUSec=infinity", "CPUWeight=200"], cpu
        body = json.dumps({"model": "tiny-chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        reply = t.run(
            [
                "curl",
                "-sf",
                "http://127.0.0.1:8200/v1/chat/completions",
                "-H",
                "Content-Type: application/json",
                "-d",
                body,
            ]
        )
        assert json.loads(reply.stdout)["model"] == "tiny-chat"
        metrics = t.run(["curl", "-sf", "http://127.0.0.1:8200/metrics"]).stdout
        assert LLAMA.in_flight_metric in metrics
        pid = int(t.run(["systemctl", "show", "-p", "MainPID", "--value", unit.name]).stdout)
        user = t.run(["ps", "-o", "user=", "-p", str(pid)]).stdout.strip()
        assert user not in ("root", "0")  # an unprivileged dynamic user
    finally:
        t.run(
            ["sh", "-c", f"systemctl stop {unit.name}; rm -f /etc/systemd/system/{unit.name}; systemctl daemon-reload"]
        )
        t.close()


# Arguments a user may write: any printable text without the refused shell characters, control characters or
# noncharacters (systemd refuses those: tests/test_systemd_escape.py).
allowed_text = st.text(
    alphabet=st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp"), blacklist_characters=SHELL_CHARS).filter(
        lambda ch: not NONCHARACTER.match(ch)
    ),
    max_size=40,
)
allowed_args = st.lists(
    st.one_of(allowed_text, st.sampled_from([";", "%n", "%%", "\"'", "a b", "--x=%h", "%i%%", "", " ", "\\;"])),
    max_size=6,
)


class _Host:
    transport: SSHTransport | None = None


BATCH = 20
"""Argument lists checked per round trip to the host: 10 examples of 20 check 200 argv lists, as 200 examples of one
did, with 10 daemon-reloads instead of 200."""


@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
@given(batch=st.lists(allowed_args, min_size=BATCH, max_size=BATCH))
def test_execstart_argv_is_exactly_what_was_rendered(fleet_inventory: Inventory, batch: list[list[str]]) -> None:
    """systemctl show -p ExecStart (read through D-Bus as JSON, the same property) gives back the exact argv."""
    host = fleet_inventory.hosts[2 % len(fleet_inventory.hosts)]
    if _Host.transport is None:
        _Host.transport = SSHTransport(host)
    t = _Host.transport
    units = [render_unit(_run(f"argv-check{i}", 8300 + i, tuple(args)), LLAMA, host) for i, args in enumerate(batch)]
    for unit in units:
        t.put(f"/etc/systemd/system/{unit.name}", unit.text.encode())
    assert t.run(["systemctl", "daemon-reload"]).exit_code == 0
    script = "; ".join(
        "p=$(busctl call org.freedesktop.systemd1 /org/freedesktop/systemd1 org.freedesktop.systemd1.Manager "
        f"LoadUnit s {shlex.quote(unit.name)} | cut -d'\"' -f2) && busctl --json=short get-property "
        'org.freedesktop.systemd1 "$p" org.freedesktop.systemd1.Service ExecStart && '
        f"systemctl show -p ExecStart {shlex.quote(unit.name)} | head -c 300 | base64 -w0 && echo"
        for unit in units
    )
    out = t.run(["sh", "-c", script])
    files = " ".join(f"/etc/systemd/system/{u.name}" for u in units)
    t.run(["sh", "-c", f"rm -f {files}; systemctl daemon-reload"])  # never started; left behind they are drift
    assert out.exit_code == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 2 * len(units), out.stdout[-2000:]
    for unit, data, shown in zip(units, lines[0::2], lines[1::2], strict=True):
        assert json.loads(data)["data"][0][1] == list(unit.argv)
        assert f"path={unit.argv[0]} ;" in base64.b64decode(shown).decode()
