"""The README's tutorial runs as written on a real host: every shell block, then the Python client, in order.

The blocks are read from README.md itself, so the tutorial cannot drift from the code. Only what names the
reader's own machine is replaced: the host's address, the llama-server's path, and the SSH key and known_hosts
the test fleet uses (added to `ssh`/`scp` and to the inventory's defaults). The host is a real systemd host with
sshd, HAProxy and the real llama-server (tests/fleet.py); the client is the official `openai` package."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fleet import Fleet
from tests.llama import LLAMA_VERSION, llama_engine, tiny_model

pytestmark = pytest.mark.fleet

ROOT = Path(__file__).resolve().parent.parent
ADDRESS = "10.0.0.11"
LLAMA = "/opt/llama.cpp/bin/llama-server"


def tutorial_blocks() -> list[tuple[str, str]]:
    """(language, code) of each fenced block of the README's tutorial section, in order."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Tutorial", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```(\w+)\n(.*?)```", section, re.DOTALL)


def test_the_tutorial_has_its_steps() -> None:
    blocks = tutorial_blocks()
    assert [lang for lang, _ in blocks].count("sh") >= 5 and blocks[-1][0] == "python"
    text = "\n".join(code for _, code in blocks)
    for step in ("cat > hosts.yaml", "scp ", "engine-ctl key new", "engine-ctl apply", "curl ", "OpenAI("):
        assert step in text, step


@pytest.fixture
def workdir(tmp_path: Path, fleet: Fleet) -> Iterator[Path]:
    yield tmp_path
    deploy = tmp_path / "deploy"
    if (deploy / "engine-ctl.state.json").exists():
        subprocess.run([str(ROOT / ".venv/bin/engine-ctl"), "destroy", "--auto-approve"], cwd=deploy,
                       capture_output=True, text=True, timeout=300, check=False)  # fmt: skip


def _localize(code: str, fleet: Fleet, address: str, llama: str) -> str:
    ssh_opts = f"-i {fleet.key} -o UserKnownHostsFile={fleet.known_hosts} -o StrictHostKeyChecking=yes"
    # the reader's build: the test's llama-server is not the seed's release, so its version is pinned (README)
    pinned = f'{{"path": "{llama}", "version": "{LLAMA_VERSION}"}}'
    code = code.replace(ADDRESS, address).replace(f"{{llama.cpp: {LLAMA}}}", f"{{llama.cpp: {pinned}}}")
    code = re.sub(r"^(\s*)(ssh|scp) ", rf"\1\2 {ssh_opts} ", code, flags=re.MULTILINE)
    return code.replace(
        "  user: root\n", f"  user: root\n  identity_file: {fleet.key}\n  known_hosts: {fleet.known_hosts}\n"
    )


def test_the_readme_tutorial_serves_a_token_through_the_gateway(fleet: Fleet, workdir: Path) -> None:
    host = fleet.hosts[-1]
    llama = llama_engine()["path"]
    fleet.ssh(host, "rm -rf /var/lib/engine-ctl/models/tiny-llama")
    (workdir / "deploy").mkdir()
    shutil.copy(tiny_model(), workdir / "deploy" / "tiny-llama-f32.gguf")  # the file the reader has
    blocks = tutorial_blocks()
    script = "set -euo pipefail\n" + "\n".join(
        _localize(code, fleet, host.address, llama) for lang, code in blocks if lang == "sh"
    )
    script += "\nprintf '%s' \"$OPENAI_API_KEY\" > ../key\n"
    env = {**os.environ, "PATH": f"{ROOT / '.venv/bin'}:{os.environ['PATH']}", "NO_COLOR": "1"}
    env.pop("OPENAI_API_KEY", None)
    ran = subprocess.run(["bash", "-c", script], cwd=workdir, env=env, capture_output=True, text=True, timeout=600)
    assert ran.returncode == 0, ran.stdout[-4000:] + ran.stderr[-4000:]
    assert "Traceback" not in ran.stderr
    assert '"choices"' in ran.stdout and '"model":"chat"' in ran.stdout.replace(" ", ""), ran.stdout[-2000:]

    python = _localize(blocks[-1][1], fleet, host.address, llama)
    env["OPENAI_API_KEY"] = (workdir / "key").read_text()
    client = subprocess.run([sys.executable, "-c", python], env=env, capture_output=True, text=True, timeout=120)
    assert client.returncode == 0, client.stderr[-3000:]
    assert client.stdout.endswith("\n"), "the openai client printed the reply's text"

    deploy = workdir / "deploy"
    again = subprocess.run(["engine-ctl", "plan", "--detailed-exitcode"], cwd=deploy, env=env, capture_output=True,
                           text=True, timeout=300)  # fmt: skip
    assert again.returncode == 0, again.stdout + again.stderr
    assert "No changes" in again.stdout
