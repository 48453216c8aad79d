"""Activation fusion: ``act(Conv(...))``, ``act(Gemm(...))``, ``act(MatMul(...))`` as one node.

Pattern: a Conv, Gemm or MatMul whose output's only reader is one of Relu,
LeakyRelu, Clip (constant or absent min/max), Sigmoid, HardSigmoid,
HardSwish, Tanh or Swish, or whose output x has exactly two readers forming
Swish, ``Mul(x, Sigmoid(x))`` or ``Mul(x, Sigmoid(Mul(x, alpha)))`` with a
one-element constant alpha (SiLU in YOLO-style detectors, QuickGELU's 1.702),
the Sigmoid's (and the scaling's) output read by that Mul alone; the base
output and the intermediate values are not graph outputs. Replacement:
``ai.minfer::FusedConv`` / ``FusedGemm`` / ``FusedMatMul`` with the base op's
attributes plus ``activation`` and ``activation_params`` (see `ops`; Swish's
params: [alpha]). Exact:
the kernel runs the registered base kernel and then the same activation
formula, in place on the fresh result (saving one intermediate tensor); the
activation formula may round differently from the standalone kernel (rtol 1e-5).
Only float dtypes are fused (the fused kernels' activations are float-only),
only when the base op has a kernel, and Gemm only from opset 7 (earlier Gemm
broadcast differently).
"""

from __future__ import annotations

import numpy as np

from minfer_core import Graph, Node

from ._util import FLOATS, MINFER_DOMAIN, add_const, const, dtype_of, fresh, has_kernel, is_op, opset, other_input

FUSED = {"Conv": "FusedConv", "Gemm": "FusedGemm", "MatMul": "FusedMatMul"}
ACTIVATIONS = ("Relu", "LeakyRelu", "Clip", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh")
SWISH_OPSET = 24  # the opset that has Swish as one op; below it the portable form is Mul, Sigmoid, Mul


def _params(graph: Graph, act: Node) -> list[float] | None:
    """The activation's parameters as floats, or None when they are not constant."""
    a = act.attrs
    if act.op_type == "LeakyRelu":
        return [float(a.get("alpha", 0.01))]
    if act.op_type == "HardSigmoid":
        return [float(a.get("alpha", 0.2)), float(a.get("beta", 0.5))]
    if act.op_type != "Clip":
        return []
    if "min" in a or "max" in a:
        return [float(a.get("min", -np.inf)), float(a.get("max", np.inf))]
    bounds = []
    for i, default in ((1, -np.inf), (2, np.inf)):
        name = act.inputs[i] if len(act.inputs) > i else ""
        value = const(graph, name) if name else np.asarray(default)
        if value is None:
            return None
        bounds.append(float(np.asarray(value)))
    return bounds


def _fusable_base(graph: Graph, node: Node) -> bool:
    if node.domain or node.op_type not in FUSED or len(node.outputs) != 1:
        return False
    if node.op_type == "Gemm" and (opset(graph) < 7 or "broadcast" in node.attrs):
        return False
    return dtype_of(graph, node.outputs[0]) in FLOATS and has_kernel(graph, "", node.op_type)


def _swish(graph: Graph, x: str) -> tuple[float, list[Node]] | None:
    """(alpha, the nodes) when the readers of ``x`` compute Swish of it and nothing else: Sigmoid(x) or
    Sigmoid(Mul(x, alpha)) (alpha a one-element constant), then Mul(x, that), the last node's output the result."""
    readers = graph.consumers(x)
    if len(readers) != 2 or len(set(map(id, readers))) != 2:
        return None
    outputs = set(graph.outputs)
    for first, last in (readers, readers[::-1]):
        alpha, chain = 1.0, [first]
        if is_op(first, "Mul"):  # the scaling: alpha * x
            alpha_name = other_input(first, x)
            c = const(graph, alpha_name) if alpha_name else None
            rank = len(getattr(graph.type_of(x), "shape", None) or ())
            if c is None or c.size != 1 or c.dtype != dtype_of(graph, x) or c.ndim > rank:
                continue
            gate = graph.sole_consumer(first.outputs[0])
            if not is_op(gate, "Sigmoid") or first.outputs[0] in outputs:
                continue
            alpha, chain = float(c.reshape(())), [first, gate]
        if not is_op(chain[-1], "Sigmoid") or chain[-1].inputs[0] != (chain[0].outputs[0] if len(chain) > 1 else x):
            continue
        s = chain[-1].outputs[0]
        if s in outputs or graph.sole_consumer(s) is not last or not is_op(last, "Mul") or other_input(last, x) != s:
            continue
        return alpha, [*chain, last]
    return None


def activation_fusion(graph: Graph) -> bool:
    """Fuse Conv/Gemm/MatMul + a following activation (or Swish's Sigmoid and Mul) into one ai.minfer node."""
    changed = False
    for base in list(graph.nodes):
        if base not in graph.nodes or not _fusable_base(graph, base) or base.outputs[0] in graph.outputs:
            continue
        act = graph.sole_consumer(base.outputs[0])
        if is_op(act, *ACTIVATIONS) and act.inputs[0] == base.outputs[0]:
            params, name, nodes = _params(graph, act), act.op_type, [act]
        elif is_op(act, "Swish") and act.inputs[0] == base.outputs[0]:
            params, name, nodes = [float(act.attrs.get("alpha", 1.0))], "Swish", [act]
        else:
            swish = _swish(graph, base.outputs[0])
            if swish is None:
                continue
            params, name, nodes = [swish[0]], "Swish", swish[1]
        if params is None:
            continue
        attrs = dict(base.attrs, activation=name, activation_params=params)
        fused = Node(FUSED[base.op_type], base.inputs, nodes[-1].outputs, attrs, base.name, MINFER_DOMAIN)
        graph.opsets.setdefault(MINFER_DOMAIN, 1)
        graph.replace([base, *nodes], fused)
        changed = True
    return changed


def activation_nodes(graph: Graph, act: str, params: list[float], src: str, out: str, name: str) -> list[Node]:
    """``out = act(src)`` as standard nodes (for --portable): Swish below opset 24 as Mul, Sigmoid, Mul (the
    scaling left out for alpha 1), else one node (`activation_node`)."""
    if act != "Swish" or opset(graph) >= SWISH_OPSET:
        return [activation_node(graph, act, params, src, out, name)]
    alpha = params[0] if params else 1.0
    t = graph.type_of(src)
    nodes, x = [], src
    if alpha != 1.0:
        dtype = t.dtype if t is not None else np.dtype(np.float32)
        x = fresh(graph, f"{name}_scaled")
        nodes.append(Node("Mul", [src, add_const(graph, f"{name}_alpha", np.array(alpha, dtype=dtype))], [x], {},
                          fresh(graph, f"{name}_scale")))
    gate = fresh(graph, f"{name}_gate")
    nodes += [Node("Sigmoid", [x], [gate], {}, fresh(graph, f"{name}_sigmoid")), Node("Mul", [src, gate], [out], {}, name)]
    if t is not None:
        graph.types.update({v: t for v in (x, gate) if v != src})
    return nodes


def activation_node(graph: Graph, act: str, params: list[float], src: str, out: str, name: str) -> Node:
    """``out = act(src)`` as a standard node, with ``params`` as activation_fusion recorded them (for --portable;
    Swish: one node from opset 24, `activation_nodes` below it)."""
    dtype = graph.type_of(src).dtype if graph.type_of(src) is not None else np.dtype(np.float32)
    if act == "LeakyRelu":
        return Node(act, [src], [out], {"alpha": params[0]}, name)
    if act == "Swish":
        if opset(graph) < SWISH_OPSET:
            raise ValueError(f"Swish is one op from opset {SWISH_OPSET} on: use activation_nodes")
        return Node(act, [src], [out], {"alpha": params[0] if params else 1.0}, name)
    if act == "HardSigmoid":
        return Node(act, [src], [out], {"alpha": params[0], "beta": params[1]}, name)
    if act == "Clip":
        lo, hi = params
        if opset(graph) < 11:
            return Node(act, [src], [out], {"min": lo, "max": hi}, name)
        names = [add_const(graph, f"{name}_min", np.array(lo, dtype=dtype)),
                 add_const(graph, f"{name}_max", np.array(hi, dtype=dtype))]
        return Node(act, [src, *names], [out], {}, name)
    return Node(act, [src], [out], {}, name)
