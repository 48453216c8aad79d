"""A/B in one process: quantized stems applying their chain band by band (`QStem.into`) against the sums written
whole, then the chain over them (the path before), on each static quantized MobileNetV2.

``env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python bench/results/session28/stem_ab.py [ROUNDS]`` from
the checkout: per format the model's median over the rounds (each round 20 runs with, 20 without, in turn) and
the outputs' agreement.
"""

from __future__ import annotations

import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import numpy as np  # noqa: E402

from bench import models as bench_models  # noqa: E402
from bench.quantized import quantize  # noqa: E402


def main() -> None:
    from minfer_core import Engine
    from minfer_ops_numba.qconv import QConv

    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    model = bench_models.build("mobilenet_v2", 1)
    model.ir_version = bench_models.ORT_IR_VERSION
    feeds = bench_models.random_feeds(model)
    for fmt in ("qdq", "qdq_pc", "qoperator"):
        engine = Engine(quantize(model, fmt, feeds, Path(tempfile.mkdtemp()) / fmt))
        stems = [o for o in gc.get_objects() if isinstance(o, QConv) and o.banded]
        times: dict[bool, list[float]] = {True: [], False: []}
        outs = {}
        for _ in range(rounds):
            for banded in (True, False):
                for s in stems:
                    s.banded = banded
                outs[banded] = engine.run(None, feeds)[0]
                for _ in range(20):
                    t0 = time.perf_counter()
                    engine.run(None, feeds)
                    times[banded].append(time.perf_counter() - t0)
        for s in stems:
            s.banded = True
        same = np.array_equal(outs[True].view(np.int32), outs[False].view(np.int32))
        print(f"{fmt:<10} stems {len(stems)}: banded {statistics.median(times[True]) * 1e3:.3f} ms, "
              f"before {statistics.median(times[False]) * 1e3:.3f} ms, same bits {same}", flush=True)
        del engine, stems


if __name__ == "__main__":
    main()
