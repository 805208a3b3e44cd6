#!/usr/bin/env bash
# What users install: build the wheel and the sdist, install each into a fresh virtual environment outside the
# source tree (so nothing can import from the checkout), and run the CLI from it on a copy of examples/quickstart.
# Usage: tools/check_wheel.sh [PYTHON]   (prints "wheel ok" and "sdist ok"; exits non-zero on any failure)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
python="${1:-${PYTHON:-python3}}"
work="$(mktemp -d /tmp/engine-ctl-wheel.XXXXXX)"
trap 'rm -rf "$work"' EXIT
builder="$work/builder"
"$python" -m venv "$builder"
"$builder/bin/pip" install -q build
# Build from a copy of the tracked tree, so build artefacts never land in the checkout.
mkdir "$work/src"
git -C "$root" ls-files -z --cached --others --exclude-standard | (cd "$root" && xargs -0 cp --parents -t "$work/src")
"$builder/bin/python" -m build -q --wheel --sdist --outdir "$work/dist" "$work/src" >/dev/null
rm -rf "$work/src"
cp -r "$root/examples/quickstart" "$work/quickstart"
for kind in wheel sdist; do
  case "$kind" in
    wheel) artefact="$(ls "$work"/dist/*.whl)" ;;
    sdist) artefact="$(ls "$work"/dist/*.tar.gz)" ;;
  esac
  env_dir="$work/env-$kind"
  "$python" -m venv "$env_dir"
  "$env_dir/bin/pip" install -q "$artefact"
  # Run from an empty directory: the installed package, not the checkout, must answer.
  cd "$work"
  "$env_dir/bin/python" -c 'import engine_ctl, sys; p = engine_ctl.__file__; sys.exit(0 if "'"$root"'" not in p else f"imported from the checkout: {p}")'
  "$env_dir/bin/engine-ctl" --help >/dev/null
  "$env_dir/bin/engine-ctl" validate quickstart >/dev/null
  # plan: the quickstart's weights are not on this machine, so the plan names the deployment, says it is Pending
  # on them, and exits 1 (nothing can serve it yet); anything else (a traceback, another status) fails.
  status=0
  "$env_dir/bin/engine-ctl" plan quickstart --state "$work/state-$kind.json" >"$work/plan-$kind.txt" 2>"$work/plan-$kind.err" || status=$?
  # (0 where this machine happens to have the weights in place)
  if grep -q Traceback "$work/plan-$kind.err" || { [ "$status" != 0 ] && { [ "$status" != 1 ] || ! grep -q "Pending: tiny-chat: Waiting for the weights" "$work/plan-$kind.txt"; }; }; then
    echo "plan exited $status:"; cat "$work/plan-$kind.txt" "$work/plan-$kind.err"; exit 1
  fi
  grep -q "tiny-chat" "$work/plan-$kind.txt"
  "$env_dir/bin/engine-ctl" schema >/dev/null
  echo "$kind ok: $(basename "$artefact")"
done
