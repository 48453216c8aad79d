"""Control-flow passes: take apart control flow whose outcome is known at build time.

- ``constant_if_inlining``: an ``If`` whose condition is a constant (an
  initializer, as constant folding leaves a computed one) is replaced by the
  nodes of the branch it takes. The branch's own values (node outputs,
  initializers) get names unique in the graph, every read of them follows
  (nested subgraphs too), and each branch output becomes the If output of
  the same position: its producer is renamed to output it, or an
  ``Identity`` copies it when the branch returns an outer value, a constant
  or one value twice. Exact: the same nodes run on the same values; the
  untaken branch never runs either way.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minfer_core import Graph, Node


def constant_if_inlining(graph: Graph) -> bool:
    """Replace each If whose condition is a constant by the nodes of the branch it takes."""
    changed = False
    for node in list(graph.nodes):
        branch = _taken_branch(graph, node)
        if branch is not None:
            _inline(graph, node, branch.copy())
            changed = True
    return changed


def _taken_branch(graph: Graph, node: Node) -> Graph | None:
    if node.op_type != "If" or node.domain not in ("", "ai.onnx") or not node.inputs:
        return None
    cond = graph.initializers.get(node.inputs[0])
    if cond is None or np.size(cond) != 1:
        return None
    branch = node.attrs.get("then_branch" if bool(np.asarray(cond).reshape(-1)[0]) else "else_branch")
    if not isinstance(branch, Graph) or branch.inputs or len(branch.outputs) != len(node.outputs):
        return None  # not a valid If: left for the build to refuse with its own message
    return branch


def _inline(graph: Graph, node: Node, body: Graph) -> None:
    """Put ``body``'s nodes where ``node`` stands, its values renamed apart, its outputs as ``node``'s."""
    prefix = node.name or "if"
    taken: set[str] = set(graph.values()) | body.values()
    renamed = {}
    for name in list(body.initializers):
        new = renamed[name] = _fresh(graph, taken, f"{prefix}_{name}")
        graph.add_initializer(new, body.initializers[name])
        body.replace_all_uses(name, new, graph_outputs=False)
    for inner in body.topological_order():
        for out in [o for o in inner.outputs if o]:
            new = renamed[out] = _fresh(graph, taken, f"{prefix}_{out}")
            body.rename_output(inner, out, new)
    extra = _bind_outputs(body, node, [renamed.get(o, o) for o in body.outputs])
    for copy in extra:
        copy.name = _fresh(graph, taken, copy.name)
    for old, new in renamed.items():
        if old in body.types and new not in graph.types:
            graph.types[new] = body.types[old]
    nodes = [Node(n.op_type, n.inputs, n.outputs, n.attrs, _fresh(graph, taken, f"{prefix}_{n.name or n.op_type}"),
                  n.domain) for n in body.topological_order()]
    graph.replace([node], nodes + extra)


def _bind_outputs(body: Graph, node: Node, sources: list[str]) -> list[Node]:
    """Make ``body``'s nodes produce ``node``'s outputs; returns the Identity nodes for outputs that cannot be."""
    extra, moved = [], {}  # moved: a body value -> the If output its producer now outputs instead
    for target, source in zip(node.outputs, sources):
        producer = body.producer(source)
        if not target:
            continue
        if producer is not None and source not in moved:
            body.rename_output(producer, source, target)
            moved[source] = target
        else:  # an outer value, a constant, or a value an earlier output already took
            extra.append(Node("Identity", [moved.get(source, source)], [target], {}, f"{node.name or 'if'}_copy"))
    return extra


def _fresh(graph: Graph, taken: set[str], base: str) -> str:
    name = graph.unique_name(base)
    while name in taken:
        name = graph.unique_name(base)
    taken.add(name)
    return name


# ---- property-suite patterns ---------------------------------------------------------------------


def patterns() -> Any:
    """The pass's target strategy: If nodes whose condition is a constant (an initializer, or a Constant
    node that folding makes one) or, where nothing may change, computed from the input; branches read
    outer values, hold constants of their own and may return one value twice or an outer one; the If's
    output is sometimes a graph output or read twice."""
    from hypothesis import strategies as st

    from minfer_core.testing import GraphBuilder
    from minfer_core.testing.control import computed_condition, if_node
    from minfer_core.testing.strategies import expose, shapes

    @st.composite
    def graphs(draw: Any) -> Graph:
        b = GraphBuilder(opset=draw(st.sampled_from([13, 17])))
        dtype = draw(st.sampled_from([np.float32, np.float64]))
        shape = draw(shapes(1, 3))
        x = b.input(shape, dtype)
        how = draw(st.sampled_from(["initializer", "initializer", "Constant", "computed"]))
        if how == "computed":
            cond = computed_condition(b, x, dtype)
        else:
            value = np.asarray(draw(st.booleans()))
            cond = b.const(value) if how == "initializer" else b.op("Constant", value=value)
        outputs = draw(st.integers(1, 2))
        res = if_node(draw, b, x, shape, dtype, cond, outputs)
        first = res if outputs == 1 else res[0]
        expose(draw, b, first)
        b.output(b.op("Neg", first), *([res[1]] if outputs == 2 else []))
        return b.build()

    return graphs()
