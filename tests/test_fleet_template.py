"""The model's Jinja chat template reaches the real llama-server through the unit, and the engine cache is the
inventory's cache_dir: on a real systemd host (systemd 252), with the real llama-server."""

from __future__ import annotations

import json

import pytest
from engine_ctl.providers import provider

from engine_ctl.core.documents.inventory import Inventory
from engine_ctl.core.fit.runspec import FitPlan, ReplicaRun
from engine_ctl.core.model import Model
from engine_ctl.core.render.units import chat_template_path, render_unit, unit_name
from engine_ctl.shell.transport import SSHTransport
from tests.llama import llama_server_dir, tiny_model

pytestmark = pytest.mark.fleet

LLAMA = provider("llama.cpp")
# Jinja with what a unit file would otherwise mangle: a leading space, newlines, %, quotes, a backslash, non-ASCII.
TEMPLATE = (
    ' {%- for m in messages %}<|{{ m.role }}|>\n{{ m.content }} 100% "q" \\ naïve — ok\n{% endfor %}'
    "{%- if add_generation_prompt %}<|assistant|>\n{% endif %} "
)


def _run(port: int) -> ReplicaRun:
    plan = FitPlan(
        engine="llama.cpp", gpu_vendor="any", accelerator="cpu", kind="chat", gpus=0, min_gpu_memory_gb=0,
        memory_basis="arch", cpu_cores=2, threads=2, memory_bytes=2 << 30, context_length=512, parallel=1,
        weights_bytes=17_000_000, kv_cache_bytes=1 << 20,
    )  # fmt: skip
    model = Model(name="tiny", format="gguf", path=str(tiny_model()), chat_template=TEMPLATE)
    return ReplicaRun(
        deployment="tmpl", model=model, model_path=str(tiny_model()), port=port, plan=plan, threads=2,
        executable=str(llama_server_dir() / "bin" / "llama-server"),
        chat_template_file=chat_template_path(unit_name("tmpl", 0, "a")), cache_dir="/var/cache/engine-ctl/tmpl",
    )  # fmt: skip


def test_the_jinja_template_is_the_servers_and_the_cache_is_the_units(fleet_inventory: Inventory) -> None:
    host = fleet_inventory.hosts[-1]
    t = SSHTransport(host)
    unit = render_unit(_run(8400), LLAMA, host)
    try:
        t.put(f"/etc/systemd/system/{unit.name}", unit.text.encode())
        assert t.run(["systemctl", "daemon-reload"]).exit_code == 0
        started = t.run(["systemctl", "start", unit.name], timeout=120)
        journal = t.run(["journalctl", "-u", unit.name, "--no-pager"]).stdout[-3000:]
        assert started.exit_code == 0, started.stderr + journal
        props = json.loads(t.run(["curl", "-sf", "http://127.0.0.1:8400/props"]).stdout)
        assert props["chat_template"] == TEMPLATE  # byte for byte, through SetCredential's escaping
        pid = t.run(["systemctl", "show", "-p", "MainPID", "--value", unit.name]).stdout.strip()
        environ = t.run(["sh", "-c", f"tr '\\0' '\\n' < /proc/{pid}/environ"]).stdout.splitlines()
        for key in ("HOME", "XDG_CACHE_HOME", "LLAMA_CACHE"):
            assert f"{key}=/var/cache/engine-ctl/tmpl" in environ
        # systemd made the cache directory, owned by the unit's own dynamic user: the engine can write there
        owner = t.run(["stat", "-c", "%u", "/var/cache/private/engine-ctl/tmpl"]).stdout.strip()
        assert owner == t.run(["ps", "-o", "uid=", "-p", pid]).stdout.strip() and owner != "0"
    finally:
        t.run(
            ["sh", "-c", f"systemctl stop {unit.name}; rm -f /etc/systemd/system/{unit.name}; systemctl daemon-reload"]
        )
        t.close()
