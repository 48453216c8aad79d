"""Whole models with and without minfer-ops-numba: one process each, alternating, medians.

Each child process builds the model (``--threads``, default "auto") and prints the median of its timed runs; the parent
alternates a child with every plugin and a child with every plugin but minfer-ops-numba (``MINFER_PLUGINS``),
``--rounds`` times, and prints each side's median of medians. Run from the checkout:

    .venv/bin/python plugins/minfer_ops_numba/bench/models.py [--batch 1 8] [--rounds 3] [--runs 30] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from importlib.metadata import entry_points

MODELS = ("mobilenet_v3_large", "light_shufflenet", "light_squeezenet")


def model(name: str):
    if name.startswith("light_"):
        from minfer_core.testing.zoo import randomized

        return randomized(name, seed=1)
    tests = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "tests")
    sys.path[:0] = [tests, os.path.join(tests, "models")]  # the suite's model builders
    from realmodels import mobilenet_v3

    return mobilenet_v3(0, variant="large", size=224)


def child(name: str, batch: int, runs: int, threads: str) -> None:
    import numpy as np

    from minfer_core import InferenceSession

    proto = model(name)
    for v in list(proto.graph.input[:1]) + list(proto.graph.output):  # a batch dim whatever the builder wrote
        v.type.tensor_type.shape.dim[0].dim_param = "N"
    del proto.graph.value_info[:]
    sess = InferenceSession(proto.SerializeToString(), threads=threads if threads == "auto" else int(threads))
    inp = sess.get_inputs()[0]
    shape = [batch] + [d if isinstance(d, int) else 1 for d in inp.shape[1:]]
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    for _ in range(5):  # discovery run, tuning
        sess.run(None, {inp.name: x})
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        sess.run(None, {inp.name: x})
        times.append(time.perf_counter() - t)
    print(statistics.median(times) * 1e3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", nargs=4)
    ap.add_argument("--threads", default="auto", help='the sessions\' threads: "auto" (2 here) or a count')
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    args = ap.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]), int(args.child[2]), args.child[3])
        return
    from minfer_ops_numba._jit import cache_dir

    names = sorted({ep.dist.name for ep in entry_points(group="minfer.plugins")})
    sides = {"numba": ",".join(names), "numpy": ",".join(n for n in names if n != "minfer-ops-numba")}
    for name in args.models:
        for batch in args.batch:
            got: dict[str, list[float]] = {side: [] for side in sides}
            for _ in range(args.rounds):
                for side, allow in sides.items():
                    # each child times the kernels that apply afresh (choices persisted by other runs, of other
                    # code, are not reused) and loads the compiled kernels from the usual cache
                    with tempfile.TemporaryDirectory() as fresh:
                        env = dict(os.environ, MINFER_PLUGINS=allow, MINFER_CACHE=fresh,
                                   NUMBA_CACHE_DIR=str(cache_dir()))
                        run = subprocess.run([sys.executable, __file__, "--child", name, str(batch), str(args.runs),
                                              args.threads], env=env, capture_output=True, text=True)
                    if run.returncode:
                        break  # a model with a fixed batch dim somewhere (shufflenet's Reshape)
                    got[side].append(float(run.stdout.split()[-1]))
            if not got["numba"] or not got["numpy"]:
                print(f"{name:20} b{batch}: does not run at this batch")
                continue
            a, b = statistics.median(got["numba"]), statistics.median(got["numpy"])
            print(f"{name:20} b{batch}: with numba {a:7.2f} ms, numpy only {b:7.2f} ms, speedup {b / a:.2f} "
                  f"(per round: {[round(v, 2) for v in got['numba']]} vs {[round(v, 2) for v in got['numpy']]})",
                  flush=True)


if __name__ == "__main__":
    main()
