#!/usr/bin/env bash
# Create .venv (if needed) and install minfer-core with the first-party plugins.
# Usage: bash scripts/setup.sh [--test]   (--test adds pytest, hypothesis, onnxruntime and the example plugin)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
core=.
extra=()
if [ "${1:-}" = "--test" ]; then
  core=".[test]"
  extra=(-e ./examples/minfer_contrib_example)
fi
pkgs=(-e "$core" -e ./plugins/minfer_ops_basic -e ./plugins/minfer_ops_conv -e ./plugins/minfer_passes "${extra[@]}")
.venv/bin/python -m pip install --quiet "${pkgs[@]}"
