#!/usr/bin/env bash
# Set up minfer with test dependencies and run the whole test suite, then the installed-wheels stage
# (tests/install/run_installed.sh: the wheels in a fresh venv, run from outside the checkout).
# Usage: bash scripts/test.sh [PYTEST ARGS...]
#   With pytest arguments only pytest runs, unless MINFER_INSTALLED=1; MINFER_INSTALLED=0 skips the stage.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
export MINFER_STRICT_PLUGINS=1   # a plugin that fails to load must fail the run, not vanish
export MINFER_HYPOTHESIS_PROFILE=${MINFER_HYPOTHESIS_PROFILE:-minfer-ci}   # the testing kit's profiles, the one set
installed=${MINFER_INSTALLED:-$([ "$#" -eq 0 ] && echo 1 || echo 0)}
set +e
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
status=$?
set -e
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests: failing the run" >&2
  exit 1
fi
if [ "$installed" = 1 ]; then
  # run even when pytest failed: a packaging break is reported in the same CI run
  bash tests/install/run_installed.sh || status=1
fi
exit "$status"
