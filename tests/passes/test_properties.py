"""minfer's own run of the pass property suite: every installed pass, the `all` pipeline."""

from __future__ import annotations

from minfer_core.testing.pass_suite import (  # noqa: F401  (pytest collects these)
    pytest_generate_tests,
    test_all_pipeline_keeps_outputs,
    test_every_pass_is_covered,
    test_pass_fires_and_keeps_outputs,
    test_pass_keeps_outputs_on_random_graphs,
)
