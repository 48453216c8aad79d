"""How the core's per-node choices (timed in a shape's first run, each candidate alone on the node's inputs) fare in
the run itself: one engine of a model as the core tuned it, then engines whose stored choices name each node's other
candidates (the k-th other candidate of every timed node at once), each profiled step by step in one process.

``env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python bench/results/session30/choice_sweep.py MODEL FORMAT
[RUNS]`` from the checkout (FORMAT float|qdq|qdq_pc|qoperator|dynamic): per timed node its kernel candidates' step
medians in the run, the chosen one marked, and the sum of what the in-run best would save.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "session28"))

import steps as profiler  # noqa: E402  (session 28's per-step profiler)

from bench import models as bench_models  # noqa: E402
from bench.quantized import quantize  # noqa: E402


def read_store(folder: Path) -> dict[str, str]:
    data: dict[str, str] = {}
    for path in folder.glob("tuning-*.jsonl"):
        for line in path.read_text().splitlines():
            if line.strip():
                key, value = json.loads(line)
                data[key] = value
    return data


def main() -> None:
    from minfer_core import Engine
    import minfer_core.tuning as tuning

    name, fmt = sys.argv[1], sys.argv[2]
    runs = int(sys.argv[3]) if len(sys.argv) > 3 else 30
    model = bench_models.build(name, 1)
    model.ir_version = bench_models.ORT_IR_VERSION
    feeds = bench_models.random_feeds(model)
    if fmt != "float":
        model = quantize(model, fmt, feeds, Path(tempfile.mkdtemp()) / fmt)
    base = Path(tempfile.mkdtemp())
    os.environ["MINFER_CACHE"] = str(base)
    tuned = Engine(model)
    profiles = {"tuned": (profiler.profile(tuned, feeds, runs), tuned)}
    stored = read_store(base)
    kernels = {k: v for k, v in stored.items() if "minfer-ops" in k.rsplit("|", 1)[1] and "," in k.rsplit("|", 1)[1]}
    print(f"{len(kernels)} timed kernel choices")
    for k in range(1, 6):
        variant, changed = dict(stored), 0
        for key, chosen in kernels.items():
            others = [n for n in key.rsplit("|", 1)[1].split(",") if n != chosen]
            if len(others) >= k:
                variant[key], changed = others[k - 1], changed + 1
        if not changed:
            break
        folder = Path(tempfile.mkdtemp())
        fp = tuning.fingerprint()
        (folder / f"tuning-{fp}.jsonl").write_text("\n".join(json.dumps([a, b]) for a, b in variant.items()))
        os.environ["MINFER_CACHE"] = str(folder)
        engine = Engine(model)
        profiles[f"other{k}"] = (profiler.profile(engine, feeds, runs), engine)
    rows: dict[str, dict[str, tuple[float, str]]] = {}
    order: list[str] = []
    for label, (times, engine) in profiles.items():
        nodes = engine.executor.program.step_nodes
        bound = engine.executor.plans.bound[engine.executor.plans.last]
        for t, node, step in zip(times, nodes, bound):
            key = ",".join(node.outputs)
            if key not in rows:
                rows[key] = {}
                order.append(key)
            rows[key][label] = (t, profiler.kernel_name(step))
    saved = 0.0
    for key in order:
        row = rows[key]
        if len({kn for _, kn in row.values()}) < 2 or "tuned" not in row:
            continue
        best = min(t for t, _ in row.values())
        saved += row["tuned"][0] - best
        cells = "  ".join(f"{label}={t:7.1f} {kn}" for label, (t, kn) in row.items())
        print(f"{key[:28]:<28} {cells}")
    print(f"in-run best saves {saved:.0f} us of the tuned run's {sum(profiles['tuned'][0]):.0f} us (sum of step medians)")


if __name__ == "__main__":
    main()
