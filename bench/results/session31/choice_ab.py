"""Whether the core's first-run choice between two kernels of a node holds in the run: the engine as tuned against
one whose stored choices name KERNEL_B wherever the tuned run chose KERNEL_A and KERNEL_B was a candidate, their
runs interleaved in one process (session 30's choice_sweep.py profiles one engine after another: noisier).

``env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python bench/results/session31/choice_ab.py FORMAT KERNEL_A
KERNEL_B [RUNS] [--preprocess]`` from the checkout (MobileNetV2; FORMAT float|qdq|qdq_pc|qoperator|dynamic; a kernel
as its module.function, e.g. qconv.float_qlinear_conv): both engines' wall medians, and the flipped nodes' step
medians in each.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "session28"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "session30"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import steps as profiler  # noqa: E402  (session 28's per-step profiler)
from choice_sweep import read_store  # noqa: E402
from steps_pair import interleaved  # noqa: E402  (this folder's)

from bench import models as bench_models  # noqa: E402
from bench.quantized import quantize  # noqa: E402


def main() -> None:
    from minfer_core import Engine
    import minfer_core.tuning as tuning

    args = [a for a in sys.argv[1:] if a != "--preprocess"]
    fmt, kernel_a, kernel_b = args[:3]
    runs = int(args[3]) if len(args) > 3 else 60
    model = bench_models.build("mobilenet_v2", 1)
    model.ir_version = bench_models.ORT_IR_VERSION
    feeds = bench_models.random_feeds(model)
    if fmt != "float":
        model = quantize(model, fmt, feeds, Path(tempfile.mkdtemp()) / fmt, "--preprocess" in sys.argv)
    base = Path(tempfile.mkdtemp())
    os.environ["MINFER_CACHE"] = str(base)
    tuned = Engine(model)
    stored = read_store(base)
    variant, flipped = dict(stored), 0
    for key, chosen in stored.items():
        names = key.rsplit("|", 1)[1].split(",")
        other = [n for n in names if n.endswith(kernel_b)]
        if chosen.endswith(kernel_a) and other:
            variant[key], flipped = other[0], flipped + 1
    print(f"{flipped} of {len(stored)} stored choices flipped from {kernel_a} to {kernel_b}")
    folder = Path(tempfile.mkdtemp())
    (folder / f"tuning-{tuning.fingerprint()}.jsonl").write_text("\n".join(json.dumps([a, b]) for a, b in variant.items()))
    os.environ["MINFER_CACHE"] = str(folder)
    engines = {"tuned": tuned, "flipped": Engine(model)}
    records, walls = interleaved(engines, feeds, runs)
    steps = {}
    for label, engine in engines.items():
        medians = [statistics.median(ts) * 1e6 for ts in zip(*records[label])]
        bound = engine.executor.plans.bound[engine.executor.plans.last]
        steps[label] = {",".join(n.outputs): (t, profiler.kernel_name(s))
                        for t, n, s in zip(medians, engine.executor.program.step_nodes, bound)}
        print(f"{label}: wall median {statistics.median(walls[label]) * 1e6:.0f} us, sum of step medians "
              f"{sum(medians):.0f}")
    for out, (t, kn) in steps["tuned"].items():
        other = steps["flipped"].get(out)
        if other is not None and other[1] != kn:
            print(f"{out[:34]:<34} tuned {t:7.1f} {kn:<28} flipped {other[0]:7.1f} {other[1]}")


if __name__ == "__main__":
    main()
