"""minfer against onnxruntime on one benchmark model, interleaved in blocks in one process (medians).

``env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python bench/results/session28/engine_vs_ort.py MODEL
[BATCH]`` from the checkout; run it with PYTHONPATH pointing at another tree's plugin folder (a git worktree of
an earlier commit) to compare two versions of a plugin in fresh processes, each against onnxruntime.
"""

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from bench.benchmark import build, make_session  # noqa: E402

name = sys.argv[1]
blob = build(name, int(sys.argv[2]) if len(sys.argv) > 2 else 1).SerializeToString()
m, feeds = make_session("minfer", blob, 2)
o, _ = make_session("onnxruntime", blob, 2)
for r in (m, o):
    for _ in range(20):
        r(feeds)
res: dict[str, list[float]] = {"minfer": [], "ort": []}
for block in range(6):
    for key, r in (("minfer", m), ("ort", o)):
        time.sleep(0.25)  # onnxruntime's and OpenBLAS's threads stop spinning
        for _ in range(30):
            t0 = time.perf_counter()
            r(feeds)
            res[key].append(time.perf_counter() - t0)
mm, oo = statistics.median(res["minfer"]) * 1e3, statistics.median(res["ort"]) * 1e3
import minfer_ops_numba  # noqa: E402

print(f"{name}: minfer {mm:.3f} ms, ort {oo:.3f} ms, ratio {mm / oo:.2f} ({Path(minfer_ops_numba.__file__).parents[2]})")
