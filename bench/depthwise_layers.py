"""Per-layer timing of depthwise 3x3 convs at shufflenet's shapes: old tap method, depthwise.plan, onnxruntime.

Run under the CPU lock, one batch size at a time (each under a minute):
``flock -x /tmp/minfer-cpu.lock .venv/bin/python -m bench.depthwise_layers --batch 1``.
minfer runs inside ``using_threads(2)`` with a 1-thread BLAS; onnxruntime with ``intra_op_num_threads=2``.
The three methods alternate in rounds of a few runs each, with a pause before each block (as
bench/benchmark.py does): onnxruntime's worker threads spin after a call and would steal a core from
whatever ran next. Reported: medians over all runs, in microseconds.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from minfer_core.parallel import using_threads
from minfer_core.threads import set_blas_threads
from minfer_ops_conv import _geometry as geo
from minfer_ops_conv import depthwise

# (channels, size, stride, how many such layers in shufflenet)
SHUFFLENET = [(112, 56, 2, 1), (136, 28, 1, 3), (136, 28, 2, 1), (272, 14, 1, 7), (272, 14, 2, 1), (544, 7, 1, 3)]


class P:
    def __init__(self, w: np.ndarray) -> None:
        self.depthwise = np.ascontiguousarray(w.reshape(w.shape[0], -1))


def old_method(w: geo.Window):
    """The tap method conv.py used before depthwise.py: pad x whole, 9 strided multiply + add passes."""

    def run(x, p, y, bias, epilogue):
        xp = geo.pad(x, w)
        c = x.shape[1]
        tmp = np.empty_like(y)
        bcast = (c,) + (1,) * len(w.out_shape)
        for t, taps in enumerate(w.taps()):
            tap = xp[(slice(None), slice(None)) + taps]
            weight = p.depthwise[:, t].reshape(bcast)
            if t == 0:
                np.multiply(tap, weight, out=y)
            else:
                np.multiply(tap, weight, out=tmp)
                y += tmp

    return run


def ort_session(x_shape, w, stride):
    c = w.shape[0]
    node = helper.make_node("Conv", ["x", "w"], ["y"], group=c, kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                            strides=[stride, stride])
    graph = helper.make_graph([node], "dw", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 10
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


PAUSE = 0.15  # seconds before each block of runs: longer than onnxruntime's spin-wait


def layer(c: int, size: int, stride: int, batch: int, rounds: int, runs: int) -> dict[str, float]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, c, size, size), dtype=np.float32)
    w = rng.standard_normal((c, 1, 3, 3), dtype=np.float32)
    win = geo.window((size, size), (3, 3), strides=(stride, stride), pads=(1, 1, 1, 1), clamp_same=True)
    y = np.empty((batch, c) + win.out_shape, np.float32)
    y_old = np.empty_like(y)
    p = P(w)
    new, old = depthwise.plan(win), old_method(win)
    sess = ort_session(x.shape, w, stride)
    ref = sess.run(None, {"x": x})[0]
    calls = {"old": lambda: old(x, p, y_old, None, None), "new": lambda: new(x, p, y, None, None),
             "ort": lambda: sess.run(None, {"x": x})}
    times: dict[str, list[float]] = {k: [] for k in calls}
    with using_threads(2):
        new(x, p, y, None, None)  # the first call picks the layout by timing both
        old(x, p, y_old, None, None)
        assert np.allclose(y, ref, atol=1e-4), np.abs(y - ref).max()
        assert np.allclose(y_old, ref, atol=1e-4)
        for _ in range(rounds):
            for name, call in calls.items():
                time.sleep(PAUSE)
                call()
                times[name] += [timed(call) for _ in range(runs)]
    return {k: float(np.median(v)) * 1e6 for k, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--runs", type=int, default=0, help="runs per block (default: 12 at batch 1, 4 at 8)")
    args = parser.parse_args()
    set_blas_threads(1)
    for batch in args.batch:
        totals = {"old": 0.0, "new": 0.0, "ort": 0.0}
        print(f"batch {batch}: C x HxW stride (count): old / new / ORT us (median)")
        for c, size, stride, count in SHUFFLENET:
            r = layer(c, size, stride, batch, args.rounds, args.runs or (12 if batch == 1 else 4))
            for k in totals:
                totals[k] += r[k] * count
            print(f"  {c:4d} x {size}x{size} s{stride} (x{count}): {r['old']:8.1f} / {r['new']:8.1f} / {r['ort']:8.1f}")
        print(f"  shufflenet total (16 layers): {totals['old']:.0f} / {totals['new']:.0f} / {totals['ort']:.0f} us")


if __name__ == "__main__":
    main()
