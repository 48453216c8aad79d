"""Per-layer Conv speed: minfer's Conv kernel against onnxruntime's on each conv shape of a model.

    .venv/bin/python -m bench.conv_study resnet50 --batch 1

For every distinct Conv geometry in the model (no passes, so each is a plain
Conv), one single-node model runs in minfer and in onnxruntime (2 threads);
the table gives each one's median time and GFLOP/s, largest gap first, to
show the conv-kernel authors where the time goes.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any, Sequence

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from bench.benchmark import PAUSE, ort_session
from bench.models import ORT_IR_VERSION, build, models


def conv_layers(name: str, batch: int) -> list[dict[str, Any]]:
    """Distinct (input shape, weight shape, attributes) of the model's Conv nodes, with their count."""
    import minfer_core

    model = build(name, batch)
    sess = minfer_core.InferenceSession(model, passes="none")
    graph = sess.graph
    seen: dict[tuple[Any, ...], dict[str, Any]] = {}
    for node in graph.nodes:
        if node.op_type != "Conv":
            continue
        x_t = graph.type_of(node.inputs[0])
        w = graph.type_of(node.inputs[1])
        key = (tuple(x_t.shape), w.shape, tuple(sorted((k, str(v)) for k, v in node.attrs.items())))
        entry = seen.setdefault(key, {"x": tuple(x_t.shape), "w": w.shape, "attrs": dict(node.attrs), "count": 0,
                                      "y": tuple(graph.type_of(node.outputs[0]).shape)})
        entry["count"] += 1
    return list(seen.values())


def single_conv(layer: dict[str, Any]) -> Any:
    rng = np.random.default_rng(0)
    w = (rng.standard_normal(layer["w"]) * 0.1).astype(np.float32)
    b = rng.standard_normal(layer["w"][0]).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], **layer["attrs"])
    graph = helper.make_graph(
        [node], "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(layer["x"]))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(layer["y"]))],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = ORT_IR_VERSION
    return model


def _times(run: Any, feeds: dict[str, np.ndarray], n: int) -> list[float]:
    """``n`` timed runs after a pause and one untimed run (the pause outlasts the other engine's spin-wait)."""
    time.sleep(PAUSE)
    run(feeds)
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        run(feeds)
        times.append(time.perf_counter() - t0)
    return times


def _medians_ms(runs: Sequence[Any], feeds: dict[str, np.ndarray], repeat: int, rounds: int) -> list[float]:
    """Each engine's median over ``rounds`` interleaved blocks of ``repeat`` runs.

    On this shared 2-core machine the other core comes and goes: one block per engine (as this study first
    did) put 2x swings on single layers (resnet50's 512x7x7 3x3 showed 1.43 or 2.65 ms). Interleaved
    rounds expose both engines to the same spells.
    """
    times: list[list[float]] = [[] for _ in runs]
    for _ in range(rounds):
        for run, acc in zip(runs, times):
            acc += _times(run, feeds, repeat)
    return [statistics.median(t) * 1e3 for t in times]


def study(name: str, batch: int, repeat: int, threads: int, rounds: int = 3) -> list[dict[str, Any]]:
    import minfer_core

    rows = []
    for layer in conv_layers(name, batch):
        model = single_conv(layer)
        x = np.random.default_rng(1).standard_normal(layer["x"]).astype(np.float32)
        feeds = {"x": x}
        sess = minfer_core.InferenceSession(model, passes="none", threads=threads)
        ort = ort_session(model.SerializeToString(), threads)
        sess.run(None, feeds)  # minfer times its candidate methods on the first run
        m_ms, o_ms = _medians_ms([lambda f: sess.run(None, f), lambda f: ort.run(None, f)], feeds, repeat, rounds)
        flops = 2 * np.prod(layer["y"]) * np.prod(layer["w"][1:])
        rows.append({**layer, "minfer_ms": m_ms, "ort_ms": o_ms, "gflops_minfer": flops / m_ms / 1e6,
                     "gflops_ort": flops / o_ms / 1e6, "lost_ms": (m_ms - o_ms) * layer["count"]})
    return sorted(rows, key=lambda r: -r["lost_ms"])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.conv_study")
    parser.add_argument("model", choices=[m for m in models() if m != "transformer"])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per round and engine")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of minfer and onnxruntime")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    rows = study(args.model, args.batch, args.repeat, args.threads, args.rounds)
    print("| input | weight | stride/pad/group | n | minfer ms | ORT ms | minfer GF/s | ORT GF/s | total lost ms |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        a = r["attrs"]
        geo = f"s{a.get('strides', [1])[0]} p{a.get('pads', [0])[0]} g{a.get('group', 1)}"
        print(f"| {'x'.join(map(str, r['x']))} | {'x'.join(map(str, r['w']))} | {geo} | {r['count']} "
              f"| {r['minfer_ms']:.2f} | {r['ort_ms']:.2f} | {r['gflops_minfer']:.0f} | {r['gflops_ort']:.0f} "
              f"| {r['lost_ms']:.1f} |")
    total_m = sum(r["minfer_ms"] * r["count"] for r in rows)
    total_o = sum(r["ort_ms"] * r["count"] for r in rows)
    print(f"\nall convs: minfer {total_m:.1f} ms, onnxruntime {total_o:.1f} ms (ratio {total_m / total_o:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
