#!/usr/bin/env bash
# The installed-wheels stage: minfer as a user gets it from `pip install`, not from this checkout.
#
# Builds a wheel of minfer-core, of every plugins/*/ and of the example plugin from a clean copy of
# the sources, checks that every file of their packages ships (subpackages, data), installs them (non-editable) into a fresh venv, and from a directory outside the
# checkout runs, first without pytest or hypothesis installed (a plugin must not need them):
#   minfer plugins --json (no plugin failed to load, every built plugin present), minfer run,
#   minfer bisect-passes, import minfer_core.testing, and `minfer --help` not offering `bench`;
# then with the example's test extra (pytest, hypothesis):
#   pytest --minfer-passes=minfer-contrib-example (runs tests and passes), and
#   pytest --minfer-passes=<a name that matches nothing> (a usage error, exit code 4).
# Any failing step fails the stage. Usage: bash tests/install/run_installed.sh   (PYTHON=python3.X to choose)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
here="$root/tests/install"
PY=${PYTHON:-python3}
MODEL=${MINFER_INSTALLED_MODEL:-light_squeezenet}
work=$(mktemp -d "${TMPDIR:-/tmp}/minfer-installed.XXXXXX")
trap 'rm -rf "$work"' EXIT
log="$work/pip.log"
start=$SECONDS

step() { echo "[installed $((SECONDS - start))s] $*"; }
fail() { echo "installed-wheels stage FAILED: $*" >&2; exit 1; }
quiet_pip() { "$@" >> "$log" 2>&1 || { cat "$log" >&2; fail "pip: $*"; }; }

step "copying the sources (tracked and new files; no build/ or egg-info leftovers that setuptools would ship)"
mkdir "$work/src" "$work/dist" "$work/outside"
(cd "$root" && git ls-files -z --cached --others --exclude-standard) \
  | (cd "$root" && while IFS= read -r -d '' f; do [ -f "$f" ] && printf '%s\0' "$f"; done) \
  | (cd "$root" && tar --null -T - -cf -) | tar -xf - -C "$work/src"

packages=(.)
for project in "$work"/src/plugins/*/pyproject.toml "$work/src/examples/minfer_contrib_example/pyproject.toml"; do
  packages+=("${project%/pyproject.toml}")
done
step "building ${#packages[@]} wheels: ${packages[*]#$work/src/}"
# one build venv with setuptools instead of pip's isolated build env per package (much faster), kept apart
# from the venv under test, where setuptools could hide a missing dependency (pkg_resources)
"$PY" -m venv "$work/build"
quiet_pip "$work/build/bin/python" -m pip install --upgrade "setuptools>=70.1"  # bdist_wheel built in
(cd "$work/src" && quiet_pip "$work/build/bin/python" -m pip wheel --no-deps --no-build-isolation -w "$work/dist" "${packages[@]}")
"$PY" -m venv "$work/venv"
vpy="$work/venv/bin/python"
quiet_pip "$vpy" -m pip uninstall --yes setuptools  # older Pythons put it in every venv; users may not have it
wheels=("$work"/dist/*.whl)
[ "${#wheels[@]}" -eq "${#packages[@]}" ] || fail "expected ${#packages[@]} wheels, got: ${wheels[*]##*/}"
"$PY" "$here/check_wheels.py" "$work/src" "${wheels[@]}" || fail "a subpackage or data file is left out of a wheel"

step "installing the wheels (non-editable) and their dependencies into a fresh venv"
quiet_pip "$vpy" -m pip install "${wheels[@]}"
export MINFER_STRICT_PLUGINS=1
unset PYTHONPATH
cd "$work/outside"
minfer="$work/venv/bin/minfer"

checks() {  # checks PHASE MODULE...: the modules import from the venv, the plugins load, a model runs
  step "$1: where ${*:2} come from, the plugins"
  where=$("$vpy" -c "import sys, importlib; [importlib.import_module(m) for m in sys.argv[1:]]; import minfer_core; print(minfer_core.__file__)" "${@:2}")
  case "$where" in "$work/venv/"*) ;; *) fail "minfer_core is imported from $where, not the venv";; esac
  "$minfer" plugins --json > plugins.json || fail "minfer plugins --json"
  "$vpy" "$here/check_plugins.py" plugins.json "${wheels[@]}" || fail "minfer plugins: see above"
  step "$1: minfer run $MODEL --random-weights"
  "$minfer" run "$MODEL" --random-weights || fail "minfer run $MODEL"
}

if "$vpy" -c "import hypothesis" 2>/dev/null || "$vpy" -c "import pytest" 2>/dev/null; then
  fail "pytest or hypothesis came in as a dependency of the wheels; plugins must run without them"
fi
checks "without pytest and hypothesis" minfer_core.testing minfer_contrib_example.passes
step "without pytest and hypothesis: minfer bisect-passes on $MODEL with random weights"
# the light models' placeholder weights (ConstantOfShape) give degenerate outputs that say nothing about a pass
"$vpy" -c "import sys, onnx; from minfer_core.testing.zoo import randomized; onnx.save(randomized(sys.argv[1]), 'model.onnx')" "$MODEL"
"$minfer" bisect-passes model.onnx | tail -n 1 || fail "minfer bisect-passes on $MODEL with random weights"
usage=$("$minfer" --help)
if grep -qw bench <<< "$usage"; then
  fail "the installed CLI offers 'bench', a checkout tool (python -m bench.benchmark in the repository)"
fi

step "installing the example's test extra (pytest, hypothesis)"
quiet_pip "$vpy" -m pip install --find-links "$work/dist" "minfer-contrib-example[test]"
checks "with pytest and hypothesis" minfer_core.testing.pytest_plugin minfer_core.testing.strategies
step "pytest --minfer-passes=minfer-contrib-example"
set +e
"$vpy" -m pytest -q -p no:cacheprovider -rs --minfer-passes=minfer-contrib-example | tee suite.txt
status=${PIPESTATUS[0]}
set -e
[ "$status" -eq 0 ] || fail "pytest --minfer-passes=minfer-contrib-example exited $status (5: no tests ran)"
# its pass on its target strategy and on random graphs, the pipeline, coverage: all run, none skipped
grep -q "^4 passed in" suite.txt || fail "pytest --minfer-passes=minfer-contrib-example did not run its 4 tests"
step "pytest --minfer-passes=no-such-plugin must be a usage error"
set +e
"$vpy" -m pytest -q -p no:cacheprovider --minfer-passes=no-such-plugin > usage.txt 2>&1
status=$?
set -e
[ "$status" -eq 4 ] || { cat usage.txt >&2; fail "--minfer-passes=no-such-plugin exited $status, not 4"; }
step "passed in $((SECONDS - start))s"
