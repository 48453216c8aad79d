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
"""

from __future__ import annotations

import argparse
import json
import math
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
    args = parser.parse_args(argv)
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
