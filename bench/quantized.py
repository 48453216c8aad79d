"""Quantized models in minfer: latency against onnxruntime and against minfer's float model, and weight bytes held.

``python -m bench.quantized [--models resnet50,mobilenet_v2,transformer] [--formats qdq,qdq_pc,qoperator,dynamic]
[--repeat 20] [--threads auto] [--preprocess]``
(run from the checkout). Each float model (bench.models: light resnet50 with random weights, the test suite's
MobileNetV2, the transformer block) goes through onnxruntime's quantizer in each format (QDQ per tensor and per
channel, QOperator, dynamic; static ones calibrated on three random inputs). Per model and format it prints:

- minfer's latency on the quantized model, onnxruntime's on the same quantized model (ORT_ENABLE_ALL, its
  int8 kernels), and minfer's on the float model: medians of ``--repeat`` runs, the sessions' runs
  interleaved (one run of each in turn), so a load change on a shared machine hits them all alike;
- the CPU time of minfer's quantized run against its float run (the ratio a loaded machine disturbs least);
- onnxruntime's quantized run against its own float run (``ort q/float``, timed in the same turns): what its int8
  kernels gain on this machine, the yardstick for minfer's ``vs float``;
- the bytes of the numpy arrays the built minfer engine keeps (its weights as held: initializers, packed copies,
  kernels' constants; `held_array_bytes`) for the quantized and the float model, before any run (the per-run
  scratch a quantized kernel dequantizes a layer's weights into is not counted: one layer's, per thread).

Figures from a machine other processes load are noise beyond ~10%: the script prints the load average before
and after; quote it with the figures.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time
import types
import weakref
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import onnx

from bench import models as bench_models

MODELS = ("resnet50", "mobilenet_v2", "transformer")
FORMATS = ("qdq", "qdq_pc", "qoperator", "dynamic")


def quantize(model: onnx.ModelProto, fmt: str, feeds: dict[str, np.ndarray], folder: Path,
             preprocess: bool = False) -> onnx.ModelProto:
    """``model`` through onnxruntime's quantizer in format ``fmt`` (static ones calibrated on random inputs), after
    onnxruntime's quant_pre_process (BatchNormalization folded into the convs, as its docs advise) if asked."""
    sys.path.insert(0, str(bench_models.TESTS))
    from modelkit import quantized_by_onnxruntime

    if fmt != "dynamic" and model.opset_import[0].version < 13:  # per-axis DequantizeLinear needs opset 13
        model = onnx.version_converter.convert_version(model, 13)
        model.ir_version = bench_models.ORT_IR_VERSION
    folder.mkdir(parents=True, exist_ok=True)
    if preprocess:
        from onnxruntime.quantization.shape_inference import quant_pre_process

        onnx.save(model, folder / "raw.onnx")
        quant_pre_process(str(folder / "raw.onnx"), str(folder / "pre.onnx"), skip_symbolic_shape=True)
        model = onnx.load(folder / "pre.onnx")
        model.ir_version = bench_models.ORT_IR_VERSION
    if fmt == "dynamic":
        return quantized_by_onnxruntime(model, folder, "dynamic")
    (name, x), = feeds.items()
    kind = "QOperator" if fmt == "qoperator" else "QDQ"
    return quantized_by_onnxruntime(model, folder, kind, x.shape, per_channel=fmt == "qdq_pc")


WEAK_PROXIES = (weakref.ProxyType, weakref.CallableProxyType)  # type() reads a dead one; isinstance() raises


def held_array_bytes(root: Any) -> int:
    """The bytes of the numpy arrays reachable from ``root`` (an engine): its weights as held, counted once each.

    Follows references as the garbage collector sees them, except into modules, classes and functions'
    globals (shared by every engine) and through weak proxies (which hold nothing, and may outlive what they
    point to: numba's typing caches keep some); an array that views another array or a bytes object (an initializer
    read from the model's raw data) counts that buffer once. The executor's arena (the planned intermediates,
    which an engine of a model with static inputs makes at build) is not a weight: it is left out.
    """
    arena = getattr(getattr(getattr(root, "executor", None), "plans", None), "arena", None)
    seen: set[int] = set()
    buffers: dict[int, int] = {}
    todo = [root]
    while todo:
        obj = todo.pop()
        if type(obj) in WEAK_PROXIES or id(obj) in seen or isinstance(obj, (type, types.ModuleType)):
            continue
        seen.add(id(obj))
        if isinstance(obj, np.ndarray):
            base = obj
            while isinstance(base.base, np.ndarray):
                base = base.base
            owner = base.base if base.base is not None else base
            if owner is arena:  # the planned buffers are views of it
                continue
            size = len(owner) if isinstance(owner, (bytes, bytearray)) else base.nbytes
            buffers[id(owner)] = max(buffers.get(id(owner), 0), size)
            continue
        if isinstance(obj, types.FunctionType):
            todo.extend(c.cell_contents for c in obj.__closure__ or () if _filled(c))
            todo.extend([obj.__defaults__, obj.__kwdefaults__])
            continue
        todo.extend(gc.get_referents(obj))
    return sum(buffers.values())


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents
    except ValueError:  # an empty cell
        return False
    return True


def minfer_runner(model: onnx.ModelProto, threads: Any) -> tuple[Callable[[dict], Any], int]:
    from minfer_core import Engine

    engine = Engine(model, threads=threads)
    return (lambda feeds: engine.run(None, feeds)), held_array_bytes(engine)


def ort_runner(model: onnx.ModelProto, threads: Any) -> Callable[[dict], Any]:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    # onnxruntime's pool threads spin for a while after each run: interleaved, they would slow the next session's
    # run (measured: minfer's float transformer block 3.0 -> 5-6.6 ms right after an onnxruntime run)
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if threads != "auto":
        opts.intra_op_num_threads = threads
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return lambda feeds: sess.run(None, feeds)


def interleaved(runners: dict[str, Callable[[dict], Any]], feeds: dict[str, np.ndarray], repeat: int) -> dict[str, float]:
    """Median milliseconds of each runner (wall clock, and ``NAME_cpu``: this process's CPU time, which other
    processes' load disturbs less), the runners taking turns run by run (after two warm-up runs each)."""
    for run in runners.values():
        run(feeds)
        run(feeds)
    times: dict[str, list[float]] = {key: [] for name in runners for key in (name, f"{name}_cpu")}
    for _ in range(repeat):
        for name, run in runners.items():
            c0, t0 = time.process_time(), time.perf_counter()
            run(feeds)
            times[name].append(1e3 * (time.perf_counter() - t0))
            times[f"{name}_cpu"].append(1e3 * (time.process_time() - c0))
    return {key: statistics.median(ts) for key, ts in times.items()}


def bench_model(name: str, formats: Sequence[str], repeat: int, threads: Any, folder: Path,
                preprocess: bool = False) -> list[dict[str, Any]]:
    """One row per format: latencies (ms) and array bytes for the quantized and the float model."""
    model = bench_models.build(name, 1)
    model.ir_version = bench_models.ORT_IR_VERSION  # the light models say 3, with initializers not among the inputs
    feeds = bench_models.random_feeds(model)
    float_run, float_bytes = minfer_runner(model, threads)
    ort_float_run = ort_runner(model, threads)
    rows = []
    for fmt in formats:
        qmodel = quantize(model, fmt, feeds, folder / f"{name}-{fmt}", preprocess)
        q_run, q_bytes = minfer_runner(qmodel, threads)
        # onnxruntime's float model too: its own quantized/float ratio on this machine, the yardstick for ours
        ms = interleaved({"minfer": q_run, "ort": ort_runner(qmodel, threads), "float": float_run,
                          "ort_float": ort_float_run}, feeds, repeat)
        rows.append({"model": name, "format": fmt, **ms, "q_mb": q_bytes / 1e6, "float_mb": float_bytes / 1e6})
        print(_line(rows[-1]), flush=True)
    return rows


HEADER = (f"{'model':<13} {'format':<10} {'minfer ms':>9} {'ort ms':>8} {'float ms':>8} {'vs ort':>7} {'vs float':>8} "
          f"{'cpu vs float':>12} {'ort q/float':>11} {'q MB':>7} {'float MB':>8} {'bytes':>6}")


def _line(r: dict[str, Any]) -> str:
    return (f"{r['model']:<13} {r['format']:<10} {r['minfer']:>9.2f} {r['ort']:>8.2f} {r['float']:>8.2f} "
            f"{r['minfer'] / r['ort']:>6.2f}x {r['minfer'] / r['float']:>7.2f}x {r['minfer_cpu'] / r['float_cpu']:>11.2f}x {r['ort'] / r['ort_float']:>10.2f}x "
            f"{r['q_mb']:>7.1f} {r['float_mb']:>8.1f} {r['q_mb'] / r['float_mb']:>5.2f}x")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.quantized", description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--formats", default=",".join(FORMATS), help=f"comma-separated, of {', '.join(FORMATS)}")
    parser.add_argument("--repeat", type=int, default=20, help="interleaved runs per session (median)")
    parser.add_argument("--threads", default="auto", help="intra-op threads of both engines (default: their own)")
    parser.add_argument("--preprocess", action="store_true",
                        help="run onnxruntime's quant_pre_process (folds BatchNormalization) before quantizing")
    args = parser.parse_args(argv)
    if args.threads != "auto":
        if not args.threads.isdigit() or int(args.threads) < 1:
            parser.error(f"--threads {args.threads}: expected a positive integer or auto")
        args.threads = int(args.threads)
    names, formats = args.models.split(","), args.formats.split(",")
    for given, known, what in ((names, MODELS, "model"), (formats, FORMATS, "format")):
        unknown = [g for g in given if g not in known]
        if unknown:
            parser.error(f"unknown {what} {', '.join(unknown)}: choose from {', '.join(known)}")
    import onnxruntime as ort

    ort.set_default_logger_severity(3)  # the light models list initializers among their inputs: a warning each
    print(f"load average before: {os.getloadavg()[0]:.2f} (figures from a loaded machine are noise beyond ~10%)")
    print(HEADER)
    with tempfile.TemporaryDirectory(prefix="minfer-quantized-") as tmp:
        for name in names:
            bench_model(name, formats, args.repeat, args.threads, Path(tmp), args.preprocess)
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
