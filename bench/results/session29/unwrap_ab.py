"""What the per-run view check cost a quantized model: one engine's bound steps as planned (each step whose
kernels did not all declare ``views=False`` wrapped in the core's `_FreshOutputs` check) against the same
engine's steps unwrapped, run alternately in one process (medians of 300 runs each).

From this session on the quantized kernels declare ``views=False`` and no such step is left to unwrap, so run it
against the commit before (a worktree of 2558648, its plugins first on the path)::

    git worktree add /tmp/base 2558648 && cd /tmp/base
    PYTHONPATH=plugins/minfer_ops_numba:plugins/minfer_ops_conv:plugins/minfer_ops_basic:. \\
        env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE /work/main/.venv/bin/python \\
        /work/main/bench/results/session29/unwrap_ab.py mobilenet_v2 qdq,qoperator,dynamic
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path.cwd()))

from bench import models as bench_models  # noqa: E402
from bench.quantized import quantize  # noqa: E402
from minfer_core import Engine  # noqa: E402
from minfer_core.plan import Steps, _FreshOutputs  # noqa: E402


def main() -> None:
    name, formats = sys.argv[1], sys.argv[2].split(",")
    model = bench_models.build(name, 1)
    model.ir_version = bench_models.ORT_IR_VERSION
    feeds = bench_models.random_feeds(model)
    for fmt in formats:
        quantized = quantize(model, fmt, feeds, Path(tempfile.mkdtemp()) / fmt)
        wrapped, unwrapped = Engine(quantized), Engine(quantized)
        for engine in (wrapped, unwrapped):
            for _ in range(3):
                engine.run(None, feeds)
        plans = unwrapped.executor.plans
        bound = plans.bound[plans.last]
        print(fmt, "wrapped steps", sum(isinstance(s[0], _FreshOutputs) for s in bound))
        plans.bound[plans.last] = Steps(((s[0].fn,) + tuple(s[1:])) if isinstance(s[0], _FreshOutputs) else s
                                        for s in bound)
        walls: dict[str, list[float]] = {"wrapped": [], "unwrapped": []}
        for _ in range(300):
            for label, engine in (("wrapped", wrapped), ("unwrapped", unwrapped)):
                start = time.perf_counter()
                engine.run(None, feeds)
                walls[label].append(time.perf_counter() - start)
        print(fmt, {k: round(statistics.median(v) * 1e6) for k, v in walls.items()}, "us")


if __name__ == "__main__":
    main()
