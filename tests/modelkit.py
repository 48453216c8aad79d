"""Model builders and the onnxruntime oracle shared by the test suite (import as `modelkit`)."""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

ORT_IR_VERSION = 10  # onnx 1.23 stamps IR 14, which onnxruntime 1.31 refuses


def make_model(nodes: list[onnx.NodeProto], inputs: list[Any], outputs: list[Any], initializers=(), opset: int = 17, **kw: Any) -> onnx.ModelProto:
    """A model onnxruntime accepts: explicit opset and IR version."""
    graph = helper.make_graph(nodes, "test", inputs, outputs, list(initializers))
    opsets = [helper.make_opsetid("", opset)] + list(kw.pop("extra_opsets", []))
    model = helper.make_model(graph, opset_imports=opsets, **kw)
    model.ir_version = ORT_IR_VERSION
    return model


def tensor(name: str, shape: Any, elem: int = TensorProto.FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def ort_run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """onnxruntime's outputs for ``model`` (2 threads, warnings off)."""
    ort = pytest.importorskip("onnxruntime")
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    opts.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def outputs_around(graph: Any, apply: Any) -> tuple[bool, list[np.ndarray], list[np.ndarray]]:
    """Shape-infer ``graph``, apply the pass function ``apply`` to it in place and validate the result.

    Returns (whether it changed the graph, outputs without the pass, outputs with it) on the same random feeds.
    """
    from minfer_core import InferenceSession
    from minfer_core.testing import random_feeds
    from minfer_passes.shapes import shape_inference

    shape_inference(graph)
    before = graph.copy()
    changed = apply(graph)
    graph.validate()
    feeds = random_feeds(before)
    want = InferenceSession(before, passes="none").run(None, feeds)
    got = InferenceSession(graph.copy(), passes="none").run(None, feeds)
    return changed, want, got


def reference_conv(x, w, b, pads, strides):
    """Direct float64 conv: a sum over kernel taps of strided input slices."""
    n = x.shape[0]
    m, _, kh, kw = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    oh = (xp.shape[2] - kh) // strides[0] + 1
    ow = (xp.shape[3] - kw) // strides[1] + 1
    y = np.zeros((n, m, oh, ow))
    for i in range(kh):
        for j in range(kw):
            patch = xp[:, :, i : i + strides[0] * (oh - 1) + 1 : strides[0], j : j + strides[1] * (ow - 1) + 1 : strides[1]]
            y += np.einsum("mc,nchw->nmhw", w[:, :, i, j].astype(np.float64), patch)
    return y + b.reshape(1, -1, 1, 1)


def conv_context(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, constant: bool = True) -> Any:
    """A Conv node's KernelContext: x a run-time input, w (and b) constants unless ``constant`` is False."""
    from minfer_core import KernelContext, TensorType

    inputs = [x, w] + ([] if b is None else [b])
    types = tuple(TensorType(a.dtype, a.shape) for a in inputs)
    consts = (None,) + (tuple(inputs[1:]) if constant else (None,) * (len(inputs) - 1))
    return KernelContext("node", "Conv", 22, types, (None,), consts, 1)


def onnx_conv(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, attrs: dict) -> np.ndarray:
    """onnx's reference Conv on the node ``attrs`` describe."""
    from onnx.reference import ReferenceEvaluator

    names = ["x", "w"] + ([] if b is None else ["b"])
    node = helper.make_node("Conv", names, ["y"], **attrs)
    model = make_model([node], [tensor(n, None) for n in names], [tensor("y", None)], opset=22)
    return ReferenceEvaluator(model).run(None, dict(zip(names, [x, w] + ([] if b is None else [b]))))[0]


def fused_epilogue(name: str, params: tuple, z: np.ndarray | None, act: Any) -> Any:
    """An epilogue as minfer-passes' FusedConv makes it: numpy's add of the residual ``z``, then ``act`` (the prepared
    in-place activation kernel of ``name``, or None) on each tile, with its ``spec`` (docs/kernel-contract.md)."""

    def finish(y: np.ndarray, region: tuple) -> None:
        part = y[region]
        if z is not None:
            np.add(part, z[region], out=part)
        if act is not None:
            act(part, out=part)

    finish.spec = (name, tuple(params), z)  # type: ignore[attr-defined]
    return finish


def assert_epilogue_once(run: Any, x: np.ndarray, want: np.ndarray, threads: int) -> None:
    """``run(x, None, None, out=y, epilogue=...)`` on ``threads`` threads hands every output element to the epilogue
    exactly once, after its sum is complete (the epilogue negates what it gets: twice, or too early, is wrong)."""
    import threading

    from minfer_core.parallel import using_threads

    y = np.full(want.shape, np.nan, np.float32)
    seen = np.zeros(want.shape, int)
    lock = threading.Lock()

    def epilogue(out: np.ndarray, region: tuple) -> None:
        assert out is y
        with lock:
            seen[region] += 1
        np.negative(out[region], out=out[region])

    with using_threads(threads):
        run(x, None, None, out=y, epilogue=epilogue)
    assert (seen == 1).all()
    np.testing.assert_allclose(-y, want, rtol=1e-5, atol=1e-5)


def team_and_split_runs(monkeypatch: Any, module: Any, run: Any, x: np.ndarray, shape: tuple[int, ...],
                        epilogue: Any) -> tuple[np.ndarray, np.ndarray]:
    """A compiled conv's output on two threads through its native team's driver (``module.team_units``, which must
    run), then with the team refused (its parallel_for path): (team's, split's), each into a NaN-filled buffer."""
    from minfer_core.parallel import using_threads
    from minfer_ops_numba import team

    calls: list[int] = []
    real = module.team_units
    monkeypatch.setattr(module, "team_units", lambda *args: calls.append(1) or real(*args))
    with using_threads(2):
        got = run(x, out=np.full(shape, np.nan, np.float32), epilogue=epilogue)
        assert calls, "the team driver never ran"
        monkeypatch.setattr(team, "size", lambda: 1)
        want = run(x, out=np.full(shape, np.nan, np.float32), epilogue=epilogue)
    return got, want


def spy_parallel_for(monkeypatch: Any, module: Any) -> list[int]:
    """Record the range count of every `parallel_for` call ``module`` makes (the calls still run)."""
    calls: list[int] = []
    real = module.parallel_for

    def spy(n: int, fn: Any, **kw: Any) -> Any:
        calls.append(n)
        return real(n, fn, **kw)

    monkeypatch.setattr(module, "parallel_for", spy)
    return calls


def conv_case(xs, ws, pads, strides, folded: bool):
    """A random single-group conv: (x, b, its float64 reference output, the window, the packed weights).

    ``folded``: the bias is packed with the weights (the methods that copy their operand add it in the GEMM).
    """
    from minfer_ops_conv import conv

    rng = np.random.default_rng(sum(xs) + sum(ws))
    x = rng.standard_normal(xs).astype(np.float32)
    w = (rng.standard_normal(ws) / np.sqrt(np.prod(ws[1:]))).astype(np.float32)
    b = rng.standard_normal(ws[0]).astype(np.float32)
    want = reference_conv(x, w, b, pads, strides)
    win = conv.geo.window(xs[2:], ws[2:], strides=strides, pads=pads, clamp_same=True)
    return x, w, b, want, win, conv.pack(w, 1, build_time=True, bias=b if folded else None)


def run_conv_plan(plan: Any, x: np.ndarray, p: Any, b: np.ndarray, want: np.ndarray, threads: int) -> np.ndarray:
    """Run a conv plan on ``threads`` threads with an epilogue that negates each finished tile; check that every
    element was finished exactly once, in the output itself, and equals ``want``. Returns the output."""
    import threading

    from minfer_core.parallel import using_threads
    from minfer_ops_conv import conv

    y = np.full(want.shape, np.nan, dtype=np.float32)
    seen = np.zeros(want.shape, dtype=int)
    lock = threading.Lock()

    def epilogue(out, region):
        assert out is y
        with lock:
            seen[region] += 1
        np.negative(out[region], out=out[region])  # a visible, once-only change

    with using_threads(threads):
        plan(x, p, y, conv._bias_column(b, 2, np.float32), epilogue)
    assert (seen == 1).all(), (plan, threads)
    np.testing.assert_allclose(-y, want, rtol=1e-4, atol=1e-4)
    return y


def child_exit_code(pid: int, hang: str, timeout: float = 20.0) -> int:
    """The exit code of forked child ``pid``; kills it and fails the test with ``hang`` if it is not done in time."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        finished, status = os.waitpid(pid, os.WNOHANG)
        if finished:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    pytest.fail(hang)


def ints(rng: np.random.Generator, dtype: Any, shape: Any) -> np.ndarray:
    """Uniform integers over the whole range of ``dtype``."""
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, size=shape, endpoint=True).astype(dtype)


def quantized_by_onnxruntime(model: onnx.ModelProto, tmp_path: Any, kind: str, shape: Any = None,
                             calibration: int = 3, **options: Any) -> onnx.ModelProto:
    """``model`` through onnxruntime's quantizer: ``kind`` "dynamic" (quantize_dynamic), or "QOperator" / "QDQ"
    (quantize_static, calibrated on ``calibration`` seeded random inputs of ``shape``); IR version set for onnxruntime."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_dynamic, quantize_static

    src, dst = tmp_path / "float.onnx", tmp_path / "quant.onnx"
    onnx.save(model, src)
    if kind == "dynamic":
        quantize_dynamic(str(src), str(dst), **options)
    else:
        name, rng = model.graph.input[0].name, np.random.default_rng(1)
        batches = iter([{name: rng.standard_normal(shape).astype(np.float32)} for _ in range(calibration)])

        class Reader(CalibrationDataReader):
            def get_next(self) -> Any:
                return next(batches, None)

        quantize_static(str(src), str(dst), Reader(), quant_format=getattr(QuantFormat, kind), **options)
    out = onnx.load(dst)
    out.ir_version = ORT_IR_VERSION
    return out


def onnxruntime_levels(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """onnxruntime's first output with every graph optimization off, then all on (their spread is its own tolerance)."""
    import onnxruntime as ort

    outs = []
    for level in [ort.GraphOptimizationLevel.ORT_DISABLE_ALL, ort.GraphOptimizationLevel.ORT_ENABLE_ALL]:
        opts = ort.SessionOptions()
        opts.graph_optimization_level, opts.log_severity_level = level, 3
        sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        outs.append(sess.run(None, feeds)[0])
    return outs


def assert_within_level_spread(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> None:
    """minfer's first output differs from onnxruntime's by no more than onnxruntime's two optimization levels differ."""
    from minfer_core import Engine

    outs = onnxruntime_levels(model, feeds)
    spread = float(np.abs(outs[0] - outs[1]).max())  # 0.0 for exact integer models: then minfer must match exactly
    got = Engine(model).run(None, feeds)[0]
    assert got.dtype == outs[0].dtype and got.shape == outs[0].shape
    assert float(np.abs(got - outs[0]).max()) <= spread
