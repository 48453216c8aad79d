"""Target strategies of the passes (``Pass.patterns``): each pass's pattern in random context.

Every strategy embeds the pattern with random shapes, attributes and
constants, and with `expose` around the intermediate values a fusion goes
through (an extra consumer, or a graph output in the middle), so the suite
sees each pass both where it must fire and where it must not. Imported only
by the property suite: hypothesis is a test dependency.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import strategies as st

from minfer_core.testing import GraphBuilder
from minfer_core.testing.strategies import expose, floats_array, has_kernels, loosen, shapes

ACTS = ("Relu", "LeakyRelu", "Clip", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh")


def _nchw() -> st.SearchStrategy[tuple[int, int, int, int]]:
    return st.tuples(st.integers(1, 2), st.integers(1, 4), st.integers(1, 6), st.integers(1, 6))


def _finish(b: GraphBuilder, y: str) -> Any:
    b.output(b.op("Neg", y) if has_kernels("Neg") else y)
    return b.build()


@st.composite
def _conv(draw: Any, b: GraphBuilder, x: str, shape: tuple[int, ...], bias: bool | None = None) -> str:
    """A Conv with random group, kernel, strides, pads and dilations valid for ``shape``."""
    n, c, h, w = shape
    group = draw(st.sampled_from([g for g in (1, 2, c) if c % g == 0]))
    m = group * draw(st.integers(1, 2))
    kh, kw = draw(st.integers(1, min(3, h))), draw(st.integers(1, min(3, w)))
    attrs: dict[str, Any] = {"kernel_shape": [kh, kw], "group": group}
    if draw(st.booleans()):
        attrs["pads"] = [draw(st.integers(0, 1)) for _ in range(4)]
    if draw(st.booleans()):
        attrs["strides"] = [draw(st.integers(1, 2)), draw(st.integers(1, 2))]
    weights = b.const(draw(floats_array((m, c // group, kh, kw))))
    inputs = [x, weights]
    if bias if bias is not None else draw(st.booleans()):
        inputs.append(b.const(draw(floats_array((m,)))))
    return b.op("Conv", *inputs, **attrs)


@st.composite
def _conv_transpose(draw: Any, b: GraphBuilder, x: str, shape: tuple[int, ...]) -> str:
    """A ConvTranspose with random group, kernel, strides and pads (weights (C, M/group, kh, kw))."""
    c = shape[1]
    group = draw(st.sampled_from([g for g in (1, 2, c) if c % g == 0]))
    m_per = draw(st.integers(1, 2))
    kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    attrs: dict[str, Any] = {"kernel_shape": [kh, kw], "group": group, "strides": [draw(st.integers(1, 2))] * 2}
    inputs = [x, b.const(draw(floats_array((c, m_per, kh, kw))))]
    if draw(st.booleans()):
        inputs.append(b.const(draw(floats_array((group * m_per,)))))
    return b.op("ConvTranspose", *inputs, **attrs)


def _out_channels(b: GraphBuilder, conv_out: str) -> int:
    node = b.graph.producer(conv_out)
    w = b.graph.initializers[node.inputs[1]]
    return int(w.shape[0] if node.op_type == "Conv" else w.shape[1] * node.attrs.get("group", 1))


@st.composite
def constant_folding(draw: Any) -> Any:
    b = GraphBuilder()
    shape = draw(shapes(1, 3))
    c = b.const(draw(floats_array(shape)))
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["Add", "Mul", "Neg", "Relu", "Constant"]))
        if op == "Constant":
            c = b.op("Add", c, b.op("Constant", value=draw(floats_array(shape))))
        elif op in ("Add", "Mul"):
            c = b.op(op, c, b.const(draw(floats_array(shape))))
        else:
            c = b.op(op, c)
    expose(draw, b, c)
    return _finish(b, b.op("Add", b.input(shape), c))


@st.composite
def shape_folding(draw: Any) -> Any:
    b = GraphBuilder()
    shape = draw(shapes(2, 4))
    x = b.input(shape)
    dims = b.op("Shape", x)
    first = b.op("Gather", dims, b.const(np.array([0], dtype=np.int64)), axis=0)
    target = b.op("Concat", first, b.const(np.array([-1], dtype=np.int64)), axis=0)
    expose(draw, b, dims)
    return _finish(b, b.op("Reshape", x, target))


@st.composite
def dead_code_elimination(draw: Any) -> Any:
    b = GraphBuilder()
    x = b.input(draw(shapes()))
    y = b.op("Relu", x)
    dead = b.op("Neg", b.op("Add", x, b.const(np.float32(1))))
    if draw(st.booleans()):
        b.output(dead)  # a graph output is alive
    b.const(np.zeros(3, np.float32))  # orphaned initializer
    b.output(y)
    return b.build()


def _identity_case(draw: Any, b: GraphBuilder, x: str, shape: tuple[int, ...]) -> str:
    """One of the identity cases, sometimes in a form that is not an identity."""
    op = draw(st.sampled_from(["Identity", "Dropout", "Cast", "Reshape", "Flatten", "MaxPool", "AveragePool",
                               "Split", "Pad", "Transpose", "Expand"]))
    real = draw(st.booleans()) or op in ("Identity", "Dropout")
    rank = len(shape)
    if op == "Cast":
        return b.op("Cast", x, to=1 if real else 11)
    if op == "Reshape":
        target = shape if real else (-1,)
        return b.op("Reshape", x, b.const(np.array(target, dtype=np.int64)))
    if op == "Flatten":
        return b.op("Flatten", x, axis=rank - 1 if real and rank == 2 else 1)
    if op in ("MaxPool", "AveragePool"):
        x4 = b.op("Reshape", x, b.const(np.array([1, 1, -1, shape[-1]], dtype=np.int64)))
        y = b.op(op, x4, kernel_shape=[1, 1], strides=[1, 1], pads=[0, 0, 0, 0] if real else [0, 0, 0, 1])
        return b.op("Reshape", y, b.const(np.array([-1], dtype=np.int64)))
    if op == "Split":
        return b.op("Split", x, axis=0) if real else b.op("Split", x, axis=0, outputs=1)
    if op == "Pad":
        pads = [0] * (2 * rank) if real else [1] + [0] * (2 * rank - 1)
        return b.op("Pad", x, b.const(np.array(pads, dtype=np.int64)))
    if op == "Transpose":
        perm = list(range(rank)) if real else list(draw(st.permutations(range(rank))))
        return b.op("Transpose", x, perm=perm)
    if op == "Expand":
        target = shape if real else (2,) + tuple(shape)
        return b.op("Expand", x, b.const(np.array(target, dtype=np.int64)))
    return b.op(op, x)


@st.composite
def identity_elimination(draw: Any) -> Any:
    b = GraphBuilder()
    shape = draw(shapes(2, 4))
    x = b.op("Relu", b.input(shape))
    expose(draw, b, x)
    y = _identity_case(draw, b, x, shape)
    if draw(st.integers(0, 3)) == 0:
        b.output(y)  # the bypassed value is itself a graph output
        return b.build()
    return _finish(b, y)


@st.composite
def transpose_merge(draw: Any) -> Any:
    b = GraphBuilder()
    shape = draw(shapes(2, 4))
    x = b.input(shape)
    p1 = list(draw(st.permutations(range(len(shape)))))
    t = b.op("Transpose", x, perm=p1)
    expose(draw, b, t)
    p2 = [int(i) for i in np.argsort(p1)] if draw(st.booleans()) else list(draw(st.permutations(range(len(shape)))))
    return _finish(b, b.op("Transpose", t, perm=p2))


@st.composite
def reshape_merge(draw: Any) -> Any:
    b = GraphBuilder()
    shape = draw(shapes(2, 4))
    x = b.input(shape)
    first = b.op("Flatten", x, axis=1) if draw(st.booleans()) else b.op(
        "Reshape", x, b.const(np.array([-1], dtype=np.int64)))
    expose(draw, b, first)
    size = int(np.prod(shape))
    target = draw(st.sampled_from([[size], [1, -1], [-1, 1], list(reversed(shape)), [0, -1]]))
    return _finish(b, b.op("Reshape", first, b.const(np.array(target, dtype=np.int64))))


@st.composite
def global_pool_flatten(draw: Any) -> Any:
    b = GraphBuilder()
    shape = draw(_nchw())
    pool = b.op(draw(st.sampled_from(["GlobalAveragePool", "GlobalMaxPool"])), b.input(shape))
    expose(draw, b, pool)
    if draw(st.booleans()):
        flat = b.op("Flatten", pool, axis=draw(st.sampled_from([1, 1, 2])))
    else:
        flat = b.op("Reshape", pool, b.const(np.array(shape[:2], dtype=np.int64)))
    return _finish(b, flat)


@st.composite
def conv_bn_fusion(draw: Any) -> Any:
    b = GraphBuilder()
    shape = draw(_nchw())
    if has_kernels("ConvTranspose") and draw(st.booleans()):
        y = draw(_conv_transpose(b, b.input(shape), shape))
    else:
        y = draw(_conv(b, b.input(shape), shape))
    channels = _out_channels(b, y)
    expose(draw, b, y)
    params = [draw(floats_array((channels,), lo, hi)) for lo, hi in ((0.5, 1.5), (-1, 1), (-1, 1), (0.2, 2))]
    eps = draw(st.sampled_from([1e-5, 1e-3]))
    return _finish(b, b.op("BatchNormalization", y, *[b.const(p) for p in params], epsilon=eps))


@st.composite
def affine_fusion(draw: Any) -> Any:
    b = GraphBuilder()
    shape = draw(_nchw())
    x = b.input(shape)
    loosen(draw, b, x)  # only the channel count matters
    kind = draw(st.sampled_from(["Conv", "BatchNormalization"] + (["Gemm"] if has_kernels("Gemm") else [])))
    if kind == "Gemm":
        k, n = draw(st.integers(1, 4)), draw(st.integers(1, 4))
        a = b.input((shape[0], k))
        loosen(draw, b, a)
        y = b.op("Gemm", a, b.const(draw(floats_array((k, n)))))
        cshape = draw(st.sampled_from([(n,), (1, n), (shape[0], n), ()]))
    else:
        if kind == "Conv":
            y = draw(_conv(b, x, shape))
            c = _out_channels(b, y)
        else:
            c = shape[1]
            params = [draw(floats_array((c,), lo, hi)) for lo, hi in ((0.5, 1.5), (-1, 1), (-1, 1), (0.2, 2))]
            y = b.op("BatchNormalization", x, *[b.const(p) for p in params])
        cshape = draw(st.sampled_from([(c, 1, 1), (1, c, 1, 1), (), (1,), (c,) if c == 1 else (1, 1, 1, 1)]))
    expose(draw, b, y)
    bias = b.const(draw(floats_array(cshape, 0.5, 1.5)))
    op = draw(st.sampled_from(["Mul", "Add"]))
    return _finish(b, b.op(op, *((y, bias) if draw(st.booleans()) else (bias, y))))


@st.composite
def matmul_add_to_gemm(draw: Any) -> Any:
    b = GraphBuilder()
    m, k, n = (draw(st.integers(1, 4)) for _ in range(3))
    a = b.input((m, k))
    loosen(draw, b, a)  # M symbolic or unknown: a C of [M, N] or [M, 1] must then stay an Add
    y = b.op("MatMul", a, b.const(draw(floats_array((k, n)))))
    expose(draw, b, y)
    cshape = draw(st.sampled_from([(n,), (1, n), (m, n), (m, 1)]))
    c = b.input(cshape) if draw(st.integers(0, 3)) == 0 else b.const(draw(floats_array(cshape)))
    return _finish(b, b.op("Add", y, c))


@st.composite
def activation_fusion(draw: Any) -> Any:
    """A Conv, Gemm or MatMul then an activation, or Swish as Sigmoid and Mul (`_swish`)."""
    swish = has_kernels("Sigmoid", "Mul") and draw(st.booleans())
    b = GraphBuilder(opset=17)
    bases = ["Conv"] + [op for op in ("Gemm", "MatMul") if has_kernels(op)]
    base = draw(st.sampled_from(bases))
    if base == "Conv":
        shape = draw(_nchw())
        y = draw(_conv(b, b.input(shape), shape))
    else:
        m, k, n = (draw(st.integers(1, 4)) for _ in range(3))
        y = b.op(base, b.input((m, k)), b.const(draw(floats_array((k, n)))))
    expose(draw, b, y)
    return _finish(b, draw(_swish(b, y)) if swish else _activation(draw, b, y, draw(st.sampled_from(ACTS))))


@st.composite
def _swish(draw: Any, b: GraphBuilder, y: str) -> str:
    """y * Sigmoid(y) or y * Sigmoid(alpha * y), the Mul's operands in either order, alpha a 0-d or (1,) constant
    on either side (fires), or of another shape, or with the gate read elsewhere (must not fire)."""
    x = y
    if draw(st.booleans()):
        shape = draw(st.sampled_from([(), (1,), (1,) * 5]))  # rank 5: the scaling broadcasts y up, not fusable
        c = b.const(np.full(shape, draw(st.sampled_from([1.702, 0.5, -1.0])), np.float32))
        x = b.op("Mul", *((y, c) if draw(st.booleans()) else (c, y)))
    gate = b.op("Sigmoid", x)
    if draw(st.integers(0, 3)) == 0:
        b.output(gate)
    return b.op("Mul", *((y, gate) if draw(st.booleans()) else (gate, y)))


def _activation(draw: Any, b: GraphBuilder, y: str, act: str) -> str:
    """``act(y)`` with random parameters (Clip's bounds as constant inputs, some omitted)."""
    attrs: dict[str, Any] = {}
    extra: list[str] = []
    if act == "LeakyRelu":
        attrs["alpha"] = draw(st.sampled_from([0.01, 0.2]))
    elif act == "HardSigmoid":
        attrs = {"alpha": draw(st.sampled_from([0.2, 0.5])), "beta": draw(st.sampled_from([0.5, 0.3]))}
    elif act == "Clip":
        lo, hi = draw(st.sampled_from([-0.5, 0.0])), draw(st.sampled_from([0.5, 6.0]))
        extra = [b.const(np.float32(lo)), b.const(np.float32(hi))]
        extra = extra[: draw(st.integers(0, 2))]
    return b.op(act, y, *extra, **attrs)


def _conv_out_shape(b: GraphBuilder, y: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The output shape of the Conv producing ``y`` from an input of ``shape`` (no dilations)."""
    node = b.graph.producer(y)
    assert node is not None
    kernel, pads = node.attrs["kernel_shape"], node.attrs.get("pads", [0, 0, 0, 0])
    strides = node.attrs.get("strides", [1, 1])
    spatial = [(shape[2 + i] + pads[i] + pads[2 + i] - kernel[i]) // strides[i] + 1 for i in range(2)]
    return (shape[0], _out_channels(b, y), *spatial)


@st.composite
def conv_residual_fusion(draw: Any) -> Any:
    """Conv + Add/Sum(Z) [+ activation]: Z of the output's shape (fires) or broadcasting (must not fire).

    Z is a graph input, a value computed after the Conv (the fused node must
    move after it), the output of a second identical Conv (a ResNet
    downsample block: both operands are Convs), or the Conv's own input;
    the Conv output and the sum are randomly read elsewhere or graph outputs.
    """
    b = GraphBuilder(opset=draw(st.sampled_from([13, 17])))
    shape = draw(_nchw())
    x = b.input(shape)
    how = loosen(draw, b, x)  # a symbolic batch fuses only with Z of the same symbol; an unknown one never
    y = draw(_conv(b, x, shape))
    out = _conv_out_shape(b, y, shape)
    kind = draw(st.sampled_from(["input", "later", "conv", "x", "broadcast", "broadcast"]))
    if kind == "x" and out != shape:
        kind = "later"
    if kind == "input":
        z = b.input(out)
        if how != "static":
            loosen(draw, b, z)
    elif kind == "later":
        z = b.op("Tanh", b.input(out))
    elif kind == "conv":
        node = b.graph.producer(y)
        assert node is not None
        z = b.op("Conv", x, *[b.const(draw(floats_array(b.graph.initializers[i].shape))) for i in node.inputs[1:]],
                 **node.attrs)
    elif kind == "x":
        z = x
    else:
        n, c, h, w = out
        options = [(1, c, 1, 1), (c, 1, 1), (w,), (1, 1, h, w), (n, c, 1, w), (2 * n, c, h, w), (1, 1, 1, 1)]
        z = b.input(draw(st.sampled_from([o for o in options if o != out])))
    expose(draw, b, y)
    args = (y, z) if draw(st.booleans()) else (z, y)
    total = b.op(draw(st.sampled_from(["Add", "Add", "Sum"])), *args)
    act = draw(st.sampled_from(["Relu", "Relu", "none", *ACTS]))
    if act == "none":
        return _finish(b, total)
    expose(draw, b, total)
    return _finish(b, _activation(draw, b, total, act))


@st.composite
def scalar_binary(draw: Any) -> Any:
    b = GraphBuilder()
    shape = draw(shapes(1, 3))
    x = b.op("Relu", b.input(shape))
    cshape = draw(st.sampled_from([(), (1,), (1, 1), (1, 1, 1, 1), shape[-1:]]))
    c = b.const(draw(floats_array(cshape, 0.5, 2.0)))
    op = draw(st.sampled_from(["Add", "Sub", "Mul", "Div"]))
    return _finish(b, b.op(op, *((x, c) if draw(st.booleans()) else (c, x))))


@st.composite
def weighted_sum_fusion(draw: Any) -> Any:
    b = GraphBuilder()
    shape = draw(shapes(1, 3))
    other = shape if draw(st.booleans()) else (1,) * len(shape)
    terms = []
    for s in (shape, other):
        v = b.input(s)
        c = b.const(draw(floats_array(draw(st.sampled_from([(), (1,)])), -2, 2)))
        terms.append(b.op("Mul", *((v, c) if draw(st.booleans()) else (c, v))))
    expose(draw, b, terms[0])
    return _finish(b, b.op("Add", *terms))


@st.composite
def shape_inference(draw: Any) -> Any:
    b = GraphBuilder()
    x = b.input(draw(shapes()))
    y = b.op("Relu", b.op("Add", x, b.const(draw(floats_array((1,))))))
    return _finish(b, y)


@st.composite
def expand_fused(draw: Any) -> Any:
    from minfer_passes import activation, algebra, residual

    kind = draw(st.sampled_from(["activation", "residual", "scalar", "wsum"]))
    g = draw({"activation": activation_fusion(), "residual": conv_residual_fusion(), "scalar": scalar_binary(),
              "wsum": weighted_sum_fusion()}[kind])
    from minfer_passes.shapes import shape_inference as infer

    infer(g)
    residual.conv_residual_fusion(g)
    activation.activation_fusion(g)
    algebra.weighted_sum_fusion(g)
    algebra.scalar_binary(g)
    return g


@st.composite
def global_conv_to_gemm(draw: Any) -> Any:
    b = GraphBuilder()
    n, c, h, w = draw(_nchw())
    x = b.input((n, c, h, w))
    loosen(draw, b, x)  # the batch may be symbolic or unknown: the Conv is still a matrix product
    pooled = b.op(draw(st.sampled_from(["GlobalAveragePool", "GlobalMaxPool"])), x) if draw(st.integers(0, 3)) else x
    m = draw(st.integers(1, 4))
    k = 1 if draw(st.integers(0, 3)) else 2
    inputs = [pooled, b.const(draw(floats_array((m, c, k, k))))]
    if draw(st.booleans()):
        inputs.append(b.const(draw(floats_array((m,)))))
    y = b.op("Conv", *inputs, kernel_shape=[k, k], **({"pads": [1, 1, 0, 0]} if k == 2 else {}))
    expose(draw, b, y)
    tail = draw(st.sampled_from(["flatten", "reshape", "none"]))
    if tail == "flatten":
        y = b.op("Flatten", y, axis=1)
    elif tail == "reshape":
        y = b.op("Reshape", y, b.const(np.array([n, -1], dtype=np.int64)))
    return _finish(b, y)
