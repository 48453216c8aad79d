"""The build sequence up to kernel binding, in one place: checks, passes, inference, function expansion.

``strict`` (the default) refuses an invalid model before any pass runs, so
the error names the model's node and not a pass (`strict.check_model`, then
strict shape inference); ``strict=False`` is the lenient build (inference
failures recorded in ``inference_failures``, invalid nodes found, if at all,
at run time). Either way a broken plugin warns (or raises under
``MINFER_STRICT_PLUGINS=1``), and two plugins claiming an op the model uses
is an AmbiguousKernelError unless a preference decides.
"""

from __future__ import annotations

from typing import Iterable

import attrs

from .expand import expand_functions
from .graph import Graph
from .infer import infer_types
from .passes import PassResult
from .pipeline import PassSelection, optimize
from .plugins import Registry, check_plugins
from .strict import check_model


@attrs.frozen
class Built:
    """What the build did before binding: the passes that changed the graph, and inference failures."""

    pass_results: list[PassResult]
    inference_failures: dict[str, str]


def build_graph(
    graph: Graph,
    registry: Registry,
    passes: PassSelection,
    disabled_passes: Iterable[str],
    *,
    provider: str,
    strict: bool = True,
) -> Built:
    """Check, optimize, annotate and expand ``graph`` in place, ready for kernel binding."""
    check_plugins(registry)
    if strict:
        check_model(graph)
    else:
        graph.validate()
    check_op_claims(graph, registry)
    if strict:
        check_types(graph, registry)
    results = optimize(graph, registry, passes, disabled_passes)
    # after the passes failures are recorded: the model was checked, and the run computes real shapes. A rewrite
    # keeps what a value name computes, so when every value already has a static type inference could only repeat it
    failures = {} if strict and _all_static(graph) else infer_types(graph, registry)
    # expansion continues into inlined bodies; a context-dependent body waits for its inputs' types
    while expand_functions(graph, registry, provider):
        failures = infer_types(graph, registry)
    return Built(results, failures)


def check_types(graph: Graph, registry: Registry) -> None:
    """Strict shape inference on the model as given, so an error names its node, not a pass.

    The types it infers stay on the graph and ``graph.meta["inferred"]`` says
    so: a pass that re-infers types need not repeat it before any rewrite.
    """
    infer_types(graph, registry, strict=True)
    graph.meta["inferred"] = True


def check_op_claims(graph: Graph, registry: Registry) -> None:
    """Every op the graph uses is claimed by one plugin, or by several with a preference (else AmbiguousKernelError)."""
    for domain, op_type in sorted(_op_types(graph)):
        registry.op_def(domain, op_type)


def _all_static(graph: Graph) -> bool:
    types = [graph.types.get(out) for node in graph.nodes for out in node.outputs if out]
    static = all(t is not None and t.is_static and min(t.shape, default=0) >= 0 for t in types)  # type: ignore[arg-type]
    return static and next(graph.subgraphs(), None) is None


def _op_types(graph: Graph) -> set[tuple[str, str]]:
    found = {(n.domain, n.op_type) for n in graph.nodes}
    for sub in graph.subgraphs():
        found |= _op_types(sub)
    return found
