"""Session 27: which kernel the core's timing keeps for resnet50's 7x7 stem in a fresh process, with the
second-round rule as installed (COLD_LOSS, "new") and as it was (CLEAR_LOSS after the first round, "old"), a
process each, in turns; prints each candidate call's ms and the kernel kept. Each process's choice store is a copy
of MINFER_CACHE's less the stem's kernel choice: minfer-ops-conv's own method for the stem stays stored, as in a
process after an earlier one whose kernel timing was not stored (not calm), so numpy's Conv calls warm while
smallconv.py's first call is cold. numba's cache is MINFER_CACHE's, warm.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python bench/results/session27/stem_choice.py [PROCESSES]

The effect is a process's first calls: in one process the second engine built finds warm what the first touched,
so each variant needs its own process.
"""
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
CHILD = """
import sys
import minfer_core.tuning as tuning
if sys.argv[1] == "old":
    tuning.COLD_LOSS = tuning.CLEAR_LOSS
from bench import models as bm
from minfer_core import Engine
real = tuning.choose
def choose(key, names, time_one, prior=None, margin=tuning.MARGIN):
    log = []
    def timed(i):
        took = time_one(i)
        log.append((names[i].split('.')[-2], round(took * 1e3, 2)))
        return took
    won = real(key, names, timed, prior, margin)
    if "[7, 7]" in key:
        print(sys.argv[1], "calls (kernel, ms):", log, "-> kept", names[won].split(".")[-2], flush=True)
    return won
tuning.choose = choose
Engine(bm.build("resnet50", 1), threads=2)
"""


def main(processes: int) -> None:
    numba_cache = os.environ.get("NUMBA_CACHE_DIR") or str(
        Path(os.environ.get("MINFER_CACHE") or Path.home() / ".cache" / "minfer") / "numba")
    given = Path(os.environ.get("MINFER_CACHE") or Path.home() / ".cache" / "minfer")
    stores = {p.name: [ln for ln in p.read_text().splitlines() if not (ln.startswith('["::Conv') and "[7, 7]" in ln)]
              for p in given.glob("tuning-*.jsonl")}
    for _ in range(processes):
        for rule in ("old", "new"):
            folder = Path(tempfile.mkdtemp())
            for name, lines in stores.items():
                (folder / name).write_text("\n".join(lines))
            env = {**os.environ, "NUMBA_CACHE_DIR": numba_cache, "MINFER_CACHE": str(folder),
                   "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore"}
            subprocess.run([sys.executable, "-c", CHILD, rule], env=env, check=True, cwd=ROOT)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 4)
