#!/usr/bin/env bash
# Set up minfer and run a real model end to end: ResNet-50 from the onnx wheel's model zoo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/minfer info light_resnet50
.venv/bin/minfer run light_resnet50 --repeat 5
