"""Issue 16's "no first-run cliff": first and early runs against the steady median, in fresh processes.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python -m bench.firstrun_probe [--models M ...]
        [--repeats 3] [--runs 10] [--threads 2] [--compare DIR] [--clock wall|cpu] [--modes fresh shapes]

Per model and repeat (models and repeats interleaved, so a burst of load from elsewhere spreads over all):

- ``cold``: a fresh process over an empty ``MINFER_CACHE`` builds a session and runs the model ``runs`` times;
- ``warm``: a second fresh process over the same folder (the tuning choices the first stored);
- ``shapes-cold`` / ``shapes-warm``: the same two with a symbolic batch (the OCR recognizer: a symbolic width),
  one session run on each new shape in turn (SHAPES) inside the process.

Printed per row: first/median and max(runs 2..)/median, medians over the repeats (the issue's bounds: 5x cold,
2x warm, 1.5x for later runs), the steady median in ms, and the session's build in seconds (a model with static
inputs is warmed up by a run on zeros at build: the first run's planning and timing moved there). ``--compare DIR``: every process also runs once with
``PYTHONPATH=DIR`` (a copy of packages as they were: the "before" of an A/B), interleaved with the checkout's.
Rows marked "/cpu" (``--clock cpu``: "/wall") use the process's CPU time per run: on a loaded machine a
2-thread run's wall time is mostly waiting for a descheduled thread. ``--modes`` picks the fresh-process rows,
the in-process shapes rows, or both. ``--child`` is the per-process probe (one JSON line).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MODELS = ("squeezenet", "resnet50", "mobilenet_v2", "ocr_recognizer")
# per model: the symbolic dim (input axis, output axes) and the sizes a session meets in turn
SHAPES: dict[str, tuple[int, int, tuple[int, ...]]] = {"ocr_recognizer": (3, 1, (64, 96, 128))}
BATCHES = (1, 2, 4)


def _symbolic(name: str) -> Any:
    """The model with its batch (the OCR recognizer: its width) symbolic."""
    from bench.models import build

    axis, out_axis, _ = SHAPES.get(name, (0, 0, BATCHES))
    model = build(name, 2)  # batch 2: Reshape targets that fixed the batch at 1 now copy it
    for value in model.graph.input:
        value.type.tensor_type.shape.dim[axis].dim_param = "S"
    for value in model.graph.output:
        dims = value.type.tensor_type.shape.dim
        if len(dims) > out_axis:
            dims[out_axis].dim_param = "T" if axis else "S"
    if axis == 0:
        return model
    for value in model.graph.input:  # the recognizer's batch back to 1
        value.type.tensor_type.shape.dim[0].dim_value = 1
    for value in model.graph.output:
        value.type.tensor_type.shape.dim[0].dim_value = 1
    return model


def _feeds(model: Any, sizes: dict[int, int]) -> dict[str, Any]:
    import numpy as np

    rng = np.random.default_rng(0)
    out = {}
    inits = {t.name for t in model.graph.initializer}
    for value in model.graph.input:
        if value.name in inits:
            continue
        dims = value.type.tensor_type.shape.dim
        shape = tuple(sizes.get(i, d.dim_value or 1) for i, d in enumerate(dims))
        out[value.name] = rng.standard_normal(shape).astype(np.float32)
    return out


def child(name: str, mode: str, runs: int, threads: int | str) -> dict[str, Any]:
    """One fresh process: build, then ``runs`` timed runs per shape (``mode``: "fresh" or "shapes")."""
    import minfer_core
    from bench.models import build

    minfer_core.get_registry()
    if mode == "fresh":
        model = build(name, 1)
        cases = [("b1", _feeds(model, {}))]
    else:
        model = _symbolic(name)
        axis, _, sizes = SHAPES.get(name, (0, 0, BATCHES))
        cases = [(f"{'w' if axis else 'b'}{s}", _feeds(model, {axis: s})) for s in sizes]
    t0 = time.perf_counter()
    sess = minfer_core.InferenceSession(model, threads=threads)
    out: dict[str, Any] = {"build_s": time.perf_counter() - t0, "wall": {}, "cpu": {}}
    for label, feeds in cases:
        walls, cpus = [], []
        for _ in range(runs):
            t0, c0 = time.perf_counter(), time.process_time()
            sess.run(None, feeds)
            walls.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
        out["wall"][label], out["cpu"][label] = walls, cpus
    return out


def _spawn(name: str, mode: str, runs: int, threads: int | str, cache: str, path: str = "") -> dict[str, Any]:
    env = dict(os.environ, MINFER_CACHE=cache, NUMBA_CACHE_DIR=str(Path(cache) / "numba"))
    if path:
        env["PYTHONPATH"] = path
    cmd = [sys.executable, "-m", "bench.firstrun_probe", "--child", name, mode, "--runs", str(runs),
           "--threads", str(threads)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900, env=env)
    if done.returncode:
        raise SystemExit(f"{name} {mode}: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def ratios(times: list[float]) -> tuple[float, float, float]:
    """(first / median, max of runs 2.. / median, median ms) of one shape's run times; the median over runs 2.."""
    med = statistics.median(times[1:])
    return times[0] / med, max(times[1:]) / med, med * 1e3


def measure(models: list[str], repeats: int, runs: int, threads: int | str, compare: str = "",
            clock: str = "wall", modes: tuple[str, ...] = ("fresh", "shapes")) -> dict[tuple[str, ...], list[tuple]]:
    """Per (model, row, shape, variant): the `ratios` of each repeat."""
    rows: dict[tuple[str, str, str, str], list[tuple]] = {}
    variants = [("new", ""), ("base", compare)] if compare else [("new", "")]
    for rep in range(repeats):
        for name in models:
            for mode in modes:
                for variant, path in variants[:: -1 if rep % 2 else 1]:
                    with tempfile.TemporaryDirectory(prefix="minfer-probe-") as cache:
                        for warmth in ("cold", "warm"):
                            got = _spawn(name, mode, runs, threads, cache, path)
                            row = warmth if mode == "fresh" else f"shapes-{warmth}"
                            for shape, times in got[clock].items():
                                # the build's seconds too: a static model's warm-up run moved the first run's work there
                                rows.setdefault((name, row, shape, variant), []).append(ratios(times) + (got["build_s"],))
                                other = "cpu" if clock == "wall" else "wall"
                                rows.setdefault((name, row, shape, f"{variant}/{other}"), []).append(
                                    ratios(got[other][shape]) + (got["build_s"],))
    return rows


def report(rows: dict[tuple[str, str, str, str], list[tuple]]) -> str:
    lines = [f"{'model':<16}{'row':<13}{'shape':<6}{'var':<10}{'first/med':>10}{'max2+/med':>10}{'med ms':>9}"
             f"{'build s':>8}   first/med, max2+/med each repeat"]
    for (name, row, shape, variant), got in sorted(rows.items(), key=lambda kv: kv[0][:3]):
        first, later, med, build_s = (statistics.median(g[k] for g in got) for k in range(4))
        each = " ".join(f"{g[0]:.1f},{g[1]:.1f}" for g in got)
        lines.append(f"{name:<16}{row:<13}{shape:<6}{variant:<10}{first:>10.2f}{later:>10.2f}{med:>9.2f}{build_s:>8.2f}   {each}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="*", default=list(MODELS))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--threads", default="2")
    ap.add_argument("--compare", default="", metavar="DIR")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    ap.add_argument("--modes", nargs="*", choices=("fresh", "shapes"), default=["fresh", "shapes"])
    ap.add_argument("--child", nargs=2, metavar=("MODEL", "MODE"))
    args = ap.parse_args()
    threads: int | str = int(args.threads) if args.threads.isdigit() else args.threads
    if args.child:
        print(json.dumps(child(*args.child, args.runs, threads)))
        return
    print(f"# {time.strftime('%Y-%m-%d %H:%M')} load {os.getloadavg()[0]:.2f}, threads={threads}, runs={args.runs}, "
          f"clock={args.clock}")
    print(report(measure(args.models, args.repeats, args.runs, threads, args.compare, args.clock,
                         tuple(args.modes))))


if __name__ == "__main__":
    main()
