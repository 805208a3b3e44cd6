#!/usr/bin/env bash
# A virtual environment holding vLLM's or SGLang's release (the one the provider pins: RELEASE in
# providers/<engine>.py), enough to run its own argument parser on a CPU machine (tests/test_multinode_parsers.py),
# cached outside the repository and keyed by the version: $ENGINE_CTL_CACHE/<engine>-<version>-venv
# (/var/cache/engine-ctl by default). Prints that path on stdout; idempotent; one build at a time per machine.
#
#   bash tests/tools/engine_venv.sh vllm      # vLLM's `serve` parser, VLLM_TARGET_DEVICE=cpu
#   bash tests/tools/engine_venv.sh sglang    # SGLang's prepare_server_args
#
# The wheels' own dependencies are CUDA builds (flashinfer, cutlass, deep-gemm, torch with CUDA: gigabytes), so the
# engine goes in with --no-deps, then torch's CPU build and only the packages the parser's imports need (found by
# importing: the lists below). torch==$TORCH comes from pip's configured sources (this machine: /opt/wheels); where
# they have no CPU build, point pip at one: PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu.
set -euo pipefail
# All in a function: bash has read all of it before it runs, so editing the file meanwhile cannot break a run.
main() {
  local ENGINE="${1:?usage: engine_venv.sh vllm|sglang}"
  HERE="$(cd "$(dirname "$0")" && pwd)"
  ROOT="$(cd "$HERE/../.." && pwd)"
  case "$ENGINE" in
    vllm | sglang) ;;
    *) echo "engine_venv.sh: unknown engine $ENGINE (vllm or sglang)" >&2; exit 2 ;;
  esac
  VERSION="$(sed -n 's/^RELEASE = "\(.*\)"$/\1/p' "$ROOT/providers/$ENGINE.py")"
  [ -n "$VERSION" ] || { echo "engine_venv.sh: no RELEASE in providers/$ENGINE.py" >&2; exit 1; }
  TORCH="${ENGINE_CTL_PARSER_TORCH:-2.13.0+cpu}"
  CACHE_ROOT="${ENGINE_CTL_CACHE:-/var/cache/engine-ctl}"
  DEST="$CACHE_ROOT/$ENGINE-$VERSION-venv"
  if [ -f "$DEST/.complete" ]; then echo "$DEST"; exit 0; fi
  mkdir -p "$CACHE_ROOT"
  exec 9>"$CACHE_ROOT/.$ENGINE-$VERSION-venv.lock"
  flock 9
  if [ -f "$DEST/.complete" ]; then echo "$DEST"; exit 0; fi

  # What each parser imports beyond torch (vLLM: vllm/entrypoints/cli/serve.py and vllm/engine/arg_utils.py;
  # SGLang: sglang/srt/server_args.py), found by importing, pinned to the versions that worked (within the wheels' own
  # requirements), so that a fresh machine builds the same environment.
  case "$ENGINE" in
    # vllm/entrypoints/cli/serve.py imports the API server (fastapi, openai, the tool and reasoning parsers), the
    # engine core's client (zmq, msgspec) and the structured-output backends (xgrammar, llguidance)
    vllm) DEPS=(numpy==2.4.6 packaging==26.4 regex==2026.11.19 psutil==7.2.2 huggingface_hub==2.4.0 pydantic==2.14.4
                cbor2==6.3.0 pyzmq==27.3.0 urllib3==2.8.0 transformers==5.25.0 aiohttp==3.14.5 requests==2.34.2
                openai-harmony==0.0.8 openai==3.60.0 msgspec==0.23.0 cloudpickle==3.1.3 pillow==13.0.0
                pybase64==1.5.1 cachetools==8.0.2 uvloop==0.23.0 py-cpuinfo==9.0.0 prometheus_client==0.26.0
                'fastapi[standard]==0.136.3' partial-json-parser==0.2.1.1.post7 xgrammar==0.2.9 llguidance==1.7.6
                model-hosting-container-standards==0.1.16) ;;
    # sglang/__init__.py imports sglang.srt.utils, which imports triton (1 GB installed) and IPython
    sglang) DEPS=(numpy==2.4.6 orjson==3.13.0 psutil==7.2.2 pybase64==1.5.1 requests==2.34.2 triton==3.9.0
                  packaging==26.4 pillow==13.0.0 starlette==1.10.0 msgspec==0.23.0 pydantic==2.14.4 pyzmq==27.3.0
                  tqdm==4.70.1 ipython==9.18.1 aiohttp==3.14.5) ;;
  esac

  PY="${PYTHON:-python3}"
  start=$(date +%s)
  rm -rf "$DEST"
  "$PY" -m venv "$DEST"
  export PIP_DISABLE_PIP_VERSION_CHECK=1
  "$DEST/bin/pip" install --quiet --no-deps "$ENGINE==$VERSION" >&2
  # --no-warn-conflicts: the engine was installed without its own (CUDA) requirements, on purpose
  "$DEST/bin/pip" install --quiet --no-warn-conflicts "torch==$TORCH" "${DEPS[@]}" >&2
  # The cache is complete only once the parser runs: a plain argv must parse.
  # (the model must be a directory that exists: vLLM takes any other path for a Hugging Face repository id)
  local model
  model="$(mktemp -d)"
  case "$ENGINE" in
    vllm) probe="[\"vllm\", \"serve\", \"$model\"]" ;;
    sglang) probe="[\"python3\", \"-m\", \"sglang.launch_server\", \"--model-path\", \"$model\"]" ;;
  esac
  verdict="$(cd / && env -u PYTHONPATH VLLM_TARGET_DEVICE=cpu HF_HUB_OFFLINE=1 "$DEST/bin/python" "$HERE/engine_parse.py" \
    "$ENGINE" "$probe" | tail -n1)"
  rmdir "$model"
  case "$verdict" in
    '{"ok": true'*) ;;
    *) echo "engine_venv.sh: $ENGINE $VERSION's parser does not run in $DEST: $verdict" >&2; exit 1 ;;
  esac
  touch "$DEST/.complete"
  echo "engine_venv.sh: $ENGINE $VERSION in $DEST: $(( $(date +%s) - start ))s, $(du -sh "$DEST" | cut -f1)" >&2
  echo "$DEST"
}
main "$@"
