"""The target strategy of `integer.integer_conv_fusion` for the pass property suite (hypothesis: a test dependency,
imported when the strategy is made)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ._util import MINFER_DOMAIN


def patterns() -> Any:
    """The pass's target strategy: Q -> QLinearConv -> DQ (int8 or uint8 activations, random zero points, a bias,
    per-tensor or per-channel weights, stride 1 or 2), its 8-bit output sometimes read as it is by a second
    QLinearConv (an 8-bit edge), then another such conv, or a QuantizeDequantize and sometimes a residual Add/Sum
    rounded again (a QDQ model's block tail); or ConvInteger -> Cast -> Mul by a scalar; each intermediate sometimes
    read elsewhere or a graph output."""
    from hypothesis import strategies as st

    from minfer_core.testing import GraphBuilder
    from minfer_core.testing.strategies import expose

    def rounding(draw: Any, b: GraphBuilder, value: str) -> str:
        """ai.minfer::QuantizeDequantize of ``value`` (qdq_fusion's form of a Q -> DQ pair) on a random 8-bit grid."""
        zp = draw(st.integers(0, 255))
        scale = draw(st.sampled_from([0.02, 0.05, 0.1]))
        return b.op("QuantizeDequantize", value, domain=MINFER_DOMAIN, scale=scale, low=float(-zp), high=float(255 - zp))

    def tail(draw: Any, b: GraphBuilder, value: str, shape: tuple[int, ...]) -> str:
        """A rounding of ``value``, then sometimes + a rounded Z of its shape (Add or Sum) and another rounding."""
        y = rounding(draw, b, value)
        if draw(st.booleans()):
            if draw(st.booleans()):  # each exposure stops the fusion: less often, so that it fires often enough
                expose(draw, b, y)
            z = rounding(draw, b, b.input(shape))
            y = b.op(draw(st.sampled_from(["Add", "Sum"])), *draw(st.permutations([y, z])))
            if draw(st.booleans()):
                expose(draw, b, y)
            y = rounding(draw, b, y)
        return y

    def exposed(draw: Any, b: GraphBuilder, value: str) -> None:
        """`strategies.expose` for an 8-bit value: nothing, another reader (a Cast: no Neg of uint8), or an output."""
        how = draw(st.sampled_from(["none", "none", "consumer", "output"]))
        if how != "none":
            b.output(b.op("Cast", value, to=1) if how == "consumer" else value)

    def affine(draw: Any, b: GraphBuilder, value: str, channels: int) -> str:
        """Sometimes a ChannelAffine reading ``value`` (S or none, B; an activation it fuses, or LeakyRelu: not)."""
        if draw(st.integers(0, 2)) == 0:
            return value
        rng = np.random.default_rng(draw(st.integers(0, 2**16)))
        s = b.const(rng.uniform(-1.5, 1.5, channels).astype(np.float32)) if draw(st.booleans()) else ""
        shift = b.const(rng.uniform(-1, 1, channels).astype(np.float32))
        act = draw(st.sampled_from(["", "Relu", "Clip", "LeakyRelu"]))
        params = {"Clip": [0.0, 6.0], "LeakyRelu": [0.1]}.get(act, [])
        attrs = {"activation": act, "activation_params": params} if act else {}
        return b.op("ChannelAffine", value, s, shift, domain=MINFER_DOMAIN, **attrs)

    def params(draw: Any, b: GraphBuilder, dtype: Any) -> tuple[str, str]:
        info = np.iinfo(dtype)
        zp = draw(st.integers(int(info.min) // 2, int(info.max) // 2))
        return b.const(np.float32(draw(st.sampled_from([0.02, 0.05, 0.1])))), b.const(np.asarray(zp, dtype))

    @st.composite
    def scaled(draw: Any) -> Any:
        """ConvInteger (uint8 input, int8 weights, zero points or not) -> Cast -> Mul by a float32 scalar [-> Add of
        a per-channel bias [-> Relu/Clip]]."""
        b = GraphBuilder(opset=13)
        c, m = draw(st.integers(1, 4)), draw(st.integers(1, 4))
        x = b.input((1, c, draw(st.integers(3, 6)), draw(st.integers(3, 6))), dtype=np.uint8)
        rng = np.random.default_rng(draw(st.integers(0, 2**16)))
        w = b.const(rng.integers(-127, 128, (m, c, 3, 3)).astype(np.int8))
        zps = [b.const(np.uint8(draw(st.integers(0, 255)))), b.const(np.int8(draw(st.integers(-3, 3))))]
        y = b.op("ConvInteger", x, w, *zps[: draw(st.integers(0, 2))], kernel_shape=[3, 3], pads=[1, 1, 1, 1])
        exposed(draw, b, y)
        f = b.op("Cast", y, to=1)
        exposed(draw, b, f)
        s = b.input(draw(st.sampled_from([(), (1,), (1, 1, 1, 1)]))) if draw(st.booleans()) else \
            b.const(np.float32(draw(st.sampled_from([0.001, 0.37]))))
        y = b.op("Mul", *draw(st.permutations([f, s])))
        if draw(st.booleans()):  # quantize_dynamic's bias: an Add of one value per channel, then an activation
            if draw(st.integers(0, 3)) == 0:  # an exposure stops the fusion: rarely, so that it fires often enough
                exposed(draw, b, y)
            shift = rng.uniform(-1, 1, m).astype(np.float32).reshape(draw(st.sampled_from([(m, 1, 1), (1, m, 1, 1)])))
            y = b.op("Add", *draw(st.permutations([y, b.const(shift)])))
            act = draw(st.sampled_from(["", "Relu", "Clip"]))
            if act:
                if draw(st.integers(0, 3)) == 0:
                    exposed(draw, b, y)
                bounds = [b.const(np.float32(0.0)), b.const(np.float32(6.0))] if act == "Clip" else []
                y = b.op(act, y, *bounds)
        z = affine(draw, b, y, m)
        if z != y:
            exposed(draw, b, y)
        b.output(z)
        return b.build()

    @st.composite
    def graphs(draw: Any) -> Any:
        b = GraphBuilder(opset=13)
        dtype = draw(st.sampled_from([np.uint8, np.int8]))
        c, m, depthwise = draw(st.integers(1, 4)), draw(st.integers(1, 4)), draw(st.booleans())
        m = c if depthwise else m
        h, w_ = draw(st.integers(3, 6)), draw(st.integers(3, 6))
        x = b.input((1, c, h, w_))
        xs, xz = params(draw, b, dtype)
        xq = b.op("QuantizeLinear", x, xs, xz)
        exposed(draw, b, xq)
        rng = np.random.default_rng(draw(st.integers(0, 2**16)))
        w = b.const(rng.integers(-127, 128, (m, 1 if depthwise else c, 3, 3)).astype(np.int8))
        per_channel = draw(st.booleans())
        ws = b.const((rng.random(m) * 0.02 + 0.001).astype(np.float32) if per_channel else np.float32(0.01))
        wz = b.const(np.zeros(m, np.int8) if per_channel else np.int8(0))
        ys, yz = params(draw, b, dtype)
        bias = [b.const(rng.integers(-500, 500, m).astype(np.int32))] if draw(st.booleans()) else []
        stride = draw(st.sampled_from([1, 2]))
        y = b.op("QLinearConv", xq, xs, xz, w, ws, wz, ys, yz, *bias, kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                 strides=[stride, stride], group=m if depthwise else 1)
        exposed(draw, b, y)
        if draw(st.booleans()):  # a second conv reading the 8-bit y as it is (an 8-bit edge)
            w2 = b.const(rng.integers(-127, 128, (m, 1 if depthwise else m, 3, 3)).astype(np.int8))
            ys2, yz2 = params(draw, b, dtype)
            y2 = b.op("QLinearConv", y, ys, yz, w2, b.const(np.float32(0.01)), b.const(np.int8(0)), ys2, yz2,
                      kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=m if depthwise else 1)
            b.output(b.op("DequantizeLinear", y2, ys2, yz2))
        d = b.op("DequantizeLinear", y, ys, yz)
        e = affine(draw, b, d, m)
        if e != d:
            exposed(draw, b, d)
        after = draw(st.sampled_from(["conv", "tail", "none"]))
        if after == "tail":  # a QDQ model's rounding (and residual) after the conv
            expose(draw, b, e)
            e = tail(draw, b, e, (1, m, (h - 1) // stride + 1, (w_ - 1) // stride + 1))
        if after == "conv":  # a second quantized conv reading it (the edge between two fused convs)
            exposed(draw, b, e)
            xs2, xz2 = params(draw, b, dtype)
            w2 = b.const(rng.integers(-127, 128, (m, m, 3, 3)).astype(np.int8))
            ys2, yz2 = params(draw, b, dtype)
            y2 = b.op("QLinearConv", b.op("QuantizeLinear", e, xs2, xz2), xs2, xz2, w2, b.const(np.float32(0.01)),
                      b.const(np.int8(0)), ys2, yz2, kernel_shape=[3, 3], pads=[1, 1, 1, 1])
            e = b.op("DequantizeLinear", y2, ys2, yz2)
        b.output(e)
        return b.build()

    return st.one_of(graphs(), scaled())
