"""vLLM and SGLang replicas over two machines on the real fleet (issue 30), with test doubles for what cannot run
here: the GPUs and the engines. Everything else is real: the facts probe, the fit, the units under systemd, the
gateway's HAProxy, apply's roll (the workers, then the head behind its health gate), plan and destroy.

The doubles, and where their formats come from:
- nvidia-smi: prints the recorded output of a real 8 x H100 machine (tests/recordings/nvidia-smi-8xH100.csv, the
  `--query-gpu=index,uuid,name,memory.total,memory.used,driver_version --format=csv,noheader,nounits` format of
  NVIDIA's nvidia-smi documentation; tests/recordings/README.md), its UUIDs made each machine's own, and no line
  for `--query-compute-apps` (no process on the GPUs), as the facts probe and apply's start-up sampler ask.
- The engines: tests/tools/group_engine_double.py, installed as `pip install` lays the engines out in a virtual
  environment (python3 -m venv): vLLM's `bin/vllm` console script, SGLang's `sglang` package run as
  `python -m sglang.launch_server`, and each one's NAME-VERSION.dist-info, which the facts probe reads for the
  version. Their multi-node argv and start-up order follow vLLM 0.30.0's docs/serving/parallelism_scaling.md
  ("Running vLLM with MultiProcessing", https://docs.vllm.ai/en/v0.30.0/serving/parallelism_scaling.html) and
  SGLang's multi-node deployment page (https://docs.sglang.io/references/multi_node_deployment/multi_node.html)
  with SGLang 0.5.22's srt/entrypoints/engine.py (docs/multinode-engines.md): the head listens on the
  rendezvous address and serves its API once every worker has joined; a worker dials the head and listens on no
  port first (SGLang's serves its health check after joining). Each records its argv and environment.
- The checkpoint: a config.json of a two-layer Llama (the keys Hugging Face's LlamaConfig writes) and a valid
  safetensors file (https://huggingface.co/docs/safetensors: a little-endian u64 header length, a JSON header,
  the tensor bytes).
"""

from __future__ import annotations

import json
import shlex
import struct
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine_ctl.core.documents.apikey import key_sha256
from tests.fleet import Fleet, FleetHost
from tests.fleetfacts import recording
from tests.fleetproject import MODELS_DIR, ROOT

pytestmark = pytest.mark.fleet
NAME = "grp"
KEY = "ak-test-engine-group-" + "e5" * 24
OPT = "/opt/engine-ctl-test"
DOUBLE = ROOT / "tests" / "tools" / "group_engine_double.py"
MODEL = "tiny-llama-st"
CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "hidden_size": 64, "intermediate_size": 128, "max_position_embeddings": 2048,
    "vocab_size": 256, "torch_dtype": "float16", "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
}  # fmt: skip
GPU_QUERY = "--query-gpu=index,uuid,name,memory.total,memory.used,driver_version"
# engine -> (its virtual environment, the executable the inventory names, the release its provider pins)
ENGINES = {
    "vllm": (f"{OPT}/vllm", f"{OPT}/vllm/bin/vllm", "0.30.0"),
    "sglang": (f"{OPT}/sglang", f"{OPT}/sglang/bin/python3", "0.5.22"),
}


def nvidia_smi(i: int) -> str:
    """The recorded 8 x H100 output for --query-gpu (UUIDs made machine i's own); nothing for --query-compute-apps
    (no process on the GPUs); anything else fails, so a query the double does not know is seen."""
    csv = recording("nvidia-smi-8xH100.csv").replace("GPU-2f7b6c1e", f"GPU-{i:08x}")
    return (
        "#!/bin/sh\n"
        'case "$*" in\n'
        f"  *{GPU_QUERY}*--format=csv,noheader,nounits*) cat <<'RECORDED'\n{csv}RECORDED\n  ;;\n"
        "  *--query-compute-apps=*--format=csv,noheader,nounits*) ;;\n"
        '  *) echo "the nvidia-smi double does not know: $*" >&2; exit 2;;\n'
        "esac\n"
    )


def safetensors() -> bytes:
    """One f16 tensor of 64 x 64 in the safetensors layout."""
    data = bytes(64 * 64 * 2)
    header = json.dumps({"model.embed_tokens.weight": {"dtype": "F16", "shape": [64, 64],
                                                       "data_offsets": [0, len(data)]}}).encode()  # fmt: skip
    return struct.pack("<Q", len(header)) + header + data


class EngineGroups:
    """An inventory (hosts[0] the gateway; hosts[1] and hosts[2] with the doubles, both engines named in their
    `engines:` and eth0 as their network_interface) and a project directory per engine, driven through the real
    CLI."""

    def __init__(self, path: Path, fleet: Fleet) -> None:
        self.path, self.fleet = path, fleet
        self.gateway, self.gpu_hosts = fleet.hosts[0], fleet.hosts[1:3]
        engines = ", ".join(f"{e}: {{path: {exe}, version: '{v}'}}" for e, (_, exe, v) in ENGINES.items())
        inventory = Path(fleet.inventory).read_text()
        for h in fleet.hosts[:3]:
            line = f"  - {{name: {h.name}, address: {h.address}}}"
            assert line in inventory
            # eth0: each fleet host's link to the others (tests/fleet.py)
            extra = ", roles: [gateway]" if h is self.gateway else f", network_interface: eth0, engines: {{{engines}}}"
            inventory = inventory.replace(line, line[:-1] + extra + "}")
        self.inventory = path / "hosts.yaml"
        self.inventory.write_text(inventory)

    def install_doubles(self) -> None:
        double = DOUBLE.read_text().split("\n", 1)[1]
        for i, h in enumerate(self.gpu_hosts, start=1):
            model = f"{MODELS_DIR}/{MODEL}"
            steps = [
                f"printf %s {shlex.quote(nvidia_smi(i))} > /usr/local/bin/nvidia-smi",
                "chmod 755 /usr/local/bin/nvidia-smi",
                f"mkdir -p {model}",
                f"printf %s {shlex.quote(json.dumps(CONFIG))} > {model}/config.json",
            ]
            for engine, (venv, _, version) in ENGINES.items():
                python = f"{venv}/bin/python3"
                self.ssh(h, f"/usr/bin/python3 -m venv --without-pip {venv}")
                site = self.ssh(h, f"{python} -c 'import sysconfig; print(sysconfig.get_path(\"purelib\"))'").strip()
                dist = f"{site}/{engine}-{version}.dist-info"
                steps += [
                    f"mkdir -p {dist}",
                    f"printf 'Metadata-Version: 2.1\\nName: {engine}\\nVersion: {version}\\n\\n' > {dist}/METADATA",
                    f"printf 'pip\\n' > {dist}/INSTALLER",
                ]
                if engine == "vllm":  # pip's console script: the venv's python runs it
                    script = shlex.quote(f"#!{python}\n{double}")
                    steps += [f"printf %s {script} > {venv}/bin/vllm", f"chmod 755 {venv}/bin/vllm"]
                else:  # the package, run as python -m sglang.launch_server
                    steps += [f"mkdir -p {site}/sglang", f": > {site}/sglang/__init__.py",
                              f"printf %s {shlex.quote(double)} > {site}/sglang/launch_server.py"]  # fmt: skip
            self.ssh(h, " && ".join(steps))
            subprocess.run([*self.fleet.ssh_argv(h), f"cat > {model}/model.safetensors"], input=safetensors(),
                           check=True, timeout=60)  # fmt: skip

    def remove_doubles(self) -> None:
        for h in self.gpu_hosts:
            self.ssh(h, f"rm -rf /usr/local/bin/nvidia-smi {OPT} {MODELS_DIR}/{MODEL} "
                        f"/var/cache/engine-ctl/{NAME}/*-double-rank*.json", check=False)  # fmt: skip

    def write(self, engine: str) -> Path:
        docs = self.path / engine
        docs.mkdir(exist_ok=True)
        (docs / "d.yaml").write_text(
            textwrap.dedent(
                f"""
                kind: Model
                metadata: {{name: tiny}}
                spec: {{format: safetensors, path: {MODEL}}}
                ---
                metadata: {{name: {NAME}}}
                spec:
                  model: tiny
                  engine: {engine}
                  accelerator: gpu
                  gpus: 1
                  cpu_cores: 1
                  nodes: 2
                  context_length: 1024
                ---
                kind: ApiKey
                metadata: {{name: all}}
                spec: {{sha256: {key_sha256(KEY)}}}
                """
            )
        )
        return docs

    def cli(self, docs: Path, *args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "engine_ctl", *args, str(docs), "--inventory", str(self.inventory)]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False, cwd=docs)
        assert "Traceback" not in proc.stderr, proc.stderr
        if check:
            assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc

    def state(self) -> dict:  # type: ignore[type-arg]
        """The project's state file (beside the inventory): one for both engines, which run one after the other."""
        state = self.path / "engine-ctl.state.json"
        return json.loads(state.read_text()) if state.exists() else {}  # type: ignore[no-any-return]

    def host(self, name: str) -> FleetHost:
        return next(h for h in self.fleet.hosts if h.name == name)

    def ssh(self, h: FleetHost, command: str, check: bool = True) -> str:
        return self.fleet.ssh(h, command, check=check).stdout

    def recorded(self, engine: str, host: FleetHost, rank: int) -> dict:  # type: ignore[type-arg]
        """What the double of member `rank` recorded: its argv, environment and times (CLOCK_MONOTONIC, s)."""
        return json.loads(self.ssh(host, f"cat /var/cache/engine-ctl/{NAME}/{engine}-double-rank{rank}.json"))  # type: ignore[no-any-return]

    def unit_times(self, host: FleetHost, unit: str) -> dict[str, int]:
        """systemd's monotonic timestamps of `unit` (µs): one kernel clock for every fleet host (containers share
        it), so an order across hosts is real."""
        props = ("ExecMainStartTimestampMonotonic", "ActiveEnterTimestampMonotonic")
        out = self.ssh(host, f"systemctl show {' '.join('-p ' + p for p in props)} {unit}")
        return {k: int(v) for k, v in (line.split("=", 1) for line in out.split())}


@pytest.fixture(scope="module")
def groups(fleet: Fleet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineGroups]:
    g = EngineGroups(tmp_path_factory.mktemp("enginegroups"), fleet)
    g.install_doubles()
    try:
        yield g
    finally:
        for engine in ENGINES:  # whatever a failed test left
            if (g.path / engine).exists() and NAME in g.state().get("deployments", {}):
                g.cli(g.path / engine, "destroy", "--auto-approve")
        fleet.ssh(g.gateway, "systemctl disable --now engine-ctl-gateway.service", check=False)
        g.remove_doubles()


def _option(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def _check_argv(engine: str, r: dict, m: dict, head: FleetHost, worker: FleetHost) -> None:  # type: ignore[type-arg]
    """The runtime's flags, as the engine's multi-node page writes them: the same group and rendezvous on every
    member, each its own rank; only the head serves the API."""
    h_argv, w_argv = r["argv"][1:], m["argv"][1:]
    for argv, rank in ((h_argv, "0"), (w_argv, "1")):
        assert _option(argv, "--nnodes") == "2" and _option(argv, "--node-rank") == rank
    if engine == "vllm":
        for argv in (h_argv, w_argv):
            assert argv[0] == "serve" and _option(argv, "--master-addr") == head.address
            assert _option(argv, "--master-port") == str(r["group_port"])
            assert _option(argv, "--pipeline-parallel-size") == "2" and _option(argv, "--tensor-parallel-size") == "1"
            assert _option(argv, "--distributed-executor-backend") == "mp"
        assert "--headless" in w_argv and "--port" not in w_argv and "--host" not in w_argv
        assert "--headless" not in h_argv
    else:
        for argv in (h_argv, w_argv):
            assert argv[:2] == ["-m", "sglang.launch_server"]
            assert _option(argv, "--dist-init-addr") == f"{head.address}:{r['group_port']}"
            assert _option(argv, "--tp-size") == "2"  # tensor parallel spans the group's GPUs
        assert (_option(w_argv, "--host"), _option(w_argv, "--port")) == (worker.address, str(m["port"]))
    assert (_option(h_argv, "--host"), _option(h_argv, "--port")) == (head.address, str(r["port"]))
    assert r["group_port"] != r["port"]


@pytest.mark.parametrize("engine", list(ENGINES))
def test_a_group_starts_its_worker_then_its_head_with_the_runtimes_argv_and_environment(
    groups: EngineGroups, engine: str
) -> None:
    g = groups
    docs = g.write(engine)
    applied = g.cli(docs, "apply", "--auto-approve", check=True)
    (r,) = g.state()["deployments"][NAME]["replicas"]
    (m,) = r["members"]
    head, worker = g.host(r["host"]), g.host(m["host"])
    assert {head.name, worker.name} == {h.name for h in g.gpu_hosts}  # the machines with GPUs; never the gateway
    out = applied.stdout
    # started, not gated on a port: the worker joins its head before it listens (if ever)
    assert f"group member 1 on {worker.name}: {m['unit']} started" in out, out
    assert out.index(f"group member 1 on {worker.name}") < out.index(f"{r['unit']} serving on port"), out

    # the order systemd saw: the worker was up before the head's process started; the head became active (its
    # health gate passed) only after the worker had joined its rendezvous port, from the worker's machine
    w_times, h_times = g.unit_times(worker, m["unit"]), g.unit_times(head, r["unit"])
    assert w_times["ActiveEnterTimestampMonotonic"] < h_times["ExecMainStartTimestampMonotonic"], (w_times, h_times)
    head_rec, worker_rec = g.recorded(engine, head, 0), g.recorded(engine, worker, 1)
    (joined,) = head_rec["workers"]
    assert joined["said"] == "rank 1" and joined["peer"] == worker.address
    assert joined["at"] * 1e6 < head_rec["serving"] * 1e6 < h_times["ActiveEnterTimestampMonotonic"]
    flags = 1 if engine == "vllm" else 3  # after `vllm` / `python3 -m sglang.launch_server`
    assert head_rec["argv"][1:] == r["argv"][flags:] and worker_rec["argv"][1:] == m["argv"][flags:]  # what runs
    _check_argv(engine, r, m, head, worker)

    # the environment: each member gives the others its own address; its GPU is the one placed on its machine
    host_ip = {"vllm": "VLLM_HOST_IP", "sglang": "SGLANG_HOST_IP"}[engine]
    for rec, host, gpus in ((head_rec, head, r["gpus"]), (worker_rec, worker, m["gpus"])):
        env = rec["env"]
        assert env[host_ip] == host.address
        assert env["CUDA_VISIBLE_DEVICES"] == ",".join(gpus) and len(gpus) == 1
        assert gpus[0].startswith(f"GPU-{1 + g.gpu_hosts.index(host):08x}-")  # from that machine's nvidia-smi
        assert env["HF_HUB_OFFLINE"] == "1"
        # the collective libraries' interface: the host's network_interface in the inventory, an interface it has
        assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == "eth0"
        assert host.address in g.ssh(host, "ip -4 -o addr show dev eth0")

    # the worker accepts only the group's hosts and has no port gate; the gateway sends requests to the head only
    unit = g.ssh(worker, f"cat /etc/systemd/system/{m['unit']}")
    assert f"IPAddressAllow=localhost {' '.join(sorted([head.address, worker.address]))}\n" in unit
    assert "ss -Hltn" not in unit
    config = g.ssh(g.gateway, "cat /etc/engine-ctl/gateway/haproxy.cfg")
    servers = [line.split() for line in config.splitlines() if line.strip().startswith("server ")]
    in_group = [s for s in servers if any(h.address in " ".join(s) for h in g.gpu_hosts)]
    assert len(in_group) == 1 and f"{head.address}:{r['port']}" in in_group[0], servers

    again = g.cli(docs, "plan", "--detailed-exitcode")
    assert again.returncode == 0, again.stdout + again.stderr

    # another release pip-installed into the head's environment: the launcher's bytes stay the same (vLLM's console
    # script, SGLang's python3), the dist-info's version does not; the plan names it, and no longer once put back
    venv, _, version = ENGINES[engine]
    newer = version.rsplit(".", 1)[0] + "." + str(int(version.rsplit(".", 1)[1]) + 1)
    dist = f"$({venv}/bin/python3 -c 'import sysconfig; print(sysconfig.get_path(\"purelib\"))')/{engine}"
    bump = (f"mv {dist}-{version}.dist-info {dist}-{newer}.dist-info && "
            f"sed -i 's/^Version: .*/Version: {newer}/' {dist}-{newer}.dist-info/METADATA")  # fmt: skip
    g.ssh(head, bump)
    upgraded = g.cli(docs, "plan", "--detailed-exitcode")
    said = upgraded.stdout + upgraded.stderr
    assert upgraded.returncode == 2, said
    assert f"the engine at {r['argv'][0]} on {head.name} changed: version {version} " in said, said
    assert f"→ {newer} " in said, said
    g.ssh(head, bump.replace(newer, "NEWER").replace(version, newer).replace("NEWER", version))
    back = g.cli(docs, "plan", "--detailed-exitcode")
    assert back.returncode == 0, back.stdout + back.stderr

    g.cli(docs, "destroy", "--auto-approve", check=True)
    for host, unit in ((head, r["unit"]), (worker, m["unit"])):
        assert g.ssh(host, f"test -e /etc/systemd/system/{unit} && echo present || echo gone").strip() == "gone"
        # no double runs on (the bracket keeps pgrep from matching the shell that runs it)
        assert g.ssh(host, f"pgrep -c -f '[{OPT[0]}]{OPT[1:]}' || true").strip() in ("", "0")
    assert f"{head.address}:{r['port']}" not in g.ssh(g.gateway, "cat /etc/engine-ctl/gateway/haproxy.cfg || true")
