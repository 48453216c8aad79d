"""minfer vs onnxruntime vs onnx's ReferenceEvaluator: latency, ratios, memory.

    .venv/bin/python -m bench.benchmark                      # everything (~10 min on 2 cores)
    .venv/bin/python -m bench.benchmark --models resnet50 vgg19 --batches 1

For each model and batch size the three engines run in the same process on
the same feeds. minfer and onnxruntime alternate in rounds (so load from
other processes hits both alike) with a pause before each block: OpenBLAS
and onnxruntime worker threads spin ~0.1 s after a call and would steal a
core from whatever runs next. Medians are reported. Peak memory is measured
in a fresh process per engine (bench/memprobe.py). Results go to stdout as a
markdown table and to ``bench/results/latest.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from bench.models import LIGHT, build, models
from bench.progress import Progress

PAUSE = 0.25  # seconds between engines: longer than the BLAS/ORT spin-wait
# untimed runs of each engine before the rounds: minfer plans a shape on its first run, and with a process
# team (--parallel processes) times what to share and team against threads over its next 9 runs
WARMUP = 10
RESULTS = Path(__file__).parent / "results"
Runner = Callable[[dict[str, np.ndarray]], Any]


def make_session(engine: str, blob: bytes, threads: int | str = 2) -> tuple[Runner, dict[str, np.ndarray]]:
    """A run callable for ``engine`` ("minfer", "onnxruntime", "reference") and random feeds for the model.

    ``threads`` is onnxruntime's intra-op thread count and minfer's intra-op thread count.
    """
    import onnx

    model = onnx.load_from_string(blob)
    feeds = random_feeds(model)
    if engine == "minfer":
        import minfer_core

        sess = minfer_core.InferenceSession(model, threads=threads)
        return (lambda f: sess.run(None, f)), feeds
    if engine == "onnxruntime":
        sess = ort_session(blob, threads if isinstance(threads, int) else 2)
        return (lambda f: sess.run(None, f)), feeds
    if engine == "reference":
        from onnx.reference import ReferenceEvaluator

        ref = ReferenceEvaluator(model)
        return (lambda f: ref.run(None, f)), feeds
    raise ValueError(f"unknown engine {engine!r}")


def ort_session(blob: bytes, threads: int = 2) -> Any:
    """onnxruntime as the issue fixes it: 2 intra-op threads, every graph optimization."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.log_severity_level = 3
    return ort.InferenceSession(blob, opts, providers=["CPUExecutionProvider"])


def random_feeds(model: Any, seed: int = 0) -> dict[str, np.ndarray]:
    from onnx import helper

    inits = {t.name for t in model.graph.initializer}
    rng = np.random.default_rng(seed)
    feeds = {}
    for value in model.graph.input:
        if value.name in inits:
            continue
        t = value.type.tensor_type
        shape = [d.dim_value for d in t.shape.dim]
        feeds[value.name] = rng.standard_normal(shape).astype(helper.tensor_dtype_to_np_dtype(t.elem_type))
    return feeds


def timed(run: Runner, feeds: dict[str, np.ndarray], n: int) -> list[float]:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        run(feeds)
        times.append(time.perf_counter() - t0)
    return times


def bench_model(name: str, batch: int, args: argparse.Namespace, progress: Progress) -> dict[str, Any]:
    """Latency of the three engines, output agreement and minfer's memory plan for one model and batch."""
    label = f"{name} b{batch}"
    progress.stage(f"{label}: building")
    blob = build(name, batch).SerializeToString()
    t0 = time.perf_counter()
    m_run, feeds = make_session("minfer", blob, args.minfer_threads or args.threads)
    build_s = time.perf_counter() - t0
    o_run, _ = make_session("onnxruntime", blob, args.threads)
    got, want = m_run(feeds)[0], o_run(feeds)[0]
    # each engine warms up alone (the first run of each is the one above): right after a run onnxruntime's
    # threads spin on both cores, and minfer's process mode times its choices during these runs
    time.sleep(PAUSE)
    for _ in range(WARMUP - 1):
        m_run(feeds)
    time.sleep(PAUSE)
    for _ in range(WARMUP - 1):
        o_run(feeds)
    row: dict[str, Any] = {"model": name, "batch": batch, "minfer_build_s": round(build_s, 3)}
    row["max_rel_err"] = float(np.abs(got - want).max() / (np.abs(want).max() + 1e-30))
    m_times: list[float] = []
    o_times: list[float] = []
    for r in range(args.rounds):
        for engine, run, times in (("minfer", m_run, m_times), ("onnxruntime", o_run, o_times)):
            progress.stage(f"{label}: {engine} round {r + 1}/{args.rounds}")
            time.sleep(PAUSE)
            times += timed(run, feeds, args.repeat)
    row["minfer_ms"] = statistics.median(m_times) * 1e3
    row["ort_ms"] = statistics.median(o_times) * 1e3
    row["minfer_over_ort"] = row["minfer_ms"] / row["ort_ms"]
    row["minfer_iqr_ms"] = _iqr(m_times) * 1e3
    row["ort_iqr_ms"] = _iqr(o_times) * 1e3
    row.update(_memory_plan(m_run, feeds))
    if args.ref:
        progress.stage(f"{label}: ReferenceEvaluator")
        r_run, _ = make_session("reference", blob)
        time.sleep(PAUSE)
        row["ref_ms"] = statistics.median(timed(r_run, feeds, args.ref_repeat)) * 1e3
        row["ref_over_minfer"] = row["ref_ms"] / row["minfer_ms"]
        # onnxruntime's own speed-up over the reference, measured alike: what the 50x asks of minfer
        # is more than onnxruntime does on the GEMM-bound models (their convs and GEMMs run in BLAS in both)
        row["ref_over_ort"] = row["ref_ms"] / row["ort_ms"]
    if args.memory:
        for engine in ("minfer", "onnxruntime"):
            progress.stage(f"{label}: peak memory of {engine} (fresh process)")
            threads = args.minfer_threads or args.threads if engine == "minfer" else args.threads
            row.update({f"{engine}_{k}": v for k, v in memprobe(engine, name, batch, threads=threads).items()})
    return row


def _iqr(xs: Sequence[float]) -> float:
    q = statistics.quantiles(xs, n=4) if len(xs) >= 2 else [xs[0]] * 3
    return q[2] - q[0]


def _memory_plan(run: Runner, feeds: dict[str, np.ndarray]) -> dict[str, Any]:
    sess = run.__closure__[0].cell_contents  # type: ignore[union-attr]  # the InferenceSession make_session built
    rep = sess.memory_report()
    mib = 1 << 20
    return {
        "arena_mib": rep["arena_bytes"] / mib,
        "live_set_mib": rep["live_set_bytes"] / mib,
        "naive_mib": rep["naive_bytes"] / mib,
        "arena_over_live": rep["arena_over_live_set"],
        "allocated_arena_mib": rep["allocated_arena_bytes"] / mib,
        "arena_backed": f"{rep['arena_backed_buffers']}/{rep['buffers']}",
        "steps": rep["steps"],
    }


def memprobe(engine: str, name: str, batch: int, runs: int = 3, threads: int | str = 2) -> dict[str, Any]:
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run(
        [sys.executable, "-m", "bench.memprobe", engine, name, str(batch), str(runs), str(threads)],
        cwd=root, capture_output=True, text=True, timeout=600,
    )
    if out.returncode != 0:
        return {"memprobe_error": out.stderr.strip().splitlines()[-1:]}
    data = json.loads(out.stdout.strip().splitlines()[-1])
    return {k: data[k] for k in ("weights_mb", "build_mb", "peak_mb", "run_peak_mb", "worker_private_mb") if k in data}


def loop_overhead(nodes: int = 2000, repeat: int = 30) -> dict[str, float]:
    """Per-node cost of the run loop on a chain of tiny Add nodes, minus the kernels' own cost."""
    import minfer_core
    from onnx import TensorProto, helper

    chain = [helper.make_node("Add", [f"v{i}", "one"], [f"v{i + 1}"]) for i in range(nodes)]
    graph = helper.make_graph(
        chain, "chain",
        [helper.make_tensor_value_info("v0", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info(f"v{nodes}", TensorProto.FLOAT, [4])],
        [helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    sess = minfer_core.InferenceSession(model, passes="none")
    feeds = {"v0": np.zeros(4, np.float32)}
    sess.run(None, feeds)
    engine_s = min(timed(lambda f: sess.run(None, f), feeds, repeat))
    bound = sess.executor.plans.bound
    fns = [(step[0], step[1]) for step in bound[next(iter(bound))]]
    one = sess.graph.initializers["one"]

    def direct(_: Any) -> None:
        x = feeds["v0"]
        for fn, _ins in fns:
            x = fn(x, one)

    direct_s = min(timed(direct, feeds, repeat))
    return {
        "nodes": nodes,
        "per_node_us": engine_s / nodes * 1e6,
        "kernel_us": direct_s / nodes * 1e6,
        "overhead_us": (engine_s - direct_s) / nodes * 1e6,
    }


def geomean(xs: Sequence[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def summarize(rows: list[dict[str, Any]], batches: Sequence[int]) -> dict[str, Any]:
    """Geo-mean and worst minfer/onnxruntime ratio over the light models per batch; worst ref speed-up."""
    out: dict[str, Any] = {}
    for b in batches:
        light = [r for r in rows if r["batch"] == b and r["model"] in LIGHT]
        if light:
            ratios = [r["minfer_over_ort"] for r in light]
            worst = max(light, key=lambda r: r["minfer_over_ort"])
            out[f"b{b}"] = {
                "geomean_minfer_over_ort": geomean(ratios),
                "max_minfer_over_ort": worst["minfer_over_ort"],
                "max_model": worst["model"],
                "models": len(light),
            }
    refs = [r["ref_over_minfer"] for r in rows if "ref_over_minfer" in r]
    if refs:
        out["min_ref_over_minfer"] = min(refs)
    ort_refs = [r for r in rows if "ref_over_ort" in r]
    if ort_refs:
        out["ort_below_50x"] = [f"{r['model']} b{r['batch']} {r['ref_over_ort']:.0f}x"
                                for r in sorted(ort_refs, key=lambda r: r["ref_over_ort"]) if r["ref_over_ort"] < 50]
    return out


def blas_setting() -> str:
    """Which kernels numpy's BLAS runs: threadpoolctl's ``architecture`` of each BLAS loaded, and the pin.

    The environment pins this project's machines to OpenBLAS's Haswell (AVX2) kernels for old OpenBLAS
    builds (OPENBLAS_CORETYPE), about half onnxruntime's GEMM rate on their AVX-512 CPUs; users' machines
    have no such pin. The benchmark command unsets it (README), and a run's figures compare only with runs
    under the same setting.
    """
    import numpy as np  # noqa: F401  (loads the BLAS threadpoolctl inspects)
    from threadpoolctl import threadpool_info

    archs = [f"{i.get('internal_api')} {i.get('version')} {i.get('architecture')}" for i in threadpool_info()
             if i.get("user_api") == "blas"]
    pin = os.environ.get("OPENBLAS_CORETYPE")
    return f"{', '.join(archs) or 'no BLAS found'} ({'OPENBLAS_CORETYPE=' + pin if pin else 'not pinned'})"


def markdown(rows: list[dict[str, Any]], summary: dict[str, Any], overhead: dict[str, float] | None,
             blas: str | None = None) -> str:
    head = ("| model | b | minfer ms | ORT ms | ref ms | minfer/ORT | ref/minfer | ref/ORT | arena MiB | live-set MiB "
            "| naive MiB | arena/live | minfer peak MB | ORT peak MB | minfer run MB | ORT run MB |")
    lines = [head, "|" + "---|" * 16]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['batch']} | {r['minfer_ms']:.1f} | {r['ort_ms']:.1f} | {_f(r.get('ref_ms'), 0)} "
            f"| {r['minfer_over_ort']:.2f} | {_f(r.get('ref_over_minfer'), 1)} | {_f(r.get('ref_over_ort'), 1)} "
            f"| {r['arena_mib']:.2f} "
            f"| {r['live_set_mib']:.2f} | {r['naive_mib']:.1f} | {r['arena_over_live']:.3f} "
            f"| {_f(r.get('minfer_peak_mb'), 1)} | {_f(r.get('onnxruntime_peak_mb'), 1)} "
            f"| {_f(r.get('minfer_run_peak_mb'), 1)} | {_f(r.get('onnxruntime_run_peak_mb'), 1)} |"
        )
    for key, s in summary.items():
        if key.startswith("b"):
            lines.append(
                f"\nbatch {key[1:]}: geo-mean minfer/ORT {s['geomean_minfer_over_ort']:.2f} over {s['models']} light models, "
                f"worst {s['max_minfer_over_ort']:.2f} ({s['max_model']})"
            )
    if "min_ref_over_minfer" in summary:
        lines.append(f"slowest speed-up over ReferenceEvaluator: {summary['min_ref_over_minfer']:.1f}x")
    if summary.get("ort_below_50x"):
        lines.append("onnxruntime's own speed-up over ReferenceEvaluator is below 50x on: "
                     + ", ".join(summary["ort_below_50x"]))
    if blas:
        lines.append(f"numpy's BLAS (threadpoolctl): {blas}")
    if overhead:
        lines.append(
            f"run loop: {overhead['per_node_us']:.2f} us/node on a {overhead['nodes']}-node chain of tiny Adds, "
            f"of which the kernels {overhead['kernel_us']:.2f} us: overhead {overhead['overhead_us']:.2f} us/node"
        )
    return "\n".join(lines)


def _f(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def run_benchmark(
    names: Sequence[str] | None = None,
    batches: Sequence[int] = (1, 8),
    *,
    repeat: int = 5,
    rounds: int = 3,
    threads: int = 2,
    minfer_threads: int | str | None = "auto",
    ref: bool = True,
    ref_repeat: int = 1,
    memory: bool = True,
    overhead: bool = True,
    progress: Progress | None = None,
    parallel: str | None = None,
) -> dict[str, Any]:
    """Benchmark ``names`` (default: the nine light models and the transformer block) at ``batches``.

    ``parallel`` sets minfer's ``parallel=`` mode through MINFER_PARALLEL, which the fresh memory-probe
    processes inherit too.
    """
    if parallel:
        os.environ["MINFER_PARALLEL"] = parallel
    args = argparse.Namespace(repeat=repeat, rounds=rounds, ref=ref, ref_repeat=ref_repeat, memory=memory, threads=threads,
                              minfer_threads=minfer_threads)
    todo = [(n, b) for b in batches for n in models(list(names) if names else None)]
    progress = progress or Progress(len(todo))
    load_before = os.getloadavg()
    rows = []
    for name, batch in todo:
        progress.next(f"{name} b{batch}")
        rows.append(bench_model(name, batch, args, progress))
        progress.done(f"{name} b{batch}: minfer {rows[-1]['minfer_ms']:.1f} ms, ORT {rows[-1]['ort_ms']:.1f} ms, "
                      f"ratio {rows[-1]['minfer_over_ort']:.2f}")
    loop = loop_overhead() if overhead else None
    return {
        "rows": rows,
        "summary": summarize(rows, batches),
        "loop_overhead": loop,
        "machine": {"cpus": os.cpu_count(), "loadavg_before": load_before, "loadavg_after": os.getloadavg()},
        "settings": {"repeat": repeat, "rounds": rounds, "ort_threads": threads, "minfer_threads": minfer_threads or threads,
                     "minfer_parallel": os.environ.get("MINFER_PARALLEL", "threads"), "openblas_coretype": blas_setting()},
    }


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``python -m bench.benchmark`` (a checkout tool: the installed ``minfer`` CLI has no ``bench``)."""
    parser.add_argument("--models", nargs="*", help="subset of the light model names (resnet50, ...) and transformer")
    parser.add_argument("--batches", nargs="*", type=int, default=[1, 8])
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per engine per round")
    parser.add_argument("--rounds", type=int, default=3, help="alternating minfer/onnxruntime rounds")
    parser.add_argument("--threads", type=int, default=2, help="onnxruntime's intra-op threads")
    parser.add_argument("--minfer-threads", type=_thread_count, default="auto",
                        help="numpy BLAS threads for minfer: a count or 'auto' (default; see minfer_parallel)")
    parser.add_argument("--parallel", choices=("threads", "processes"), default=None,
                        help="how minfer's kernels split their work (default: MINFER_PARALLEL, else threads)")
    parser.add_argument("--ref-repeat", type=int, default=1, help="timed ReferenceEvaluator runs")
    parser.add_argument("--no-ref", action="store_true", help="skip the ReferenceEvaluator")
    parser.add_argument("--no-memory", action="store_true", help="skip the fresh-process peak memory probes")
    parser.add_argument("--json", default=None, help="where to write the results (default bench/results/latest.json)")


def _thread_count(text: str) -> int | str:
    return text if text == "auto" else int(text)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.benchmark", description=__doc__.splitlines()[0])
    add_bench_arguments(parser)
    return run_from_args(parser.parse_args(argv))


def run_from_args(args: argparse.Namespace) -> int:
    """Run the benchmark for parsed command-line options; print and save the results."""
    result = run_benchmark(
        args.models, args.batches, repeat=args.repeat, rounds=args.rounds, threads=args.threads,
        minfer_threads=args.minfer_threads, ref=not args.no_ref,
        ref_repeat=args.ref_repeat, memory=not args.no_memory, parallel=args.parallel,
    )
    out = Path(args.json or RESULTS / "latest.json")
    text = markdown(result["rows"], result["summary"], result["loop_overhead"], result["settings"]["openblas_coretype"])
    print(text)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    out.with_suffix(".md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
