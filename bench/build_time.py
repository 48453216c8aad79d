"""Session build time against node count: minfer's InferenceSession vs onnxruntime's.

    .venv/bin/python -m bench.build_time                         # 2.5k, 10k, 50k, 100k nodes (~3 min)
    .venv/bin/python -m bench.build_time --sizes 2500 10000 --repeat 3

The model is one long chain over a [1, 8] float tensor, cycling through
``Add`` of a constant vector, ``Relu``, ``Mul`` by a scalar constant and
``Identity``: every default pass scans it, ``scalar_binary`` rewrites each Mul
and ``identity_elimination`` bypasses each Identity, so the graph rewrite API
is exercised once per node, as on a large real model. Build is
``minfer_core.InferenceSession(model_bytes)`` with its default passes against
``onnxruntime.InferenceSession(model_bytes)`` (all graph optimizations, the
CPU provider); both parse the same serialized bytes. Each size is built
``--repeat`` times per engine, alternating engines, and the best time is
kept (build is single-threaded work that only other load slows down).

Growth is what matters: a rewrite that scans the node list makes build time
quadratic in the node count, which the ratio column shows as it climbs with
size. Optionally ``--profile N`` prints the top of a cProfile of minfer's
build at N nodes, by cumulative time.
"""

from __future__ import annotations

import argparse
import gc
import time
from typing import Any, Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ORT_IR_VERSION = 10  # onnx 1.23 stamps IR 14; onnxruntime reads up to 10
SIZES = (2500, 10_000, 50_000, 100_000)
CYCLE = ("Add", "Relu", "Mul", "Identity")


def chain_model(nodes: int) -> bytes:
    """A serialized ``nodes``-node chain cycling through `CYCLE` (see the module docstring)."""
    vec = numpy_helper.from_array(np.linspace(-0.5, 0.5, 8, dtype=np.float32), "vec")
    scale = numpy_helper.from_array(np.array(0.5, dtype=np.float32), "scale")
    made, prev = [], "x"
    for i in range(nodes):
        op = CYCLE[i % len(CYCLE)]
        out = "y" if i == nodes - 1 else f"v{i}"
        extra = {"Add": ["vec"], "Mul": ["scale"]}.get(op, [])
        made.append(helper.make_node(op, [prev, *extra], [out], name=f"n{i}"))
        prev = out
    graph = helper.make_graph(made, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])], [vec, scale])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = ORT_IR_VERSION
    return model.SerializeToString()


def build_minfer(data: bytes) -> Any:
    import minfer_core

    return minfer_core.InferenceSession(data)


def build_ort(data: bytes) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    return ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])


def timed(build: Callable[[bytes], Any], data: bytes) -> float:
    """Seconds to build one session (the previous one is collected first, outside the clock)."""
    gc.collect()
    start = time.perf_counter()
    session = build(data)
    seconds = time.perf_counter() - start
    del session
    return seconds


def check(data: bytes) -> None:
    """Both engines' sessions give the same output on one feed (a broken build must not look fast)."""
    x = np.random.default_rng(0).standard_normal((1, 8)).astype(np.float32)
    (want,) = build_ort(data).run(None, {"x": x})
    (got,) = build_minfer(data).run(None, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def measure(sizes: list[int], repeat: int) -> list[tuple[int, float, float]]:
    rows = []
    for n in sizes:
        data = chain_model(n)
        best = {"minfer": float("inf"), "ort": float("inf")}
        for _ in range(repeat):
            best["ort"] = min(best["ort"], timed(build_ort, data))
            best["minfer"] = min(best["minfer"], timed(build_minfer, data))
        rows.append((n, best["minfer"], best["ort"]))
        print(f"  {n} nodes: minfer {best['minfer']:.2f} s, onnxruntime {best['ort']:.2f} s", flush=True)
    return rows


def table(rows: list[tuple[int, float, float]]) -> str:
    lines = ["| nodes | minfer build (s) | onnxruntime session (s) | minfer/ORT | minfer s per 1k nodes |",
             "|---:|---:|---:|---:|---:|"]
    for n, m, o in rows:
        lines.append(f"| {n} | {m:.2f} | {o:.2f} | {m / o:.2f} | {1000 * m / n:.3f} |")
    return "\n".join(lines)


def profile(nodes: int, top: int = 25) -> None:
    import cProfile
    import pstats

    data = chain_model(nodes)
    prof = cProfile.Profile()
    prof.runcall(build_minfer, data)
    pstats.Stats(prof).sort_stats("cumulative").print_stats(top)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES), help="chain lengths in nodes")
    parser.add_argument("--repeat", type=int, default=1, help="builds per engine and size; the best is kept")
    parser.add_argument("--profile", type=int, metavar="N", help="print a cProfile of minfer's build at N nodes")
    args = parser.parse_args(argv)
    if args.profile:
        profile(args.profile)
        return
    check(chain_model(len(CYCLE) * 3))
    rows = measure(args.sizes, args.repeat)
    print(table(rows))


if __name__ == "__main__":
    main()
