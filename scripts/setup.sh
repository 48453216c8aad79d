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
pkgs=(-e . -e ./plugins/minfer_ops_basic -e ./plugins/minfer_ops_conv -e ./plugins/minfer_passes)
if [ "${1:-}" = "--test" ]; then
  pkgs+=(-e ".[test]" -e ./examples/minfer_contrib_example)
fi
.venv/bin/python -m pip install --quiet "${pkgs[@]}"
