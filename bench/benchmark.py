"""minfer vs onnxruntime vs onnx's ReferenceEvaluator: latency, first runs, ratios, memory.

    .venv/bin/python -m bench.benchmark                      # everything (see bench/README.md for the time)
    .venv/bin/python -m bench.benchmark --models resnet50 vgg19 --batches 1
    .venv/bin/python -m bench.benchmark --models real        # the real-model set only

For each model and batch size the engines run in the same process on
the same feeds. minfer (with and, when the numba plugin is installed, without
it) and onnxruntime alternate in rounds (so load from other processes hits
them alike) with a pause before each block: OpenBLAS and onnxruntime worker
threads spin ~0.1 s after a call and would steal a core from whatever runs
next. Medians are reported, and the slowest of runs 2..N against them. Peak
memory (bench/memprobe.py) and the first run of the shape, cold and warm
(bench/firstrun.py), are measured in fresh processes. Results go to stdout as
Markdown (bench/report.py) and to ``bench/results/latest.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from bench import firstrun, variants
from bench.models import build, models
from bench.models import random_feeds as random_feeds  # re-exported: ceiling and profile take it from here
from bench.progress import Progress
from bench.report import geomean as geomean, markdown as markdown, summarize

PAUSE = 0.25  # seconds between engines: longer than the BLAS/ORT spin-wait
# untimed runs of each engine before the rounds: minfer plans a shape on its first run, and with a process
# team (--parallel processes) times what to share and team against threads over its next 9 runs
WARMUP = 10
RESULTS = Path(__file__).parent / "results"
Runner = Callable[[dict[str, np.ndarray]], Any]


def make_session(engine: str, blob: bytes, threads: int | str = 2, registry: Any = None) -> tuple[Runner, dict[str, np.ndarray]]:
    """A run callable for ``engine`` ("minfer", "onnxruntime", "reference") and random feeds for the model.

    ``threads`` is onnxruntime's intra-op thread count and minfer's intra-op thread count; ``registry`` minfer's
    plugins (default: every installed one).
    """
    import onnx

    model = onnx.load_from_string(blob)
    feeds = random_feeds(model)
    if engine == "minfer":
        import minfer_core

        extra = {"registry": registry} if registry is not None else {}
        sess = minfer_core.InferenceSession(model, threads=threads, **extra)
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


def timed(run: Runner, feeds: dict[str, np.ndarray], n: int) -> list[float]:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        run(feeds)
        times.append(time.perf_counter() - t0)
    return times


def bench_model(name: str, batch: int, args: argparse.Namespace, progress: Progress) -> dict[str, Any]:
    """Latency of the engines, runs 2..N, output agreement and minfer's memory plan for one model and batch; then
    first runs and peak memory in fresh processes."""
    label = f"{name} b{batch}"
    progress.stage(f"{label}: building")
    blob = build(name, batch).SerializeToString()
    threads = args.minfer_threads or args.threads
    t0 = time.perf_counter()
    engines: dict[str, Runner] = {}
    engines["minfer"], feeds = make_session("minfer", blob, threads, registry=args.registries.get("minfer"))
    build_s = time.perf_counter() - t0
    if "minfer_nonumba" in args.registries:
        engines["minfer_nonumba"], _ = make_session("minfer", blob, threads, registry=args.registries["minfer_nonumba"])
    engines["onnxruntime"], _ = make_session("onnxruntime", blob, args.threads)
    row: dict[str, Any] = {"model": name, "batch": batch, "minfer_build_s": round(build_s, 3)}
    outs, later = {}, {}
    # each engine warms up alone: right after a run onnxruntime's threads spin on both cores, and minfer's
    # process mode times its choices during these runs. Runs 2..N (these and the timed ones) give the worst case.
    for key, run in engines.items():
        time.sleep(PAUSE)
        t0 = time.perf_counter()
        outs[key] = run(feeds)[0]
        row[f"{key}_inprocess_first_ms"] = (time.perf_counter() - t0) * 1e3
        later[key] = timed(run, feeds, WARMUP - 1)
    want = outs["onnxruntime"]
    for key, prefix in (("minfer", ""), ("minfer_nonumba", "nonumba_")):
        if key in outs:
            row[f"{prefix}max_rel_err"] = float(np.abs(outs[key] - want).max() / (np.abs(want).max() + 1e-30))
    times: dict[str, list[float]] = {key: [] for key in engines}
    for r in range(args.rounds):
        for key, run in engines.items():
            progress.stage(f"{label}: {key} round {r + 1}/{args.rounds}")
            time.sleep(PAUSE)
            times[key] += timed(run, feeds, args.repeat)
    for key, ms_key, prefix in ENGINE_KEYS:
        if key in times:
            row[ms_key] = statistics.median(times[key]) * 1e3
            row[f"{ms_key[:-3]}_iqr_ms"] = _iqr(times[key]) * 1e3
            row[f"{prefix}later_max_over_median"] = max(later[key] + times[key]) * 1e3 / row[ms_key]
    row["minfer_over_ort"] = row["minfer_ms"] / row["ort_ms"]
    if "minfer_nonumba_ms" in row:
        row["nonumba_over_ort"] = row["minfer_nonumba_ms"] / row["ort_ms"]
        row["numba_speedup"] = row["minfer_nonumba_ms"] / row["minfer_ms"]
    row.update(_memory_plan(engines["minfer"], feeds))
    if args.ref:
        progress.stage(f"{label}: ReferenceEvaluator")
        r_run, _ = make_session("reference", blob)
        time.sleep(PAUSE)
        row["ref_ms"] = statistics.median(timed(r_run, feeds, args.ref_repeat)) * 1e3
        row["ref_over_minfer"] = row["ref_ms"] / row["minfer_ms"]
        # onnxruntime's own speed-up over the reference, measured alike: what the 50x asks of minfer
        # is more than onnxruntime does on the GEMM-bound models (their convs and GEMMs run in BLAS in both)
        row["ref_over_ort"] = row["ref_ms"] / row["ort_ms"]
    _fresh_processes(row, name, batch, args, progress)
    return row


# engine -> (its median's key, the prefix of its derived keys)
ENGINE_KEYS = (("minfer", "minfer_ms", ""), ("minfer_nonumba", "minfer_nonumba_ms", "nonumba_"), ("onnxruntime", "ort_ms", "ort_"))


def _fresh_processes(row: dict[str, Any], name: str, batch: int, args: argparse.Namespace, progress: Progress) -> None:
    """First runs (cold, warm) and peak memory of each engine variant, each in fresh processes."""
    label = f"{name} b{batch}"
    for key, ms_key, prefix in ENGINE_KEYS:
        if ms_key not in row:
            continue
        engine = "onnxruntime" if key == "onnxruntime" else "minfer"
        threads = args.threads if engine == "onnxruntime" else args.minfer_threads or args.threads
        env = args.envs.get(key)
        if args.first_run:
            progress.stage(f"{label}: first runs of {key} (fresh processes)")
            # without numba the cold first run shows what compiling costs; warm, both variants reuse tuning alike
            got = firstrun.first_runs(engine, name, batch, threads, env, warm=key != "minfer_nonumba")
            row.setdefault("first_run", {})[key] = got
            if "first_ms" in got:
                row[f"{prefix}first_cold_over_median"] = got["first_ms"] / row[ms_key]
            if "warm_first_ms" in got:
                row[f"{prefix}first_warm_over_median"] = got["warm_first_ms"] / row[ms_key]
        if args.memory:
            progress.stage(f"{label}: peak memory of {key} (fresh process)")
            row.update({f"{key}_{k}": v for k, v in memprobe(engine, name, batch, threads=threads, env=env).items()})
    for key, prefix in (("minfer", ""), ("minfer_nonumba", "nonumba_")):
        if row.get(f"{key}_peak_mb") and row.get("onnxruntime_peak_mb"):
            row[f"{prefix}peak_over_ort"] = row[f"{key}_peak_mb"] / row["onnxruntime_peak_mb"]
    if "ort_first_cold_over_median" in row:
        row["ort_first_over_median"] = row.pop("ort_first_cold_over_median")


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


def memprobe(engine: str, name: str, batch: int, runs: int = 3, threads: int | str = 2,
             env: dict[str, str] | None = None) -> dict[str, Any]:
    """Peak memory of ``engine`` on one model in a fresh process (bench/memprobe.py); ``env`` its environment."""
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run(
        [sys.executable, "-m", "bench.memprobe", engine, name, str(batch), str(runs), str(threads)],
        cwd=root, capture_output=True, text=True, timeout=600, env=env,
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


def blas_setting() -> str:
    """Which kernels numpy's BLAS runs: threadpoolctl's ``architecture`` of numpy's BLAS, the pin, and any other.

    The environment pins this project's machines to OpenBLAS's Haswell (AVX2) kernels for old OpenBLAS
    builds (OPENBLAS_CORETYPE), about half onnxruntime's GEMM rate on their AVX-512 CPUs; users' machines
    have no such pin. The benchmark command unsets it (README), and a run's figures compare only with runs
    under the same setting.
    """
    import numpy as np  # noqa: F401  (loads the BLAS threadpoolctl inspects)
    from threadpoolctl import threadpool_info

    blas = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    # numpy's first: another package's BLAS (scipy's, which numba's compiler loads) may be loaded too
    archs = [f"{i.get('internal_api')} {i.get('version')} {i.get('architecture')}"
             for i in sorted(blas, key=lambda i: "numpy" not in str(i.get("filepath")))]
    pin = os.environ.get("OPENBLAS_CORETYPE")
    also = f"; also loaded: {', '.join(archs[1:])}" if len(archs) > 1 else ""
    return f"{archs[0] if archs else 'no BLAS found'} ({'OPENBLAS_CORETYPE=' + pin if pin else 'not pinned'}){also}"


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
    first_run: bool = True,
    numba: str = "both",
    cache_dir: str | None = None,
) -> dict[str, Any]:
    """Benchmark ``names`` (default: the light models and the real-model set; group names "light", "real") at
    ``batches``.

    ``parallel`` sets minfer's ``parallel=`` mode through MINFER_PARALLEL, which the fresh memory-probe
    processes inherit too. ``numba``: "with" runs minfer with every installed plugin, "without" leaves the numba
    plugin out, "both" (when it is installed) measures the two side by side. ``cache_dir`` is minfer's cache
    folder for the run (MINFER_CACHE: stored tuning choices, numba's compiled kernels), by default a new empty
    one: each shape's choices are then made under this run's conditions, not taken from an earlier busier day.
    """
    if parallel:
        os.environ["MINFER_PARALLEL"] = parallel
    todo = [(n, b) for b in batches for n in models(list(names) if names else None)]
    fresh = None if cache_dir else tempfile.mkdtemp(prefix="minfer-bench-cache-")
    before = os.environ.get("MINFER_CACHE")
    os.environ["MINFER_CACHE"] = cache_dir or str(fresh)
    try:
        args = argparse.Namespace(repeat=repeat, rounds=rounds, ref=ref, ref_repeat=ref_repeat, memory=memory,
                                  threads=threads, minfer_threads=minfer_threads, first_run=first_run, **variants.select(numba))
        load_before = os.getloadavg()
        rows = _rows(todo, args, progress or Progress(len(todo)))
        loop = loop_overhead() if overhead else None
    finally:
        os.environ.pop("MINFER_CACHE") if before is None else os.environ.update(MINFER_CACHE=before)
        if fresh:
            shutil.rmtree(fresh, ignore_errors=True)
    return {
        "rows": rows,
        "summary": summarize(rows, batches),
        "loop_overhead": loop,
        "machine": {"cpus": os.cpu_count(), "loadavg_before": load_before, "loadavg_after": os.getloadavg()},
        "settings": {"repeat": repeat, "rounds": rounds, "ort_threads": threads, "minfer_threads": minfer_threads or threads,
                     "minfer_parallel": os.environ.get("MINFER_PARALLEL", "threads"), "openblas_coretype": blas_setting(),
                     "numba": args.numba, "plugins": args.plugins, "minfer_cache": cache_dir or "new and empty"},
    }


def _rows(todo: Sequence[tuple[str, int]], args: argparse.Namespace, progress: Progress) -> list[dict[str, Any]]:
    rows = []
    for name, batch in todo:
        progress.next(f"{name} b{batch}")
        rows.append(bench_model(name, batch, args, progress))
        progress.done(f"{name} b{batch}: minfer {rows[-1]['minfer_ms']:.1f} ms, ORT {rows[-1]['ort_ms']:.1f} ms, "
                      f"ratio {rows[-1]['minfer_over_ort']:.2f}")
    return rows


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``python -m bench.benchmark`` (a checkout tool: the installed ``minfer`` CLI has no ``bench``)."""
    parser.add_argument("--models", nargs="*", help="model names (resnet50, mobilenet_v3_small, ...) or groups: light, real")
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
    parser.add_argument("--no-first-run", action="store_true", help="skip the fresh-process first-run probes")
    parser.add_argument("--numba", choices=("both", "with", "without"), default="both",
                        help="minfer with the numba plugin (minfer-ops-numba), without it, or both side by side "
                             "(the default; with it not installed: minfer as installed)")
    parser.add_argument("--cache-dir", default=None,
                        help="minfer's cache folder for the in-process sessions and memory probes (tuning choices, "
                             "compiled kernels; default: a new empty one; the first-run probes always use their own)")
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
        first_run=not args.no_first_run, numba=args.numba, cache_dir=args.cache_dir,
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
