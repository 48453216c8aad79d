#!/usr/bin/env bash
# Set up minfer and run a real model end to end: ResNet-50 from the onnx wheel's model zoo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/minfer info light_resnet50
# The model-zoo files in the onnx wheel keep the graph but not the weights (placeholders):
# --random-weights draws them, so the outputs are not all equal.
.venv/bin/minfer run light_resnet50 --random-weights --repeat 5
