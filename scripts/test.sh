#!/usr/bin/env bash
# Set up minfer with test dependencies and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
export MINFER_STRICT_PLUGINS=1   # a plugin that fails to load must fail the run, not vanish
export HYPOTHESIS_PROFILE=${HYPOTHESIS_PROFILE:-ci}
set +e
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
status=$?
set -e
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests: failing the run" >&2
  exit 1
fi
exit "$status"
