"""minfer's testing kit: graph builders, hypothesis strategies and the pass property checks.

Public API for plugin authors (imports nothing heavy; hypothesis loads with
`minfer_core.testing.strategies` and `verify_pass`):

- `GraphBuilder`, `random_feeds`, `random_array`: write small graphs and feeds.
- `minfer_core.testing.strategies`: hypothesis strategies (`graphs`, `shapes`,
  `floats_array`, `expose`) to build a pass's target strategy (`Pass.patterns`).
- `check_pass`, `check_pipeline`: one-graph checks (outputs within the pass's
  tolerance per dtype, valid graph, idempotent); `verify_pass`,
  `verify_pipeline`: the hypothesis-driven properties the suite runs,
  including "the pass really fires on its target strategy".
- `minfer_core.testing.ops`: one op at a time: `single_node_model`,
  `assert_node_matches_onnxruntime` (onnxruntime as the oracle), `call_kernel`.
- The suite as a pytest option: ``pytest --minfer-passes`` checks every
  installed pass, ``pytest --minfer-passes=my-plugin`` only that plugin's
  (plus the whole pipeline). Profiles: ``--hypothesis-profile=minfer-ci``
  (default for the suite) and ``minfer-nightly`` (or ``MINFER_HYPOTHESIS_PROFILE``).
"""

from __future__ import annotations

from .builder import GraphBuilder, random_array, random_feeds
from .checks import (
    PassCheckFailure,
    PassOutcome,
    UnusableExample,
    check_pass,
    check_pipeline,
    outputs_mismatch,
    run_graph,
    signature,
    tolerance,
)
from .suite import register_profiles, verify_pass, verify_pipeline

__all__ = [
    "GraphBuilder",
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
    "tolerance",
    "UnusableExample",
    "verify_pass",
    "verify_pipeline",
]
