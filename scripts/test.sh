#!/usr/bin/env bash
# Set up minfer with test dependencies and run the whole test suite, then the installed-wheels stage
# (tests/install/run_installed.sh: the wheels in a fresh venv, run from outside the checkout).
# Usage: bash scripts/test.sh [PYTEST ARGS...]
#   With pytest arguments only pytest runs, unless MINFER_INSTALLED=1; MINFER_INSTALLED=0 skips the stage.
#   Without pytest arguments the kernel, conformance and model suites also run without minfer-ops-numba
#   (MINFER_NUMPY_PATH=0 skips that run, =1 makes it run with arguments too).
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
numpy_path=${MINFER_NUMPY_PATH:-$([ "$#" -eq 0 ] && echo 1 || echo 0)}
if [ "$numpy_path" = 1 ] && .venv/bin/python -c "import minfer_ops_numba" 2>/dev/null; then
  # minfer-ops-numba's kernels outrank the numpy ones where they apply, so the run above tested them in sessions;
  # the suites that reach kernels through sessions run once more without it (the MINFER_PLUGINS allow-list: every
  # other plugin), so the numpy path, the default without numba, stays tested too (the numpy kernels' own tests
  # in tests/plugins call them directly: the run above covers them)
  others=$(.venv/bin/python -c "from importlib.metadata import entry_points as e; print(','.join(sorted({p.dist.name for p in e(group='minfer.plugins')} - {'minfer-ops-numba'})))")
  echo "again without minfer-ops-numba: MINFER_PLUGINS=$others"
  MINFER_PLUGINS=$others .venv/bin/python -m pytest -q -p no:cacheprovider tests/kernels tests/conformance tests/models \
    tests/runtime/test_procs.py::test_conv_methods_give_the_threads_result || status=1
fi
if [ "$installed" = 1 ]; then
  # run even when pytest failed: a packaging break is reported in the same CI run
  bash tests/install/run_installed.sh || status=1
fi
exit "$status"
