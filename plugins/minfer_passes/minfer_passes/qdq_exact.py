"""``qdq_integer_conv``: a QDQ conv group computed as onnxruntime's default level computes it, on exact integers.

onnxruntime's quantize_static (QDQ format) writes each quantized conv as ``DequantizeLinear(x_q) -> Conv(...,
DequantizeLinear(W_q), [DequantizeLinear(B_int32)]) -> QuantizeLinear``. onnxruntime's default optimization level
(ORT_ENABLE_ALL, from ORT_ENABLE_EXTENDED) runs each such group as one ``QLinearConv``: the exact integer sums
``sum((x_q - x_zp) * (W_q - w_zp)) + B``, times ``x_scale * w_scale / y_scale``, rounded once. The float conv of
the dequantized values that ORT_DISABLE_ALL runs (and the DequantConv of `qdq`) sums rounded float32 products in
its BLAS's order instead: where a sum falls within a few ulps of a half step, the rounding goes to the other
integer, a difference that deep per-tensor int8 networks amplify (mobilenet_v2: 0.16 on the logits). On the
integers no summation order matters: minfer gives onnxruntime's default level's bits whatever its BLAS or threads.

Pattern (the group onnxruntime's QDQ selectors fuse): a Conv whose X is a DequantizeLinear (per tensor, constant
float32 scale, constant 8-bit zero point); whose W is a DequantizeLinear of a constant 8-bit weight (per tensor, or
per output channel: axis 0); whose bias, if any, is a DequantizeLinear of a constant int32 tensor with zero point 0
and scale ``x_scale * w_scale`` (float32, bit for bit); and whose output only a QuantizeLinear reads (per tensor,
constant scale, a constant 8-bit zero point). Never through a graph output.

Shared DequantizeLinears, as onnxruntime 1.2x on x86-64 decides (its transformers, in their order):
``EnsureUniqueDQForNodeUnit`` first gives every node input reading a DequantizeLinear its own copy, so another
reader of X's, W's or B's DequantizeLinear never stops a group by itself; then ``QDQS8ToU8Transformer`` (x86 only:
``QDQIsInt8Allowed`` is false there) rewrites an int8 QuantizeLinear -> DequantizeLinear pair to uint8 only where the
QuantizeLinear feeds that one DequantizeLinear, which the copies undo when it had several readers; and the Conv
selector fuses only when X and Y end up of one type, not int8. So uint8 activations fuse whoever else reads X's
DequantizeLinear; int8 ones fuse only when X's pair and Y's pair are each alone (a QuantizeLinear feeding one
DequantizeLinear that one node input reads): quantized resnet50's downsample convs and first block convs (X's
DequantizeLinear also read by the other branch or the residual Sum), and squeezenet's squeeze convs (Y's read by two
expand convs), stay float in onnxruntime, so here too. A DequantizeLinear another node still reads stays for it.
Replacement: ``QLinearConv`` with those operands, writing the QuantizeLinear's output; `integer` then fuses the Q/DQ
around it (``FloatQLinearConv``).

Not exact against the float graph: an output moves by one step of its grid where the float sum fell within
rounding of a half step (the pass's tolerance: the largest step its target strategy draws).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minfer_core import Graph, Node

from ._util import const, has_kernel

INT8 = (np.dtype(np.int8), np.dtype(np.uint8))
F32 = (np.dtype(np.float32),)
# a QuantizeLinear or DequantizeLinear with any other attribute (blocked, another output type) is not per tensor
PLAIN_ATTRS = {"axis"}
# the largest output scale the target strategy draws: one step of it bounds what the pass moves
STEP = 0.1


def _scalar(graph: Graph, name: str, dtypes: tuple[np.dtype, ...]) -> np.ndarray | None:
    value = const(graph, name)
    return value if value is not None and value.size == 1 and value.dtype in dtypes else None


def _dequantize(graph: Graph, name: str, zero_point: bool = True) -> Node | None:
    """The plain DequantizeLinear producing ``name`` (its zero point given, unless not ``zero_point``); other readers
    allowed: onnxruntime gives each reader its own copy."""
    dq = graph.producer(name)
    if dq is None or dq.domain or dq.op_type != "DequantizeLinear" or set(dq.attrs) - PLAIN_ATTRS:
        return None
    given = len(dq.inputs) > 2 and bool(dq.inputs[2])
    return None if len(dq.inputs) < 2 or (zero_point and not given) else dq


def _quantize_out(graph: Graph, conv: Node) -> Node | None:
    """The plain per-tensor QuantizeLinear that alone reads ``conv``'s output."""
    q = graph.sole_consumer(conv.outputs[0])
    if q is None or q.domain or q.op_type != "QuantizeLinear" or set(q.attrs) - PLAIN_ATTRS or len(q.inputs) < 3:
        return None
    ok = _scalar(graph, q.inputs[1], F32) is not None and _scalar(graph, q.inputs[2], INT8) is not None
    return q if ok and q.inputs[0] == conv.outputs[0] else None


def _alone(graph: Graph, q: Node | None, dq: Node | None) -> bool:
    """Whether onnxruntime's x86 S8->U8 rewrite takes the int8 pair ``q`` -> ``dq``: ``q`` feeds ``dq`` alone, and
    ``dq`` at most one node input (else its copies would make ``q`` feed several), with equal constant zero points."""
    if q is None or dq is None or q.domain or q.op_type != "QuantizeLinear" or len(q.inputs) < 3:
        return False
    if dq.domain or dq.op_type != "DequantizeLinear" or graph.sole_consumer(q.outputs[0]) is not dq:
        return False
    readers = len(graph.consumers(dq.outputs[0]))
    if readers > 1 or (readers == 1 and dq.outputs[0] in graph.outputs):
        return False
    qz = _scalar(graph, q.inputs[2], INT8)
    dz = _scalar(graph, dq.inputs[2], INT8) if len(dq.inputs) > 2 and dq.inputs[2] else np.zeros((), np.int8)
    return qz is not None and dz is not None and qz.dtype == dz.dtype == np.int8 and qz.item() == dz.item()


def _seen_type(graph: Graph, q: Node | None, dq: Node | None, zero_point: np.ndarray) -> np.dtype:
    """The 8-bit type onnxruntime's Conv selector sees on one side of the group (int8 made uint8 where it can)."""
    return np.dtype(np.uint8) if zero_point.dtype == np.uint8 or _alone(graph, q, dq) else np.dtype(np.int8)


def _weight_ok(graph: Graph, dw: Node) -> bool:
    """A constant 8-bit weight with a float32 scale (and zero point) per tensor or per output channel."""
    w, ws, wz = (const(graph, name) for name in dw.inputs[:3])
    if w is None or ws is None or wz is None or w.dtype not in INT8 or wz.dtype != w.dtype or ws.dtype != np.float32:
        return False
    if ws.size == 1 and wz.size == 1:
        return True
    axis = int(dw.attrs.get("axis", 1)) % w.ndim
    return axis == 0 and ws.ndim == 1 and ws.size == w.shape[0] and wz.size in (1, w.shape[0])


def _bias_ok(graph: Graph, db: Node, x_scale: np.ndarray, w_scale: np.ndarray) -> bool:
    """An int32 bias, zero point 0, dequantized with x_scale * w_scale (float32) as QLinearConv's bias is read."""
    b, bs = const(graph, db.inputs[0]), const(graph, db.inputs[1])
    bz = const(graph, db.inputs[2]) if len(db.inputs) > 2 and db.inputs[2] else np.zeros((), np.int32)
    if b is None or bs is None or bz is None or b.dtype != np.int32 or bs.dtype != np.float32 or np.any(bz):
        return False
    want = np.float32(x_scale.reshape(-1)[0]) * w_scale.reshape(-1)
    have = bs.reshape(-1)
    return have.size in (1, want.size) and want.size in (1, b.size) and bool(np.all(have == want))


def _group(graph: Graph, conv: Node) -> list[Node] | None:
    """[dq_x, dq_w, (dq_b), q_y] of ``conv`` when it is a group onnxruntime fuses into a QLinearConv, else None."""
    if conv.domain or conv.op_type != "Conv" or not 2 <= len(conv.inputs) <= 3 or conv.outputs[0] in graph.outputs:
        return None
    q = _quantize_out(graph, conv)
    dx, dw = (_dequantize(graph, name) for name in conv.inputs[:2])
    if q is None or dx is None or dw is None or not _weight_ok(graph, dw):
        return None
    xs, xz = _scalar(graph, dx.inputs[1], F32), _scalar(graph, dx.inputs[2], INT8)
    if xs is None or xz is None or xz.dtype != const(graph, q.inputs[2]).dtype:  # mixed 8-bit types: left float
        return None
    x_type = _seen_type(graph, graph.producer(dx.inputs[0]), dx, xz)
    y_type = _seen_type(graph, q, graph.sole_consumer(q.outputs[0]), const(graph, q.inputs[2]))
    if x_type != y_type or x_type == np.int8:  # int8 x int8 QLinearConv: not on x86 (QDQIsInt8Allowed)
        return None
    if len(conv.inputs) < 3 or not conv.inputs[2]:
        return [dx, dw, q]
    db = _dequantize(graph, conv.inputs[2], zero_point=False)
    if db is None or not _bias_ok(graph, db, xs, const(graph, dw.inputs[1])):
        return None
    return [dx, dw, db, q]


def qdq_integer_conv(graph: Graph) -> bool:
    """DequantizeLinear -> Conv (int8 weight, int32 bias dequantized) -> QuantizeLinear as one QLinearConv: exact
    integer sums, rounded once, as onnxruntime's default level computes the group."""
    if not has_kernel(graph, "", "QLinearConv"):
        return False
    # every group decided on the graph as given, as onnxruntime decides them all after its copies and type rewrites
    # (fusing one first would hide the QuantizeLinear -> DequantizeLinear pair the next one's types depend on)
    groups = [(conv, found) for conv in graph.nodes if (found := _group(graph, conv)) is not None]
    for conv, found in groups:
        dx, dw, q = found[0], found[1], found[-1]
        inputs = [*dx.inputs[:3], *dw.inputs[:3], *q.inputs[1:3]] + ([found[2].inputs[0]] if len(found) == 4 else [])
        graph.replace([conv, q], Node("QLinearConv", inputs, list(q.outputs), dict(conv.attrs), conv.name, ""))
        for dq in found[:-1]:  # a DequantizeLinear another node still reads stays for it (its own copy, in onnxruntime)
            if graph.producer(dq.outputs[0]) is dq and not graph.is_used(dq.outputs[0]):
                graph.remove_node(dq)
    return bool(groups)


def patterns() -> Any:
    """The pass's target strategy: x -> Q/DQ -> Conv(DQ int8 W per tensor or per channel, sometimes a DQ'd int32
    bias) -> Q/DQ, uint8 or int8 activations with random zero points, each intermediate sometimes read elsewhere
    or a graph output (which stops an int8 group at X's or Y's pair, and any group at the Conv's output); a bias
    scale that is not x_scale * w_scale must not fuse either."""
    from hypothesis import strategies as st

    from minfer_core.testing import GraphBuilder
    from minfer_core.testing.strategies import expose

    def params(draw: Any, b: GraphBuilder, dtype: Any) -> tuple[np.float32, str, str]:
        info = np.iinfo(dtype)
        zp = draw(st.integers(int(info.min) // 2, int(info.max) // 2))
        scale = np.float32(draw(st.sampled_from([0.02, 0.05, STEP])))
        return scale, b.const(scale), b.const(np.asarray(zp, dtype))

    @st.composite
    def graphs(draw: Any) -> Any:
        b = GraphBuilder(opset=13)
        dtype = draw(st.sampled_from([np.uint8, np.int8]))
        c, m = draw(st.integers(1, 4)), draw(st.integers(1, 4))
        x = b.input((1, c, draw(st.integers(3, 6)), draw(st.integers(3, 6))))
        xs, xs_name, xz = params(draw, b, dtype)
        xq = b.op("QuantizeLinear", x, xs_name, xz)
        xd = b.op("DequantizeLinear", xq, xs_name, xz)
        expose(draw, b, xd)
        rng = np.random.default_rng(draw(st.integers(0, 2**16)))
        ws = (rng.random(m) * 0.02 + 0.001).astype(np.float32) if draw(st.booleans()) else np.float32(0.01)
        wd = b.op("DequantizeLinear", b.const(rng.integers(-127, 128, (m, c, 3, 3)).astype(np.int8)), b.const(ws),
                  b.const(np.zeros(np.shape(ws), np.int8)), axis=0)
        expose(draw, b, wd)
        inputs = [xd, wd]
        if draw(st.booleans()):
            bias_scale = xs * ws if draw(st.integers(0, 3)) else np.float32(0.5) * xs * ws  # the latter: not fused
            inputs.append(b.op("DequantizeLinear", b.const(rng.integers(-2000, 2000, m).astype(np.int32)),
                               b.const(np.asarray(bias_scale, np.float32)), b.const(np.zeros(np.shape(ws), np.int32)),
                               axis=0))
        y = b.op("Conv", *inputs, kernel_shape=[3, 3], pads=[1, 1, 1, 1])
        expose(draw, b, y)
        _, ys, yz = params(draw, b, dtype)
        yq = b.op("QuantizeLinear", y, ys, yz)
        b.output(b.op("DequantizeLinear", yq, ys, yz))
        return b.build()

    return graphs()
