"""A project on the real fleet: a directory of documents with its own state file, driven through the real CLI
in a subprocess, and the fixtures that give each fleet test one (the tiny model on every host)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fleet import Fleet, FleetHost
from tests.llama import tiny_model, wrong_shape_model

MODELS_DIR = "/var/lib/engine-ctl/models"
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def weights(fleet: Fleet) -> None:
    """The tiny model (and a copy the engine refuses at load, corrupt.gguf) in every host's models_dir."""
    for h in fleet.hosts:
        fleet.ssh(
            h,
            f"mkdir -p {MODELS_DIR}/tiny && cp {tiny_model()} {MODELS_DIR}/tiny/tiny.gguf && "
            f"cp {wrong_shape_model()} {MODELS_DIR}/tiny/corrupt.gguf",  # whole, refused by the engine at load
        )


class Project:
    """A directory of documents with its own state file, driven through the real CLI in a subprocess."""

    def __init__(self, path: Path, fleet: Fleet, name: str) -> None:
        self.path, self.fleet, self.name = path, fleet, name
        self.state_file = path / "engine-ctl.state.json"

    def write(self, spec: str, model_file: str = "tiny.gguf") -> None:
        (self.path / "docs.yaml").write_text(
            textwrap.dedent(
                f"""
                kind: Model
                metadata: {{name: tiny}}
                spec: {{format: gguf, path: tiny/{model_file}, parameters: 4170048}}
                ---
                metadata: {{name: {self.name}}}
                spec:
                  model: tiny
                  accelerator: cpu
                """
            )
            + textwrap.indent(textwrap.dedent(spec).strip(), "  ")
            + "\n"
        )

    def cli(
        self, *args: str, check: bool = False, timeout: float = 300, docs: bool = True
    ) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "engine_ctl", *args]
        if docs and args[0] in ("plan", "apply", "destroy", "status", "list", "import"):
            argv += [str(self.path), "--inventory", self.fleet.inventory]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, cwd=ROOT)
        assert "Traceback" not in proc.stderr, proc.stderr
        if check:
            assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc

    def state(self) -> dict:  # type: ignore[type-arg]
        return json.loads(self.state_file.read_text())

    def replicas(self) -> list[dict]:  # type: ignore[type-arg]
        return self.state()["deployments"][self.name]["replicas"]

    def address(self, host: str) -> str:
        return next(h.address for h in self.fleet.hosts if h.name == host)

    def health(self, replica: dict) -> int | None:  # type: ignore[type-arg]
        try:
            with urllib.request.urlopen(
                f"http://{self.address(replica['host'])}:{replica['port']}/health", timeout=2
            ) as r:
                return int(r.status)
        except OSError:
            return None

    def chat(self, replica: dict) -> dict:  # type: ignore[type-arg]
        body = json.dumps({"model": self.name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        req = urllib.request.Request(
            f"http://{self.address(replica['host'])}:{replica['port']}/v1/chat/completions",
            data=body.encode(), headers={"Content-Type": "application/json"},
        )  # fmt: skip
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read())

    def host_of(self, replica: dict) -> FleetHost:  # type: ignore[type-arg]
        return next(x for x in self.fleet.hosts if x.name == replica["host"])

    def main_pid(self, replica: dict) -> int:  # type: ignore[type-arg]
        h = self.host_of(replica)
        return int(self.fleet.ssh(h, f"systemctl show -p MainPID --value {replica['unit']}").stdout)


@pytest.fixture
def project(tmp_path: Path, fleet: Fleet, weights: None, request: pytest.FixtureRequest) -> Iterator[Project]:
    name = "t-" + request.node.name.removeprefix("test_").replace("_", "-")[:30].rstrip("-")
    p = Project(tmp_path, fleet, name)
    yield p
    if p.state_file.exists():
        lock = p.state_file.with_name(p.state_file.name + ".lock")
        lock.unlink(missing_ok=True)
        p.cli("destroy", "--auto-approve")


def gateway_chat(address: str, key: str, model: str, timeout: float = 180) -> tuple[int, dict]:  # type: ignore[type-arg]
    """One chat completion through the gateway at `address` (port 8800): its HTTP status and JSON body."""
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    req = urllib.request.Request(
        f"http://{address}:8800/v1/chat/completions", data=body.encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())
