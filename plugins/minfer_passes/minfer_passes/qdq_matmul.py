"""``qdq_integer_matmul``: a QDQ MatMul of a constant 8-bit weight on the exact integer product.

onnxruntime's quantize_static (QDQ format) writes each quantized linear layer as ``QuantizeLinear(x) ->
DequantizeLinear -> MatMul(., DequantizeLinear(W_q))``. ``qdq_fusion`` would make it a ``DequantMatMul``: the
weight dequantized to float32 every run, then a float GEMM. onnxruntime's default level (ORT_ENABLE_ALL) runs the
group on integers instead (QLinearMatMul, or MatMulIntegerToFloat without a QuantizeLinear after it): the exact
sums ``sum((x_q - x_zp) * (W_q - w_zp))``, scaled once by ``x_scale * w_scale``. This pass writes that second form,
``ai.minfer::ScaledMatMulInteger(x_q, W_q, x_zp, w_zp, x_scale * w_scale)`` (minfer-ops-basic's qmatmul.py;
minfer-ops-numba runs it on its exact 8-bit GEMM), so the following QuantizeLinear, if any, stays as it was.

Pattern: a MatMul whose A is a plain per-tensor DequantizeLinear (constant float32 scale, constant 8-bit zero
point; other nodes may read it too, as the Q, K and V layers read one: onnxruntime gives each reader its own copy,
and the integer input is read here, not the float one) of an 8-bit value, and whose B is a DequantizeLinear of a
constant 2-D 8-bit weight (float32 scale per tensor, or per output column: axis 1) that this MatMul alone reads
(another reader would still need the float weight, so the group stays whole for ``qdq_fusion``). Per tensor, the
scale input is the float32 product ``x_scale * w_scale``, as onnxruntime computes it; per column, it is 1 and a
``Mul`` by the constant column products ``x_scale * w_scale[n]`` follows (the exact integers times 1 are the
integers: the same float32 operations as onnxruntime's per-column scale).

Not exact against the float graph: the float MatMul sums rounded float32 products in its BLAS's order, these are
exact; the difference is a few ulps of the sum's magnitude, which a QuantizeLinear after it turns into at most one
step of its grid (the pass's tolerance, as ``qdq_integer_conv``'s). ``--portable`` lowers ScaledMatMulInteger
(``integer_matmul.lower_integer_matmul``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minfer_core import Graph, Node

from ._util import MINFER_DOMAIN, add_const, const, fresh, has_kernel

SCALED = "ScaledMatMulInteger"
INT8 = (np.dtype(np.int8), np.dtype(np.uint8))
# a DequantizeLinear with another attribute (blocked, an output type) is not per tensor or per axis
PLAIN_ATTRS = {"axis"}
# the largest output step the target strategy draws: one step of it bounds what the pass moves
STEP = 0.1


def _dequantize(graph: Graph, name: str) -> Node | None:
    """The plain DequantizeLinear producing ``name``, with a zero point input."""
    dq = graph.producer(name)
    if dq is None or dq.domain or dq.op_type != "DequantizeLinear" or set(dq.attrs) - PLAIN_ATTRS:
        return None
    return dq if len(dq.inputs) > 2 and dq.inputs[1] and dq.inputs[2] else None


def _activation(graph: Graph, dx: Node) -> tuple[np.ndarray, str] | None:
    """(scale, zero point name) of a per-tensor DequantizeLinear of an 8-bit value, constant parameters."""
    xs, xz, t = const(graph, dx.inputs[1]), const(graph, dx.inputs[2]), graph.type_of(dx.inputs[0])
    if xs is None or xz is None or t is None or t.dtype not in INT8 or xz.dtype != t.dtype:
        return None
    return (xs, dx.inputs[2]) if xs.dtype == np.float32 and xs.size == 1 and xz.size == 1 else None


def _weight(graph: Graph, dw: Node, mm: Node) -> np.ndarray | None:
    """The weight's float32 scale ([1] or [N]) when ``dw`` dequantizes a constant 2-D 8-bit weight, per tensor or
    per output column, and only ``mm`` reads it (once)."""
    w, ws, wz = (const(graph, name) for name in dw.inputs[:3])
    if w is None or ws is None or wz is None or w.ndim != 2 or w.dtype not in INT8 or wz.dtype != w.dtype:
        return None
    if ws.dtype != np.float32 or graph.sole_consumer(dw.outputs[0]) is not mm or mm.inputs.count(dw.outputs[0]) != 1:
        return None
    if dw.outputs[0] in graph.outputs:
        return None
    if ws.size == 1 and wz.size == 1:
        return ws.reshape(1)
    axis = int(dw.attrs.get("axis", 1)) % 2
    n = w.shape[1]
    return ws.reshape(-1) if axis == 1 and ws.ndim == 1 and ws.size == n and wz.size in (1, n) else None


def _group(graph: Graph, mm: Node) -> tuple[Node, Node, np.ndarray, np.ndarray] | None:
    """(dq_x, dq_w, x_scale, w_scale) of a MatMul this pass rewrites, else None."""
    if mm.domain or mm.op_type != "MatMul" or len(mm.inputs) != 2 or len(mm.outputs) != 1:
        return None
    dx, dw = _dequantize(graph, mm.inputs[0]), _dequantize(graph, mm.inputs[1])
    if dx is None or dw is None or dx is dw:
        return None
    x = _activation(graph, dx)
    ws = _weight(graph, dw, mm)
    t = graph.type_of(dx.inputs[0])
    if x is None or ws is None or t is None or t.shape is None or len(t.shape) < 2:
        return None
    return dx, dw, x[0], ws


def _replacement(graph: Graph, mm: Node, dx: Node, dw: Node, xs: np.ndarray, ws: np.ndarray) -> list[Node]:
    """ScaledMatMulInteger of the integers [then a Mul by the per-column scales]."""
    name = mm.name or "qdq_matmul"
    scales = np.multiply(np.float32(xs.reshape(-1)[0]), ws, dtype=np.float32)  # onnxruntime's a_scale * b_scale
    inputs = [dx.inputs[0], dw.inputs[0], dx.inputs[2], dw.inputs[2]]
    if scales.size == 1:
        scale = add_const(graph, f"{name}_scale", scales.reshape(()))
        return [Node(SCALED, [*inputs, scale], list(mm.outputs), {}, mm.name, MINFER_DOMAIN)]
    one = add_const(graph, f"{name}_unit", np.float32(1))
    columns = add_const(graph, f"{name}_column_scales", scales)
    sums = fresh(graph, f"{name}_sums")
    return [Node(SCALED, [*inputs, one], [sums], {}, mm.name, MINFER_DOMAIN),
            Node("Mul", [sums, columns], list(mm.outputs), {}, fresh(graph, f"{name}_scaled"))]


def qdq_integer_matmul(graph: Graph) -> bool:
    """DequantizeLinear(x_q) and DequantizeLinear(constant 8-bit W) into MatMul as one ScaledMatMulInteger of the
    integers, scaled once by x_scale * w_scale, as onnxruntime's default level computes the group."""
    if not has_kernel(graph, MINFER_DOMAIN, SCALED):
        return False
    changed = False
    for mm in list(graph.nodes):
        found = _group(graph, mm)
        if found is None:
            continue
        dx, dw, xs, ws = found
        graph.opsets.setdefault(MINFER_DOMAIN, 1)
        graph.replace([mm], _replacement(graph, mm, dx, dw, xs, ws))
        graph.remove_node(dw)  # only this MatMul read it
        if not graph.is_used(dx.outputs[0]) and dx.outputs[0] not in graph.outputs:
            graph.remove_node(dx)  # a DequantizeLinear another node still reads stays for it
        changed = True
    return changed


def patterns() -> Any:
    """The pass's target strategy: x -> Q/DQ -> MatMul(DQ of a constant 8-bit W, per tensor or per column) ->
    Q/DQ, uint8 or int8 activations with random zero points, x's DequantizeLinear sometimes read elsewhere, the
    MatMul's output sometimes a graph output."""
    from hypothesis import strategies as st

    from minfer_core.testing import GraphBuilder
    from minfer_core.testing.strategies import expose

    def params(draw: Any, b: GraphBuilder, dtype: Any) -> tuple[str, str]:
        info = np.iinfo(dtype)
        zp = draw(st.integers(int(info.min) // 2, int(info.max) // 2))
        scale = np.float32(draw(st.sampled_from([0.02, 0.05, STEP])))
        return b.const(scale), b.const(np.asarray(zp, dtype))

    @st.composite
    def graphs(draw: Any) -> Any:
        b = GraphBuilder(opset=13)
        dtype = draw(st.sampled_from([np.uint8, np.int8]))
        k, n = draw(st.integers(1, 8)), draw(st.integers(1, 6))
        x = b.input((draw(st.integers(1, 3)), draw(st.integers(1, 4)), k))
        xs, xz = params(draw, b, dtype)
        xd = b.op("DequantizeLinear", b.op("QuantizeLinear", x, xs, xz), xs, xz)
        expose(draw, b, xd)
        rng = np.random.default_rng(draw(st.integers(0, 2**16)))
        ws = (rng.random(n) * 0.02 + 0.001).astype(np.float32) if draw(st.booleans()) else np.float32(0.01)
        wd = b.op("DequantizeLinear", b.const(rng.integers(-127, 128, (k, n)).astype(np.int8)), b.const(ws),
                  b.const(np.zeros(np.shape(ws), np.int8)), axis=1)
        y = b.op("MatMul", xd, wd)
        expose(draw, b, y)
        ys, yz = params(draw, b, dtype)
        b.output(b.op("DequantizeLinear", b.op("QuantizeLinear", y, ys, yz), ys, yz))
        return b.build()

    return graphs()
