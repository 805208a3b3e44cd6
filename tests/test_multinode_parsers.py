"""Issue 30: a vLLM or SGLang replica over several machines. The head's and the workers' argv, as the providers
render them, pass the engines' OWN parsers, for the releases the providers pin, on a CPU machine:

- vLLM 0.30.0: the parser `vllm` builds for `serve` (vllm/entrypoints/cli/serve.py), its checks and
  EngineArgs.from_cli_args, with VLLM_TARGET_DEVICE=cpu;
- SGLang 0.5.22: sglang.srt.server_args.prepare_server_args (what launch_server.py calls), with its light
  dependencies only.

Each runs in its own virtual environment, cached outside the repository by tests/tools/engine_venv.sh (CI builds
both before the tests, .ci/run), through tests/tools/engine_parse.py. The formats follow vLLM's
docs/serving/parallelism_scaling.md ("Running vLLM with MultiProcessing") and SGLang's multi-node deployment page
(references/multi_node_deployment/multi_node.md); see docs/multinode-engines.md.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
from engine_ctl.providers import provider
from engine_ctl.providers.base import Group
from engine_ctl.providers.sglang import RELEASE as SGLANG_RELEASE
from engine_ctl.providers.vllm import RELEASE as VLLM_RELEASE

from engine_ctl.core.documents.engine_args import check_engine_args
from engine_ctl.core.fit.runspec import FitPlan, ReplicaRun
from engine_ctl.core.model import Model
from tests.fleetfacts import h100x8

pytestmark = pytest.mark.slow  # each engine's parser imports torch and the engine in its own venv: seconds a batch

ROOT = Path(__file__).resolve().parent.parent
VENV_SCRIPT = ROOT / "tests" / "tools" / "engine_venv.sh"
HARNESS = ROOT / "tests" / "tools" / "engine_parse.py"
CACHE_ROOT = Path(os.environ.get("ENGINE_CTL_CACHE", "/var/cache/engine-ctl"))
RELEASES = {"vllm": VLLM_RELEASE, "sglang": SGLANG_RELEASE}
MODEL = Path(tempfile.gettempdir()) / "engine-ctl-multinode-parsers" / "big"
"""The checkpoint directory the argv names: it must exist, as on a host (vLLM's EngineArgs takes a path that does
not exist for a Hugging Face repository id and refuses it); an empty directory is enough for the parsers."""
EXECUTABLES = {"vllm": "/usr/local/bin/vllm", "sglang": "/usr/bin/python3"}

# (nodes, GPUs per node, the collective library's interface)
GROUPS = [(2, 1, None), (2, 8, "eth1"), (4, 1, "ens5"), (4, 8, None)]


def venv_python(engine: str) -> Path:
    """The engine's cached virtual environment's python; fails (never skips) when it is missing."""
    venv = CACHE_ROOT / f"{engine}-{RELEASES[engine]}-venv"
    python = venv / "bin" / "python"
    if not (python.exists() and (venv / ".complete").exists()):
        pytest.fail(
            f"{venv} is missing: run `bash {VENV_SCRIPT.relative_to(ROOT)} {engine}` first (.ci/run does); "
            f"it installs {engine} {RELEASES[engine]} and what its parser needs into that cached venv"
        )
    return python


def run_parser(engine: str, argvs: list[list[str]]) -> list[dict[str, Any]]:
    """The engine's parser's verdict on each argv, in one run of the harness (the engine's imports take seconds)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env |= {"VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    done = subprocess.run(
        [str(venv_python(engine)), str(HARNESS), engine],
        input=json.dumps(argvs), capture_output=True, text=True, timeout=900, env=env, cwd="/",
    )  # fmt: skip
    assert done.returncode == 0, f"the {engine} harness failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    lines = done.stdout.strip().splitlines()
    assert lines, f"the {engine} harness printed nothing:\n{done.stderr[-3000:]}"
    verdicts: list[dict[str, Any]] = json.loads(lines[-1])
    assert len(verdicts) == len(argvs)
    return verdicts


VERDICTS: dict[str, dict[str, dict[str, Any]]] = {}


def parse(engine: str, argv: list[str]) -> dict[str, Any]:
    """The verdict on one argv: every argv this module asks about is parsed in one batch per engine, the first
    time one is asked for (all_argvs lists them)."""
    if engine not in VERDICTS:
        MODEL.mkdir(parents=True, exist_ok=True)
        argvs = all_argvs(engine)
        VERDICTS[engine] = {json.dumps(a): v for a, v in zip(argvs, run_parser(engine, argvs), strict=True)}
    key = json.dumps(argv)
    assert key in VERDICTS[engine], f"add this argv to all_argvs: {argv}"
    return VERDICTS[engine][key]


def parsed(engine: str, argv: list[str]) -> dict[str, Any]:
    verdict = parse(engine, argv)
    assert verdict["ok"], f"{engine} {RELEASES[engine]} refused {argv}:\n{verdict['error']}"
    values: dict[str, Any] = verdict["values"]
    return values


def refused(engine: str, argv: list[str]) -> str:
    verdict = parse(engine, argv)
    assert not verdict["ok"], f"{engine} {RELEASES[engine]} accepted {argv}: {verdict.get('values')}"
    error: str = verdict["error"]
    return error


def member_run(
    engine: str, gpus: int, address: str, executable: str | None = None, model_path: str = str(MODEL)
) -> ReplicaRun:
    """One member's replica run: its own GPUs and address (each member is rendered with its host's run)."""
    plan = FitPlan(
        engine=engine, gpu_vendor="nvidia", accelerator="gpu", kind="chat", gpus=gpus, min_gpu_memory_gb=20,
        memory_basis="arch", cpu_cores=8, threads=None, memory_bytes=64 << 30, context_length=8192,
        parallel=256, weights_bytes=400 << 30, kv_cache_bytes=0,
    )  # fmt: skip
    model = Model(name="big", format="safetensors", path=model_path)
    return ReplicaRun(
        deployment="chat", model=model, model_path=model_path, executable=executable or EXECUTABLES[engine],
        bind_address=address, port=8100, gpus=h100x8().gpus[:gpus], plan=plan,
    )  # fmt: skip


def group_of(nodes: int, interface: str | None) -> Group:
    addresses = tuple(f"10.30.0.{10 + i}" for i in range(nodes))
    return Group(addresses=addresses, ports=tuple(29600 + i for i in range(nodes)), interface=interface)


def members(engine: str, nodes: int, gpus: int, interface: str | None) -> list[tuple[int, list[str]]]:
    """(rank, argv) of every member, the head first, rendered by the provider."""
    p, group = provider(engine), group_of(nodes, interface)
    out = [(0, p.group_head_argv(member_run(engine, gpus, group.addresses[0]), group))]
    for rank in range(1, nodes):
        out.append((rank, p.group_worker_argv(member_run(engine, gpus, group.addresses[rank]), group, rank)))
    return out


def test_both_engines_spread_a_replica_over_machines() -> None:
    assert provider("vllm").multi_node and provider("sglang").multi_node


@pytest.mark.parametrize(("nodes", "gpus", "interface"), GROUPS)
def test_vllm_serve_parses_the_head_and_the_workers(nodes: int, gpus: int, interface: str | None) -> None:
    """vLLM's multi-node serving with multiprocessing: tp = GPUs per node, pp = nodes; every member names the
    head as master; the workers run headless (no API server: no --host/--port)."""
    group = group_of(nodes, interface)
    for rank, argv in members("vllm", nodes, gpus, interface):
        assert argv[:3] == ["/usr/local/bin/vllm", "serve", str(MODEL)]
        values = parsed("vllm", argv)
        assert values["model"] == str(MODEL) and values["served_model_name"] == ["chat"]
        assert values["tensor_parallel_size"] == gpus and values["pipeline_parallel_size"] == nodes
        assert values["nnodes"] == nodes and values["node_rank"] == rank
        assert values["master_addr"] == group.head and values["master_port"] == group.ports[0]
        assert values["distributed_executor_backend"] == "mp"
        assert values["headless"] is (rank > 0)
        assert values["max_model_len"] == 8192
        if rank == 0:
            assert (values["host"], values["port"]) == (group.head, 8100)
        else:
            assert "--host" not in argv and "--port" not in argv
        # vLLM's own rule (engine/arg_utils.py, create_engine_config): nnodes divides tp x pp x dp
        assert (values["tensor_parallel_size"] * values["pipeline_parallel_size"]) % values["nnodes"] == 0
        # vLLM's ParallelConfig: each node runs one worker per GPU it has, no more (its own layout)
        assert values["world_size"] == gpus * nodes and values["local_world_size"] == gpus
        assert values["node_rank_within_dp"] == rank


@pytest.mark.parametrize(("nodes", "gpus", "interface"), GROUPS)
def test_sglang_prepare_server_args_parses_the_head_and_the_workers(
    nodes: int, gpus: int, interface: str | None
) -> None:
    """SGLang's multi-node tensor parallel: --tp-size over all the group's GPUs, the head's --dist-init-addr on
    every member; each worker keeps its own --host/--port (SGLang serves a health check there)."""
    group = group_of(nodes, interface)
    for rank, argv in members("sglang", nodes, gpus, interface):
        assert argv[:3] == ["/usr/bin/python3", "-m", "sglang.launch_server"]
        values = parsed("sglang", argv)
        assert values["model"] == str(MODEL) and values["served_model_name"] == "chat"
        assert values["tp_size"] == gpus * nodes and values["pp_size"] == 1
        assert values["nnodes"] == nodes and values["node_rank"] == rank
        assert values["dist_init_addr"] == f"{group.head}:{group.ports[0]}"
        assert (values["host"], values["port"]) == (group.addresses[rank], 8100)
        assert values["context_length"] == 8192
        # SGLang's rule, checked at launch (arg_groups/validation_hook.py): nnodes divides tp x pp
        assert (values["tp_size"] * values["pp_size"]) % values["nnodes"] == 0


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@pytest.mark.parametrize("interface", [None, "eth1"])
def test_each_members_environment_names_its_address_and_the_interface(engine: str, interface: str | None) -> None:
    p, group = provider(engine), group_of(4, interface)
    host_ip = {"vllm": "VLLM_HOST_IP", "sglang": "SGLANG_HOST_IP"}[engine]
    for rank in range(4):
        run = member_run(engine, 8, group.addresses[rank])
        env = p.group_environment(run, group, rank)
        assert env[host_ip] == group.addresses[rank]
        assert env["CUDA_VISIBLE_DEVICES"] == ",".join(g.uuid for g in run.gpus)
        assert env["HF_HUB_OFFLINE"] == "1"
        if interface:
            assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == interface
        else:
            assert "NCCL_SOCKET_IFNAME" not in env and "GLOO_SOCKET_IFNAME" not in env


@pytest.mark.parametrize(
    ("engine", "args", "where"),
    [
        ("vllm", ["--nnodes", "2"], "spec.nodes"),
        ("vllm", ["--master-addr", "10.0.0.1"], "spec.nodes"),
        ("vllm", ["--headless"], "spec.nodes"),
        ("vllm", ["-n", "2"], "--nnodes, not -n"),
        ("sglang", ["--dist-init-addr", "10.0.0.1:5000"], "spec.nodes"),
        ("sglang", ["--node-rank", "1"], "spec.nodes"),
    ],
)
def test_engine_args_cannot_set_the_runtimes_flags(engine: str, args: list[str], where: str) -> None:
    """The group's flags are the deployment's (spec.nodes): a user's engine_args naming them is refused."""
    messages = [p.message for p in check_engine_args(args, provider(engine), "spec.engine_args")]
    assert len(messages) == 1 and where in messages[0], messages


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_a_worker_rank_outside_the_group_is_refused(engine: str) -> None:
    p, group = provider(engine), group_of(2, None)
    run = member_run(engine, 1, group.addresses[1])
    for rank in (0, 2, -1):
        with pytest.raises(ValueError, match="not a worker"):
            p.group_worker_argv(run, group, rank)
    with pytest.raises(ValueError, match="needs 2 ports"):
        p.group_worker_argv(run, Group(addresses=group.addresses, ports=(29600,)), 1)


def test_an_ipv6_head_is_bracketed_for_sglang_and_parsed() -> None:
    assert parsed("sglang", ipv6_worker())["dist_init_addr"] == "[fd00::10]:29600"


# --- the parsers do refuse: a wrong argv fails, so the tests above can fail -----------------------------------


def _head(engine: str) -> list[str]:
    return members(engine, 2, 8, None)[0][1]


def with_value(argv: list[str], flag: str, value: str) -> list[str]:
    i = argv.index(flag)
    return [*argv[: i + 1], value, *argv[i + 2 :]]


def wrong_argvs(engine: str) -> list[list[str]]:
    """Argv the parser must refuse: a flag the release lacks, a value of the wrong type, and (vLLM) a backend that
    cannot span nodes, (SGLang) a flag without its value.
    (SGLang checks that nnodes divides tp x pp in check_server_args, which runs at launch after resolving the
    model's config and the GPUs: not here.)"""
    head = _head(engine)
    if engine == "vllm":
        unknown = [*head, "--master-address", "10.30.0.10"]  # vLLM's flag is --master-addr
        ray = with_value(head, "--distributed-executor-backend", "ray")
        return [unknown, with_value(head, "--node-rank", "zero"), with_value(head, "--master-port", "http"), ray]
    unknown = [*head, "--master-addr", "10.30.0.10"]  # SGLang's is --dist-init-addr
    return [unknown, with_value(head, "--nnodes", "two"), [*head, "--node-rank"]]


def ipv6_worker() -> list[str]:
    group = Group(addresses=("fd00::10", "fd00::11"), ports=(29600, 29601))
    return provider("sglang").group_worker_argv(member_run("sglang", 1, "fd00::11"), group, 1)


def all_argvs(engine: str) -> list[list[str]]:
    argvs = [argv for nodes, gpus, interface in GROUPS for _, argv in members(engine, nodes, gpus, interface)]
    return argvs + wrong_argvs(engine) + ([ipv6_worker()] if engine == "sglang" else [])


def test_vllm_refuses_a_wrong_multinode_argv() -> None:
    unknown, rank_word, port_word, ray = wrong_argvs("vllm")
    assert "master-address" in refused("vllm", unknown)
    assert "--node-rank" in refused("vllm", rank_word)
    assert "--master-port" in refused("vllm", port_word)
    # ParallelConfig's check: --nnodes is the multiprocessing backend's (Ray places its workers itself)
    assert "nnodes > 1 can only be set when distributed executor backend is mp" in refused("vllm", ray)


def test_sglang_refuses_a_wrong_multinode_argv() -> None:
    unknown, nodes_word, rank_without_value = wrong_argvs("sglang")
    assert "master-addr" in refused("sglang", unknown)
    assert "--nnodes" in refused("sglang", nodes_word)
    assert "--node-rank: expected one argument" in refused("sglang", rank_without_value)


def test_the_docs_show_the_argv_the_providers_render() -> None:
    """docs/multinode-engines.md's four command lines (vLLM head and worker, SGLang head and worker, nodes: 2,
    gpus: 8) are what the providers render, word for word."""
    text = (ROOT / "docs" / "multinode-engines.md").read_text()
    blocks = [shlex.split(b.replace("\\\n", " ")) for b in re.findall(r"```\n(.*?)```", text, re.DOTALL)]
    group = group_of(2, None)
    rendered = []
    for engine, executable in (("vllm", "vllm"), ("sglang", "python3")):
        p = provider(engine)
        head, worker = (member_run(engine, 8, a, executable, "/srv/models/big") for a in group.addresses)
        rendered += [p.group_head_argv(head, group), p.group_worker_argv(worker, group, 1)]
    assert blocks == rendered
