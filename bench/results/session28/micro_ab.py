"""A/B in one process: qconv_blas.py's 1x1 convs by pointwise.py's micro-kernel (`MICRO`) against BLAS (the path
before), on each static quantized MobileNetV2.

``env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python bench/results/session28/micro_ab.py [ROUNDS]`` from
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
    from minfer_ops_numba.qconv_blas import Product

    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    model = bench_models.build("mobilenet_v2", 1)
    model.ir_version = bench_models.ORT_IR_VERSION
    feeds = bench_models.random_feeds(model)
    for fmt in ("qdq", "qdq_pc", "qoperator"):
        engine = Engine(quantize(model, fmt, feeds, Path(tempfile.mkdtemp()) / fmt))
        stems = [o for o in gc.get_objects() if isinstance(o, Product) and o.micro]
        times: dict[bool, list[float]] = {True: [], False: []}
        outs = {}
        for _ in range(rounds):
            for banded in (True, False):
                for s in stems:
                    s.micro = banded
                    s.plans.clear()
                outs[banded] = engine.run(None, feeds)[0]
                for _ in range(20):
                    t0 = time.perf_counter()
                    engine.run(None, feeds)
                    times[banded].append(time.perf_counter() - t0)
        for s in stems:
            s.micro = True
            s.plans.clear()
        same = np.array_equal(outs[True].view(np.int32), outs[False].view(np.int32))
        print(f"{fmt:<10} convs {len(stems)}: micro {statistics.median(times[True]) * 1e3:.3f} ms, "
              f"blas {statistics.median(times[False]) * 1e3:.3f} ms, same bits {same}", flush=True)
        del engine, stems


if __name__ == "__main__":
    main()
