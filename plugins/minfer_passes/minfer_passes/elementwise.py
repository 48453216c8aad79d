"""``elementwise_fusion``: a connected group of elementwise ops as one ``ai.minfer::FusedElementwise``.

Pattern: a *sink* node and the elementwise nodes upstream of it whose every
reader is already in the group (so no value inside the group is read outside
it, and none is a graph output: only the sink's output leaves the group).
Members are standard-domain Add, Sub, Mul, Div, Max and Min of two inputs,
Pow by a one-element constant exponent, Where, Neg, Abs, Sqrt, Exp, Log,
Reciprocal, Tanh, Erf, Sigmoid, Relu, HardSwish, LeakyRelu, HardSigmoid and
Clip with constant (or absent) bounds. Every member's output has the sink's
dtype, float32 or float64 (the only dtypes whose every step the kernel
computes like the standalone kernels), and the sink's rank, with no dim known
to be 1 where the sink's is not: operands may broadcast (a bias vector, a
per-channel scale, a scalar, a bool mask), but no member computes a smaller
tensor that the fused kernel would recompute at full size (LayerNorm's
``sqrt(var + eps)`` stays out of the group that divides by it). A
one-element constant becomes an immediate of the program only where it
cannot change its node's shape. Only groups of two nodes or more are fused.
Replacement: one ``FusedElementwise`` whose attributes are the group as a
step program (format in the plugin's README and `decode`), put where the
sink stood; its output is the broadcast of its inputs, which is the sink's.

Runs after the passes that fuse elementwise ops into something else (an
activation or a residual into a Conv/Gemm, BatchNormalization + activation,
GELU's Erf spelling, constant Mul/Add folded into weights), so it takes only
what they leave, and before ``scalar_binary``/``weighted_sum_fusion``, which
would otherwise split chains into single scalar ops first.

Numerically close, not bit-exact: each step is the same numpy operation as
the standalone kernel except Sigmoid (``1 / (1 + exp(-x))`` instead of the
overflow-free form: equal within a few ulps, and 0 instead of a denormal
below -88) and Pow by 3 (``x*x*x``, within 2 ulps of powf). Erf calls the
registered Erf kernel. ``--portable`` lowers the node back to one standard
node per step.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from minfer_core import Graph, Node, TensorType, op

from ._util import MINFER_DOMAIN, add_const, const, dtype_of, fresh, has_kernel, opset
from .activation import _params as activation_params

OP = "FusedElementwise"
DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
UNUSED = -1
WIDTH = 3  # operand slots per step in ``args``

# step op -> (number of operands, operand positions that must be constants)
STEPS: dict[str, tuple[int, tuple[int, ...]]] = {
    **{name: (2, ()) for name in ("Add", "Sub", "Mul", "Div", "Max", "Min")},
    "Pow": (2, (1,)),
    "Where": (3, ()),
    **{name: (1, ()) for name in ("Neg", "Abs", "Sqrt", "Exp", "Log", "Reciprocal", "Tanh", "Erf", "Sigmoid",
                                  "Relu", "HardSwish")},
    "LeakyRelu": (2, (1,)),
    "HardSigmoid": (3, (1, 2)),
    "Clip": (3, (1, 2)),
}
PARAMETRIC = ("LeakyRelu", "HardSigmoid", "Clip")  # constants from attributes (Clip: from inputs since opset 11)
LEGACY_ATTRS = {"consumed_inputs"}  # no effect; any other attribute (opset < 7 broadcast, axis) is refused


# ---- the program format --------------------------------------------------------------------------


def encode(steps: Sequence[tuple[str, Sequence[int]]], constants: Sequence[float], dtype: np.dtype) -> dict[str, Any]:
    """The node attributes of a program: ``ops``, ``args`` (3 per step, -1 unused), ``constants`` (1-D tensor)."""
    args: list[int] = []
    for _, refs in steps:
        args += list(refs) + [UNUSED] * (WIDTH - len(refs))
    return {"ops": [name for name, _ in steps], "args": args, "constants": np.asarray(constants, dtype=dtype)}


def decode(n_inputs: int, ops: Sequence[str], args: Sequence[int],
           constants: Any) -> tuple[list[tuple[str, tuple[int, ...]]], np.ndarray]:
    """The steps ``[(op, refs)]`` and constants of a program, checked; ValueError says what is wrong.

    A reference ``r`` is input ``r`` below ``n_inputs``, then ``constants[r - n_inputs]``, then the
    result of step ``r - n_inputs - len(constants)``, which must come before the step reading it.
    """
    consts = np.asarray(constants if constants is not None else [], dtype=None).reshape(-1)
    if len(args) != WIDTH * len(ops) or not ops:
        raise ValueError(f"{len(ops)} ops need {WIDTH * len(ops)} args (3 per step, -1 for unused), got {len(args)}")
    base = n_inputs + consts.size
    steps = []
    for k, name in enumerate(ops):
        if name not in STEPS:
            raise ValueError(f"step {k}: unknown op {name!r}; known: {', '.join(STEPS)}")
        arity, fixed = STEPS[name]
        row = [int(a) for a in args[WIDTH * k: WIDTH * k + WIDTH]]
        refs, rest = tuple(row[:arity]), row[arity:]
        if any(r < 0 or r >= base + k for r in refs) or any(r != UNUSED for r in rest):
            raise ValueError(f"step {k} ({name}): operands {row} must be {arity} references below {base + k} "
                             f"({n_inputs} inputs, {consts.size} constants, {k} earlier steps), then -1")
        if any(not n_inputs <= refs[i] < base for i in fixed):
            raise ValueError(f"step {k} ({name}): operand(s) {list(fixed)} must be constants")
        steps.append((name, refs))
    return steps, consts


# ---- the pass ------------------------------------------------------------------------------------


def _immediate(graph: Graph, name: str, dtype: np.dtype, rank: int, any_dtype: bool = False) -> float | None:
    """The value of ``name`` when it is a one-element constant that cannot change the result's shape."""
    c = const(graph, name)
    if c is None or c.size != 1 or c.ndim > rank or c.dtype.kind not in "fiu" or (c.dtype != dtype and not any_dtype):
        return None
    v = c.reshape(()).item()
    return float(v) if float(dtype.type(v)) == float(v) else None  # a Pow exponent must be exact in the dtype


def _operands(graph: Graph, node: Node, dtype: np.dtype, rank: int) -> list[Any] | None:
    """The step's operands (value names, or floats for constants) when ``node`` may join a group of ``dtype``."""
    name = node.op_type
    if node.domain or name not in STEPS or len(node.outputs) != 1 or dtype_of(graph, node.outputs[0]) != dtype:
        return None
    arity, fixed = STEPS[name]
    if name in PARAMETRIC:
        params = activation_params(graph, node)
        return None if params is None else [node.inputs[0], *params]
    if set(node.attrs) - LEGACY_ATTRS or len(node.inputs) != arity or "" in node.inputs:
        return None
    if name == "Erf" and not has_kernel(graph, "", "Erf"):
        return None
    consts = {i: _immediate(graph, v, dtype, rank, any_dtype=i in fixed) for i, v in enumerate(node.inputs)}
    # a one-element constant is an immediate only where a value operand has its rank or more: it then
    # cannot change the node's shape, so the group's output is the broadcast of the group's inputs
    ranks = [graph.type_of(v).rank for i, v in enumerate(node.inputs) if consts[i] is None and graph.type_of(v)]
    top = max((r for r in ranks if r is not None), default=-1)
    out: list[Any] = []
    for i, value in enumerate(node.inputs):
        c = consts[i]
        if c is not None and const(graph, value).ndim > top:  # type: ignore[union-attr]
            c = None
        if c is None and i in fixed:
            return None
        out.append(value if c is None else c)
    return out


def _types_ok(graph: Graph, name: str, operands: list[Any], dtype: np.dtype) -> bool:
    """Every value operand has the group's dtype (Where's condition: bool)."""
    for i, v in enumerate(operands):
        if isinstance(v, str) and dtype_of(graph, v) != (np.dtype(bool) if name == "Where" and i == 0 else dtype):
            return False
    return True


def _fits(graph: Graph, value: str, shape: tuple[Any, ...]) -> bool:
    """Whether ``value``, upstream of a sink of ``shape``, surely is no smaller tensor broadcast into it.

    Each dim of a member is 1 or the sink's (the sink's output is the broadcast of
    everything upstream), so only a dim known to be 1 where the sink's is not
    known to be 1 marks a smaller tensor; the fused kernel would recompute it at
    full size. An unknown dim is taken as full: that is only ever wasted work.
    """
    t = graph.type_of(value)
    if t is None or t.shape is None or len(t.shape) != len(shape):
        return False
    return all(not (d == 1 and s != 1) for d, s in zip(t.shape, shape))


def _member(graph: Graph, node: Node, sink: Node) -> list[Any] | None:
    """``node``'s operands when it computes a tensor of the sink's dtype and not surely a smaller one."""
    dtype, t = dtype_of(graph, sink.outputs[0]), graph.type_of(sink.outputs[0])
    if dtype not in DTYPES or t is None or t.shape is None:
        return None
    if node is not sink and not _fits(graph, node.outputs[0], t.shape):
        return None
    ops = _operands(graph, node, dtype, len(t.shape))
    return ops if ops is not None and _types_ok(graph, node.op_type, ops, dtype) else None


def _group(graph: Graph, sink: Node) -> dict[Node, list[Any]]:
    """The sink and every fusable node upstream whose output only group members read (and no graph output)."""
    first = _member(graph, sink, sink)
    if first is None:
        return {}
    group = {sink: first}
    work = [sink]
    while work:
        node = work.pop()
        for value in group[node]:
            producer = graph.producer(value) if isinstance(value, str) else None
            if producer is None or producer in group or value in graph.outputs:
                continue
            # checked again when each further reader joins: the last one to join admits the producer
            if all(reader in group for reader in graph.consumers(value)):
                operands = _member(graph, producer, sink)
                if operands is not None:
                    group[producer] = operands
                    work.append(producer)
    return group


def _program(graph: Graph, nodes: list[Node], operands: dict[Node, list[Any]], dtype: np.dtype) -> tuple[list[str], dict]:
    """(the fused node's inputs, its attributes) for the group ``nodes`` in graph order."""
    made = {n.outputs[0]: k for k, n in enumerate(nodes)}
    inputs: list[str] = []
    consts: dict[bytes, float] = {}
    for n in nodes:
        for v in operands[n]:
            if isinstance(v, str) and v not in made and v not in inputs:
                inputs.append(v)
            elif not isinstance(v, str):
                consts.setdefault(np.float64(v).tobytes(), v)  # by bits: -0.0 and 0.0 stay apart
    keys = list(consts)
    base = len(inputs) + len(keys)

    def ref(v: Any) -> int:
        if not isinstance(v, str):
            return len(inputs) + keys.index(np.float64(v).tobytes())
        return base + made[v] if v in made else inputs.index(v)

    steps = [(n.op_type, [ref(v) for v in operands[n]]) for n in nodes]
    return inputs, encode(steps, list(consts.values()), dtype)


def _agrees(got: TensorType | None, want: TensorType | None) -> bool:
    """Same dtype and rank, and no dim known on both sides with two sizes (or names)."""
    if got is None or want is None or got.dtype != want.dtype or got.shape is None or want.shape is None:
        return False
    return len(got.shape) == len(want.shape) and all(
        a is None or b is None or a == b or not (isinstance(a, int) and isinstance(b, int))
        for a, b in zip(got.shape, want.shape))


def elementwise_fusion(graph: Graph) -> bool:
    """Fuse connected groups of elementwise ops (float32/float64) into ai.minfer::FusedElementwise."""
    if not has_kernel(graph, MINFER_DOMAIN, OP) or opset(graph) < 7:  # before 7, broadcasting was per attribute
        return False
    nodes = list(graph.nodes)
    order = {id(n): i for i, n in enumerate(nodes)}
    gone: set[int] = set()
    changed = False
    for sink in reversed(nodes):  # downstream first: each group grows from the last node it can end with
        if id(sink) in gone:
            continue
        group = _group(graph, sink)
        if len(group) < 2:
            continue
        members = sorted(group, key=lambda n: order[id(n)])
        dtype = dtype_of(graph, sink.outputs[0])
        inputs, attrs = _program(graph, members, group, dtype)  # type: ignore[arg-type]
        if not _agrees(infer(*[graph.type_of(v) for v in inputs], **attrs)[0], graph.type_of(sink.outputs[0])):
            continue  # a safety net: what the fused node infers must not contradict the sink's type
        graph.opsets.setdefault(MINFER_DOMAIN, 1)
        graph.replace(members, Node(OP, inputs, sink.outputs, attrs, sink.name, MINFER_DOMAIN))
        gone.update(id(n) for n in members)
        changed = True
    return changed


# ---- shape and dtype inference -------------------------------------------------------------------


def _broadcast_dim(dims: list[Any]) -> Any:
    """numpy's broadcast of one axis over known, symbolic and unknown dims (None when it cannot be told)."""
    rest = {d for d in dims if d != 1}
    if not rest:
        return 1
    if any(d is None or (isinstance(d, int) and d < 0) for d in rest):
        return None
    sizes = {d for d in rest if isinstance(d, int)}
    if sizes:
        return sizes.pop() if len(sizes) == 1 else None  # a symbolic dim broadcast with 3 must be 3
    return rest.pop() if len(rest) == 1 else None


def infer(*types: TensorType | None, constants: Any = None, **attrs: Any) -> list[TensorType | None]:
    """FusedElementwise's output: the broadcast of every input's shape, in the constants' (the group's) dtype."""
    floats = [t for t in types if t is not None and t.dtype != np.dtype(bool)]
    dtype = np.asarray(constants).dtype if constants is not None else (floats[0].dtype if floats else None)
    if dtype is None:
        return [None]
    if any(t is None or t.shape is None for t in types):
        return [TensorType(dtype, None)]
    shapes = [t.shape for t in types]  # type: ignore[union-attr]
    rank = max((len(s) for s in shapes), default=0)
    padded = [(1,) * (rank - len(s)) + tuple(s) for s in shapes]  # type: ignore[arg-type]
    return [TensorType(dtype, tuple(_broadcast_dim([s[i] for s in padded]) for i in range(rank)))]


OPS = [op(OP, domain=MINFER_DOMAIN, infer=infer,
          doc="a group of elementwise ops as one step program (ops, args, constants), evaluated block by block")]


# ---- --portable ----------------------------------------------------------------------------------


def _standard(graph: Graph, name: str, regs: list[str], refs: tuple[int, ...], values: list[float | None],
              dst: str, fresh_name: str, dtype: np.dtype) -> Node:
    """One step as a standard node writing ``dst`` (constants as 0-d initializers, or attributes where ONNX has them)."""
    if name == "LeakyRelu":
        return Node(name, [regs[refs[0]]], [dst], {"alpha": values[refs[1]]}, fresh_name)
    if name == "HardSigmoid":
        return Node(name, [regs[refs[0]]], [dst], {"alpha": values[refs[1]], "beta": values[refs[2]]}, fresh_name)
    if name == "Clip" and opset(graph) < 11:
        return Node(name, [regs[refs[0]]], [dst], {"min": values[refs[1]], "max": values[refs[2]]}, fresh_name)
    ins = []
    for r in refs:
        if values[r] is not None and not regs[r]:
            regs[r] = add_const(graph, f"{fresh_name}_c", np.asarray(values[r], dtype))
        ins.append(regs[r])
    return Node(name, ins, [dst], {}, fresh_name)


def expand_elementwise(graph: Graph, node: Node) -> None:
    """FusedElementwise -> one standard node per step, the last writing the fused node's output."""
    n = len(node.inputs)
    steps, consts = decode(n, node.attrs["ops"], node.attrs["args"], node.attrs.get("constants"))
    dtype = consts.dtype if consts.dtype.kind == "f" else (dtype_of(graph, node.outputs[0]) or np.dtype(np.float32))
    regs = list(node.inputs) + [""] * consts.size  # constants get an initializer when a standard input needs one
    values: list[float | None] = [None] * n + [float(c) for c in consts]
    t = graph.type_of(node.outputs[0])
    new = []
    for k, (name, refs) in enumerate(steps):
        dst = node.outputs[0] if k == len(steps) - 1 else fresh(graph, f"{node.name or OP}_s{k}")
        if t is not None and dst != node.outputs[0]:
            graph.types[dst] = t  # every step of a fused group computes the output's shape
        last = k == len(steps) - 1
        step_name = node.name if last and node.name else fresh(graph, f"{node.name or OP}_{name.lower()}")
        new.append(_standard(graph, name, regs, refs, values, dst, step_name, dtype))
        regs.append(dst)
        values.append(None)
    graph.replace([node], new)
