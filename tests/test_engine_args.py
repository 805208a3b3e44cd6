"""One test per engine_args rule of seed 000 ("Engine arguments")."""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from engine_ctl.providers import provider
from engine_ctl.providers.llamacpp import ALLOWED as LLAMA_ALLOWED
from engine_ctl.providers.vllm import ALLOWED as VLLM_ALLOWED

from engine_ctl.core.documents.engine_args import check_engine_args
from engine_ctl.core.documents.inventory import Host, Inventory
from engine_ctl.core.fit.modelfacts import ModelFacts
from engine_ctl.core.plan.pipeline import render_deployment
from tests.fleetfacts import cpu_host
from tests.helpers import deployment, load, messages
from tests.llama import llama_server_dir, tiny_model

LLAMA = provider("llama.cpp")
VLLM = provider("vllm")


def problems(args: list[str], engine: str = "llama.cpp") -> list[str]:
    return [p.message for p in check_engine_args(args, provider(engine), "spec.engine_args")]


def test_allowed_arguments_pass() -> None:
    assert problems(["--flash-attn", "on", "--temp=0.7", "--seed", "-1", "--jinja"]) == []
    assert problems(["--enable-prefix-caching", "--dtype", "bfloat16"], "vllm") == []


def test_at_most_64_arguments() -> None:
    assert problems(["--jinja"] * 65) == ["spec.engine_args: at most 64 arguments (found 65)"]
    assert problems(["--jinja"] * 64) == []


def test_each_argument_at_most_4096_characters() -> None:
    assert problems(["--override-kv", "a" * 4097]) == ["spec.engine_args[1]: at most 4096 characters (found 4097)"]
    assert problems(["--override-kv", "a" * 4096]) == []


@pytest.mark.parametrize(
    "ch", ["\n", "\t", "\x00", "\x1b", "\x7f", "\x85", "\u2028", "\u2029", "\u202e", "\u200b", "\ufdd0", "\U0001fffe"]
)
def test_no_control_characters(ch: str) -> None:
    """Cc, the line/paragraph separators and invisible format characters (Zl, Zp, Cf), and the noncharacters that
    systemd refuses in a unit line as not UTF-8 clean."""
    (msg,) = problems(["--override-kv", f"a{ch}b"])
    assert msg.startswith(f"spec.engine_args[1]: no control characters (found U+{ord(ch):04X} (")


@pytest.mark.parametrize("ch", list("`$|&<>\\"))
def test_no_shell_characters(ch: str) -> None:
    (msg,) = problems(["--override-kv", f"a{ch}b"])
    assert msg.startswith("spec.engine_args[1] ")
    assert f"no shell characters (` $ | & < > \\); found {ch}" in msg


def test_long_form_only_names_the_long_form() -> None:
    assert problems(["-fa", "on"]) == ["spec.engine_args[0] -fa: flags in their long form (--flash-attn, not -fa)"]
    assert problems(["-tp", "2"], "vllm") == [
        "spec.engine_args[0] -tp: flags in their long form (--tensor-parallel-size, not -tp)"
    ]


def test_first_argument_is_a_flag() -> None:
    assert problems(["0.7", "--temp"]) == ["spec.engine_args[0] '0.7': the first argument is a flag"]


def test_flag_value_and_flag_equals_value_both_work() -> None:
    assert problems(["--temp", "0.7"]) == problems(["--temp=0.7"]) == []


def test_value_without_a_flag() -> None:
    assert problems(["--temp", "0.7", "0.8"]) == ["spec.engine_args[2] '0.8': a value with no flag before it"]


@pytest.mark.parametrize(
    ("flag", "where"),
    [
        ("--ctx-size", "spec.context_length"),
        ("--parallel", "spec.parallel"),
        ("--n-gpu-layers", "spec.accelerator"),
        ("--alias", "the deployment's name"),
        ("--model", "the deployment"),
        ("--port", "the deployment"),
        ("--mmproj", "the model's mmproj"),
        ("--chat-template-file", "the model's chat_template"),
    ],
)
def test_flags_the_deployment_sets_say_where_to_set_them(flag: str, where: str) -> None:
    assert problems([flag, "1"]) == [f"spec.engine_args[0] {flag}: set by the deployment; set it with {where}"]


def test_vllm_flags_the_deployment_sets() -> None:
    assert problems(["--max-model-len=4096"], "vllm") == [
        "spec.engine_args[0] --max-model-len: set by the deployment; set it with spec.context_length"
    ]
    assert problems(["--tensor-parallel-size", "2"], "vllm") == [
        "spec.engine_args[0] --tensor-parallel-size: set by the deployment; "
        "set it with spec.gpus (a replica is one machine's GPUs)"
    ]


def test_not_on_the_allow_list_lists_it() -> None:
    (msg,) = problems(["--frobnicate"])
    assert msg.startswith("spec.engine_args[0] --frobnicate: not on llama.cpp's allow-list: --threads, ")
    assert all(flag in msg for flag in LLAMA_ALLOWED)
    (vmsg,) = problems(["--frobnicate"], "vllm")
    assert all(flag in vmsg for flag in VLLM_ALLOWED)


@pytest.mark.parametrize(
    ("flag", "engine", "reason"),
    [
        ("--trust-remote-code", "vllm", "opens the server further"),
        ("--api-key", "vllm", "opens the server further"),
        ("--api-key", "llama.cpp", "opens the server further"),
        ("--lora", "llama.cpp", "reads a file"),
        ("--grammar-file", "llama.cpp", "reads a file"),
        ("--model-draft", "llama.cpp", "reads a file"),
        ("--hf-repo", "llama.cpp", "fetches from the network"),
        ("--ssl-key-file", "llama.cpp", "keys and certificates"),
        ("--ssl-certfile", "vllm", "keys and certificates"),
    ],
)
def test_refused_by_design_with_reason(flag: str, engine: str, reason: str) -> None:
    (msg,) = problems([flag, "x"], engine)
    assert msg.startswith(f"spec.engine_args[0] {flag}: {reason}")
    assert "not allowed, by design" in msg


def test_one_argument_per_item() -> None:
    (msg,) = problems(["--temp 0.7"])
    assert "one argument per item" in msg


def test_engine_args_located_in_the_file() -> None:
    _, diags = deployment("model: llama-3-2-3b\nengine_args:\n  - --temp\n  - '0.7'\n  - -fa")
    (d,) = [x for x in diags if x.severity == "error"]
    assert d.field == "spec.engine_args[2]"
    assert (d.location.line, d.location.column) == (7, 7)


def test_flat_form_extra_args_need_accept_extra_args() -> None:
    from tests.helpers import load

    _, diags = load("name: d\nengine: llamacpp\nmodel: m\nengine_config: {extra_args: [--temp, '1']}")
    assert messages(diags) == [
        "engine_config.extra_args: set engine_config.accept_extra_args: true to pass extra engine arguments"
    ]


# --- the form each engine takes: llama-server refuses --flag=value, argparse (vLLM, SGLang) takes both ----------

ARGS = ["--seed=42", "--temp", "0.7", "--override-kv=tokenizer.ggml.add_bos_token=bool:false", "--rope-freq-scale=-0.5"]


def test_llamacpp_gets_flag_space_value() -> None:
    assert LLAMA.engine_args_argv(ARGS) == [
        "--seed", "42", "--temp", "0.7", "--override-kv", "tokenizer.ggml.add_bos_token=bool:false",
        "--rope-freq-scale", "-0.5",
    ]  # fmt: skip


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_argparse_engines_get_the_arguments_as_written(engine: str) -> None:
    args = ["--seed=42", "--dtype", "bfloat16", '--compilation-config={"level": 3}']
    assert provider(engine).engine_args_argv(args) == args


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rendered_argv(args: str) -> list[str]:
    model = tiny_model()
    result, diags = load(
        f"kind: Model\nmetadata: {{name: tiny}}\nspec: {{format: gguf, path: {model}, context_length: 2048}}\n",
        f"metadata: {{name: seeded}}\nspec: {{model: tiny, accelerator: cpu, context_length: 256, parallel: 1, "
        f"engine_args: {args}}}\n",
    )
    assert messages(diags) == []
    facts = cpu_host(cores=2)
    host = Host(
        name=facts.host, address="127.0.0.1", engines={"llama.cpp": str(llama_server_dir() / "bin/llama-server")}
    )
    shape = ModelFacts(block_count=2, head_count=4, head_count_kv=2, embedding_length=64, weights_bytes=17_000_000)
    rendered = render_deployment(result.desired, "seeded", Inventory(hosts=(host,)), {facts.host: facts}, shape)
    (unit,) = rendered.units
    return list(unit.argv)


def _serves(argv: list[str], log: Path) -> bool:
    """Run argv on 127.0.0.1 and wait for GET /health to answer 200 (False when the server exits first)."""
    argv[argv.index("--host") + 1] = "127.0.0.1"
    port = _free_port()
    argv[argv.index("--port") + 1] = str(port)
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as reply:
                    if reply.status == 200:
                        return True
            except (OSError, urllib.error.HTTPError):
                pass
            time.sleep(0.25)
        return False
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_flag_equals_value_runs_on_the_real_llama_server(tmp_path: Path) -> None:
    """The rendered argv of a deployment with engine_args [--seed=42] starts the real llama-server, which serves."""
    argv = _rendered_argv("[--seed=42, --temp=0.5]")
    assert argv[-4:] == ["--seed", "42", "--temp", "0.5"]
    assert _serves(argv, tmp_path / "llama.log"), (tmp_path / "llama.log").read_text()[-2000:]
    # the control: the form as written is what llama-server refuses
    joined = [*argv[:-4], "--seed=42", "--temp=0.5"]
    assert not _serves(joined, tmp_path / "joined.log")
    assert "invalid argument: --seed=42" in (tmp_path / "joined.log").read_text()
