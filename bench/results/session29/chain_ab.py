"""A QDQ DequantConv's rounding chain on pointwise.py's blocks against once after the sums.

One engine of MobileNetV2 QDQ whose pointwise kernels toggle between the two paths (their `quant.Chains`
answering None: the epilogue then runs once after the sums, as before this session), per-step medians over ten
alternations of 20 runs, and the run's medians. liveconv.py's kernels (the other DequantConvs) are not toggled.

``env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python bench/results/session29/chain_ab.py`` from the
checkout.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "session28"))

import steps  # noqa: E402  (session 28's per-step profiler)
from minfer_ops_numba import pointwise, quant  # noqa: E402

from bench import models as bench_models  # noqa: E402
from bench.quantized import quantize  # noqa: E402

ON = [True]


class Toggled(quant.Chains):
    """pointwise.py's chains, answering None (no chain on the blocks) while ON[0] is False."""

    def of(self, epilogue):
        return super().of(epilogue) if ON[0] else None


def main() -> None:
    from minfer_core import Engine

    pointwise.Chains = Toggled  # before the engine prepares its kernels
    model = bench_models.build("mobilenet_v2", 1)
    model.ir_version = bench_models.ORT_IR_VERSION
    feeds = bench_models.random_feeds(model)
    engine = Engine(quantize(model, "qdq", feeds, Path(tempfile.mkdtemp()) / "qdq"))
    for _ in range(5):
        engine.run(None, feeds)
    per_step: dict[bool, list[list[float]]] = {True: [], False: []}
    walls: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(10):
        for on in (True, False):
            ON[0] = on
            for _ in range(3):
                engine.run(None, feeds)
            per_step[on].append(steps.profile(engine, feeds, 20))
            for _ in range(20):
                start = time.perf_counter()
                engine.run(None, feeds)
                walls[on].append(time.perf_counter() - start)
    medians = {on: [statistics.median(ts) for ts in zip(*per_step[on])] for on in per_step}
    for i, node in enumerate(engine.executor.program.step_nodes):
        if node.op_type == "DequantConv":
            print(f"{node.outputs[0]:12s} blocks {medians[True][i]:7.1f}  after {medians[False][i]:7.1f} us")
    print("sum of step medians: blocks", round(sum(medians[True])), "after", round(sum(medians[False])))
    print("run median: blocks", round(statistics.median(walls[True]) * 1e6), "after",
          round(statistics.median(walls[False]) * 1e6))


if __name__ == "__main__":
    main()
