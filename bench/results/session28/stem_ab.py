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
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import numpy as np  # noqa: E402

from bench import models as bench_models  # noqa: E402
from bench.quantized import quantize  # noqa: E402


def alternate(found: Any, switch: Any, rounds: int, labels: tuple[str, str],
              formats: tuple[str, ...] = ("qdq", "qdq_pc", "qoperator")) -> None:
    """Per quantized MobileNetV2 (``formats``): the kernel objects ``found`` picks among the live ones,
    ``switch(obj, on)`` on and off in turn (20 runs a block), the model's medians either way and whether the
    outputs agree."""
    from minfer_core import Engine

    model = bench_models.build("mobilenet_v2", 1)
    model.ir_version = bench_models.ORT_IR_VERSION
    feeds = bench_models.random_feeds(model)
    for fmt in formats:
        engine = Engine(quantize(model, fmt, feeds, Path(tempfile.mkdtemp()) / fmt))
        objects = [o for o in gc.get_objects() if found(o)]
        times: dict[bool, list[float]] = {True: [], False: []}
        outs = {}
        for _ in range(rounds):
            for on in (True, False):
                for o in objects:
                    switch(o, on)
                outs[on] = engine.run(None, feeds)[0]
                for _ in range(20):
                    t0 = time.perf_counter()
                    engine.run(None, feeds)
                    times[on].append(time.perf_counter() - t0)
        for o in objects:
            switch(o, True)
        same = np.array_equal(outs[True].view(np.int32), outs[False].view(np.int32))
        print(f"{fmt:<10} objects {len(objects)}: {labels[0]} {statistics.median(times[True]) * 1e3:.3f} ms, "
              f"{labels[1]} {statistics.median(times[False]) * 1e3:.3f} ms, same bits {same}", flush=True)
        del engine, objects


def main() -> None:
    from minfer_ops_numba.qconv import QConv

    def switch(conv: Any, on: bool) -> None:
        conv.banded = on

    alternate(lambda o: isinstance(o, QConv) and o.banded, switch, int(sys.argv[1]) if len(sys.argv) > 1 else 10,
              ("banded", "before"))


if __name__ == "__main__":
    main()
