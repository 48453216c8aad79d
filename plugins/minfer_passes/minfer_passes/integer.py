"""``integer_conv_fusion``: the float conversions around an integer conv, in the conv's input conversion and epilogue.

onnxruntime's QOperator format (quantize_static) leaves the float ops it does not quantize (a BatchNormalization it
was not asked to fold, a Clip, ...) between ``DequantizeLinear`` and ``QuantizeLinear`` nodes, so that each
QLinearConv of such a model is read from a QuantizeLinear and read by a DequantizeLinear. Each of those is a pass
over the whole tensor out of cache, and an 8-bit array written only to be converted back to float.

Pattern: a QLinearConv whose input X is the output of a QuantizeLinear (per tensor, constant float32 scale and 8-bit
zero point equal to the conv's ``x_scale``/``x_zero_point`` constants) that nothing else reads, and/or whose output
is read only by a DequantizeLinear with the conv's ``y_scale``/``y_zero_point`` constants; never through a graph
output. Replacement: ``ai.minfer::FloatQLinearConv`` (minfer-ops-conv's kernel) with the conv's inputs (X the
QuantizeLinear's float input when ``float_input``), its attributes, and ``float_input``/``float_output``: the
kernel quantizes X while converting it for the integer conv and dequantizes each output tile in its epilogue.

Exact: the kernel does the same float32 operations as the three nodes (QuantizeLinear's division and
round-half-even, the conv's exact integer sums and requantization, DequantizeLinear's ``(q - zp) * scale``).

onnxruntime's quantize_dynamic follows each ConvInteger with ``Cast`` (to float32) and ``Mul`` by the product of
the input's and the weight's scales: two more passes over the output. Pattern: a ConvInteger whose output only a
Cast to float32 reads, whose output only a Mul by a float32 value of one element (no broadcast beyond the output's
rank) reads; never through a graph output. Replacement: ``ai.minfer::ScaledConvInteger(x, w, x_zero_point,
w_zero_point, scale)``, the conv's attributes: its epilogue rounds each tile's exact integers to float32 as the
Cast does and multiplies them as the Mul does. Exact too.

Then each fused conv's epilogue takes more of what follows it, exactly (the same float32 operations, in order):

- its float output's sole reader, a ``ChannelAffine`` (a BatchNormalization the quantizer left between two convs,
  with its Relu or Clip; constant S and B): S and B become the node's inputs 9 and 10 (ScaledConvInteger: 5 and
  6), the activation its ``activation``/``activation_params``;
- a ScaledConvInteger's float output read only by an Add of a constant per-channel bias (quantize_dynamic's form of
  a conv's bias, every conv's once quant_pre_process folded the BatchNormalizations), and its Relu/Clip: B (input
  6, S absent) and the activation;
- a FloatQLinearConv's float output read only by another FloatQLinearConv's float input: the first quantizes it
  on the second's input grid (``output_quantization``) and the second reads those centered integers as they are
  (``float_input`` 2), one pass over the tensor fewer;
- a FloatQLinearConv's float output read only by a ``QuantizeDequantize`` (`qdq`: a QDQ model's rounding before a
  residual Add or a conv that stays float): that rounding as its last step (``output_rounding``), in the epilogue;
  then that rounded output's sole reader adding a same-shape float32 ``Z`` (Add, or Sum of two: a residual block's
  tail) that a QuantizeDequantize alone reads: Z (input 11) and that rounding (``residual_rounding``); or whose
  readers all round it on one grid (FloatQLinearConvs quantizing it as their input, QuantizeDequantizes): that
  grid, the sum rounded once in the epilogue (each reader then gets the integers it computed);
- the ``DynamicQuantizeLinear`` whose outputs only a ScaledConvInteger reads (the scale through a Mul by a
  constant): the node takes the float input (``dynamic_input``) and quantizes it while centering it;
- last, an integer conv's 8-bit output (QLinearConv -> QLinearConv, no float op between: a QDQ model quantized
  after quant_pre_process folded its BatchNormalizations; a QOperator model, whose convs also feed QLinearAdds):
  the same centered-integer edge, the writer quantizing on its own output grid, other readers given the 8-bit
  value back by a QuantizeLinear of scale 1 (`_eight_bit_edge`), so that every such conv is a FloatQLinearConv with
  a float32 output, which minfer-ops-numba's kernels take (MobileNetV2 QDQ, pre-processed: 2.13x -> 1.13x its
  float model).

``--portable`` lowers the nodes back to the ones they stand for (`integer_lower.lower_integer`).
"""

from __future__ import annotations

import numpy as np

from minfer_core import Graph, Node

from ._util import MINFER_DOMAIN, add_const, const, fixpoint, fresh, has_kernel, same_shape
from .activation import _params as _params_of
from .qdq_ops import QDQ

FUSED = "FloatQLinearConv"
SCALED = "ScaledConvInteger"
INT8 = (np.dtype(np.int8), np.dtype(np.uint8))
# a QuantizeLinear or DequantizeLinear with any other attribute (blocked, another output type, a precision) is not
# the per-tensor one the kernel computes
PLAIN_ATTRS = {"axis"}


def _params(graph: Graph, scale_name: str, zp_name: str) -> tuple[np.ndarray, np.ndarray] | None:
    """A per-tensor float32 scale and 8-bit zero point, both constant."""
    scale, zp = const(graph, scale_name), const(graph, zp_name)
    if scale is None or zp is None or scale.size != 1 or zp.size != 1 or scale.dtype != np.float32:
        return None
    return (scale, zp) if zp.dtype in INT8 else None


def _same(a: tuple[np.ndarray, np.ndarray] | None, b: tuple[np.ndarray, np.ndarray] | None) -> bool:
    return a is not None and b is not None and a[1].dtype == b[1].dtype and all(
        np.array_equal(x.reshape(-1), y.reshape(-1)) for x, y in zip(a, b))


def _quantize_in(graph: Graph, conv: Node) -> Node | None:
    """The QuantizeLinear whose float32 output only ``conv`` reads, as its X, with the conv's x parameters."""
    q = graph.producer(conv.inputs[0])
    if q is None or q.domain or q.op_type != "QuantizeLinear" or len(q.inputs) < 3 or set(q.attrs) - PLAIN_ATTRS:
        return None
    t = graph.type_of(q.inputs[0])
    if t is None or t.dtype != np.float32 or q.outputs[0] in graph.outputs:
        return None
    if graph.sole_consumer(q.outputs[0]) is not conv:
        return None
    if conv.inputs.count(q.outputs[0]) != 1:
        return None
    same = _same(_params(graph, q.inputs[1], q.inputs[2]), _params(graph, conv.inputs[1], conv.inputs[2]))
    return q if same else None


def _dequantize_out(graph: Graph, conv: Node) -> Node | None:
    """The DequantizeLinear that alone reads ``conv``'s output, with the conv's y parameters."""
    y = conv.outputs[0]
    dq = graph.sole_consumer(y)
    if dq is None or dq.domain or dq.op_type != "DequantizeLinear" or y in graph.outputs or len(dq.inputs) < 3:
        return None
    if dq.inputs[0] != y or y in dq.inputs[1:] or set(dq.attrs) - PLAIN_ATTRS:
        return None
    same = _same(_params(graph, dq.inputs[1], dq.inputs[2]), _params(graph, conv.inputs[6], conv.inputs[7]))
    return dq if same else None


def integer_conv_fusion(graph: Graph) -> bool:
    """QuantizeLinear -> QLinearConv -> DequantizeLinear (either end alone too) as one FloatQLinearConv; ConvInteger
    -> Cast to float32 -> Mul by one float32 value as one ScaledConvInteger; either's float output's sole reader, a
    ChannelAffine (none, Relu or Clip), in its epilogue."""
    fused = _qlinear_convs(graph)
    fused = _scaled_convs(graph) or fused
    fused = _affine_epilogues(graph) or fused
    fused = _bias_epilogues(graph) or fused
    fused = _dynamic_inputs(graph) or fused
    fused = _quantized_edges(graph) or fused
    fused = _rounded_outputs(graph) or fused
    fused = _residual_tails(graph) or fused
    return _eight_bit_edges(graph) or fused


def _plain_rounding(graph: Graph, node: Node | None, x: str) -> list[float] | None:
    """[scale, low, high] of ``node`` when it is a QuantizeDequantize of ``x`` alone, with one grid."""
    if node is None or node.domain != MINFER_DOMAIN or node.op_type != QDQ or list(node.inputs) != [x]:
        return None
    if node.attrs.get("post_scale") or x in graph.outputs:
        return None
    return [float(node.attrs["scale"]), float(node.attrs["low"]), float(node.attrs["high"])]


def _residual_tails(graph: Graph) -> bool:
    """A rounded FloatQLinearConv output (``output_rounding``) whose sole reader adds a same-shape float32 Z (Add, or
    Sum of two) read only by a QuantizeDequantize: Z as input 11, that rounding as ``residual_rounding`` (a
    quantized residual block's tail, as `qdq` fuses it into a DequantConv). Exact: the epilogue adds Z to each
    rounded tile and rounds the sum with the nodes' float32 operations (float32 addition commutes)."""
    changed = False
    for node in list(graph.nodes):
        if node.domain != MINFER_DOMAIN or node.op_type != FUSED or "output_rounding" not in node.attrs:
            continue
        y = node.outputs[0]
        add = graph.sole_consumer(y)
        if "residual_rounding" in node.attrs or y in graph.outputs or add is None or add.domain:
            continue
        if add.op_type not in ("Add", "Sum") or len(add.inputs) != 2 or add.inputs[0] == add.inputs[1]:
            continue
        z = add.inputs[1] if add.inputs[0] == y else add.inputs[0]
        t, tz = graph.type_of(y), graph.type_of(z)
        if t is None or tz is None or tz.dtype != np.float32 or not same_shape(graph, y, z):
            continue
        inputs = (list(node.inputs) + [""] * 11)[:11] + [z]
        qd = graph.sole_consumer(add.outputs[0])
        grid = _plain_rounding(graph, qd, add.outputs[0])
        if grid is not None:
            graph.replace([node, add, qd], Node(FUSED, inputs, list(qd.outputs),
                                                {**node.attrs, "residual_rounding": grid}, node.name, MINFER_DOMAIN))
            changed = True  # after Z's producer
            continue
        readers = _readers_grid(graph, add.outputs[0])
        if readers is None:
            continue
        grid, roundings = readers
        graph.replace([node, add], Node(FUSED, inputs, list(add.outputs), {**node.attrs, "residual_rounding": grid},
                                        node.name, MINFER_DOMAIN))
        for qd in roundings:  # rounding a value on its grid again gives it back
            graph.replace_all_uses(qd.outputs[0], add.outputs[0])
            graph.remove_node(qd)
        changed = True
    return changed


def _readers_grid(graph: Graph, total: str) -> tuple[list[float], list[Node]] | None:
    """(grid, the roundings among them) when every reader of a residual sum rounds it on one grid: a FloatQLinearConv
    quantizing it as its float input (``float_input`` 1: the QuantizeLinear it took in), or a plain
    QuantizeDequantize of it (not a graph output). The sum may then be rounded on that grid in the conv's epilogue:
    quantizing a value of the grid gives its integer back (rint((k * s) / s) = k for |k| < 2**22), so each conv
    reads the integers it read, and each rounding returns its input."""
    if total in graph.outputs:
        return None
    grids, roundings = [], []
    for reader in graph.consumers(total):
        if reader.domain == MINFER_DOMAIN and reader.op_type == QDQ:
            grid = _plain_rounding(graph, reader, total)
            if grid is None or reader.outputs[0] in graph.outputs:
                return None
            roundings.append(reader)
        else:
            grid = _input_grid(graph, reader, total)
            if grid is None:
                return None
        grids.append(grid)
    return (grids[0], roundings) if grids and all(g == grids[0] for g in grids) else None


def _has_last_step(node: Node) -> bool:
    """Whether a FloatQLinearConv's epilogue already ends in a rounding (nothing fuses after it)."""
    return "output_quantization" in node.attrs or "output_rounding" in node.attrs


def _rounded_outputs(graph: Graph) -> bool:
    """A FloatQLinearConv's float output read only by a plain QuantizeDequantize (one input, no second grid): the
    rounding in the epilogue (``output_rounding`` [scale, low, high]), one node and one pass over the tensor less.
    Exact: the epilogue computes clip(rint(y / scale), low, high) * scale with the node's float32 operations."""
    changed = False
    for node in list(graph.nodes):
        if node.domain != MINFER_DOMAIN or node.op_type != FUSED or not node.attrs.get("float_output"):
            continue
        y = node.outputs[0]
        grid = _plain_rounding(graph, graph.sole_consumer(y), y)
        if _has_last_step(node) or grid is None:
            continue
        qd = graph.sole_consumer(y)
        graph.replace([node, qd], Node(FUSED, node.inputs, list(qd.outputs), {**node.attrs, "output_rounding": grid},
                                       node.name, MINFER_DOMAIN))
        changed = True
    return changed


def _quantized_edges(graph: Graph) -> bool:
    """A FloatQLinearConv's float output read only by another's float input: the first quantizes it in its epilogue
    on the second's input grid (``output_quantization`` [x_scale, low, high], its output then the centered integers
    clip(rint(y / x_scale), low, high) as float32), and the second takes them as they are (``float_input`` 2): one
    pass over the tensor less. Exact: the epilogue computes what the second's input conversion would."""
    updates: dict[int, tuple[Node, dict]] = {}  # found on the graph as it is, then each node replaced once
    for node in graph.nodes:
        grid = _edge_grid(graph, node)
        if grid is not None:
            reader = graph.sole_consumer(node.outputs[0])
            updates.setdefault(id(node), (node, {}))[1]["output_quantization"] = grid
            updates.setdefault(id(reader), (reader, {}))[1]["float_input"] = 2
    for node, changes in updates.values():
        graph.replace([node], Node(FUSED, node.inputs, node.outputs, {**node.attrs, **changes}, node.name,
                                   MINFER_DOMAIN))
    return bool(updates)


def _edge_grid(graph: Graph, node: Node) -> list[float] | None:
    """[x_scale, low, high] of the FloatQLinearConv alone reading ``node``'s float output as its float input."""
    if node.domain != MINFER_DOMAIN or node.op_type != FUSED or not node.attrs.get("float_output"):
        return None
    y = node.outputs[0]
    reader = graph.sole_consumer(y)
    if _has_last_step(node) or y in graph.outputs or reader is None:
        return None
    return _input_grid(graph, reader, y)


def _input_grid(graph: Graph, reader: Node, x: str) -> list[float] | None:
    """[x_scale, low, high] when ``reader`` is a FloatQLinearConv quantizing ``x`` as its float input (``float_input``
    1, x once, as input 0): the grid its input conversion rounds on, the integer range less the zero point."""
    if reader.domain != MINFER_DOMAIN or reader.op_type != FUSED or reader.attrs.get("float_input") != 1:
        return None
    if reader.inputs.count(x) != 1 or reader.inputs[0] != x:
        return None
    params = _params(graph, reader.inputs[1], reader.inputs[2])
    if params is None:
        return None
    scale, zp = params
    info, z = np.iinfo(zp.dtype), float(zp.reshape(-1)[0])
    return [float(scale.reshape(-1)[0]), float(info.min) - z, float(info.max) - z]


def _scale_factor(graph: Graph, mul: Node, xs: str) -> str | np.ndarray | None:
    """The float32 one-element constant ``mul`` multiplies ``xs`` by (a Mul's operand name, or a BinaryScalar's
    scalar), or None."""
    if not mul.domain and mul.op_type == "Mul" and len(mul.inputs) == 2 and mul.inputs.count(xs) == 1:
        other = mul.inputs[1] if mul.inputs[0] == xs else mul.inputs[0]
        value = const(graph, other)
        return other if value is not None and value.dtype == np.float32 and value.size == 1 else None
    if mul.domain == MINFER_DOMAIN and mul.op_type == "BinaryScalar" and mul.attrs.get("op") == "Mul":
        value = np.asarray(mul.attrs.get("scalar"))
        return value if value.dtype == np.float32 and value.size == 1 and mul.inputs == [xs] else None
    return None


def _dynamic_producer(graph: Graph, conv: Node) -> tuple[Node, Node, str | np.ndarray] | None:
    """The DynamicQuantizeLinear whose outputs only the ScaledConvInteger ``conv`` reads (X, its zero point, and
    its scale through a product by a constant that is conv's scale), that product and its constant."""
    dql = graph.producer(conv.inputs[0])
    if dql is None or dql.domain or dql.op_type != "DynamicQuantizeLinear" or len(dql.outputs) != 3:
        return None
    xq, xs, xz = dql.outputs
    t = graph.type_of(dql.inputs[0])
    if t is None or t.dtype != np.float32 or any(v in graph.outputs for v in dql.outputs) or conv.inputs[2] != xz:
        return None
    if any(graph.sole_consumer(v) is not conv or conv.inputs.count(v) != 1 for v in (xq, xz)):
        return None
    mul = graph.sole_consumer(xs)
    if mul is None or len(mul.outputs) != 1 or mul.outputs[0] != conv.inputs[4] or mul.outputs[0] in graph.outputs:
        return None
    if graph.sole_consumer(mul.outputs[0]) is not conv or conv.inputs.count(mul.outputs[0]) != 1:
        return None
    factor = _scale_factor(graph, mul, xs)
    return None if factor is None else (dql, mul, factor)


def _dynamic_inputs(graph: Graph) -> bool:
    """Each ScaledConvInteger's DynamicQuantizeLinear (read by it alone) in its input conversion: the node takes X
    as float32 (``dynamic_input``), its zero point input empty and its scale input the weight's factor; the kernel
    quantizes X while centering it for the conv (one pass instead of two) and multiplies the scale it found by the
    factor as the Mul did. Exact: DynamicQuantizeLinear's scale and zero point depend on X's min and max only."""
    changed = False
    for conv in list(graph.nodes):
        if conv.domain != MINFER_DOMAIN or conv.op_type != SCALED or conv.attrs.get("dynamic_input"):
            continue
        found = _dynamic_producer(graph, conv)
        if found is None:
            continue
        dql, mul, factor = found
        if not isinstance(factor, str):
            factor = add_const(graph, f"{conv.name or 'conv'}_weight_scale", factor.astype(np.float32))
        inputs = [dql.inputs[0], conv.inputs[1], "", conv.inputs[3], factor, *conv.inputs[5:]]
        graph.replace([dql, mul, conv], Node(SCALED, inputs, list(conv.outputs), {**conv.attrs, "dynamic_input": 1},
                                             conv.name, MINFER_DOMAIN))
        changed = True
    return changed


AFFINE = "ChannelAffine"
# the activations the integer convs' epilogue computes as ChannelAffine's kernels do
AFFINE_ACTS = ("", "Relu", "Clip")
# where S and B go: after the node's own inputs (a FloatQLinearConv's bias slot kept, empty when absent)
AFFINE_SLOT = {FUSED: 9, SCALED: 5}


def _channel_vector(graph: Graph, name: str, channels: int) -> bool:
    value = const(graph, name)
    return value is not None and value.dtype == np.float32 and value.size == channels


def _affine_reader(graph: Graph, node: Node) -> Node | None:
    """The ChannelAffine (constant float32 S, B of one value per channel; activation none, Relu or Clip) alone
    reading the float output of an integer conv that has no epilogue stage yet."""
    if node.domain != MINFER_DOMAIN or node.op_type not in AFFINE_SLOT or len(node.inputs) > AFFINE_SLOT[node.op_type]:
        return None
    if node.op_type == FUSED and (not node.attrs.get("float_output") or _has_last_step(node)):
        return None
    y = node.outputs[0]
    ca, t = graph.sole_consumer(y), graph.type_of(y)
    if ca is None or ca.domain != MINFER_DOMAIN or ca.op_type != AFFINE or y in graph.outputs or len(ca.inputs) != 3:
        return None
    if ca.inputs[0] != y or y in ca.inputs[1:] or ca.attrs.get("activation", "") not in AFFINE_ACTS:
        return None
    if t is None or t.shape is None or len(t.shape) < 3 or not isinstance(t.shape[1], int):
        return None
    s, b = ca.inputs[1:3]
    ok = b and _channel_vector(graph, b, t.shape[1]) and (not s or _channel_vector(graph, s, t.shape[1]))
    return ca if ok else None


def _affine_epilogues(graph: Graph) -> bool:
    """Each integer conv's ChannelAffine reader (a BatchNormalization the quantizer left between two convs, and
    its Relu/Clip) as the conv's epilogue: S, B its inputs, the activation its attribute. Exact: the kernel
    applies ChannelAffine's float32 operations in its order to each dequantized tile."""
    changed = False
    for node in list(graph.nodes):
        ca = _affine_reader(graph, node)
        if ca is None:
            continue
        slot = AFFINE_SLOT[node.op_type]
        inputs = (list(node.inputs) + [""] * slot)[:slot] + list(ca.inputs[1:3])
        attrs = dict(node.attrs)
        if ca.attrs.get("activation"):
            attrs.update(activation=ca.attrs["activation"],
                         activation_params=[float(v) for v in ca.attrs.get("activation_params", [])])
        graph.replace([node, ca], Node(node.op_type, inputs, list(ca.outputs), attrs, node.name, node.domain))
        changed = True
    return changed


def _channel_bias(graph: Graph, add: Node, y: str, rank: int, channels: int) -> np.ndarray | None:
    """The Add's other operand as a flat (channels,) float32 array when it is a constant of one value per channel
    that broadcasts along axis 1 of a rank-``rank`` y (shape (C, 1, ...) or (1, C, 1, ...)), else None."""
    others = [v for v in add.inputs if v != y]
    if add.domain or add.op_type != "Add" or len(add.inputs) != 2 or len(others) != 1:
        return None
    b = const(graph, others[0])
    if b is None or b.dtype != np.float32 or b.size != channels or b.ndim > rank:
        return None
    dims = (1,) * (rank - b.ndim) + tuple(b.shape)
    return b.reshape(-1) if dims[1] == channels and all(d == 1 for i, d in enumerate(dims) if i != 1) else None


def _bias_epilogues(graph: Graph) -> bool:
    """A ScaledConvInteger's float output read only by an Add of a constant per-channel bias (quantize_dynamic's
    form of a conv's bias: ConvInteger has none), and that sum's only reader a Relu or Clip of constant bounds if
    any: the bias as the epilogue's B (S absent), the activation its attribute: the Add and the activation, each a
    pass over the output (a FusedElementwise after elementwise_fusion), in the conv's epilogue. Exact: the epilogue
    computes act(v * scale + B) with the nodes' float32 operations (addition commutes)."""
    changed = False
    for node in list(graph.nodes):
        if node.domain != MINFER_DOMAIN or node.op_type != SCALED or len(node.inputs) > AFFINE_SLOT[SCALED]:
            continue
        if node.attrs.get("activation"):
            continue
        y, t = node.outputs[0], graph.type_of(node.outputs[0])
        add = graph.sole_consumer(y)
        if add is None or t is None or t.shape is None or len(t.shape) < 3 or not isinstance(t.shape[1], int):
            continue
        bias = _channel_bias(graph, add, y, len(t.shape), t.shape[1])
        if bias is None:
            continue
        fused, attrs = [node, add], dict(node.attrs)
        act = graph.sole_consumer(add.outputs[0])
        if act is not None and not act.domain and act.op_type in ("Relu", "Clip") and act.inputs[0] == add.outputs[0]:
            params = _params_of(graph, act)  # Relu's none, Clip's constant bounds (else None)
            if params is not None:
                fused.append(act)
                attrs.update(activation=act.op_type, activation_params=params)
        inputs = (list(node.inputs) + [""] * 5)[:5] + ["", add_const(graph, f"{y}_bias", bias)]
        graph.replace(fused, Node(SCALED, inputs, list(fused[-1].outputs), attrs, node.name, node.domain))
        changed = True
    return changed


def _scale_of(graph: Graph, mul: Node, cast_out: str, rank: int) -> str | None:
    """The Mul's other operand when it is one float32 element that does not broadcast beyond ``rank`` dims."""
    others = [v for v in mul.inputs if v != cast_out]
    if len(mul.inputs) != 2 or len(others) != 1:
        return None
    t = graph.type_of(others[0])
    if t is None or t.dtype != np.float32 or t.shape is None or len(t.shape) > rank:
        return None
    return others[0] if all(d == 1 for d in t.shape) else None


def _scaled_convs(graph: Graph) -> bool:
    if not has_kernel(graph, MINFER_DOMAIN, SCALED):
        return False
    changed = False
    for conv in list(graph.nodes):
        if conv.domain or conv.op_type != "ConvInteger" or conv.outputs[0] in graph.outputs:
            continue
        cast = graph.sole_consumer(conv.outputs[0])
        if cast is None or cast.domain or cast.op_type != "Cast" or cast.attrs.get("to") != 1:
            continue
        mul = graph.sole_consumer(cast.outputs[0])
        t = graph.type_of(conv.outputs[0])
        if mul is None or mul.domain or mul.op_type != "Mul" or cast.outputs[0] in graph.outputs or t is None:
            continue
        scale = _scale_of(graph, mul, cast.outputs[0], len(t.shape) if t.shape is not None else 0)
        if scale is None:
            continue
        inputs = (list(conv.inputs) + [""] * 4)[:4] + [scale]
        graph.opsets.setdefault(MINFER_DOMAIN, 1)
        graph.replace([conv, cast, mul], Node(SCALED, inputs, list(mul.outputs), dict(conv.attrs), conv.name,
                                              MINFER_DOMAIN))
        changed = True
    return changed


def _qlinear_convs(graph: Graph) -> bool:
    if not has_kernel(graph, MINFER_DOMAIN, FUSED):
        return False
    changed = False
    for conv in list(graph.nodes):
        if conv.domain or conv.op_type != "QLinearConv" or len(conv.inputs) < 8:
            continue
        q, dq = _quantize_in(graph, conv), _dequantize_out(graph, conv)
        if q is None and dq is None:
            continue
        inputs = list(conv.inputs)
        if q is not None:
            inputs[0] = q.inputs[0]
        outputs = list(dq.outputs if dq is not None else conv.outputs)
        attrs = {**conv.attrs, "float_input": int(q is not None), "float_output": int(dq is not None)}
        graph.opsets.setdefault(MINFER_DOMAIN, 1)
        graph.replace([n for n in (q, conv, dq) if n is not None], Node(FUSED, inputs, outputs, attrs, conv.name,
                                                                          MINFER_DOMAIN))
        changed = True
    return changed


def _eight_bit_out(node: Node) -> bool:
    """Whether ``node`` is an integer conv writing 8-bit Y: a QLinearConv, or a FloatQLinearConv without
    ``float_output`` (which then has no epilogue steps after the requantization)."""
    if not node.domain and node.op_type == "QLinearConv":
        return len(node.inputs) >= 8
    return node.domain == MINFER_DOMAIN and node.op_type == FUSED and not node.attrs.get("float_output")


def _eight_bit_reader(graph: Graph, reader: Node, y: str, grid: tuple[np.ndarray, np.ndarray]) -> bool:
    """Whether ``reader`` is an integer conv taking 8-bit ``y`` as its X (input 0, once) on ``grid`` (y's scale and
    zero point): a QLinearConv, or a FloatQLinearConv without ``float_input``."""
    if not reader.domain and reader.op_type == "QLinearConv":
        ok = len(reader.inputs) >= 8
    else:
        ok = reader.domain == MINFER_DOMAIN and reader.op_type == FUSED and not reader.attrs.get("float_input")
    return ok and reader.inputs[0] == y and reader.inputs.count(y) == 1 and _same(
        grid, _params(graph, reader.inputs[1], reader.inputs[2]))


def _eight_bit_edge(graph: Graph) -> bool:
    """One integer conv's 8-bit output (no graph output) made the centered-integer edge `_quantized_edges` makes:
    the writer a FloatQLinearConv with ``float_output`` and ``output_quantization`` on its own Y grid, each integer
    conv reading Y as it is ``float_input`` 2 (QLinearConv -> QLinearConv, no float op between: a QDQ model
    quantized after BatchNormalization's folding, as onnxruntime's quant_pre_process does, or a QOperator model);
    any other reader (a QOperator block's QLinearAdd) gets the 8-bit Y back from a QuantizeLinear of those integers
    (scale 1, Y's zero point). Exact: the requantized integer k, dequantized (k * y_scale) and quantized again
    (rint((k * y_scale) / y_scale), |k| <= 255), is k; k + zero point is Y. minfer-ops-numba's conv kernels take
    float32 outputs only: they then run every such conv (MobileNetV2 QOperator, pre-processed: 18.9 -> 7.0 ms;
    the numpy kernels alike, 30.5 either way)."""
    if not has_kernel(graph, MINFER_DOMAIN, FUSED):
        return False
    for node in graph.nodes:
        if not _eight_bit_out(node) or node.outputs[0] in graph.outputs:
            continue
        y = node.outputs[0]
        grid = _params(graph, node.inputs[6], node.inputs[7])
        if grid is None:
            continue
        readers = graph.consumers(y)
        convs = [r for r in readers if _eight_bit_reader(graph, r, y, grid)]
        scale, zp = grid
        info, z = np.iinfo(zp.dtype), float(zp.reshape(-1)[0])
        centered = fresh(graph, f"{y}_centered")
        attrs = {**node.attrs, "float_input": int(node.attrs.get("float_input", 0)), "float_output": 1,
                 "output_quantization": [float(scale.reshape(-1)[0]), float(info.min) - z, float(info.max) - z]}
        graph.opsets.setdefault(MINFER_DOMAIN, 1)
        graph.replace([node], Node(FUSED, list(node.inputs), [centered], attrs, node.name, MINFER_DOMAIN))
        for reader in dict.fromkeys(convs):
            reader_attrs = {**reader.attrs, "float_input": 2, "float_output": int(reader.attrs.get("float_output", 0))}
            graph.replace([reader], Node(FUSED, [centered] + list(reader.inputs[1:]), list(reader.outputs),
                                         reader_attrs, reader.name, MINFER_DOMAIN))
        if len(convs) < len(readers):  # the other readers' 8-bit Y, as the conv wrote it
            one = add_const(graph, f"{y}_unit_scale", np.float32(1.0))
            graph.insert_before(graph.consumers(y)[0], Node("QuantizeLinear", [centered, one, node.inputs[7]], [y],
                                                           {}, fresh(graph, f"{y}_requantized")))
        return True
    return False


_eight_bit_edges = fixpoint(_eight_bit_edge)


# the property suite's target strategy (declared as minfer_passes.integer:patterns)
from .integer_patterns import patterns  # noqa: E402,F401
