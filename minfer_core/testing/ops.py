"""Checking one op at a time: a single-node model, minfer vs onnxruntime, and direct kernel calls.

For plugin authors testing their kernels::

    from minfer_core.testing.ops import assert_node_matches_onnxruntime
    assert_node_matches_onnxruntime("Gelu", 20, [x], {"approximate": "tanh"})

onnxruntime is imported only when a comparison runs (it is a test oracle,
never a runtime dependency).
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

import numpy as np
import onnx
from onnx import helper

from ..kernel import Kernel, KernelContext

ORT_IR_VERSION = 10  # onnx 1.23 stamps IR 14, which onnxruntime 1.31 refuses


def single_node_model(
    op_type: str,
    opset: int,
    inputs: Sequence[np.ndarray | None],
    attrs: dict[str, Any] | None = None,
    num_outputs: int = 1,
    domain: str = "",
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A one-node model whose inputs ``i0, i1, ...`` are graph inputs (None leaves one out), and its feeds."""
    names = ["" if x is None else f"i{i}" for i, x in enumerate(inputs)]
    node = helper.make_node(op_type, names, [f"o{i}" for i in range(num_outputs)], domain=domain or None, **(attrs or {}))
    ins = [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(x.dtype), x.shape)
        for n, x in zip(names, inputs)
        if n and x is not None
    ]
    outs = [helper.make_empty_tensor_value_info(f"o{i}") for i in range(num_outputs)]
    opsets = [helper.make_opsetid(domain, opset)] + ([helper.make_opsetid("", 21)] if domain else [])
    model = helper.make_model(helper.make_graph([node], "node", ins, outs), opset_imports=opsets)
    model.ir_version = ORT_IR_VERSION
    feeds = {n: x for n, x in zip(names, inputs) if n and x is not None}
    return model, feeds


def onnxruntime_outputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """onnxruntime's outputs for ``model`` (warnings off)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def assert_node_matches_onnxruntime(
    op_type: str,
    opset: int,
    inputs: Sequence[np.ndarray | None],
    attrs: dict[str, Any] | None = None,
    num_outputs: int = 1,
    *,
    rtol: float = 1e-5,
    atol: float = 1e-6,
) -> list[np.ndarray]:
    """minfer and onnxruntime agree on every output of one node: dtype, shape, then values."""
    from ..engine import Engine

    model, feeds = single_node_model(op_type, opset, inputs, attrs, num_outputs)
    want = onnxruntime_outputs(model, feeds)
    got = Engine(model).run(None, feeds)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.dtype and g.shape == w.shape, f"output {i}: {g.dtype}{g.shape} vs onnxruntime {w.dtype}{w.shape}"
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=rtol, atol=atol, err_msg=f"output {i}")
    return got


def call_kernel(kernels: Iterable[Kernel], op_type: str, opset: int, *inputs: Any, num_outputs: int = 1, **attrs: Any) -> Any:
    """Call the kernel of ``kernels`` the engine would pick at ``opset``, preparing it first when needed."""
    kern = max((k for k in kernels if k.op_type == op_type and k.since <= opset), key=lambda k: k.since)
    n = len(inputs)
    ctx = KernelContext("node", op_type, opset, (None,) * n, (None,) * num_outputs, (None,) * n, num_outputs)
    return kern.prepared(ctx, attrs)(*inputs)  # checked and prepared as the engine does
