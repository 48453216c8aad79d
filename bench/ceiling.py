"""The sgemm ceiling: how fast each benchmark model could run if every multiply-add ran at numpy's best GEMM rate.

    .venv/bin/python -m bench.ceiling                      # all models, batch 1 and 8
    .venv/bin/python -m bench.ceiling --results bench/results/final.json

Counts the multiply-adds of each model's Conv, ConvTranspose, Gemm and
MatMul nodes (from the shapes minfer infers for the benchmark's inputs; no
passes, so nothing is fused away), measures the float32 GEMM rate numpy's
BLAS reaches here on large square matrices with every core (the best case:
conv-shaped GEMMs run slower), and prints the time those multiply-adds take
at that rate: no copies, no other ops, no overhead. With a results file of
`bench.benchmark`, it also gives onnxruntime's effective rate on the model
and the smallest minfer/onnxruntime ratio that rate allows (Winograd's
fewer multiplies aside). This shows what is left to win on each model and
what no numpy kernel can win while BLAS is the floor.

It first times numpy's and onnxruntime's GEMMs themselves on the same shapes
(a large square one and resnet50's conv GEMMs at batch 1), both on two
cores: numpy the better of two BLAS threads and half of one thread's time (a
perfect split between minfer's intra-op threads), onnxruntime a lone MatMul
with a constant right operand (which it pre-packs, as in its Conv). Their
ratio is the handicap any numpy kernel starts from on GEMM-bound layers.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import Any, Sequence

import numpy as np

from bench.benchmark import random_feeds
from bench.models import build, models


def multiply_adds(name: str, batch: int) -> int:
    """Multiply-adds of the model's Conv/ConvTranspose/Gemm/MatMul nodes at this batch size."""
    import minfer_core

    model = build(name, batch)
    feeds = random_feeds(model)
    sess = minfer_core.InferenceSession(model, passes="none", threads=1)
    graph = sess.graph
    sig = tuple((feeds[n].shape, feeds[n].dtype) for n in graph.inputs)
    types = sess.shape_types(sig)

    def shape(value: str) -> tuple[int, ...]:
        if value in graph.initializers:
            return tuple(graph.initializers[value].shape)
        t = types.get(value) or graph.type_of(value)
        if t is None or t.shape is None or not all(isinstance(d, int) for d in t.shape):
            raise ValueError(f"{name}: no static shape for {value}")
        return tuple(int(d) for d in t.shape)

    total = 0
    for node in graph.nodes:
        if node.domain not in ("", "ai.onnx"):
            continue
        if node.op_type in ("Conv", "ConvTranspose"):
            # every output element of a Conv takes W[1:] multiply-adds; every input element of a ConvTranspose gives them
            w = shape(node.inputs[1])
            side = node.outputs[0] if node.op_type == "Conv" else node.inputs[0]
            total += math.prod(shape(side)) * math.prod(w[1:])
        elif node.op_type in ("Gemm", "MatMul"):
            a, y = shape(node.inputs[0]), shape(node.outputs[0])
            k = a[0] if node.op_type == "Gemm" and node.attrs.get("transA", 0) else a[-1]
            total += math.prod(y) * k
    return total


def gemm_rate(threads: int, size: int = 2048, repeat: int = 7) -> float:
    """Best float32 GFLOP/s of numpy's matmul on size x size matrices with ``threads`` BLAS threads."""
    from minfer_core.threads import set_blas_threads

    old = set_blas_threads(threads)
    try:
        rng = np.random.default_rng(0)
        a, b = (rng.standard_normal((size, size)).astype(np.float32) for _ in range(2))
        c = np.empty_like(a)
        np.matmul(a, b, out=c)
        best = min(_timed(lambda: np.matmul(a, b, out=c)) for _ in range(repeat))
    finally:
        if old is not None:
            set_blas_threads(old)
    return 2 * size**3 / best / 1e9


# (M, K, N) of C[M, N] = A[M, K] @ B[K, N]: a large square GEMM, then resnet50's conv GEMMs at batch 1 as minfer's
# im2col and pointwise methods run them (weights M x K, columns K x N): 1x1 at 56x56, 3x3 at 56x56 and 14x14, 1x1 at 7x7
GEMM_SHAPES = ((2048, 2048, 2048), (256, 64, 3136), (64, 576, 3136), (256, 2304, 196), (1024, 256, 196),
               (2048, 512, 49))


def numpy_gemm_ms(m: int, k: int, n: int, repeat: int = 15) -> float:
    """Best time of numpy's float32 GEMM on two cores: two BLAS threads, or one thread's time halved."""
    from minfer_core.threads import set_blas_threads

    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    c = np.empty((m, n), np.float32)
    best = {}
    old = set_blas_threads(1)
    try:
        for threads in (1, 2):
            set_blas_threads(threads)
            np.matmul(a, b, out=c)
            best[threads] = min(_timed(lambda: np.matmul(a, b, out=c)) for _ in range(repeat))
    finally:
        if old is not None:
            set_blas_threads(old)
    return min(best[1] / 2, best[2]) * 1e3


def ort_gemm_ms(m: int, k: int, n: int, threads: int = 2, repeat: int = 15) -> float:
    """Best time of onnxruntime's MatMul X[N, K] @ W[K, M] (W constant, pre-packed) with ``threads`` threads."""
    from onnx import TensorProto, helper, numpy_helper

    from bench.benchmark import PAUSE, ort_session
    from bench.models import ORT_IR_VERSION

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((k, m)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "gemm",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, m])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = ORT_IR_VERSION
    sess = ort_session(model.SerializeToString(), threads)
    feeds = {"x": rng.standard_normal((n, k)).astype(np.float32)}
    sess.run(None, feeds)
    best = min(_timed(lambda: sess.run(None, feeds)) for _ in range(repeat))
    time.sleep(PAUSE)  # its threads spin after a call: let them stop before numpy is timed again
    return best * 1e3


def gemm_gap(shapes: Sequence[tuple[int, int, int]] = GEMM_SHAPES, rounds: int = 3) -> list[dict[str, float]]:
    """numpy's and onnxruntime's two-core GEMM times on each shape, best of ``rounds`` interleaved rounds."""
    rows = []
    for m, k, n in shapes:
        times = [(numpy_gemm_ms(m, k, n), ort_gemm_ms(m, k, n)) for _ in range(rounds)]
        np_ms, ort_ms = min(t[0] for t in times), min(t[1] for t in times)
        flop = 2 * m * k * n / 1e9
        rows.append({"m": m, "k": k, "n": n, "numpy_ms": np_ms, "ort_ms": ort_ms, "numpy_gflops": flop / np_ms * 1e3,
                     "ort_gflops": flop / ort_ms * 1e3, "ratio": np_ms / ort_ms})
    return rows


def _timed(fn: Any) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ceiling")
    parser.add_argument("--models", nargs="*", default=None)
    parser.add_argument("--batches", nargs="*", type=int, default=[1, 8])
    parser.add_argument("--threads", type=int, default=2, help="BLAS threads for the rate (default 2, the cores)")
    parser.add_argument("--results", default=None, help="a bench.benchmark JSON file, for onnxruntime's times")
    parser.add_argument("--no-gemm-gap", dest="gap", action="store_false", help="skip timing numpy vs onnxruntime GEMMs")
    args = parser.parse_args(argv)
    if args.gap:
        print("GEMMs on two cores, numpy (OPENBLAS_CORETYPE=%s) against onnxruntime, best of 3 rounds:\n"
              % os.environ.get("OPENBLAS_CORETYPE", "unset"))
        print("| M | K | N | numpy ms | ORT ms | numpy GFLOP/s | ORT GFLOP/s | numpy/ORT |")
        print("|---|---|---|---|---|---|---|---|")
        for r in gemm_gap():
            print(f"| {r['m']} | {r['k']} | {r['n']} | {r['numpy_ms']:.3f} | {r['ort_ms']:.3f} | {r['numpy_gflops']:.0f} | "
                  f"{r['ort_gflops']:.0f} | {r['ratio']:.2f} |", flush=True)
        print()
    measured: dict[tuple[str, int], dict[str, Any]] = {}
    if args.results:
        with open(args.results) as fh:
            data = json.load(fh)
        for row in data["rows"] if isinstance(data, dict) else data:
            measured[(row["model"], row["batch"])] = row
    rate = gemm_rate(args.threads)
    print(f"numpy float32 GEMM, 2048^3, {args.threads} BLAS threads: {rate:.0f} GFLOP/s (best of 7)\n")
    print("| model | b | GFLOP | at that rate ms | minfer ms | ORT ms | ORT GFLOP/s | best possible minfer/ORT |")
    print("|---|---|---|---|---|---|---|---|")
    for name in models(args.models):
        for batch in args.batches:
            flops = 2 * multiply_adds(name, batch)
            floor = flops / rate / 1e6
            row = measured.get((name, batch), {})
            m_ms, o_ms = row.get("minfer_ms"), row.get("ort_ms")
            cells = [f"{flops / 1e9:.2f}", f"{floor:.1f}", f"{m_ms:.1f}" if m_ms else "-", f"{o_ms:.1f}" if o_ms else "-",
                     f"{flops / o_ms / 1e6:.0f}" if o_ms else "-", f"{floor / o_ms:.2f}" if o_ms else "-"]
            print(f"| {name} | {batch} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
