"""The example plugin's pass: ScaledTanh with alpha=1 and beta=1 is plain Tanh.

Exact: tanh(1 * x) * 1 == tanh(x) for every x. Firing lets the rest of the
pipeline (and other engines, after `minfer optimize`) see a standard op.
"""

from minfer_core import Node, Pass


def plain_scaled_tanh(graph):
    """Replace com.example::ScaledTanh(alpha=1, beta=1) by Tanh."""
    changed = False
    for node in list(graph.nodes):
        if (node.domain, node.op_type) != ("com.example", "ScaledTanh"):
            continue
        if node.attrs.get("alpha", 1.0) != 1.0 or node.attrs.get("beta", 1.0) != 1.0:
            continue
        graph.replace([node], Node("Tanh", node.inputs, node.outputs, {}, node.name))
        changed = True
    return changed


# The target strategy is named, not imported: it needs hypothesis, which only the property suite
# (`pytest --minfer-passes=minfer-contrib-example`) loads. The plugin itself runs without it.
PASS = Pass("plain_scaled_tanh", plain_scaled_tanh, patterns="minfer_contrib_example.strategies:scaled_tanh_graphs",
            rtol=1e-6, atol=1e-7)
