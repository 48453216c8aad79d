"""Per-step medians of minfer's float MobileNetV2 and a quantized form of it, their runs interleaved in one process.

``env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python bench/results/session31/steps_pair.py FORMAT [RUNS]
[--preprocess]`` from the checkout (FORMAT qdq|qdq_pc|qoperator|dynamic; ``--preprocess``: onnxruntime's
quant_pre_process first, as bench.quantized's): each run of one engine is followed by a run of the other, so a load
change on the shared machine hits both alike (session 28's steps.py profiles one engine, then the other). Prints
each engine's steps (op, kernel, output) with their medians, then the quantized steps against the float step of
the same output name.
"""

from __future__ import annotations

import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "session28"))

import steps as profiler  # noqa: E402  (session 28's per-step profiler: its patched executors and kernel names)

from bench import models as bench_models  # noqa: E402
from bench.quantized import quantize  # noqa: E402


def base(name: str) -> str:
    """An output's name less the quantizer's suffixes (clip_95_QuantizeLinear_Output_centered -> clip_95)."""
    found = re.match(r"([a-z]+_\d+)", name)
    return found.group(1) if found else name


def interleaved(engines: dict[str, Any], feeds: dict[str, Any], runs: int) -> tuple[dict, dict]:
    """(per engine its runs' step times, per engine its runs' wall times): five warm runs each, then ``runs`` rounds
    of one run of each engine in turn, its steps timed by session 28's patched executors."""
    for engine in engines.values():
        for _ in range(5):
            engine.run(None, feeds)
    profiler.seq.execute, profiler.ex.execute_team = profiler._timed, profiler._team
    records: dict[str, list[list[float]]] = {k: [] for k in engines}
    walls: dict[str, list[float]] = {k: [] for k in engines}
    for _ in range(runs):
        for label, engine in engines.items():
            profiler.RECORD.clear()
            t0 = time.perf_counter()
            engine.run(None, feeds)
            walls[label].append(time.perf_counter() - t0)
            records[label].append(profiler.RECORD[0])
    return records, walls


def mobilenet_forms(runs: int, name: str = "mobilenet_v2") -> tuple[str, int, Any, Any, dict]:
    """(FORMAT, RUNS, the float model (MobileNetV2, or bench.models' ``name``), its quantized form, feeds) from the
    command line ``FORMAT [RUNS] [--preprocess]`` (RUNS defaulting to ``runs``; --preprocess: onnxruntime's
    quant_pre_process first; other ``--`` options are the caller's)."""
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    fmt, runs = args[0], int(args[1]) if len(args) > 1 else runs
    model = bench_models.build(name, 1)
    model.ir_version = bench_models.ORT_IR_VERSION
    feeds = bench_models.random_feeds(model)
    qmodel = quantize(model, fmt, feeds, Path(tempfile.mkdtemp()) / fmt, "--preprocess" in sys.argv)
    return fmt, runs, model, qmodel, feeds


def main() -> None:
    from minfer_core import Engine

    fmt, runs, model, qmodel, feeds = mobilenet_forms(60)
    engines = {"float": Engine(model), fmt: Engine(qmodel)}
    records, walls = interleaved(engines, feeds, runs)
    rows: dict[str, list[tuple[float, str, str, str]]] = {}
    for label, engine in engines.items():
        medians = [statistics.median(ts) * 1e6 for ts in zip(*records[label])]
        nodes = engine.executor.program.step_nodes
        bound = engine.executor.plans.bound[engine.executor.plans.last]
        rows[label] = [(t, n.op_type, profiler.kernel_name(s), ",".join(n.outputs)) for t, n, s in zip(medians, nodes, bound)]
        print(f"== {label}: wall median {statistics.median(walls[label]) * 1e6:.0f} us, sum of step medians "
              f"{sum(medians):.0f}")
        for i, (t, op, kn, out) in enumerate(rows[label]):
            print(f"{i:3d} {t:8.1f}  {op:<20} {kn:<36} {out[:34]}")
    floats = {base(out): (t, kn) for t, _, kn, out in rows["float"]}
    print(f"== {fmt} against float, by output")
    for t, op, kn, out in rows[fmt]:
        f = floats.get(base(out))
        tail = f"float {f[0]:7.1f} {f[1]:<26} diff {t - f[0]:+7.1f}" if f else "(no float step)"
        print(f"{base(out):<26} {t:7.1f} {op:<18} {kn:<28} {tail}")


if __name__ == "__main__":
    main()
