"""minfer's testing kit: graph builders, hypothesis strategies and the pass property checks.

Public API for plugin authors (imports nothing heavy; hypothesis loads with
`minfer_core.testing.strategies` and `verify_pass`):

- `GraphBuilder`, `random_feeds`, `random_array`: write small graphs and feeds.
- `minfer_core.testing.strategies`: hypothesis strategies (`graphs`, `shapes`,
  `floats_array`, `expose`) to build a pass's target strategy (`Pass.patterns`).
- `target_strategy(pass)`: the pass's `Pass.patterns` resolved (an import
  string is imported only then) and called: its hypothesis strategy.
- `check_pass`, `check_pipeline`: one-graph checks (outputs within the pass's
  tolerance per dtype, valid graph, idempotent); `verify_pass`,
  `verify_pipeline`: the hypothesis-driven properties the suite runs,
  including "the pass really fires on its target strategy".
- `minfer_core.testing.ops`: one op at a time: `single_node_model`,
  `assert_node_matches_onnxruntime` (onnxruntime as the oracle), `call_kernel`.
- The suite as a pytest option: ``pytest --minfer-passes`` checks every
  installed pass, ``pytest --minfer-passes=my-plugin`` only that plugin's
  (plus the whole pipeline). Profiles (`load_profile` makes one every
  test's): ``minfer-ci`` (the suite's default), ``minfer-dev`` and
  ``minfer-nightly``, chosen by ``MINFER_HYPOTHESIS_PROFILE`` or ``--hypothesis-profile``.
"""

from __future__ import annotations

from typing import Any

# imported on first use: the pytest11 plugin lives in this package, and every pytest run in the environment
# imports it, so the package itself imports nothing (no graph, engine, onnx or hypothesis)
_LAZY = {name: module for module, names in {
    "builder": "GraphBuilder random_array random_feeds",
    "checks": "PassCheckFailure PassOutcome UnusableExample check_pass check_pipeline outputs_mismatch run_graph "
              "signature tolerance",
    "suite": "load_profile register_profiles target_strategy verify_pass verify_pipeline",
}.items() for name in names.split()}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'minfer_core.testing' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"minfer_core.testing.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    "GraphBuilder",
    "load_profile",
    "PassCheckFailure",
    "PassOutcome",
    "check_pass",
    "check_pipeline",
    "outputs_mismatch",
    "random_array",
    "random_feeds",
    "register_profiles",
    "run_graph",
    "signature",
    "target_strategy",
    "tolerance",
    "UnusableExample",
    "verify_pass",
    "verify_pipeline",
]
