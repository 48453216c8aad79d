"""``shape_inference``: re-annotate every value's dtype and shape after rewriting.

Annotations of values that no longer exist are dropped (the graph's inputs
and outputs keep their declared types), then the core's static inference
runs over the whole graph. It reports a change only when the annotations
differ, so the fixed-point loop settles. Once it has inferred a graph and
every value has a static type, a later application only drops stale
annotations (see the function). Exact: it changes no computation.

The inference itself is the core's (``minfer_core.infer_types``).
"""

from __future__ import annotations

from minfer_core import Graph, TensorType, get_registry, infer_types


INFERRED = "minfer_passes.inferred"
"""``graph.meta`` flag: this pass has inferred the whole graph once (declared value_info is not trusted before).
The core's strict build sets ``graph.meta["inferred"]`` after inferring every value itself: that counts too."""


def shape_inference(graph: Graph) -> bool:
    """Drop stale value annotations and re-infer every value's dtype and shape."""
    before = dict(graph.types)
    made = [o for n in graph.nodes for o in n.outputs if o]
    live = set(graph.inputs) | set(graph.outputs) | set(made)
    graph.types = {k: v for k, v in graph.types.items() if k in live}
    inferred = graph.meta.get(INFERRED) or graph.meta.get("inferred")  # by this pass, or by the core's strict build
    if inferred and all(_static(graph.types.get(o)) for o in made):
        # a rewrite keeps what a value name computes: once every value has a static type, inference
        # could only repeat it, and re-inferring every round would cost more than all the rewrites
        return graph.types != before
    infer_types(graph, get_registry())
    graph.meta[INFERRED] = True
    return graph.types != before


def _static(t: TensorType | None) -> bool:
    return t is not None and t.is_static and all(d >= 0 for d in t.shape)  # type: ignore[union-attr,operator]
