"""``channel_affine_fusion``: an inference BatchNormalization (+ an activation) as one ``ai.minfer::ChannelAffine``.

Pattern: a BatchNormalization in inference mode (no ``training_mode``,
``spatial`` 1, no statistics outputs read) with constant scale, bias, mean
and var, on a float input of known rank >= 2, optionally followed by an
activation minfer-passes fuses elsewhere (Relu, LeakyRelu, Clip with constant
bounds, Sigmoid, HardSigmoid, HardSwish, Tanh) that is the BN output's only
reader, the BN output being no graph output. This is what pre-activation
networks leave after conv_bn_fusion (densenet's BN -> Relu -> Conv after each
Concat): no Conv before the BN to absorb it.

Replacement: ``ChannelAffine(X, S, B)`` with ``S = (1 / sqrt(var + eps)) * scale``
and ``B = bias - mean * S`` (each step rounded in X's dtype, as onnxruntime's
CPU kernel rounds: the values minfer-ops-conv's BatchNormalization kernel
multiplies and adds), and
``activation``/``activation_params`` as on the other fused ops. Its kernel
computes ``act(X * S + B)`` chunk by chunk (a few hundred KB each, so the
chunk is read from memory once and written once, the add and the activation
running while it is in cache), the chunks split over `parallel_for`.
Same rounding as the BN kernel (product rounded, then the sum), then the
activation formula of the fused ops (rtol 1e-5 / atol 1e-6).

``--portable`` lowers it to ``BatchNormalization(X, S, B, 0, 1)`` with
epsilon 0 (opset 9 on; ``Mul`` + ``Add`` before) and the activation.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from minfer_core import Graph, Node, kernel, op, parallel_for, same_as_input, spmd

from ._util import FLOATS, MINFER_DOMAIN, add_const, const, dtype_of, fresh, has_kernel, opset
from .activation import ACTIVATIONS as ACTIVATION_OPS
from .activation import _params, activation_node
from .fusion import _bn_params
from .ops import ACTIVATIONS

OP = "ChannelAffine"

# ---- the pass ------------------------------------------------------------------------------


def _rank(graph: Graph, value: str) -> int | None:
    t = graph.type_of(value)
    return None if t is None or t.shape is None else len(t.shape)


def _activation(graph: Graph, value: str) -> tuple[Node, list[float]] | None:
    act = graph.sole_consumer(value)
    if act is None or act.domain or act.op_type not in ACTIVATION_OPS or act.inputs[0] != value:
        return None
    params = _params(graph, act)
    return None if params is None else (act, params)


def _folded(scale: np.ndarray, bias: np.ndarray, mean: np.ndarray, var: np.ndarray, epsilon: float,
            dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """S and B of ``dtype`` rounded step by step as minfer-ops-conv's BatchNormalization (and onnxruntime) round them.

    In ``dtype`` (float16/bfloat16: float32): S = (1 / sqrt(var + eps)) * scale, B = bias - mean * S. Folded in
    float64 instead, S or B moves by an ulp on a few channels, which a DynamicQuantizeLinear reading the
    output can turn into a whole quantization step.
    """
    t = np.dtype(dtype) if np.dtype(dtype) in (np.float32, np.float64) else np.dtype(np.float32)
    scale, bias, mean, var = (p.astype(t) for p in (scale, bias, mean, var))
    with np.errstate(divide="ignore", invalid="ignore"):
        s = t.type(1) / np.sqrt(var + t.type(epsilon)) * scale
        b = bias - mean * s
    return s.astype(dtype), b.astype(dtype)


def _step(graph: Graph, bn: Node) -> bool:
    if bn.domain or bn.op_type != "BatchNormalization" or not bn.inputs:
        return False
    x = bn.inputs[0]
    rank = _rank(graph, x)
    if rank is None or rank < 2:
        return False
    dtype = dtype_of(graph, x)
    params = _bn_params(graph, bn)
    if dtype not in FLOATS or params is None:
        return False
    s, b = _folded(*params, float(bn.attrs.get("epsilon", 1e-5)), dtype)
    name = bn.name or "bn"
    inputs = [x, add_const(graph, f"{name}_scale", s), add_const(graph, f"{name}_shift", b)]
    fused, attrs, end = [bn], {}, bn.outputs[0]
    found = _activation(graph, end)
    if found is not None:
        act, act_params = found
        attrs = {"activation": act.op_type, "activation_params": act_params}
        fused.append(act)
        end = act.outputs[0]
    graph.opsets.setdefault(MINFER_DOMAIN, 1)
    graph.replace(fused, Node(OP, inputs, [end], attrs, bn.name, MINFER_DOMAIN))
    return True


# activations with act(s * z) = s * act(z) for s > 0: a positive scale moves through them into the next Conv
HOMOGENEOUS = ("", "Relu", "LeakyRelu")


def _scale_target(graph: Graph, node: Node) -> tuple[Node, np.ndarray, np.ndarray] | None:
    """The Conv/FusedConv that can absorb ``node``'s scale, with the scale and that Conv's weights."""
    if len(node.inputs) < 3 or not node.inputs[1] or node.attrs.get("activation", "") not in HOMOGENEOUS:
        return None
    s = const(graph, node.inputs[1])
    if s is None or not (np.all(s > 0) if node.attrs.get("activation") else np.all(s != 0)):
        return None
    conv = graph.sole_consumer(node.outputs[0])
    if conv is None or conv.op_type not in ("Conv", "FusedConv") or conv.domain not in ("", MINFER_DOMAIN):
        return None
    if (conv.op_type == "Conv") != (conv.domain == "") or conv.inputs[0] != node.outputs[0]:
        return None
    w = const(graph, conv.inputs[1]) if len(conv.inputs) > 1 else None
    if w is None or conv.attrs.get("group", 1) != 1 or w.ndim < 2 or w.shape[1] != s.size or w.dtype != s.dtype:
        return None
    return conv, s.reshape(-1).astype(np.float64), w


def _fold_scale(graph: Graph, node: Node) -> bool:
    """``act(X*S + B)`` read only by a Conv: ``act(X + B/S)``, and S moves into the Conv's W along its input channels."""
    found = _scale_target(graph, node)
    if found is None:
        return False
    conv, s, w = found
    b = const(graph, node.inputs[2])
    if b is None:
        return False
    w2 = w.astype(np.float64) * s.reshape((1, -1) + (1,) * (w.ndim - 2))
    name = node.name or OP
    shift = add_const(graph, f"{name}_shift", (b.astype(np.float64).reshape(-1) / s).astype(b.dtype))
    weights = add_const(graph, f"{conv.name or 'conv'}_W", w2.astype(w.dtype))
    graph.replace([node], Node(OP, [node.inputs[0], "", shift], node.outputs, dict(node.attrs), node.name, node.domain))
    graph.replace([conv], Node(conv.op_type, [conv.inputs[0], weights, *conv.inputs[2:]], conv.outputs,
                             dict(conv.attrs), conv.name, conv.domain))
    return True


def channel_affine_fusion(graph: Graph) -> bool:
    """Turn inference BatchNormalization with constant parameters (+ an activation) into ai.minfer::ChannelAffine."""
    if not has_kernel(graph, MINFER_DOMAIN, OP):
        return False
    changed = False
    for node in list(graph.nodes):
        if node in graph.nodes and _step(graph, node):
            changed = True
    for node in list(graph.nodes):
        if node.domain == MINFER_DOMAIN and node.op_type == OP and _fold_scale(graph, node):
            changed = True
    return changed


# ---- the kernel ----------------------------------------------------------------------------

CHUNK = 1 << 16  # elements per chunk (256 KB of float32): read once, then added to and activated in L2
# Below this many elements one thread does it all. Measured on densenet121 (2 threads): splitting from 64K
# elements on made ChannelAffine slower at batch 1 (4.4 -> 6.1 ms: an empty two-thread parallel_for costs
# ~50 us here, and two cores share the memory bandwidth), from 1M on faster at batch 8 (33 -> 27 ms).
SPLIT = 1 << 20
ROW = 16  # spatial sizes from this on run as rows of one channel; below, as rows of one image


@functools.lru_cache(maxsize=8)
def _zeros(dtype: np.dtype, size: int) -> np.ndarray:
    """A shared read-only zero array: numpy 2.4's max against an array runs ~5x faster than against a 0-d zero."""
    z = np.zeros(size, dtype)
    z.flags.writeable = False
    return z


def _relu(y: np.ndarray, zeros: np.ndarray) -> None:
    flat = y.reshape(-1)  # a chunk of whole rows of a C-contiguous buffer: a view
    np.maximum(flat, zeros[: flat.size], out=flat)


def _layout(shape: tuple[int, ...], s: np.ndarray | None, b: np.ndarray) -> tuple[tuple[int, int], Any, np.ndarray]:
    """X as a 2-D (rows, cols) array and S, B broadcast against it: per (image, channel) row, or per image row."""
    n, c, inner = shape[0], shape[1], math.prod(shape[2:])
    if inner >= ROW:
        rows = n * c, inner
        return rows, None if s is None else np.tile(s, n)[:, None], np.tile(b, n)[:, None]
    return (n, c * inner), None if s is None else np.repeat(s, inner)[None, :], np.repeat(b, inner)[None, :]


def _chunked(x2: np.ndarray, y2: np.ndarray, s2: np.ndarray | None, b2: np.ndarray, activation: str,
             params: list[float]) -> None:
    """y2 = act(x2 * s2 + b2) (x2 + b2 without s2), in chunks of whole rows split over the intra-op threads."""
    rows, cols = x2.shape
    step = max(1, CHUNK // max(cols, 1))
    per_row = b2.shape[0] != 1
    act = ACTIVATIONS[activation] if activation and activation != "Relu" else None
    zeros = _zeros(y2.dtype, max(CHUNK, cols)) if activation == "Relu" else None  # one size: no cache churn

    def chunk(r0: int, r1: int) -> None:
        y, x = y2[r0:r1], x2[r0:r1]  # out may be x: each element is read before it is written
        if s2 is not None:
            np.multiply(x, s2[r0:r1] if per_row else s2, out=y)
            x = y
        np.add(x, b2[r0:r1] if per_row else b2, out=y)
        if zeros is not None:
            _relu(y, zeros)
        elif act is not None:
            act(y, params)

    def work(lo: int, hi: int) -> None:
        with np.errstate(over="ignore"):  # per thread: numpy's error state does not follow into the pool
            for k in range(lo, hi):
                chunk(k * step, min(rows, (k + 1) * step))

    chunks = -(-rows // step)
    # chunks write only their rows of y (in place or not): a process team may share them (one part: one process)
    parallel_for(chunks, work, parts=None if x2.size >= SPLIT and chunks > 1 else 1, outputs_only=True)


# views=False: the result is the planned buffer or a fresh array, never an input's memory
@kernel(OP, domain=MINFER_DOMAIN, prepare=True, out=True, inplace=(0,), views=False)
def channel_affine(ctx: Any, *, activation: str = "", activation_params: list[float] | None = None) -> Any:
    """ai.minfer::ChannelAffine-1: act(X * S + B) (S omitted: act(X + B)) per channel, in cache-sized chunks."""
    if activation and activation not in ACTIVATIONS:
        raise ValueError(f"ChannelAffine: unknown activation {activation!r}; known: {', '.join(ACTIVATIONS)}")
    params = [float(p) for p in (activation_params or [])]
    s_const, b_const = (ctx.constants[i] if len(ctx.constants) > i else None for i in (1, 2))
    cache: dict[tuple, tuple] = {}

    def run(x: np.ndarray, s: np.ndarray | None, b: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
        channels = x.shape[1] if x.ndim > 1 else -1
        if channels < 0 or (s is not None and s.size != channels) or b.size != channels:
            raise ValueError(f"ChannelAffine: X {list(x.shape)} needs S (or none) and B of one value per channel "
                             f"(axis 1); got {None if s is None else s.size} and {b.size}")
        y = np.empty(x.shape, x.dtype) if out is None else out
        if x.size == 0:
            return y
        fixed = s is s_const and b is b_const  # the constants the node was built with: lay them out once per shape
        layout = cache.get((x.shape, x.dtype)) if fixed else None
        if layout is None:
            sv = None if s is None else np.asarray(s, dtype=x.dtype).reshape(-1)
            layout = _layout(x.shape, sv, np.asarray(b, dtype=x.dtype).reshape(-1))
            if fixed:
                cache[(x.shape, x.dtype)] = layout
        (rows, cols), s2, b2 = layout
        _chunked(x.reshape(rows, cols), y.reshape(rows, cols), s2, b2, activation, params)
        return y

    return spmd(run)


KERNELS = [channel_affine]
OPS = [op(OP, domain=MINFER_DOMAIN, infer=same_as_input(0),
          doc="per-channel X * S + B (a folded inference BatchNormalization), then an optional activation")]


# ---- --portable ------------------------------------------------------------------------------


def expand_channel_affine(graph: Graph, node: Node) -> None:
    """ChannelAffine -> BatchNormalization(X, S, B, 0, 1; epsilon 0) [-> activation]; Mul + Add before opset 9."""
    x, s, b = node.inputs[:3]
    act, params = node.attrs.get("activation", ""), [float(p) for p in node.attrs.get("activation_params", [])]
    t = graph.type_of(node.outputs[0]) or graph.type_of(x)
    name = node.name or OP
    y = fresh(graph, f"{name}_affine") if act else node.outputs[0]
    if t is not None and act:
        graph.types[y] = t
    new = _affine_nodes(graph, x, s, b, y, name)
    if act:
        new.append(activation_node(graph, act, params, y, node.outputs[0], fresh(graph, f"{name}_act")))
    graph.replace([node], new)


def _affine_nodes(graph: Graph, x: str, s: str, b: str, y: str, name: str) -> list[Node]:
    bv = const(graph, b)
    sv = np.ones_like(bv) if not s and bv is not None else const(graph, s)
    if sv is None or bv is None:
        raise ValueError(f"{name}: a ChannelAffine with computed S or B has no standard form here")
    if opset(graph) >= 9:
        scale = s or add_const(graph, f"{name}_scale", sv)
        zero = add_const(graph, f"{name}_mean", np.zeros(sv.size, sv.dtype))
        one = add_const(graph, f"{name}_var", np.ones(sv.size, sv.dtype))
        return [Node("BatchNormalization", [x, scale, b, zero, one], [y], {"epsilon": 0.0}, name, "")]
    rank = len(graph.type_of(x).shape)  # type: ignore[arg-type,union-attr]  # the pass only fuses a known rank
    shaped = (-1,) + (1,) * (rank - 2)
    add = Node("Add", [x, add_const(graph, f"{name}_b", bv.reshape(shaped))], [y], {}, name, "")
    if not s:
        return [add]
    mid = fresh(graph, f"{name}_mul")
    mul = Node("Mul", [x, add_const(graph, f"{name}_s", sv.reshape(shaped))], [mid], {}, fresh(graph, f"{name}_mul"), "")
    return [mul, Node("Add", [mid, *add.inputs[1:]], [y], {}, name, "")]


# ---- property-suite patterns --------------------------------------------------------------


def patterns() -> Any:
    """The pass's target strategy: BN [+ activation] [+ Conv] in random context.

    Sometimes a BN parameter or a Clip bound is computed (nothing or only the
    BN fuses), the scale has negative entries (it cannot move through a Relu),
    or the Conv is grouped (it cannot take the scale).
    """
    from hypothesis import strategies as st

    from minfer_core.testing import GraphBuilder
    from minfer_core.testing.strategies import expose, floats_array, has_kernels

    @st.composite
    def graphs(draw: Any) -> Any:
        version = draw(st.sampled_from([9, 13, 15, 17]))
        b = GraphBuilder(opset=version)
        shape = tuple(draw(st.integers(1, 3)) for _ in range(draw(st.integers(2, 5))))
        dtype = draw(st.sampled_from([np.float32, np.float32, np.float64]))
        x = b.op("Tanh", b.input(shape, dtype)) if draw(st.booleans()) else b.input(shape, dtype)
        c = shape[1]
        low = draw(st.sampled_from([0.5, 0.5, -1.5]))  # scale: sometimes with negative entries
        params = [b.const(draw(floats_array((c,), lo, hi, dtype)))
                  for lo, hi in ((low, 1.5), (-1, 1), (-1, 1), (0.2, 2))]
        if draw(st.integers(0, 5)) == 0:  # a computed parameter: must not fuse
            params[draw(st.integers(0, 3))] = b.input((c,), dtype)
        y = b.op("BatchNormalization", x, *params, epsilon=draw(st.sampled_from([1e-5, 1e-3])))
        act = draw(st.sampled_from(["none", "Relu", "Relu", *ACTIVATION_OPS]))
        if act != "none" and (act != "HardSwish" or version >= 14):
            expose(draw, b, y)
            y = _pattern_activation(draw, b, y, act, version, dtype)
        if len(shape) == 4 and draw(st.booleans()):
            expose(draw, b, y)
            group = draw(st.sampled_from([1, 1, c]))
            k = draw(st.sampled_from([1, 3]))
            w = b.const(draw(floats_array((2 * group, c // group, k, k), -1, 1, dtype)))
            y = b.op("Conv", y, w, kernel_shape=[k, k], pads=[k // 2] * 4, group=group)
        b.output(b.op("Neg", y) if has_kernels("Neg") else y)
        return b.build()

    return graphs()


def _pattern_activation(draw: Any, b: Any, y: str, act: str, version: int, dtype: Any) -> str:
    from hypothesis import strategies as st

    attrs: dict[str, Any] = {}
    extra: list[str] = []
    if act == "LeakyRelu":
        attrs["alpha"] = draw(st.sampled_from([0.01, 0.2]))
    elif act == "HardSigmoid":
        attrs = {"alpha": 0.5, "beta": 0.3}
    elif act == "Clip" and version < 11:
        attrs = {"min": -0.5, "max": 6.0}
    elif act == "Clip":
        extra = [b.const(np.asarray(-0.5, dtype)), b.const(np.asarray(6.0, dtype))][: draw(st.integers(0, 2))]
        if extra and draw(st.integers(0, 3)) == 0:
            extra[-1] = b.input((), dtype)  # a computed bound: the activation stays apart
    return b.op(act, y, *extra, **attrs)
