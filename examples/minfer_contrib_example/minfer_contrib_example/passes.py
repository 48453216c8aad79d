"""The example plugin's pass: ScaledTanh with alpha=1 and beta=1 is plain Tanh.

Exact: tanh(1 * x) * 1 == tanh(x) for every x. Firing lets the rest of the
pipeline (and other engines, after `minfer optimize`) see a standard op.
"""

from hypothesis import strategies as st

from minfer_core import Node, Pass
from minfer_core.testing import GraphBuilder
from minfer_core.testing.strategies import expose, shapes


def plain_scaled_tanh(graph):
    """Replace com.example::ScaledTanh(alpha=1, beta=1) by Tanh."""
    changed = False
    for node in list(graph.nodes):
        if (node.domain, node.op_type) != ("com.example", "ScaledTanh"):
            continue
        if node.attrs.get("alpha", 1.0) != 1.0 or node.attrs.get("beta", 1.0) != 1.0:
            continue
        index = graph.nodes.index(node)
        graph.remove_node(node)
        graph.add_node(Node("Tanh", node.inputs, node.outputs, {}, node.name), index)
        changed = True
    return changed


@st.composite
def scaled_tanh_graphs(draw):
    """ScaledTanh with default or drawn attributes, its output sometimes also a graph output."""
    b = GraphBuilder()
    x = b.input(draw(shapes()))
    attrs = draw(st.sampled_from([{}, {"alpha": 1.0, "beta": 1.0}, {"alpha": 2.0}, {"beta": 0.5}]))
    t = b.op("ScaledTanh", x, domain="com.example", **attrs)
    expose(draw, b, t)
    b.output(b.op("Relu", t))
    return b.build()


PASS = Pass("plain_scaled_tanh", plain_scaled_tanh, patterns=scaled_tanh_graphs, rtol=1e-6, atol=1e-7)
