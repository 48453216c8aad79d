"""``shape_inference``: re-annotate every value's dtype and shape after rewriting.

Annotations of values that no longer exist are dropped (the graph's inputs
and outputs keep their declared types), then the core's static inference
runs over the whole graph. It reports a change only when the annotations
differ, so the fixed-point loop settles. Exact: it changes no computation.

The inference itself is the core's (``minfer_core.infer_types``).
"""

from __future__ import annotations

from minfer_core import Graph, get_registry, infer_types


def shape_inference(graph: Graph) -> bool:
    """Drop stale value annotations and re-infer every value's dtype and shape."""
    before = dict(graph.types)
    live = set(graph.inputs) | set(graph.outputs) | {o for n in graph.nodes for o in n.outputs if o}
    graph.types = {k: v for k, v in graph.types.items() if k in live}
    infer_types(graph, get_registry())
    return graph.types != before
