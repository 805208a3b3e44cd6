"""vLLM's and SGLang's flags against the real tools' own argument lists (issue 14), as llama.cpp's are checked against
the real `llama-server --help` in test_render.py.

The lists are tests/engine_flags/<package>-<version>.txt, read from each release's wheel by
tests/tools/engine_flags.py (their parsers need torch, so the script reads the source with `ast`); each names the
wheel and every source file it read with its sha256. The version is the provider's RELEASE."""

from __future__ import annotations

import hashlib
import re
import zipfile
from pathlib import Path

import pytest
from engine_ctl.providers import sglang as sglang_module
from engine_ctl.providers import vllm as vllm_module

from engine_ctl.core.documents.inventory import Host, Inventory
from engine_ctl.core.fit.modelfacts import ModelFacts
from engine_ctl.core.plan.pipeline import render_deployment
from tests.fleetfacts import h100x8
from tests.helpers import load, messages
from tests.tools import engine_flags

LISTS = Path(__file__).parent / "engine_flags"
MODULES = {"vllm": vllm_module, "sglang": sglang_module}


def flag_list(engine: str) -> tuple[list[str], dict[str, bool]]:
    """The list's header lines, and each flag with whether the release marks it deprecated."""
    lines = (LISTS / f"{engine}-{MODULES[engine].RELEASE}.txt").read_text().splitlines()
    header = [line for line in lines if line.startswith("#")]
    flags = {line.split()[0]: line.endswith(engine_flags.DEPRECATED) for line in lines if not line.startswith("#")}
    return header, flags


@pytest.mark.parametrize("engine", sorted(MODULES))
def test_the_list_names_its_package_version_and_sources(engine: str) -> None:
    header, flags = flag_list(engine)
    release = MODULES[engine].RELEASE
    assert header[0].startswith(f"# {engine} {release}: ")
    assert re.fullmatch(rf"# wheel: {engine}-{re.escape(release)}-\S+\.whl sha256 [0-9a-f]{{64}}", header[1])
    files = [line.split()[2] for line in header[2:]]
    assert all(re.fullmatch(r"# file: \S+\.py sha256 [0-9a-f]{64}", line) for line in header[2:])
    main = engine_flags.VLLM_ARG_UTILS if engine == "vllm" else engine_flags.SGLANG_SERVER_ARGS
    assert main in files
    assert len(flags) > 300 and all(f.startswith("-") for f in flags)


@pytest.mark.parametrize("engine", sorted(MODULES))
def test_every_allowed_refused_and_deployment_flag_is_a_real_flag(engine: str) -> None:
    _, known = flag_list(engine)
    module = MODULES[engine]
    assert set(module.ALLOWED) - set(known) == set()
    assert set(module.SET_BY_DEPLOYMENT) - set(known) == set()
    assert set(module.REFUSED) - set(known) == set()
    assert set(module.SHORT) | set(module.SHORT.values()) <= set(known), set(module.SHORT.items())


@pytest.mark.parametrize("engine", sorted(MODULES))
def test_no_allowed_flag_is_deprecated(engine: str) -> None:
    _, known = flag_list(engine)
    assert [f for f in MODULES[engine].ALLOWED if known[f]] == []


MODELS = """
kind: Model
metadata: {name: qwen3-8b}
spec:
  format: safetensors
  hf: Qwen/Qwen3-8B@b968826d9c46dd6066d109eabc6255188de91218
  context_length: 40960
  capabilities: [chat, tools, reasoning]
  tool_call_parser: hermes
  reasoning_parser: qwen3
  chat_template: chatml
---
kind: Model
metadata: {name: jinja-8b}
spec:
  format: safetensors
  path: /srv/models/jinja-8b
  context_length: 8192
  chat_template: "{%- for m in messages %}{{ m.content }}{% endfor %}"
---
kind: Model
metadata: {name: embed}
spec: {format: safetensors, path: /srv/models/embed, context_length: 8192, capabilities: [embeddings]}
"""

SHAPE = ModelFacts(block_count=36, head_count=32, head_count_kv=8, embedding_length=4096, key_length=128,
                   value_length=128, weights_bytes=16_381_470_720)  # fmt: skip

# Every branch of the providers' argv: one or several GPUs, tools and reasoning parsers, a named and a Jinja chat
# template, an embedding model, CUDA graphs off, a KV cache type and the user's own flags.
SPECS = [
    "model: qwen3-8b\ngpus: 2\nengine_args: [--kv-cache-dtype, fp8]",
    "model: jinja-8b",
    "model: embed",
]
# engine_config's engine-only keys are written in the flat form
SGLANG_FLAT = "name: d9\nengine: sglang\nmodel: Qwen/Qwen3-8B@b968826d9c46dd6066d109eabc6255188de91218\n" \
    "engine_config: {cuda_graphs: false}\nresidency: restart_only\n"  # fmt: skip


def rendered_flags(engine: str) -> set[str]:
    flags: set[str] = set()
    bodies = {f"d{i}": "metadata: {name: d%d}\nspec:\n  engine: %s\n  %s\n" % (i, engine, spec.replace("\n", "\n  "))
              for i, spec in enumerate(SPECS)}  # fmt: skip
    if engine == "sglang":
        bodies["d9"] = SGLANG_FLAT
    for name, body in bodies.items():
        result, diags = load(MODELS, body)
        assert messages(diags) == []
        facts = h100x8()
        host = Host(name=facts.host, address="198.18.0.11", models_dir="/srv/models")
        rendered = render_deployment(result.desired, name, Inventory(hosts=(host,)), {facts.host: facts}, SHAPE)
        assert rendered.fit.failed_reason is None and rendered.fit.pending_reason is None, rendered.fit
        argv = list(rendered.units[0].argv)
        engine_argv = argv[argv.index("sglang.launch_server" if engine == "sglang" else "serve") + 1 :]
        flags |= {a.split("=")[0] for a in engine_argv if a.startswith("-")}  # not python3's own -m
    return flags


@pytest.mark.parametrize("engine", sorted(MODULES))
def test_every_flag_engine_ctl_renders_is_a_real_flag_and_not_deprecated(engine: str) -> None:
    _, known = flag_list(engine)
    rendered = rendered_flags(engine)
    assert rendered - set(known) == set()
    assert [f for f in rendered if known[f]] == []
    # the branches above were reached: each one's flag is there
    expected = {"--tensor-parallel-size", "--runner", "--tool-call-parser", "--reasoning-parser", "--chat-template"}
    if engine == "sglang":
        expected = {"--tp-size", "--is-embedding", "--tool-call-parser", "--cuda-graph-backend-decode"}
    assert expected <= rendered, expected - rendered


def test_sglang_cuda_graphs_off_renders_the_release_s_own_flags() -> None:
    """--disable-cuda-graph is deprecated in 0.5.22 (server_args.py: "Use --cuda-graph-backend-{decode,prefill}=
    disabled instead"); engine-ctl renders the replacement."""
    assert "--disable-cuda-graph" not in rendered_flags("sglang")
    _, known = flag_list("sglang")
    assert known["--disable-cuda-graph"] is True


def test_the_script_reads_the_real_parsers_shape() -> None:
    """The extractor on a miniature wheel written in the release's own idioms: a config dataclass whose bool field
    gets --no-<name> (vLLM's BooleanOptionalAction), `**{**kwargs[...], ...}`, an SGLang `A[T, Arg(...)]` field with
    aliases, a no_cli field, and a deprecated add_argument."""
    files = {
        "vllm/config/cache.py": "class CacheConfig:\n    enable_x: bool = True\n    size: int | None = None\n"
        "    either: bool | str | None = None\n",
        "vllm/engine/arg_utils.py": "def f(g):\n    k = get_kwargs(CacheConfig)\n"
        "    g.add_argument('--enable-x', **{**k['enable_x'], 'default': None})\n"
        "    g.add_argument('--size', '-s', **k['size'])\n    g.add_argument('--either', **k['either'])\n",
        "vllm/entrypoints/launchers/cli_args.py": "class BaseFrontendArgs:\n    quiet: bool = False\n"
        "class FrontendArgs(BaseFrontendArgs):\n    host: str | None = None\n",
        "vllm/utils/argparse_utils.py": "def p(arg, out):\n    if arg == '-O':\n"
        "        out.append('--optimization-level')\n",
    }
    assert extracted(files, "vllm") == {
        "-h", "--help", "--enable-x", "--no-enable-x", "--size", "-s", "--either", "--quiet", "--no-quiet",
        "--host", "-O",
    }  # fmt: skip
    files = {
        "sglang/srt/server_args.py": "_INPUT_NAMESPACES = [Par]\n"
        "def add(parser):\n    parser.add_argument('--old', action=DeprecatedStoreTrueAction)\n",
        "sglang/srt/arg_groups/fields/par.py": "class Par:\n    tp_size: A[int, Arg(help='t', aliases=['--tp'])] = 1\n"
        "    hidden: A[bool, Arg(no_cli=True)] = False\n    plain: A[bool, 'help'] = False\n"
        "    both: A[bool, Arg(action=argparse.BooleanOptionalAction)] = False\n",
    }
    assert extracted(files, "sglang") == {
        "-h", "--help", "--tp-size", "--tp", "--plain", "--both", "--no-both", f"--old {engine_flags.DEPRECATED}",
    }  # fmt: skip


def extracted(files: dict[str, str], engine: str) -> set[str]:
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        wheel = Path(folder) / f"{engine}-9.9.9-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as z:
            for name, text in files.items():
                z.writestr(name, text)
        src = engine_flags.Sources(wheel)
        flags = engine_flags.vllm_flags(src) if engine == "vllm" else engine_flags.sglang_flags(src)
        assert set(src.read) == set(files)
        assert src.read[next(iter(files))] == hashlib.sha256(files[next(iter(files))].encode()).hexdigest()
        return set(engine_flags.listed(flags))
