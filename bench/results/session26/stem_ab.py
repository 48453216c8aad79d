"""Session 26: a model's stem conv in one process with (A) and without (B) the direct loop, two threads: run
medians and the stem step's in-run median.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python bench/results/session26/stem_ab.py MODEL [BATCH]
        float: stem_rows.py's loop (A) against fewchannels.py's im2col + GEMM (B)
    ... stem_ab.py mobilenet_v2 1 qdq|qoperator
        quantized: qstem.py (A) against igemm (B), and the qstem step's parts in A
"""
import collections
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the checkout
import numpy as np  # noqa: E402

import minfer_core.plan as plan  # noqa: E402
from bench import models as bm  # noqa: E402
from minfer_core import Engine  # noqa: E402

STEP = collections.defaultdict(list)  # the first step's times, by engine
_generate, _building = plan.generate, ["A"]


def _first_step_timed(steps):
    fn, *rest = steps[0]
    key = _building[0]

    def timed(*a, **k):
        t = time.perf_counter_ns()
        r = fn(*a, **k)
        STEP[key].append(time.perf_counter_ns() - t)
        return r

    return _generate([(timed, *rest)] + list(steps[1:]))


def compare(model, feeds, module, name="fits"):
    """Engines A (as installed) and B (``module.name`` answering False while it builds), interleaved."""
    plan.generate = _first_step_timed
    engines = {"A": Engine(model, threads=2)}
    _building[0] = "B"
    real = getattr(module, name)
    setattr(module, name, lambda *a: False)
    try:
        engines["B"] = Engine(model, threads=2)
    finally:
        setattr(module, name, real)
    outs = [e.run(None, feeds)[0] for e in engines.values()]
    print("largest difference A - B:", np.abs(outs[0] - outs[1]).max())
    STEP.clear()
    runs = {k: [] for k in engines}
    for _ in range(10):
        for k, e in engines.items():
            time.sleep(0.1)
            for _ in range(20):
                t = time.perf_counter()
                e.run(None, feeds)
                runs[k].append(time.perf_counter() - t)
    print("run ms", {k: round(statistics.median(v) * 1e3, 3) for k, v in runs.items()},
          "stem us", {k: round(statistics.median(v) / 1e3, 1) for k, v in STEP.items()})
    return engines


def parts(engine, feeds):
    """qstem.py's step in ``engine``: its centering, its sums (centering included) and qconv.py's epilogue."""
    import minfer_ops_numba.qconv as qc
    import minfer_ops_numba.qstem as qs

    times = collections.defaultdict(list)

    def timed(owner, attr, label):
        real = getattr(owner, attr)

        def wrapper(*a, **k):
            t = time.perf_counter_ns()
            r = real(*a, **k)
            times[label].append(time.perf_counter_ns() - t)
            return r

        setattr(owner, attr, wrapper)

    timed(qs.QStem, "__call__", "stem sums")
    timed(qc.QConv, "finish", "finish")
    timed(qs, "centered", "centered")
    for _ in range(200):
        engine.run(None, feeds)
    print("parts us", {k: round(statistics.median(v[-150:]) / 1e3, 1) for k, v in times.items()})


def main(argv):
    name, batch = argv[0], int(argv[1]) if len(argv) > 1 else 1
    model = bm.build(name, batch)
    feeds = bm.random_feeds(model)
    if len(argv) > 2:  # quantized
        import minfer_ops_numba.qstem as qs
        from bench.quantized import quantize

        model = quantize(model, argv[2], feeds, Path(tempfile.mkdtemp()) / argv[2])
        print(name, argv[2], "qstem (A) against igemm (B)")
        parts(compare(model, feeds, qs)["A"], feeds)
    else:
        import minfer_ops_numba.stem_rows as sr

        print(name, batch, "direct loop (A) against im2col + GEMM (B)")
        compare(model, feeds, sr)


if __name__ == "__main__":
    main(sys.argv[1:])
