"""Session 27: a model's steady run median in fresh processes under the core's second-round rule as installed
("new": COLD_LOSS) and as it was ("old": CLEAR_LOSS after the first round), a process each, in turns; each process
builds with an empty choice store (numba's cache warm), then times 200 runs (two threads).

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python bench/results/session27/rule_runs.py MODEL [PROCESSES]
"""
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
CHILD = """
import statistics, sys, time
import minfer_core.tuning as tuning
if sys.argv[1] == "old":
    tuning.COLD_LOSS = tuning.CLEAR_LOSS
from bench import models as bm
from minfer_core import Engine
model = bm.build(sys.argv[2], 1)
feeds = bm.random_feeds(model)
start = time.perf_counter()
engine = Engine(model, threads=2)
built = time.perf_counter() - start
for _ in range(20):
    engine.run(None, feeds)
times = []
for _ in range(200):
    t = time.perf_counter()
    engine.run(None, feeds)
    times.append(time.perf_counter() - t)
print(sys.argv[1], round(statistics.median(times) * 1e3, 3), round(built, 2), flush=True)
"""


def main(name: str, processes: int) -> None:
    numba_cache = os.environ.get("NUMBA_CACHE_DIR") or str(
        Path(os.environ.get("MINFER_CACHE") or Path.home() / ".cache" / "minfer") / "numba")
    got: dict[str, list[float]] = {"old": [], "new": []}
    for _ in range(processes):
        for rule in ("old", "new"):
            env = {**os.environ, "NUMBA_CACHE_DIR": numba_cache, "MINFER_CACHE": tempfile.mkdtemp(),
                   "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore"}
            out = subprocess.run([sys.executable, "-c", CHILD, rule, name], env=env, check=True, cwd=ROOT,
                                 capture_output=True, text=True).stdout.split()
            got[rule].append(float(out[1]))
            print(f"{name} {rule}: run median {out[1]} ms, build with its first run {out[2]} s", flush=True)
    print(f"{name}: medians over processes, old {statistics.median(got['old']):.3f} ms, "
          f"new {statistics.median(got['new']):.3f} ms")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "mobilenet_v2", int(sys.argv[2]) if len(sys.argv) > 2 else 4)
