"""Parse an engine's argv with the engine's own parser, inside that engine's virtual environment (made by
tests/tools/engine_venv.sh), and print what it parsed as one JSON object on the last line of stdout.

    <venv>/bin/python tests/tools/engine_parse.py vllm '["/usr/local/bin/vllm", "serve", "/m", ...]'
    <venv>/bin/python tests/tools/engine_parse.py sglang '["/usr/bin/python3", "-m", "sglang.launch_server", ...]'
    <venv>/bin/python tests/tools/engine_parse.py vllm < argvs.json     # a JSON list of argv: a list of verdicts

The argv is the whole command line a unit runs, executable first, as the providers render it:
- vLLM: `vllm serve ...` goes through the parser `vllm` builds for its `serve` subcommand
  (vllm/entrypoints/cli/main.py with vllm/entrypoints/cli/serve.py's ServeSubcommand), then the subcommand's own
  checks (ServeSubcommand.validate), then EngineArgs.from_cli_args, as `vllm serve` does before it starts, and
  the ParallelConfig its engine config would get (its checks; the processes each node runs).
- SGLang: `python -m sglang.launch_server ...` goes through sglang.srt.server_args.prepare_server_args, what
  launch_server.py calls first (its argparse, then ServerArgs and its checks).

Prints {"ok": true, "values": {...}} or {"ok": false, "error": "..."} (the parser refused the argv: its
message). A missing package is no verdict: it fails (exit 1, the traceback). Runs with the engine's packages
only: nothing of engine_ctl is imported here.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import traceback
from typing import Any


def parse_vllm(argv: list[str]) -> dict[str, Any]:
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    if argv[1:2] != ["serve"]:
        raise SystemExit(f"not a `vllm serve` command line: {argv[:3]}")
    from vllm.config.parallel import ParallelConfig  # type: ignore[import-not-found]
    from vllm.engine.arg_utils import EngineArgs  # type: ignore[import-not-found]
    from vllm.entrypoints.cli.serve import ServeSubcommand  # type: ignore[import-not-found]
    from vllm.utils.argparse_utils import FlexibleArgumentParser  # type: ignore[import-not-found]

    # as vllm/entrypoints/cli/main.py builds it, with the serve subcommand only
    parser = FlexibleArgumentParser(description="vLLM CLI")
    subparsers = parser.add_subparsers(required=False, dest="subparser")
    serve = ServeSubcommand()
    serve.subparser_init(subparsers).set_defaults(dispatch_function=serve.cmd)
    args = parser.parse_args(argv[1:])
    serve.validate(args)
    if args.model_tag is not None:  # ServeSubcommand.cmd: the positional model wins
        args.model = args.model_tag
    engine = EngineArgs.from_cli_args(args)
    # the parallel fields as create_engine_config passes them (it also needs the model's config, absent here):
    # ParallelConfig's own checks (nnodes > 1 needs the mp backend) and the layout it derives per node
    parallel = ParallelConfig(
        tensor_parallel_size=engine.tensor_parallel_size,
        pipeline_parallel_size=engine.pipeline_parallel_size,
        data_parallel_size=engine.data_parallel_size,
        nnodes=engine.nnodes,
        node_rank=engine.node_rank,
        master_addr=engine.master_addr,
        master_port=engine.master_port,
        distributed_executor_backend=engine.distributed_executor_backend,
    )
    return {
        "model": engine.model,
        "served_model_name": engine.served_model_name,
        "tensor_parallel_size": engine.tensor_parallel_size,
        "pipeline_parallel_size": engine.pipeline_parallel_size,
        "nnodes": engine.nnodes,
        "node_rank": engine.node_rank,
        "master_addr": engine.master_addr,
        "master_port": engine.master_port,
        "distributed_executor_backend": engine.distributed_executor_backend,
        "headless": bool(args.headless),
        "host": args.host,
        "port": args.port,
        "max_model_len": engine.max_model_len,
        "world_size": parallel.world_size,
        "local_world_size": parallel.local_world_size,
        "node_rank_within_dp": parallel.node_rank_within_dp,
    }


def parse_sglang(argv: list[str]) -> dict[str, Any]:
    if argv[1:3] != ["-m", "sglang.launch_server"]:
        raise SystemExit(f"not a `python -m sglang.launch_server` command line: {argv[:3]}")
    from sglang.srt.server_args import prepare_server_args  # type: ignore[import-not-found]

    server_args = prepare_server_args(argv[3:])
    return {
        "model": server_args.model_path,
        "served_model_name": server_args.served_model_name,
        "tp_size": server_args.tp_size,
        "pp_size": server_args.pp_size,
        "nnodes": server_args.nnodes,
        "node_rank": server_args.node_rank,
        "dist_init_addr": server_args.dist_init_addr,
        "host": server_args.host,
        "port": server_args.port,
        "context_length": server_args.context_length,
    }


PARSERS = {"vllm": parse_vllm, "sglang": parse_sglang}


def verdict(engine: str, argv: list[str]) -> dict[str, Any]:
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            values = PARSERS[engine](argv)
    except SystemExit as e:  # argparse's refusal: usage and message on stderr, exit 2
        return {"ok": False, "error": err.getvalue().strip() or str(e), "exit": e.code}
    except ImportError:  # the venv lacks a package the parser imports: no verdict on the argv
        raise
    except Exception as e:  # the engine's own checks after parsing (ValueError, TypeError, AssertionError)
        trace = "".join(traceback.format_exception_only(type(e), e)).strip()
        return {"ok": False, "error": trace, "stderr": err.getvalue()[-2000:]}
    return {"ok": True, "values": values}


def main() -> int:
    engine, batch = sys.argv[1], json.loads(sys.argv[2] if len(sys.argv) > 2 else sys.stdin.read())
    if batch and isinstance(batch[0], str):  # one argv
        print(json.dumps(verdict(engine, batch)))
    else:  # a list of argv: one verdict each, in order (one Python start for all: the imports take seconds)
        print(json.dumps([verdict(engine, argv) for argv in batch]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
