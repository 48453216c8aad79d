"""The target strategy of `integer_matmul.integer_matmul_fusion` for the pass property suite (hypothesis: a test
dependency, imported when the strategy is made)."""

from __future__ import annotations

from typing import Any

import numpy as np


def patterns() -> Any:
    """The pass's target strategy: [DynamicQuantizeLinear ->] MatMulInteger -> Cast -> Mul by a scalar [-> Add of a
    bias], uint8 or int8 weights with or without zero points, each intermediate sometimes read elsewhere or a
    graph output, the DynamicQuantizeLinear sometimes read by two layers."""
    from hypothesis import strategies as st

    from minfer_core.testing import GraphBuilder

    def exposed(draw: Any, b: GraphBuilder, value: str) -> None:
        """Nothing, another reader (a Cast: no Neg of uint8), or a graph output."""
        how = draw(st.sampled_from(["none", "none", "none", "consumer", "output"]))
        if how != "none":
            b.output(b.op("Cast", value, to=1) if how == "consumer" else value)

    def layer(draw: Any, b: GraphBuilder, xq: str, xs: str, xz: str | None, k: int, rng: Any) -> str:
        n = draw(st.integers(1, 6))
        wdtype = draw(st.sampled_from([np.int8, np.uint8]))
        info = np.iinfo(wdtype)
        w = b.const(rng.integers(int(info.min), int(info.max) + 1, (k, n)).astype(wdtype))
        wz = [b.const(np.asarray(draw(st.integers(-3, 3)) + (128 if wdtype == np.uint8 else 0), wdtype))]
        y = b.op("MatMulInteger", xq, w, *([xz] if xz else []), *(wz if xz and draw(st.booleans()) else []))
        exposed(draw, b, y)
        f = b.op("Cast", y, to=1)
        exposed(draw, b, f)
        ws = b.const(np.float32(draw(st.sampled_from([0.001, 0.37]))))
        scale = b.op("Mul", *draw(st.permutations([xs, ws])))
        y = b.op("Mul", *draw(st.permutations([f, scale])))
        if draw(st.booleans()):
            exposed(draw, b, y)
            bias = rng.uniform(-1, 1, draw(st.sampled_from([(n,), (1, n), (1,)]))).astype(np.float32)
            y = b.op("Add", *draw(st.permutations([y, b.const(bias)])))
        return y

    @st.composite
    def graphs(draw: Any) -> Any:
        b = GraphBuilder(opset=13)
        k = draw(st.integers(1, 8))
        x = b.input((draw(st.integers(1, 3)), draw(st.integers(1, 4)), k))
        if draw(st.booleans()):  # the dynamic model's DynamicQuantizeLinear
            xq, xs, xz = b.op("DynamicQuantizeLinear", x, outputs=3)
            for v in draw(st.sampled_from([(), (xq,), (xs,), (xz,)])):
                exposed(draw, b, v)
        else:  # an input quantized elsewhere
            xq = b.input((2, 3, k), dtype=np.uint8)
            xs, xz = b.input(()), b.const(np.uint8(draw(st.integers(0, 255))))
        rng = np.random.default_rng(draw(st.integers(0, 2**16)))
        b.output(layer(draw, b, xq, xs, xz, k, rng))
        if draw(st.integers(0, 3)) == 0:  # a second layer reading the same quantized input (Q, K, V)
            b.output(layer(draw, b, xq, xs, xz, k, rng))
        return b.build()

    return graphs()
