"""The first run of a new input shape, in fresh processes: cold (empty caches), then warm (a process ran it before).

    python -m bench.firstrun ENGINE MODEL BATCH [THREADS]     # one probe: prints one JSON line

A probe imports the engine (for minfer with its plugins loaded), builds a session on the model and times its
first two runs; then it builds a second session in the same process and times that one's first run (what a
server pays for a new session once the process is warm). `first_runs` starts the probe twice over one fresh
set of cache directories (``MINFER_CACHE``, ``NUMBA_CACHE_DIR``, ``XDG_CACHE_HOME``): the first process is cold,
the second finds whatever the first persisted (tuning choices, compiled kernels), as a user's next process would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def probe(engine: str, name: str, batch: int, threads: int | str = 2) -> dict[str, Any]:
    """Import, build and first-run times of ``engine`` on one model in this (fresh) process."""
    t0 = time.perf_counter()
    if engine == "minfer":
        import minfer_core

        minfer_core.get_registry()  # plugins (and what they import, numba's compiler included) load here
    else:
        import onnxruntime  # noqa: F401
    import_s = time.perf_counter() - t0
    from bench.benchmark import make_session
    from bench.models import build

    blob = build(name, batch).SerializeToString()
    out: dict[str, Any] = {"engine": engine, "model": name, "batch": batch, "import_s": round(import_s, 3)}
    for session in ("", "second_session_"):
        t0 = time.perf_counter()
        run, feeds = make_session(engine, blob, threads)
        out[f"{session}build_s"] = round(time.perf_counter() - t0, 4)
        for label in ("first", "second")[: 2 if not session else 1]:
            t0 = time.perf_counter()
            run(feeds)
            out[f"{session}{label}_ms"] = round((time.perf_counter() - t0) * 1e3, 3)
    return out


def first_runs(engine: str, name: str, batch: int, threads: int | str = 2,
               env: dict[str, str] | None = None, warm: bool = True) -> dict[str, Any]:
    """Cold and warm first runs of ``engine`` on one model: two fresh processes over one fresh cache directory.

    Returns the cold process's figures (``first_ms`` its first run, ``second_ms`` its second,
    ``second_session_first_ms`` a second session's first run in that process) and ``warm_first_ms`` /
    ``warm_build_s`` from the second process, unless ``warm`` is False. onnxruntime persists nothing: it runs once.
    """
    with tempfile.TemporaryDirectory(prefix="minfer-firstrun-") as cache:
        base = dict(os.environ if env is None else env)
        base.update(MINFER_CACHE=cache, NUMBA_CACHE_DIR=str(Path(cache) / "numba"), XDG_CACHE_HOME=cache)
        cold = _probe_process(engine, name, batch, threads, base)
        if warm and engine == "minfer" and "error" not in cold:
            warm = _probe_process(engine, name, batch, threads, base)
            cold.update({f"warm_{k}": v for k, v in warm.items() if k in ("first_ms", "build_s", "import_s", "error")})
    return cold


def _probe_process(engine: str, name: str, batch: int, threads: int | str, env: dict[str, str]) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "bench.firstrun", engine, name, str(batch), str(threads)],
        cwd=ROOT, capture_output=True, text=True, timeout=900, env=env,
    )
    if out.returncode != 0:
        return {"error": (out.stderr.strip().splitlines() or ["no output"])[-1]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    engine, name, batch = sys.argv[1], sys.argv[2], int(sys.argv[3])
    threads: int | str = sys.argv[4] if len(sys.argv) > 4 else 2
    threads = int(threads) if str(threads).isdigit() else threads
    print(json.dumps(probe(engine, name, batch, threads)))


if __name__ == "__main__":
    main()
