"""Find the first pass application that moves a model's outputs beyond that pass's tolerance.

The property suite proves passes on random graphs; this applies the same
check (`outputs_mismatch` at the pass's own ``rtol``/``atol``) pass by pass
on one real model: ``minfer bisect-passes MODEL`` and `bisect`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import PassError


def bisect_feeds(graph: Any, seed: int, dims: dict[str, int]) -> dict[str, np.ndarray]:
    from .builder import random_feeds

    try:
        return random_feeds(graph, seed, dims)
    except ValueError as exc:  # an input without a declared shape
        raise PassError(f"bisect-passes cannot draw feeds: {exc}") from exc


def bisect(graph: Any, level: Any = "all", disabled: Any = (), feeds: dict[str, np.ndarray] | None = None,
           log: Any = print) -> tuple[Any, str] | None:
    """Apply the pipeline one pass at a time; return (record, why) for the first application that
    moves the outputs beyond that pass's tolerance, or None when none does."""
    from ..pipeline import MAX_ROUNDS, apply_pass, select_passes
    from ..plugins import get_registry
    from .checks import outputs_mismatch, run_graph

    passes = select_passes(get_registry(), level, disabled)
    feeds = feeds if feeds is not None else bisect_feeds(graph, 0, {})
    current = run_graph(graph, feeds)
    for round_ in range(1, MAX_ROUNDS + 1):
        changed = False
        for p in passes:
            result = apply_pass(graph, p, round_=round_)
            if not result.changed:
                continue
            changed = True
            outputs = run_graph(graph, feeds)
            why = outputs_mismatch(current, outputs, p.rtol, p.atol, graph.outputs)
            log(f"{result.describe()}: " + ("BEYOND TOLERANCE" if why else "ok"))
            if why:
                return result, why
            current = outputs
        if not changed:
            break
    return None
