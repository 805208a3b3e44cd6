#!/usr/bin/env bash
# mypy over the package as it installs: providers/, state/ and templates/ are engine_ctl.providers,
# engine_ctl.state and engine_ctl.templates (setuptools package-dir), which mypy cannot map by itself.
# A symlink farm gives it that layout.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
farm="$(mktemp -d)"
trap 'rm -rf "$farm"' EXIT
mkdir "$farm/engine_ctl"
for entry in "$root"/engine_ctl/*; do ln -s "$entry" "$farm/engine_ctl/"; done
for sub in providers state templates; do ln -s "$root/$sub" "$farm/engine_ctl/$sub"; done
cd "$farm"
"${MYPY:-$root/.venv/bin/mypy}" --config-file "$root/pyproject.toml" -p engine_ctl
