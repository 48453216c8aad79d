"""Activation fusion: ``act(Conv(...))``, ``act(Gemm(...))``, ``act(MatMul(...))`` as one node.

Pattern: a Conv, Gemm or MatMul whose output's only reader is one of Relu,
LeakyRelu, Clip (constant or absent min/max), Sigmoid, HardSigmoid,
HardSwish or Tanh, and whose output is not a graph output. Replacement:
``ai.minfer::FusedConv`` / ``FusedGemm`` / ``FusedMatMul`` with the base op's
attributes plus ``activation`` and ``activation_params`` (see `ops`). Exact:
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

from ._util import FLOATS, MINFER_DOMAIN, add_const, const, dtype_of, has_kernel, opset

FUSED = {"Conv": "FusedConv", "Gemm": "FusedGemm", "MatMul": "FusedMatMul"}
ACTIVATIONS = ("Relu", "LeakyRelu", "Clip", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh")


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


def activation_fusion(graph: Graph) -> bool:
    """Fuse Conv/Gemm/MatMul + a following activation into one ai.minfer node."""
    changed = False
    for base in list(graph.nodes):
        if base not in graph.nodes or not _fusable_base(graph, base):
            continue
        act = graph.sole_consumer(base.outputs[0])
        if act is None or act.domain or act.op_type not in ACTIVATIONS or act.inputs[0] != base.outputs[0]:
            continue
        params = _params(graph, act)
        if params is None:
            continue
        attrs = dict(base.attrs, activation=act.op_type, activation_params=params)
        fused = Node(FUSED[base.op_type], base.inputs, act.outputs, attrs, base.name, MINFER_DOMAIN)
        graph.opsets.setdefault(MINFER_DOMAIN, 1)
        graph.replace([base, act], fused)
        changed = True
    return changed


def activation_node(graph: Graph, act: str, params: list[float], src: str, out: str, name: str) -> Node:
    """``out = act(src)`` as a standard node, with ``params`` as activation_fusion recorded them (for --portable)."""
    dtype = graph.type_of(src).dtype if graph.type_of(src) is not None else np.dtype(np.float32)
    if act == "LeakyRelu":
        return Node(act, [src], [out], {"alpha": params[0]}, name)
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
