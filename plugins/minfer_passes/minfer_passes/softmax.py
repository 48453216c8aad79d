"""``masked_softmax_fusion``: attention's scale, padding mask and Softmax as one ``ai.minfer::MaskedSoftmax``.

Pattern (float32 or float64 scores S, Softmax over the last axis, every
intermediate read only inside the pattern and no graph output):

    T = S * c  |  c * S  |  S / c                  optional: c a one-element constant (the 1/sqrt(d) scale)
    T = Where(Expand(M, Shape(T)) | M, fill, T)   optional: fill a one-element constant (the padding mask);
                                                  Shape(T) may be folded to T's static shape
    Y = Softmax(T, axis=-1)

at least one of the two optional steps present: what PyTorch's exporter
writes for scaled dot-product attention with a key padding mask.
Replacement: ``ai.minfer::MaskedSoftmax(S, [M])`` with attributes ``op``
("Mul", "Div" or "" for none), ``scalar`` and ``fill`` (0-d tensors of S's
dtype; fill absent without M). ``Where(Expand(M, Shape(T)), f, T)`` is
``Where(M, f, T)``: Where broadcasts as Expand does, to the same shape.

Exact: the kernel multiplies (or divides) as the scalar node did, writes
``fill`` where M holds with integer bit masks (the same bits as Where, inf
and nan included, in two passes over the scores against a mask of
(batch, 1, 1, keys): numpy's Where broadcasting such a mask is ~3x slower
than a pass), then runs the registered Softmax kernel: in place when it
declares so, else from a scratch copy (several Softmax kernels are timed
against each other on the same arguments).
``--portable`` lowers it back to the scalar op, Where and Softmax.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import helper

from minfer_core import Graph, KernelContext, Node, get_registry, kernel, op, prepare_node, scratch

from ._util import MINFER_DOMAIN, add_const, const, dtype_of, fresh, has_kernel, is_op, shape_of
from .ops import _from_proto, _type_proto

OP = "MaskedSoftmax"
DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
BINARY = {"Mul": np.multiply, "Div": np.divide}

# ---- the pass ------------------------------------------------------------------------------------


def _readers_within(graph: Graph, value: str, nodes: list[Node]) -> bool:
    """Every reader of ``value`` is one of ``nodes``, and value is no graph output."""
    return value not in graph.outputs and all(any(r is n for n in nodes) for r in graph.consumers(value))


def _mask(graph: Graph, where: Node, scores: str) -> tuple[str, list[Node]]:
    """(the condition to read, the Expand and Shape nodes it makes redundant) for ``where``'s condition."""
    cond = where.inputs[0]
    expand = graph.producer(cond)
    if expand is None or not is_op(expand, "Expand") or not _readers_within(graph, cond, [where]):
        return cond, []
    target = const(graph, expand.inputs[1])
    if target is not None:  # shape_folding made Shape(T) a constant: it must be T's static shape
        static = shape_of(graph, scores)
        return (expand.inputs[0], [expand]) if static is not None and target.tolist() == list(static) else (cond, [])
    shape = graph.producer(expand.inputs[1])
    if shape is None or not is_op(shape, "Shape") or shape.inputs[0] != scores or set(shape.attrs) & {"start", "end"}:
        return cond, []
    if not _readers_within(graph, shape.outputs[0], [expand]):  # the Shape stays for its other readers
        return expand.inputs[0], [expand]
    return expand.inputs[0], [expand, shape]


def _scale(graph: Graph, t: str, readers: list[Node]) -> tuple[Node, str, np.ndarray] | None:
    """(the node, S, c) when ``t`` is S * c, c * S or S / c and only ``readers`` read it."""
    node = graph.producer(t)
    if node is None or not is_op(node, "Mul", "Div") or not _readers_within(graph, t, readers):
        return None
    for i in ((0, 1) if node.op_type == "Mul" else (0,)):
        s, c = node.inputs[i], node.inputs[1 - i]
        value, rank = const(graph, c), len(getattr(graph.type_of(s), "shape", None) or ())
        if value is not None and value.size == 1 and value.ndim <= rank and value.dtype == dtype_of(graph, s):
            return node, s, value.reshape(())
    return None


def _last_axis(graph: Graph, softmax: Node) -> bool:
    t = graph.type_of(softmax.inputs[0])
    if t is None or t.shape is None or t.dtype not in DTYPES:
        return False
    default = -1 if graph.opsets.get("", 1) >= 13 else 1
    return softmax.attrs.get("axis", default) % len(t.shape) == len(t.shape) - 1


def _match(graph: Graph, softmax: Node) -> tuple[list[Node], list[str], dict[str, Any]] | None:
    """(the nodes replaced, the fused node's inputs, its attributes) when ``softmax`` ends the pattern."""
    t = softmax.inputs[0]
    nodes, inputs, attrs = [softmax], [t], {"op": ""}
    where = graph.producer(t)
    if is_op(where, "Where") and _readers_within(graph, t, [softmax]):
        fill = const(graph, where.inputs[1])  # type: ignore[union-attr]
        scores = where.inputs[2]  # type: ignore[union-attr]
        if fill is not None and fill.size == 1 and dtype_of(graph, scores) == dtype_of(graph, t):
            cond, extra = _mask(graph, where, scores)  # type: ignore[arg-type]
            nodes += [where, *extra]  # type: ignore[list-item]
            inputs = [scores, cond]
            attrs["fill"] = np.asarray(fill.reshape(()), dtype_of(graph, t))
            t = scores
    scaled = _scale(graph, t, nodes)
    if scaled is not None:
        nodes.append(scaled[0])
        inputs[0] = scaled[1]
        attrs.update(op=scaled[0].op_type, scalar=scaled[2])
    return (nodes, inputs, attrs) if len(nodes) > 1 else None


def masked_softmax_fusion(graph: Graph) -> bool:
    """Fuse a scalar Mul/Div, a Where by a padding mask (its Expand to the scores' shape dropped) and a last-axis
    Softmax into ai.minfer::MaskedSoftmax."""
    if not has_kernel(graph, MINFER_DOMAIN, OP) or not has_kernel(graph, "", "Softmax"):
        return False
    changed = False
    for node in list(graph.nodes):
        if node not in graph.nodes or not is_op(node, "Softmax") or not _last_axis(graph, node):
            continue
        found = _match(graph, node)
        if found is None:
            continue
        nodes, inputs, attrs = found
        graph.opsets.setdefault(MINFER_DOMAIN, 1)
        graph.replace(nodes, Node(OP, inputs, list(node.outputs), attrs, node.name, MINFER_DOMAIN))
        changed = True
    return changed


# ---- the kernel ----------------------------------------------------------------------------------

_BITS = {np.dtype(np.float32): np.int32, np.dtype(np.float64): np.int64}


def _fill(y: np.ndarray, cond: np.ndarray, fill: np.ndarray) -> None:
    """y[cond] = fill, cond broadcast to y: by bit masks (and then or) when cond is smaller, else by copyto."""
    if cond.size == y.size or y.dtype not in _BITS:
        np.copyto(y, fill.astype(y.dtype), where=cond)
        return
    bits = _BITS[y.dtype]
    keep = np.where(cond, bits(0), bits(-1))
    put = np.where(cond, np.asarray(fill, y.dtype).view(bits), bits(0))
    yi = y.view(bits)
    np.bitwise_and(yi, keep, out=yi)
    np.bitwise_or(yi, put, out=yi)


def _softmax(ctx: Any) -> Any:
    """The registered Softmax kernel, over the last axis, for this node's input type."""
    t = ctx.output_types[0] if ctx.output_types else None
    inner_ctx = KernelContext(ctx.node_name, "Softmax", 13, (t,), (t,), (None,), 1)
    found = prepare_node(get_registry(), inner_ctx, {"axis": -1})
    if found is None:
        raise LookupError(f"{OP} needs a kernel for Softmax-13; none is installed")
    return found


@kernel(OP, domain=MINFER_DOMAIN, prepare=True, out=True, views=False)
def masked_softmax(ctx, *, op="", scalar=None, fill=None):
    """ai.minfer::MaskedSoftmax-1: Softmax(Where(M, fill, X op scalar)) over the last axis."""
    inner, softmax = _softmax(ctx)
    binary = BINARY.get(op)
    # a Softmax that did not declare itself in place (a timed choice between kernels runs each candidate on the
    # same arguments: in place, the second would see the first's result) reads the masked scores from scratch
    in_place = not inner.out or 0 in inner.inplace
    value = None if scalar is None else np.asarray(scalar)
    shapes: dict[tuple[tuple[int, ...], tuple[int, ...] | None], tuple[int, ...]] = {}

    def run(x, cond=None, *, out=None):
        key = (x.shape, None if cond is None else cond.shape)
        shape = shapes.get(key)
        if shape is None:
            shape = shapes[key] = x.shape if cond is None else np.broadcast_shapes(x.shape, cond.shape)
        y = out if out is not None and out.shape == shape else np.empty(shape, x.dtype)
        t = y if in_place else scratch("minfer_passes-masked_softmax", shape, x.dtype)
        if binary is not None:
            binary(x, value if value.dtype == x.dtype else value.astype(x.dtype), out=t)
        else:
            np.copyto(t, x)
        if cond is not None:
            _fill(t, cond, np.asarray(fill, x.dtype))
        result = softmax(t, out=y) if inner.out else softmax(t)
        if out is not None and result is not out:
            np.copyto(out, result)
            return out
        return result

    return run


def _infer(x: Any, cond: Any = None, **attrs: Any) -> list[Any]:
    """The scores' type, broadcast against the mask as Where would."""
    if cond is None or x is None:
        return [x]
    node = helper.make_node("Where", ["c", "x", "x"], ["y"])
    known = {"c": _type_proto(cond), "x": _type_proto(x)}
    out = onnx.shape_inference.infer_node_outputs(onnx.defs.get_schema("Where", 16), node, known,
                                                  opset_imports=[helper.make_opsetid("", 16)])
    return [_from_proto(out["y"]) if "y" in out else None]


KERNELS = [masked_softmax]
OPS = [op(OP, domain=MINFER_DOMAIN, infer=_infer,
          doc="Softmax over the last axis of Where(M, fill, X op scalar): attention's scale, padding mask and Softmax")]


# ---- --portable ----------------------------------------------------------------------------------


def expand_masked_softmax(graph: Graph, node: Node) -> None:
    """MaskedSoftmax -> [Mul/Div by the scalar], [Where by the mask], Softmax(axis=-1)."""
    name = node.name or OP
    src, new = node.inputs[0], []
    t = graph.type_of(src)
    if node.attrs.get("op"):
        c = add_const(graph, f"{name}_scalar", np.asarray(node.attrs["scalar"]))
        dst = fresh(graph, f"{name}_scaled")
        new.append(Node(node.attrs["op"], [src, c], [dst], {}, fresh(graph, f"{name}_scale"), ""))
        src = dst
        if t is not None:
            graph.types[dst] = t
    if len(node.inputs) > 1 and node.inputs[1]:
        f = add_const(graph, f"{name}_fill", np.asarray(node.attrs["fill"]))
        dst = fresh(graph, f"{name}_masked")
        new.append(Node("Where", [node.inputs[1], f, src], [dst], {}, fresh(graph, f"{name}_where"), ""))
        src = dst
        if graph.type_of(node.outputs[0]) is not None:
            graph.types[dst] = graph.type_of(node.outputs[0])  # type: ignore[assignment]
    new.append(Node("Softmax", [src], list(node.outputs), {"axis": -1}, node.name or fresh(graph, name), ""))
    graph.replace([node], new)


# ---- property-suite patterns ---------------------------------------------------------------------


def patterns() -> Any:
    """The pass's target strategy: scale, padding mask (through Expand(Shape) or not) and Softmax.

    Masks of (batch, 1, 1, keys) or the scores' own shape, fills of -inf or -1e9, scales by Mul on either
    side or Div, Softmax over the last axis (or another, which stays); sometimes an intermediate exposed.
    """
    from hypothesis import strategies as st

    from minfer_core.testing import GraphBuilder
    from minfer_core.testing.strategies import expose, floats_array

    @st.composite
    def graphs(draw: Any) -> Any:
        b = GraphBuilder(opset=17)
        dtype = draw(st.sampled_from([np.float32, np.float32, np.float64]))
        n, h, q, k = (draw(st.integers(1, 3)) for _ in range(4))
        s = b.input((n, h, q, k), dtype)
        t = s
        scale = draw(st.sampled_from(["none", "mul", "rmul", "div"]))
        if scale != "none":
            c = b.const(np.asarray(draw(st.sampled_from([0.125, 0.3, 8.0])), dtype))
            t = b.op("Div" if scale == "div" else "Mul", *((c, s) if scale == "rmul" else (s, c)))
            expose(draw, b, t)
        if draw(st.booleans()):
            full = draw(st.booleans())
            m = b.input((n, h, q, k) if full else (n, 1, 1, k), np.bool_)
            if not full and draw(st.booleans()):
                m = b.op("Expand", m, b.op("Shape", t))
            fill = draw(st.sampled_from([-np.inf, -1e9, 0.5]))
            t = b.op("Where", m, b.const(np.asarray(fill, dtype)), t)
            expose(draw, b, t)
        axis = draw(st.sampled_from([-1, -1, 3, 2]))
        y = b.op("Softmax", t, axis=axis)
        b.output(y)
        return b.build()

    return graphs()
