#!/usr/bin/env bash
# Create .venv (if needed) and install minfer-core with the first-party plugins (every plugins/*/), editable.
# Usage: bash scripts/setup.sh [--test]   (--test adds pytest, hypothesis, onnxruntime and the example plugin)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
log=.venv/setup.log
echo "setting up .venv (pip output in $log)"
if ! .venv/bin/python -m pip install --quiet --upgrade pip > "$log" 2>&1; then
  cat "$log" >&2
  exit 1
fi
core=.
extra=()
if [ "${1:-}" = "--test" ]; then
  core=".[test]"
  extra=(-e ./examples/minfer_contrib_example)
fi
pkgs=(-e "$core")
for project in plugins/*/pyproject.toml; do  # every first-party plugin, as the installed-wheels stage builds them
  pkgs+=(-e "./${project%/pyproject.toml}")
done
pkgs+=("${extra[@]}")
if ! .venv/bin/python -m pip install --quiet "${pkgs[@]}" >> "$log" 2>&1; then
  cat "$log" >&2
  exit 1
fi
echo "installed: $(.venv/bin/python -m pip list 2>/dev/null | grep -E '^minfer' | awk '{print $1}' | tr '\n' ' ')"
