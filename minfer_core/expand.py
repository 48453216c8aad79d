"""ONNX function expansion: an op with no kernel but a function body runs as its body."""

from __future__ import annotations

from .graph import Graph
from .plugins import Registry


def expand_functions(graph: Graph, registry: Registry, provider: str) -> int:
    """Replace nodes that have no kernel but an ONNX function body by the body's nodes."""
    return 0
