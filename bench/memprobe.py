"""Peak memory growth of one engine on one model, measured in a fresh process.

``python -m bench.memprobe ENGINE MODEL BATCH RUNS [THREADS]`` prints one
JSON line. The baseline is the process with the engine imported (for minfer
with its plugins loaded, as onnxruntime's import loads its kernels) and the
model's bytes (its weights) loaded; then the session is built and run
``RUNS`` times. ``peak_mb`` is the high-water mark above that baseline over
build and runs (weights the engine copies or pre-packs, plus activations
and scratch); ``run_peak_mb`` the high-water mark of the runs alone above the
RSS after the build; ``weights_mb`` the initializers' size. The high-water
mark is reset through /proc/self/clear_refs.
"""

from __future__ import annotations

import gc
import json
import sys

import numpy as np


def _status(field: str) -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0
    raise KeyError(field)


def _reset_hwm() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def probe(engine: str, name: str, batch: int, runs: int, threads: int | str = 2) -> dict[str, float | bool | str]:
    from bench.benchmark import make_session
    from bench.models import build

    __import__("minfer_core.engine" if engine == "minfer" else engine.replace("reference", "onnx.reference"))
    if engine == "minfer":
        import minfer_core

        minfer_core.get_registry()  # plugin code, like onnxruntime's library, is not growth over the weights
    model = build(name, batch)
    weights = sum(np.prod(t.dims, dtype=np.int64) * 4 for t in model.graph.initializer)
    blob = model.SerializeToString()
    del model
    gc.collect()
    base = _status("VmRSS")
    reset = _reset_hwm()
    run, feeds = make_session(engine, blob, threads)
    gc.collect()
    built = _status("VmRSS")
    build_peak = _status("VmHWM")
    _reset_hwm()
    for _ in range(runs):
        run(feeds)
    run_peak = _status("VmHWM")
    # a process team's worker (MINFER_PARALLEL=processes) shares the weights and the arena; what it holds on
    # its own (scratch, pages it copied on write) is memory the engine uses too
    worker = _worker_private_mb() if engine == "minfer" else 0.0
    build_peak += worker
    run_peak += worker
    return {
        "engine": engine,
        "model": name,
        "batch": batch,
        "weights_mb": round(weights / 2**20, 2),
        "build_mb": round(built - base, 2),
        "peak_mb": round(max(build_peak, run_peak) - base, 2),
        "run_peak_mb": round(run_peak - built, 2),
        "hwm_reset": reset,
        "worker_private_mb": round(worker, 2),
    }


def _worker_private_mb() -> float:
    from minfer_parallel import procs

    team = procs._team
    if team is None or not team.pid:
        return 0.0
    total = 0.0
    with open(f"/proc/{team.pid}/smaps_rollup") as fh:
        for line in fh:
            if line.startswith(("Private_Clean:", "Private_Dirty:")):
                total += int(line.split()[1]) / 1024.0
    return total


def main() -> None:
    engine, name, batch, runs = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    threads: int | str = sys.argv[5] if len(sys.argv) > 5 else 2
    threads = int(threads) if str(threads).isdigit() else threads
    print(json.dumps(probe(engine, name, batch, runs, threads)))


if __name__ == "__main__":
    main()
