"""``gelu_fusion``: GELU spelt with Erf, as exporters write it, as one ``ai.minfer::Gelu``.

Pattern (float32 X of known rank, every intermediate read once and no graph
output, the constants scalars of rank at most X's):

    E = Erf(X / sqrt(2))          (or X * (1/sqrt(2)))
    A = E + 1                     (either operand order, here and below)
    Y = (X * A) * 0.5             (or (X * 0.5) * A, or X * (A * 0.5))

which is what PyTorch's exporter writes for ``nn.GELU()`` (onnxruntime fuses
it back the same way). Replacement: ``ai.minfer::Gelu(X)``.

Not exact: the kernel computes ``X * Phi(X)`` from ``Phi``'s own
approximation (below) instead of Erf to float32's last bit; the result is
within 3.2e-7 of the exact GELU everywhere (a few float32 ulps at |Y| ~ 1),
checked on a dense grid in the tests (declared tolerance rtol 1e-5 / atol
1e-6). Why: Erf at full float32 accuracy takes ~35 numpy passes over the
data (two polynomial branches, a select by bits); this takes ~17 and one
exp, and the Div/Add/Mul/Mul around it disappear (transformer block, batch
8: the five ops took 5.2 ms of 21). Only float32 is fused: float64 models
keep their precise Erf.

``--portable`` lowers it back to Div, Erf, Add, Mul, Mul.

How the kernel computes it, with t = |x| and e = erfc(t / sqrt(2)):
``gelu(x) = x * (1 - e/2)`` for x >= 0 and ``x * e/2`` below, which is one
formula, ``max(x, 0) - t * e / 2``, with no cancellation on the negative side.
``e = exp(t * P(t))`` with P a degree-5 polynomial fitted here (weighted
least squares in float64 against ``math.erfc``, reweighted towards the
minimax of the GELU error, coefficients rounded to float32: the fit's
script is in the tests' docstring). t is clamped at 4 sqrt(2), where e is
below float32's resolution of 1.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from minfer_core import Graph, Node, kernel, op, parallel_for, same_as_input

from ._util import MINFER_DOMAIN, add_const, const, dtype_of, fresh, has_kernel, is_op, other_input

OP = "Gelu"

# ---- the pass ------------------------------------------------------------------------------------


def _scalar(graph: Graph, name: str, target: float, rank: int) -> bool:
    """``name`` is a constant of one element, of rank <= ``rank`` (no broadcast beyond X), equal to target."""
    v = const(graph, name)
    return (v is not None and v.size == 1 and v.ndim <= rank
            and math.isclose(float(v.reshape(())), target, rel_tol=1e-6))


def _next(graph: Graph, value: str, *op_types: str) -> Node | None:
    """The sole reader of ``value`` when it is one of ``op_types`` (standard domain)."""
    node = graph.sole_consumer(value)
    return node if is_op(node, *op_types) else None


def _match(graph: Graph, erf: Node) -> tuple[str, list[Node], str] | None:
    """(X, the nodes making GELU(X), its output) when ``erf`` is the Erf of the pattern."""
    scale = graph.producer(erf.inputs[0]) if erf.inputs else None
    if not is_op(scale, "Div", "Mul") or graph.sole_consumer(scale.outputs[0]) is not erf:  # type: ignore[union-attr]
        return None
    assert scale is not None
    for x in dict.fromkeys(scale.inputs):  # Mul may have X on either side
        tx = graph.type_of(x)
        if tx is None or tx.shape is None or dtype_of(graph, x) != np.float32:
            continue
        rank = len(tx.shape)
        if scale.op_type == "Div" and scale.inputs[0] == x and _scalar(graph, scale.inputs[1], math.sqrt(2), rank):
            break
        if scale.op_type == "Mul" and _scalar(graph, other_input(scale, x) or "", math.sqrt(0.5), rank):
            break
    else:
        return None
    add = _next(graph, erf.outputs[0], "Add")
    if add is None or not _scalar(graph, other_input(add, erf.outputs[0]) or "", 1.0, rank):
        return None
    a = add.outputs[0]
    mul = _next(graph, a, "Mul")
    if mul is None:
        return None
    partner = other_input(mul, a)
    if partner == x:  # (X * A) * 0.5
        last = _next(graph, mul.outputs[0], "Mul")
        if last is None or not _scalar(graph, other_input(last, mul.outputs[0]) or "", 0.5, rank):
            return None
        return x, [scale, erf, add, mul, last], last.outputs[0]
    if partner is not None and _scalar(graph, partner, 0.5, rank):  # X * (A * 0.5)
        last = _next(graph, mul.outputs[0], "Mul")
        if last is None or other_input(last, mul.outputs[0]) != x:
            return None
        return x, [scale, erf, add, mul, last], last.outputs[0]
    half = graph.producer(partner) if partner else None  # (X * 0.5) * A
    if (not is_op(half, "Mul") or graph.sole_consumer(partner) is not mul  # type: ignore[arg-type]
            or not _scalar(graph, other_input(half, x) or "", 0.5, rank)):  # type: ignore[arg-type]
        return None
    return x, [half, scale, erf, add, mul], mul.outputs[0]  # type: ignore[list-item]


def gelu_fusion(graph: Graph) -> bool:
    """Fuse the Erf spelling of GELU on float32 tensors into ai.minfer::Gelu."""
    if not has_kernel(graph, MINFER_DOMAIN, OP):
        return False
    changed = False
    for node in list(graph.nodes):
        if node not in graph.nodes or not is_op(node, "Erf"):
            continue
        found = _match(graph, node)
        if found is None:
            continue
        x, nodes, y = found
        graph.opsets.setdefault(MINFER_DOMAIN, 1)
        graph.replace(nodes, Node(OP, [x], [y], {}, node.name, MINFER_DOMAIN))
        changed = True
    return changed


# ---- the kernel ----------------------------------------------------------------------------------

# e = erfc(t / sqrt 2) = exp(t * P(t)), P's coefficients from the constant term up (see the module docstring)
_P = np.array([-0.7979143261909485, -0.3180961012840271, -0.03690189868211746, 0.0055295554921031,
               -0.0005128415068611503, 2.0741816115332767e-05], dtype=np.float32)  # fmt: skip
_T_MAX = 4 * math.sqrt(2)  # erfc(4) = 1.5e-8: beyond, 1 - e/2 rounds to 1 in float32
_BLOCK = 1 << 15  # elements per block: its four scratch arrays stay in L2
# elements per range handed to an intra-op thread, from two ranges up. Each range makes ~14 numpy calls per
# block, and every call of the second thread waits for the GIL (25-75 us when contended here), so a range must
# be long: ranges of one block made the split slower than one thread. Transformer block at batch 8, Gelu over
# (8, 128, 1024), 2 threads: 2505 -> 1659 us, the whole run 15.07 -> 13.94 ms (in-process A/B).
SPLIT = 1 << 18


@functools.lru_cache(maxsize=4)
def _filled(value: float, size: int) -> np.ndarray:
    """A read-only float32 array of ``value``: numpy 2.4's minimum/maximum against a 0-d operand is ~4x slower."""
    a = np.full(size, value, np.float32)
    a.flags.writeable = False
    return a


def _gelu_block(x: np.ndarray, out: np.ndarray, t: np.ndarray, p: np.ndarray) -> None:
    """GELU of a 1-D float32 block into ``out`` (which may be ``x``); ``t``, ``p``: scratch of its size."""
    n = x.size
    np.bitwise_and(x.view(np.int32), np.int32(0x7FFFFFFF), out=t.view(np.int32))  # t = |x| (nan stays nan)
    np.minimum(t, _filled(_T_MAX, _BLOCK)[:n], out=t)
    np.multiply(t, _P[-1], out=p)
    for c in _P[-2::-1]:  # p = t * P(t)
        p += c
        p *= t
    np.exp(p, out=p)  # e
    p *= t
    p *= np.float32(0.5)  # t * e / 2
    np.maximum(x, _filled(0.0, _BLOCK)[:n], out=out)  # x is read here for the last time
    out -= p


def gelu_range(x: np.ndarray, out: np.ndarray) -> None:
    """GELU of a 1-D float32 range into ``out`` (which may be ``x``), block by block."""
    block = min(x.size, _BLOCK)
    t, p = np.empty(block, np.float32), np.empty(block, np.float32)
    with np.errstate(all="ignore"):  # inf inputs: exp underflows to 0, as it should (the state is per thread)
        for i in range(0, x.size, _BLOCK):
            j = min(x.size, i + _BLOCK)
            _gelu_block(x[i:j], out[i:j], t[: j - i], p[: j - i])


def gelu32(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """GELU of a float32 array (into ``out``, which may be ``x``), within 3.2e-7 of the exact value.

    Ranges of `SPLIT` elements go to the intra-op threads; every element is computed alike either way.
    """
    flat = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    y = np.empty(np.shape(x), np.float32) if out is None else out
    res = y.reshape(-1)  # planned buffers are C-contiguous: a view
    n = flat.size
    if n < 2 * SPLIT:
        gelu_range(flat, res)
        return y

    def part(lo: int, hi: int) -> None:
        gelu_range(flat[lo * SPLIT : min(n, hi * SPLIT)], res[lo * SPLIT : min(n, hi * SPLIT)])

    parallel_for(-(-n // SPLIT), part)
    return y


_erfc = np.vectorize(math.erfc, otypes=[np.float64])


@kernel(OP, domain=MINFER_DOMAIN, out=True, inplace=(0,), views=False)
def gelu(x: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    """ai.minfer::Gelu-1: x * Phi(x); float32 (and float16, through float32) by `gelu32`, float64 exactly."""
    if x.dtype == np.float32:
        return gelu32(x, out)
    if x.dtype == np.float16:
        y = gelu32(x.astype(np.float32)).astype(np.float16)
    elif x.dtype == np.float64:
        y = 0.5 * x * _erfc(-x / math.sqrt(2))
    else:
        raise TypeError(f"ai.minfer::Gelu takes float16, float32 or float64 tensors, not {x.dtype}")
    if out is None:
        return y
    np.copyto(out, y)
    return out


KERNELS = [gelu]
OPS = [op(OP, domain=MINFER_DOMAIN, infer=same_as_input(0), doc="GELU, x * Phi(x) (the Erf form, not the tanh one)")]


# ---- --portable ----------------------------------------------------------------------------------


def expand_gelu(graph: Graph, node: Node) -> None:
    """Gelu -> Div(X, sqrt 2), Erf, Add 1, Mul X, Mul 0.5: the form the pass fused."""
    x, y = node.inputs[0], node.outputs[0]
    dtype = dtype_of(graph, x) or np.dtype(np.float32)
    t = graph.type_of(y) or graph.type_of(x)
    name = node.name or OP
    consts = [add_const(graph, f"{name}_{label}", np.asarray(v, dtype)) for label, v in
              (("sqrt2", math.sqrt(2)), ("one", 1.0), ("half", 0.5))]
    mids = [fresh(graph, f"{name}_{label}") for label in ("scaled", "erf", "plus1", "times_x")]
    if t is not None:
        for m in mids:
            graph.types[m] = t
    new = [Node("Div", [x, consts[0]], [mids[0]], {}, fresh(graph, f"{name}_div")),
           Node("Erf", [mids[0]], [mids[1]], {}, fresh(graph, f"{name}_erf")),
           Node("Add", [mids[1], consts[1]], [mids[2]], {}, fresh(graph, f"{name}_add")),
           Node("Mul", [x, mids[2]], [mids[3]], {}, fresh(graph, f"{name}_mul")),
           Node("Mul", [mids[3], consts[2]], [y], {}, name)]
    graph.replace([node], new)


# ---- property-suite patterns ---------------------------------------------------------------------


def patterns() -> Any:
    """The pass's target strategy: each exporter spelling of GELU, in random context.

    Sometimes an intermediate is also a graph output or read twice (nothing
    fuses), a constant is off (1.5 instead of sqrt 2), or the tensor is
    float64 (kept as Erf).
    """
    from hypothesis import strategies as st

    from minfer_core.testing import GraphBuilder
    from minfer_core.testing.strategies import expose, has_kernels

    @st.composite
    def graphs(draw: Any) -> Any:
        b = GraphBuilder(opset=draw(st.sampled_from([13, 17])))
        dtype = draw(st.sampled_from([np.float32, np.float32, np.float32, np.float64]))
        shape = tuple(draw(st.integers(1, 4)) for _ in range(draw(st.integers(1, 4))))
        x = b.input(shape, dtype)
        if draw(st.booleans()):
            x = b.op("Mul", x, b.const(np.asarray(4.0, dtype)))  # values well into both tails
        c = lambda v: b.const(np.asarray(v, dtype))  # noqa: E731
        swap = draw(st.booleans())
        if draw(st.booleans()):
            s = b.op("Div", x, c(draw(st.sampled_from([math.sqrt(2), math.sqrt(2), 1.5]))))
        else:
            s = b.op("Mul", *((c(math.sqrt(0.5)), x) if swap else (x, c(math.sqrt(0.5)))))
        expose(draw, b, s)
        e = b.op("Erf", s)
        expose(draw, b, e)
        a = b.op("Add", *((c(1.0), e) if swap else (e, c(1.0))))
        expose(draw, b, a)
        form = draw(st.sampled_from(["x*a*h", "h*a", "x*(a*h)"]))
        if form == "x*a*h":
            m = b.op("Mul", *((a, x) if swap else (x, a)))
            expose(draw, b, m)
            y = b.op("Mul", m, c(0.5))
        elif form == "h*a":
            h = b.op("Mul", x, c(0.5))
            expose(draw, b, h)
            y = b.op("Mul", *((a, h) if swap else (h, a)))
        else:
            m = b.op("Mul", a, c(0.5))
            expose(draw, b, m)
            y = b.op("Mul", x, m)
        b.output(b.op("Neg", y) if has_kernels("Neg") else y)
        return b.build()

    return graphs()
