"""Per-step times of minfer's run of a model's float and quantized forms, in one process (medians over runs).

``python bench/results/session28/steps.py MODEL FORMAT [RUNS [BATCH]]`` from the checkout: each engine's steps (op,
output shape and dtype, kernel) with their median time, the float and quantized runs interleaved.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import minfer_core.sequential as seq  # noqa: E402
import minfer_parallel.executors as ex  # noqa: E402
from minfer_parallel.loops import execute_timed, execute_team  # noqa: E402

from bench import models as bench_models  # noqa: E402
from bench.quantized import quantize  # noqa: E402

RECORD: list[list[float]] = []


def _timed(vals, steps):
    RECORD.append(execute_timed(vals, steps))


def _team(vals, steps, flags, team, times=None):
    t = [0.0] * len(steps)
    execute_team(vals, steps, flags, team, t)
    RECORD.append(t)


def engine_steps(engine):
    ex_ = engine.executor
    return ex_.program.step_nodes


def kernel_name(step) -> str:
    fn = step[0]
    for _ in range(6):
        inner = getattr(fn, "func", None) or getattr(fn, "fn", None)
        if inner is None:
            break
        fn = inner
    return f"{getattr(fn, '__module__', '?').split('.')[-1]}.{getattr(fn, '__name__', type(fn).__name__)}"


def profile(engine, feeds, runs):
    for _ in range(5):
        engine.run(None, feeds)
    seq.execute, ex.execute_team = _timed, _team
    RECORD.clear()
    try:
        for _ in range(runs):
            engine.run(None, feeds)
    finally:
        seq.execute, ex.execute_team = orig_seq, orig_team
    per_step = [statistics.median(ts) * 1e6 for ts in zip(*RECORD)]
    walls = []
    for _ in range(runs):
        t0 = time.perf_counter()
        engine.run(None, feeds)
        walls.append(time.perf_counter() - t0)
    print(f"engine.run median {statistics.median(walls) * 1e6:.0f} us (unpatched)")
    return per_step


orig_seq, orig_team = seq.execute, ex.execute_team


def main() -> None:
    from minfer_core import Engine

    name, fmt = sys.argv[1], sys.argv[2]
    runs = int(sys.argv[3]) if len(sys.argv) > 3 else 30
    batch = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    model = bench_models.build(name, batch)
    model.ir_version = bench_models.ORT_IR_VERSION
    feeds = bench_models.random_feeds(model)
    engines = {"float": Engine(model)}
    if fmt != "float":
        engines[fmt] = Engine(quantize(model, fmt, feeds, Path(tempfile.mkdtemp()) / fmt))
    for label, engine in engines.items():
        times = profile(engine, feeds, runs)
        nodes = engine.executor.program.step_nodes
        steps = engine.executor.plans.bound[engine.executor.plans.last]
        total = 0.0
        print(f"== {label}: {len(times)} steps, sum of medians {sum(times):.0f} us")
        for i, (t, node) in enumerate(zip(times, nodes)):
            total += t
            print(f"{i:3d} {t:8.1f} {total:8.0f}  {node.op_type:<22} {kernel_name(steps[i]):<40} {','.join(node.outputs)[:30]}")


if __name__ == "__main__":
    main()
