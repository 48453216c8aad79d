"""The GEMM floor: what numpy's BLAS alone costs each benchmark model, against onnxruntime.

    .venv/bin/python -m bench.ceiling                      # all models, batch 1 and 8
    .venv/bin/python -m bench.ceiling --results bench/results/session5/threads1.json

First it times the GEMMs themselves, numpy's and onnxruntime's, on the same
shapes (a large square one and resnet50's conv GEMMs at batch 1), both on two
cores: numpy the better of two BLAS threads and half of one thread's time (a
perfect split between minfer's intra-op threads), onnxruntime a lone MatMul
with a constant right operand (which it pre-packs, as in its Conv). Their
ratio is the handicap any numpy kernel starts from on a GEMM-bound layer.

Then, per model, the floor: every Conv, Gemm and MatMul node's GEMMs at their
real shapes (from the shapes minfer infers for the benchmark's inputs; no
passes) timed the same way, the cheaper of im2col and Winograd F(2x2, 3x3)'s
16 GEMMs where that applies, summed. No copies, no transforms, no other op,
no overhead, depthwise convs free: no numpy engine on this BLAS runs the model
in less. With a results file of `bench.benchmark`, it puts the floor next to
onnxruntime's and minfer's measured times: floor/ORT is the smallest
minfer/onnxruntime ratio this BLAS allows, minfer/floor what is left to win.
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
from bench.models import LIGHT, build, models


def gemm_shapes(name: str, batch: int) -> list[tuple[list[tuple[int, int, int, int]], str]]:
    """Per Conv/Gemm/MatMul node (no passes), the GEMMs minfer's fastest method could run, as alternatives.

    Each entry is ([(count, M, K, N), ...] per alternative, label): a conv's im2col GEMM (per group: M/G x
    C/G*k x images*outputs, all images in one GEMM, the best case) and, for a 3x3 stride-1 single-group conv,
    Winograd F(2x2, 3x3)'s 16 GEMMs of M x C x tiles. Depthwise convs are left out (no GEMM: their floor
    here is 0). A Gemm is its M x K x N, a MatMul its merged rows against a 2-D B or its batch of products.
    """
    import minfer_core

    model = build(name, batch)
    feeds = random_feeds(model)
    sess = minfer_core.InferenceSession(model, passes="none", threads=1)
    graph = sess.graph
    types = sess.executor.plans.shape_types(tuple((feeds[n].shape, feeds[n].dtype) for n in graph.inputs))

    def shape(value: str) -> tuple[int, ...]:
        if value in graph.initializers:
            return tuple(graph.initializers[value].shape)
        t = types.get(value) or graph.type_of(value)
        if t is None or t.shape is None or not all(isinstance(d, int) for d in t.shape):
            raise ValueError(f"{name}: no static shape for {value}")
        return tuple(int(d) for d in t.shape)

    out = []
    for node in graph.nodes:
        if node.domain not in ("", "ai.onnx"):
            continue
        if node.op_type == "Conv":
            w, y = shape(node.inputs[1]), shape(node.outputs[0])
            group = int(node.attrs.get("group", 1))
            if group > 1 and w[1] == 1 and w[0] == group:
                continue  # depthwise
            outputs = math.prod(y[2:])
            options = [[(group, w[0] // group, math.prod(w[1:]), y[0] * outputs)]]
            stride1 = all(s == 1 for s in node.attrs.get("strides", [1, 1]))
            undilated = all(d == 1 for d in node.attrs.get("dilations", [1, 1]))
            if group == 1 and tuple(w[2:]) == (3, 3) and stride1 and undilated:
                tiles = y[0] * math.ceil(y[2] / 2) * math.ceil(y[3] / 2)
                options.append([(16, w[0], w[1], tiles)])
            out.append((options, f"Conv {w} -> {y}"))
        elif node.op_type == "Gemm":
            a, y = shape(node.inputs[0]), shape(node.outputs[0])
            k = a[0] if node.attrs.get("transA", 0) else a[1]
            out.append(([[(1, y[0], k, y[1])]], f"Gemm {y}"))
        elif node.op_type == "MatMul":
            a, b, y = shape(node.inputs[0]), shape(node.inputs[1]), shape(node.outputs[0])
            if len(b) == 2 and len(a) >= 2:
                gemms = [(1, math.prod(a[:-1]), a[-1], b[-1])]
            else:
                gemms = [(math.prod(y[:-2]), y[-2], a[-1], y[-1])]
            out.append(([gemms], f"MatMul {y}"))
    return out


def gemm_floor_ms(name: str, batch: int, cache: dict[tuple[int, int, int], float] | None = None) -> float:
    """The model's Conv/Gemm/MatMul GEMMs at numpy's two-core time (`numpy_gemm_ms`), the cheaper alternative
    of each node: no copies, no transforms, no other op. No numpy engine built on this BLAS can run the model in
    less (depthwise convs aside)."""
    cache = {} if cache is None else cache

    def gemm(m: int, k: int, n: int) -> float:
        if (m, k, n) not in cache:
            cache[(m, k, n)] = numpy_gemm_ms(m, k, n, repeat=7)
        return cache[(m, k, n)]

    return sum(min(sum(count * gemm(m, k, n) for count, m, k, n in option) for option in options)
               for options, _ in gemm_shapes(name, batch))


# (M, K, N) of C[M, N] = A[M, K] @ B[K, N]: a large square GEMM, then resnet50's conv GEMMs at batch 1 as minfer's
# im2col and pointwise methods run them (weights M x K, columns K x N): 1x1 at 56x56, 3x3 at 56x56 and 14x14, 1x1 at 7x7
GEMM_SHAPES = ((2048, 2048, 2048), (256, 64, 3136), (64, 576, 3136), (256, 2304, 196), (1024, 256, 196),
               (2048, 512, 49))


def numpy_gemm_ms(m: int, k: int, n: int, repeat: int = 15) -> float:
    """Best time of numpy's float32 GEMM on two cores: two BLAS threads, or one thread's time halved."""
    from minfer_parallel.blas import set_blas_threads

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
    print("The GEMM floor: each model's Conv/Gemm/MatMul GEMMs at numpy's two-core time (Winograd where cheaper):\n")
    print("| model | b | GEMM floor ms | ORT ms | minfer ms | floor/ORT | minfer/ORT | minfer/floor |")
    print("|---|---|---|---|---|---|---|---|")
    cache: dict[tuple[int, int, int], float] = {}
    lower: dict[int, list[float]] = {}
    for name in models(args.models or ["light", "transformer"]):  # its GEMM-floor table: the light models
        for batch in args.batches:
            floor = gemm_floor_ms(name, batch, cache)
            row = measured.get((name, batch), {})
            m_ms, o_ms = row.get("minfer_ms"), row.get("ort_ms")
            if o_ms and name in LIGHT:
                lower.setdefault(batch, []).append(floor / o_ms)
            cells = [f"{floor:.1f}", _cell(o_ms, "{:.1f}"), _cell(m_ms, "{:.1f}"), _cell(o_ms and floor / o_ms, "{:.2f}"),
                     _cell(m_ms and o_ms and m_ms / o_ms, "{:.2f}"), _cell(m_ms and m_ms / floor, "{:.2f}")]
            print(f"| {name} | {batch} | " + " | ".join(cells) + " |", flush=True)
    for batch, ratios in sorted(lower.items()):
        geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
        print(f"\nbatch {batch}: geo-mean of floor/ORT over {len(ratios)} light models {geo:.2f}, worst {max(ratios):.2f}")
    return 0


def _cell(value: float | None, fmt: str) -> str:
    return fmt.format(value) if value else "-"


if __name__ == "__main__":
    sys.exit(main())
