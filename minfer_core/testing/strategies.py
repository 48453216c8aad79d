"""Hypothesis strategies for minfer graphs (like ``hypothesis.extra.numpy``).

- `graphs()`: random valid graphs built from the registered op schemas:
  elementwise ops whose ONNX schema takes float tensors, has no required
  attribute and has a kernel in the registry, chained over values of one
  shape with broadcasting constants, plus Conv/BatchNormalization/pooling
  and layout motifs where their kernels are installed.
- Building blocks for a pass's target strategy (`Pass.patterns`):
  `shapes`, `floats_array`, `expose` (random context around an intermediate
  value: an extra consumer, or making it a graph output, so the pass is
  exercised where it must not fire too), `loosen` (declare an input's dims
  symbolic, ``"N4"``, or unknown, None, as exported models do; the feeds keep
  the drawn sizes).
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import numpy as np
from hypothesis import strategies as st

from ..graph import Graph
from ..tensor import TensorType
from .builder import GraphBuilder
from .control import if_motif, loop_motif, scan_motif

# Two-input ops that do not broadcast elementwise (their shapes follow other rules).
NOT_ELEMENTWISE = {"MatMul", "MatMulInteger", "QLinearMatMul", "PRelu", "GatherElements", "Gather", "Expand", "Tile"}
# Discontinuous ops turn a pass's allowed rounding into a jump; overflowing ones into inf: left out.
UNSTABLE = {
    "Round", "Ceil", "Floor", "Sign", "Hardmax", "ThresholdedRelu", "Shrink",
    "Exp", "Pow", "Reciprocal", "Div", "Log", "Tan", "Cosh", "Sinh", "Acosh", "Atanh", "Mod", "Erf",
}
# Ops whose shape or meaning inference cannot pin down from random float inputs (recurrences, data-dependent
# shapes, complex-valued transforms): left out of the schema-driven step.
NOT_GENERATED = {"GRU", "LSTM", "RNN", "Range", "Unique", "DFT", "STFT", "Det", "Resize", "NonZero", "Loop", "If", "Scan"}


@functools.lru_cache(maxsize=None)
def _schema_ops(opset: int, kernels: frozenset[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(unary, binary) float elementwise op types with a kernel, from onnx.defs."""
    import onnx

    unary, binary = [], []
    for op_type in sorted(kernels):
        try:
            schema = onnx.defs.get_schema(op_type, opset, "")
        except Exception:
            continue
        if op_type in UNSTABLE or op_type in NOT_ELEMENTWISE or len(schema.outputs) != 1:
            continue
        if any(a.required for a in schema.attributes.values()):
            continue
        if not _takes_float(schema):
            continue
        ins = [i for i in schema.inputs if i.option != onnx.defs.OpSchema.FormalParameterOption.Optional]
        same = schema.inputs and all(i.type_str == schema.outputs[0].type_str for i in schema.inputs[:len(ins)])
        if len(ins) == 1 and same and _keeps_shape(schema, op_type, opset, 1):
            unary.append(op_type)
        elif len(ins) == 2 and len(schema.inputs) == 2 and same and _keeps_shape(schema, op_type, opset, 2):
            binary.append(op_type)
    return tuple(unary), tuple(binary)


@functools.lru_cache(maxsize=None)
def _general_ops(opset: int, kernels: frozenset[str]) -> tuple[tuple[str, int, int], ...]:
    """(op_type, min inputs, max inputs) of float ops with a kernel whose inputs all share the output's type."""
    import onnx

    Option = onnx.defs.OpSchema.FormalParameterOption
    found = []
    for op_type in sorted(kernels):
        try:
            schema = onnx.defs.get_schema(op_type, opset, "")
        except Exception:
            continue
        if op_type in UNSTABLE or op_type in NOT_GENERATED or not _takes_float(schema):
            continue
        if any(a.required for a in schema.attributes.values()) or not schema.inputs or any(o.option != Option.Optional for o in schema.outputs[1:]):
            continue
        required = [i for i in schema.inputs if i.option != Option.Optional]
        if not required or any(i.type_str != schema.outputs[0].type_str for i in required):
            continue
        variadic = required[-1].option == Option.Variadic
        found.append((op_type, len(required), len(required) + 2 if variadic else len(required)))
    return tuple(found)


def inferred_shape(op_type: str, opset: int, shapes_: Sequence[tuple[int, ...]], attrs: dict[str, Any],
                   max_size: int = 4096) -> tuple[int, ...] | None:
    """The static output shape onnx's inference gives a float node, or None when it rejects it."""
    import onnx
    from onnx import TensorProto, helper

    names = [f"i{i}" for i in range(len(shapes_))]
    types = {n: helper.make_tensor_type_proto(TensorProto.FLOAT, list(s)) for n, s in zip(names, shapes_)}
    try:
        schema = onnx.defs.get_schema(op_type, opset, "")
        out = onnx.shape_inference.infer_node_outputs(
            schema, helper.make_node(op_type, names, ["y"], **attrs), types,
            opset_imports=[helper.make_opsetid("", opset)])
    except Exception:
        return None
    tt = out["y"].tensor_type if "y" in out else None
    if tt is None or not tt.HasField("shape") or any(not d.HasField("dim_value") for d in tt.shape.dim):
        return None
    shape = tuple(int(d.dim_value) for d in tt.shape.dim)
    return shape if all(d >= 1 for d in shape) and int(np.prod(shape)) <= max_size else None


def _keeps_shape(schema: Any, op_type: str, opset: int, arity: int) -> bool:
    """Whether onnx's inference says the op maps float[2,3,1,5] inputs (the second broadcast) to float[2,3,1,5]."""
    import onnx
    from onnx import TensorProto, helper

    names = [f"i{i}" for i in range(arity)]
    shapes_ = [[2, 3, 1, 5], [3, 1, 1]][:arity]
    types = {n: helper.make_tensor_type_proto(TensorProto.FLOAT, s) for n, s in zip(names, shapes_)}
    try:
        out = onnx.shape_inference.infer_node_outputs(
            schema, helper.make_node(op_type, names, ["y"]), types, opset_imports=[helper.make_opsetid("", opset)])
    except Exception:
        return False
    tt = out["y"].tensor_type if "y" in out else None
    return tt is not None and tt.elem_type == TensorProto.FLOAT and [d.dim_value for d in tt.shape.dim] == [2, 3, 1, 5]


def _takes_float(schema: Any) -> bool:
    for c in schema.type_constraints:
        if c.type_param_str == schema.outputs[0].type_str:
            return "tensor(float)" in c.allowed_type_strs
    return False


def _kernel_ops(opset: int) -> frozenset[str]:
    from ..plugins import get_registry

    reg = get_registry()
    return frozenset(op for (dom, op) in reg.kernels if dom == "" and reg.select_kernel("", op, opset) is not None)


def _registered(opset: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    return _schema_ops(opset, _kernel_ops(opset))


def has_kernels(*op_types: str, opset: int = 17) -> bool:
    """Whether every standard op in ``op_types`` has a kernel at ``opset``."""
    from ..plugins import get_registry

    return all(get_registry().select_kernel("", t, opset) is not None for t in op_types)


def shapes(min_rank: int = 1, max_rank: int = 4, max_side: int = 5) -> st.SearchStrategy[tuple[int, ...]]:
    """Small static shapes."""
    return st.lists(st.integers(1, max_side), min_size=min_rank, max_size=max_rank).map(tuple)


@st.composite
def floats_array(draw: Any, shape: Sequence[int], low: float = -1.0, high: float = 1.0,
                 dtype: Any = np.float32) -> np.ndarray:
    """An array of ``shape`` with values in [low, high] (drawn from a seed: fast and shrinkable)."""
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    return rng.uniform(low, high, size=tuple(shape)).astype(dtype)


def expose(draw: Any, b: GraphBuilder, value: str) -> str:
    """Random context around ``value``: nothing, an extra consumer, or a graph output in the middle.

    Returns which was chosen. A fusion through ``value`` must not fire in the
    last two cases; the outputs must hold in all three.
    """
    how = draw(st.sampled_from(["none", "none", "consumer", "output"]))
    if how == "consumer":
        b.output(b.op("Neg", value) if has_kernels("Neg") else b.op("Identity", value))
    elif how == "output":
        b.output(value)
    return how


def loosen(draw: Any, b: GraphBuilder, name: str, axes: Sequence[int] = (0,)) -> str:
    """Sometimes declare graph input ``name``'s dims at ``axes`` symbolic or unknown; returns which was chosen.

    "static" (half the time) leaves the declaration alone; "symbolic" names
    each dim after its size (``"N4"``: inputs of one size share the symbol,
    so their feeds stay consistent); "unknown" declares None, as an exporter
    writes an unnamed dynamic dim. The drawn sizes go to
    ``graph.meta["feed_shapes"]``, where `random_feeds` finds them. A pass
    must not use a dim that is not a known size, and must keep outputs.
    """
    how = draw(st.sampled_from(["static", "static", "symbolic", "unknown"]))
    t = b.graph.types[name]
    if how == "static" or t.shape is None or not axes:
        return "static"
    dims = list(t.shape)
    for axis in axes:
        dims[axis] = f"N{dims[axis]}" if how == "symbolic" else None
    b.graph.meta.setdefault("feed_shapes", {}).setdefault(name, tuple(t.shape))
    b.graph.types[name] = TensorType(t.dtype, tuple(dims))
    return how


@st.composite
def graphs(draw: Any, max_nodes: int = 8, opset: int = 17, dtypes: Sequence[Any] = (np.float32, np.float64)) -> Graph:
    """A random valid graph built from the registered op schemas.

    One dtype per graph, drawn from ``dtypes``. Each step applies, to values
    already in the graph, a float elementwise op (unary, or binary with a
    value or a broadcasting constant), any other registered float op whose
    inputs share one type (arity, attributes and the result's shape
    accepted by onnx's own inference for that schema: `inferred_shape`), or a
    motif (Conv + BatchNormalization, pooling, transposes, identities, an
    If, a Loop or a Scan over it: `control`). The
    inputs' declared dims are sometimes symbolic or unknown (`loosen`).
    """
    unary, binary = _registered(opset)
    general = _general_ops(opset, _kernel_ops(opset))
    dtype = np.dtype(draw(st.sampled_from(list(dtypes))))
    b = GraphBuilder(opset)
    shape = draw(st.tuples(st.integers(1, 2), st.integers(1, 4), st.integers(1, 5), st.integers(1, 5)))
    shapes_: dict[str, tuple[int, ...]] = {b.input(shape, dtype): shape}
    if draw(st.booleans()):
        shapes_[b.input(shape, dtype)] = shape
    axes = draw(st.sampled_from([(0,), (0,), (2,), (0, 3)]))
    for name in list(shapes_):
        loosen(draw, b, name, axes)
    motifs = [m for m, needs in MOTIFS if has_kernels(*needs, opset=opset)]
    for _ in range(draw(st.integers(1, max_nodes))):
        src = draw(st.sampled_from(list(shapes_)))
        kind = draw(st.sampled_from(["unary", "binary", "schema", "motif"]))
        if kind == "unary" and unary:
            op_type = draw(st.sampled_from(unary))
            out = b.op(op_type, src, **draw(op_attributes(op_type, opset, len(shapes_[src]))))
            shapes_[out] = shapes_[src]
        elif kind == "binary" and binary:
            same = [v for v, s in shapes_.items() if s == shapes_[src]]
            other = draw(st.sampled_from(same)) if draw(st.booleans()) else b.const(draw(floats_array(
                draw(st.sampled_from([(), (1,), shapes_[src][-1:]])), dtype=dtype)))
            shapes_[b.op(draw(st.sampled_from(binary)), src, other)] = shapes_[src]
        elif kind == "schema" and general:
            _schema_step(draw, b, shapes_, general, opset)
        elif kind == "motif" and motifs and len(shapes_[src]) == 4:
            out = draw(st.sampled_from(motifs))(draw, b, src, shapes_[src], dtype)
            shapes_[out] = shapes_[src]
    values = list(shapes_)
    b.output(values[-1])
    for v in values[1:-1]:
        if draw(st.integers(0, 3)) == 0:
            b.output(v)
    return b.build()


def _schema_step(draw: Any, b: GraphBuilder, shapes_: dict[str, tuple[int, ...]],
                 general: Sequence[tuple[str, int, int]], opset: int) -> None:
    """Apply a drawn op to drawn values when onnx's inference accepts the combination."""
    op_type, low, high = draw(st.sampled_from(list(general)))
    inputs = [draw(st.sampled_from(list(shapes_))) for _ in range(draw(st.integers(low, high)))]
    attrs = draw(op_attributes(op_type, opset, len(shapes_[inputs[0]])))
    out_shape = inferred_shape(op_type, opset, [shapes_[i] for i in inputs], attrs)
    if out_shape is not None:
        shapes_[b.op(op_type, *inputs, **attrs)] = out_shape


@st.composite
def op_attributes(draw: Any, op_type: str, opset: int, rank: int) -> dict[str, Any]:
    """Attributes for ``op_type`` drawn within the schema's rules: each optional attribute is
    left at its default or set: ``axis`` within the rank, floats scaled from their default,
    ``p`` of Lp ops in {1, 2}; attributes with other rules stay at their defaults."""
    import onnx

    schema = onnx.defs.get_schema(op_type, opset, "")
    out: dict[str, Any] = {}
    for name, attr in sorted(schema.attributes.items()):
        if not draw(st.booleans()):
            continue
        kind = attr.type
        default = onnx.helper.get_attribute_value(attr.default_value) if attr.default_value.name else None
        if name == "axis" and kind == onnx.defs.OpSchema.AttrType.INT:
            out[name] = draw(st.integers(-rank, rank - 1))
        elif name == "p" and kind == onnx.defs.OpSchema.AttrType.INT:
            out[name] = draw(st.sampled_from([1, 2]))
        elif kind == onnx.defs.OpSchema.AttrType.FLOAT and isinstance(default, float) and default > 0:
            out[name] = float(default * draw(st.sampled_from([0.5, 1.0, 2.0])))
    return out


def _conv_bn(draw: Any, b: GraphBuilder, x: str, shape: tuple[int, ...], dtype: Any) -> str:
    c = shape[1]
    w = b.const(draw(floats_array((c, c, 1, 1), dtype=dtype)))
    y = b.op("Conv", x, w, b.const(draw(floats_array((c,), dtype=dtype))), kernel_shape=[1, 1])
    params = [draw(floats_array((c,), lo, hi, dtype)) for lo, hi in ((0.5, 1.5), (-1, 1), (-1, 1), (0.5, 2))]
    return b.op("BatchNormalization", y, *[b.const(p) for p in params])




def _pool_same(draw: Any, b: GraphBuilder, x: str, shape: tuple[int, ...], dtype: Any) -> str:
    return b.op("MaxPool", x, kernel_shape=[1, 1]) if draw(st.booleans()) else b.op(
        "AveragePool", x, kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=1)




def _transpose_pair(draw: Any, b: GraphBuilder, x: str, shape: tuple[int, ...], dtype: Any) -> str:
    perm = draw(st.permutations(range(4)))
    inverse = list(np.argsort(perm))
    return b.op("Transpose", b.op("Transpose", x, perm=list(perm)), perm=[int(i) for i in inverse])




def _identities(draw: Any, b: GraphBuilder, x: str, shape: tuple[int, ...], dtype: Any) -> str:
    op = draw(st.sampled_from(["Identity", "Dropout", "Reshape"]))
    if op == "Reshape":
        return b.op("Reshape", x, b.const(np.array(shape, dtype=np.int64)))
    return b.op(op, x)



# Each motif with the ops it needs: a motif is drawn only when kernels for all of them exist.
MOTIFS = [
    (_conv_bn, ("Conv", "BatchNormalization")),
    (_pool_same, ("MaxPool", "AveragePool")),
    (_transpose_pair, ("Transpose",)),
    (_identities, ("Identity", "Dropout", "Reshape")),
    (if_motif, ("If", "ReduceMean", "Greater", "Add")),
    (loop_motif, ("Loop", "Identity", "Add")),
    (scan_motif, ("Scan", "Add", "Mul")),
]
