"""Per-node profiling in the Chrome trace format (chrome://tracing, Perfetto), like onnxruntime's profiler.

`TraceProfiler` is a run observer: the engine calls ``on_node_start`` and
``on_node_end`` around each node, so profiling costs nothing when it is off.
Events follow onnxruntime's layout (``cat`` "Session"/"Node", ``ph`` "X",
microsecond ``ts``/``dur``, ``args`` with op_name and shapes) so tools that
read onnxruntime profiles read these too.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any, Mapping, Sequence

import numpy as np

from .graph import Node


class TraceProfiler:
    """A run observer recording one Chrome trace "X" event per node execution."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self._origin = time.perf_counter_ns()
        self._start = 0
        self._pid = os.getpid()
        self._tid = threading.get_ident() % 1_000_000

    def _now_us(self) -> float:
        return (time.perf_counter_ns() - self._origin) / 1000.0

    def on_node_start(self, node: Node) -> None:
        self._start = time.perf_counter_ns()

    def on_node_end(self, node: Node, outputs: Sequence[Any]) -> None:
        end = time.perf_counter_ns()
        self.events.append(
            {
                "cat": "Node",
                "name": node.name or node.op_type,
                "ph": "X",
                "pid": self._pid,
                "tid": self._tid,
                "ts": (self._start - self._origin) / 1000.0,
                "dur": (end - self._start) / 1000.0,
                "args": {
                    "op_name": node.op_type,
                    "domain": node.domain,
                    "output_type_shape": [_type_shape(o) for o in outputs],
                    "provider": "numpy",
                },
            }
        )

    def session_event(self, name: str, start_us: float, dur_us: float) -> None:
        self.events.append(
            {"cat": "Session", "name": name, "ph": "X", "pid": self._pid, "tid": self._tid, "ts": start_us, "dur": dur_us}
        )

    def trace(self) -> dict[str, Any]:
        """The Chrome trace document."""
        return {"traceEvents": self.events, "displayTimeUnit": "ms"}


def _type_shape(value: Any) -> dict[str, list[int]]:
    if isinstance(value, np.ndarray):
        return {value.dtype.name: list(value.shape)}
    return {}


def summarize(trace: Mapping[str, Any], top: int = 15) -> list[tuple[str, int, float, float]]:
    """(op_type, count, total ms, share of node time) per op type, largest total first."""
    totals: dict[str, list[float]] = {}
    for ev in trace["traceEvents"]:
        if ev.get("cat") != "Node":
            continue
        entry = totals.setdefault(ev["args"]["op_name"], [0, 0.0])
        entry[0] += 1
        entry[1] += ev["dur"] / 1000.0
    all_ms = sum(v[1] for v in totals.values()) or 1.0
    rows = [(op, int(n), ms, ms / all_ms) for op, (n, ms) in totals.items()]
    return sorted(rows, key=lambda r: -r[2])[:top]


def profile_engine(engine: Any, feeds: Mapping[str, Any], path: str | os.PathLike[str] | None = None, *, repeat: int = 1) -> dict[str, Any]:
    """Run ``engine`` ``repeat`` times (after one unprofiled warm-up) with a TraceProfiler; write ``path``."""
    engine.run(None, feeds)  # plan this signature first, so the trace shows the steady state
    prof = TraceProfiler()
    observers = list(engine.program.observers) + [prof]
    names = list(engine.graph.outputs)
    for _ in range(max(1, repeat)):
        t0 = prof._now_us()
        engine._run(names, feeds, False, observers)
        prof.session_event("model_run", t0, prof._now_us() - t0)
    doc = prof.trace()
    if path is not None:
        with open(path, "w") as fh:
            json.dump(doc, fh)
    return doc
