"""Per-layer timing of depthwise 3x3 convs at shufflenet's shapes: each depthwise.py layout, the tuned choice, onnxruntime.

Run under the CPU lock, one batch size at a time (each under a minute):
``flock -x /tmp/minfer-cpu.lock .venv/bin/python -m bench.depthwise_layers --batch 1``.
minfer runs inside ``using_threads(2)`` with a 1-thread BLAS; onnxruntime with ``intra_op_num_threads=2``.
``--split`` forces minfer's split of every layer over the two threads (``--no-split``: never), to measure
the thresholds. The methods alternate in rounds of a few runs each, with a pause before each block (as
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
from minfer_parallel.blas import set_blas_threads
from minfer_ops_conv import _geometry as geo
from minfer_ops_conv import depthwise

# (channels, size, stride, how many such layers in shufflenet)
SHUFFLENET = [(112, 56, 2, 1), (136, 28, 1, 3), (136, 28, 2, 1), (272, 14, 1, 7), (272, 14, 2, 1), (544, 7, 1, 3)]
LAYOUTS = ["first", "last", "copies"]


class P:
    def __init__(self, w: np.ndarray) -> None:
        self.depthwise = np.ascontiguousarray(w.reshape(w.shape[0], -1))


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
    p = P(w)
    sess = ort_session(x.shape, w, stride)
    ref = sess.run(None, {"x": x})[0]
    calls = {"ort": lambda: sess.run(None, {"x": x})}
    times: dict[str, list[float]] = {"ort": []}
    with using_threads(2):
        for name in LAYOUTS + ["tuned"]:
            plan = depthwise.plan(win, None if name == "tuned" else name)
            y = np.empty((batch, c) + win.out_shape, np.float32)
            plan(x, p, y, None, None)  # the first call may pick the layout by timing
            assert np.allclose(y, ref, atol=1e-4), (name, np.abs(y - ref).max())
            calls[name] = lambda plan=plan, y=y: plan(x, p, y, None, None)
            times[name] = []
            if name == "tuned":
                times["choice"] = [plan._choices[next(iter(plan._choices))]]  # type: ignore[list-item]
        for _ in range(rounds):
            for name, call in calls.items():
                time.sleep(PAUSE)
                call()
                times[name] += [timed(call) for _ in range(runs)]
    result = {k: float(np.median(v)) * 1e6 for k, v in times.items() if k != "choice"}
    choice = times["choice"][0]
    result["choice"] = f"{choice.layout}/{choice.parts}"  # type: ignore[assignment,attr-defined]
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--runs", type=int, default=0, help="runs per block (default: 12 at batch 1, 4 at 8)")
    split = parser.add_mutually_exclusive_group()
    split.add_argument("--split", action="store_true", help="split every layer over the two threads")
    split.add_argument("--no-split", action="store_true", help="never split")
    args = parser.parse_args()
    if args.split:
        depthwise.MIN_SPLIT_MACS = depthwise.MIN_CHANNEL_SPLIT_MACS = 0
    if args.no_split:
        depthwise.MIN_SPLIT_MACS = depthwise.MIN_CHANNEL_SPLIT_MACS = 1 << 62
    set_blas_threads(1)
    names = LAYOUTS + ["tuned", "ort"]
    for batch in args.batch:
        totals = dict.fromkeys(names, 0.0)
        print(f"batch {batch}: C x HxW stride (count): {' / '.join(names)} us (median), tuned choice/parts")
        for c, size, stride, count in SHUFFLENET:
            r = layer(c, size, stride, batch, args.rounds, args.runs or (12 if batch == 1 else 4))
            for k in totals:
                totals[k] += r[k] * count
            cells = " / ".join(f"{r[k]:7.1f}" for k in names)
            print(f"  {c:4d} x {size}x{size} s{stride} (x{count}): {cells}  {r['choice']}")
        print(f"  shufflenet total (16 layers): {' / '.join(f'{totals[k]:.0f}' for k in names)} us")


if __name__ == "__main__":
    main()
