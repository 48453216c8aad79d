"""minfer with and without the executor's serial mode, in one process: what one thread alone gains on small models.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python -m bench.modes [--models M ...] [--batch 1]

Per model two sessions of two threads are built: one whose shapes may settle on one thread alone
(minfer-parallel's ``executors.SERIAL_RUN``, as shipped) and one that may not (``SERIAL_RUN`` 0 while it
decides, in its first run; neither takes a mode stored by the other). Each warms up alone, then they alternate ``--rounds`` blocks of ``--repeat`` runs, each block after
a pause (as bench.benchmark times them: worker threads that slept since the last run wake as a user's would).
Printed: each session's median in ms and the mode its shape settled on.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from bench.benchmark import PAUSE, WARMUP
from bench.models import ORT_IR_VERSION, build, random_feeds

SMALL = ("orientation", "ocr_recognizer", "detector", "encoder", "transformer", "mobilenet_v3_small")


def compare(name: str, batch: int, rounds: int, repeat: int) -> dict[str, object]:
    """Medians (ms) and settled modes of the two sessions on one model."""
    from minfer_parallel import executors

    import minfer_core
    from minfer_core import tuning

    model = build(name, batch)
    model.ir_version = ORT_IR_VERSION
    feeds = random_feeds(model)
    shipped, sessions = executors.SERIAL_RUN, {}
    for label, limit in (("without serial", 0.0), ("with serial", shipped)):
        executors.SERIAL_RUN = limit  # read when a shape's choice is made: in its first run, below
        store = tuning.store().data  # each session times its modes: the other's stored choice would be taken
        for key in [k for k in store if k.startswith("executor-mode|")]:
            del store[key]
        try:
            session = sessions[label] = minfer_core.InferenceSession(model, threads=2)
            for _ in range(WARMUP):
                session.run(None, feeds)
        finally:
            executors.SERIAL_RUN = shipped
    times = alternate(sessions, feeds, rounds, repeat)
    row: dict[str, object] = {"model": name, "batch": batch}
    for label, session in sessions.items():
        row[label] = round(statistics.median(times[label]), 3)
        row[f"{label} mode"] = list(session.executor.teams.values())
    return row


def alternate(sessions: dict[str, Any], feeds: dict[str, Any], rounds: int, repeat: int) -> dict[str, list[float]]:
    """Each session's run times (ms): ``rounds`` blocks of ``repeat`` runs a session, in turn, each after a pause."""
    times: dict[str, list[float]] = {label: [] for label in sessions}
    for _ in range(rounds):
        for label, session in sessions.items():
            time.sleep(PAUSE)
            for _ in range(repeat):
                t0 = time.perf_counter()
                session.run(None, feeds)
                times[label].append((time.perf_counter() - t0) * 1e3)
    return times


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(SMALL))
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args(argv)
    for name in args.models:
        print(compare(name, args.batch, args.rounds, args.repeat), flush=True)


if __name__ == "__main__":
    main()
