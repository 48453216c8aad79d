"""A model with and without one kernel (or one pass), in one process: what it brings where the core picks it.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python -m bench.kernel_ab KERNEL --models M ... [--batch 1]
        [--quantized qdq|qdq_pc|qoperator|dynamic]
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python -m bench.kernel_ab --without-pass PASS --models M ...

KERNEL names kernels by ``module:qualified name`` (a substring: ``minfer_ops_numba.pointwise:conv``). Per model two
sessions of two threads are built: one with every installed kernel, one with a registry of the same plugins
without the kernels KERNEL names (the process-wide registry is untouched). Each warms up alone, then they
alternate as bench.modes' sessions do. ``--quantized``: the model as onnxruntime's quantizer makes it in that
format (bench.quantized's `quantize`), for a quantized kernel. Printed: each session's median in ms and the mode
its shape settled on. ``--without-pass PASS``: the second session builds without that pass (``disabled_passes``)
instead, every kernel installed.
"""

from __future__ import annotations

import argparse
import statistics

from bench.benchmark import WARMUP
from bench.models import build, random_feeds
from bench.modes import alternate


def registry_without(kernel: str) -> object:
    """A registry of every installed plugin, less the kernels whose ``module:qualname`` contains ``kernel``."""
    from minfer_core.plugins import PluginSet  # a checkout tool may reach past the public API; plugins may not

    registry = PluginSet().registry
    dropped = 0
    for key, kernels in registry.kernels.items():
        kept = [k for k in kernels if kernel not in f"{k.fn.__module__}:{k.fn.__qualname__}"]
        dropped += len(kernels) - len(kept)
        registry.kernels[key] = kept
    if not dropped:
        raise SystemExit(f"no installed kernel matches {kernel!r}")
    return registry


def compare(kernel: str | None, name: str, batch: int, rounds: int, repeat: int,
            quantized: str | None = None, without_pass: str | None = None) -> dict[str, object]:
    """Medians (ms) and settled modes of the sessions with and without ``kernel`` (or the pass ``without_pass``) on
    one model (quantized in format ``quantized`` when given)."""
    import minfer_core

    model = build(name, batch)
    feeds = random_feeds(model)
    if quantized:
        import tempfile
        from pathlib import Path

        from bench.models import ORT_IR_VERSION
        from bench.quantized import quantize

        model.ir_version = ORT_IR_VERSION
        with tempfile.TemporaryDirectory() as folder:
            model = quantize(model, quantized, feeds, Path(folder) / quantized)
    without = (dict(disabled_passes=[without_pass]) if without_pass else dict(registry=registry_without(kernel or "")))
    sessions = {"with": minfer_core.InferenceSession(model, threads=2),
                "without": minfer_core.InferenceSession(model, threads=2, **without)}
    for session in sessions.values():
        for _ in range(WARMUP):
            session.run(None, feeds)
    times = alternate(sessions, feeds, rounds, repeat)
    row: dict[str, object] = {"model": name, "batch": batch, "quantized": quantized or "no"}
    row.update({"pass": without_pass} if without_pass else {"kernel": kernel})
    for label, session in sessions.items():
        row[label] = round(statistics.median(times[label]), 3)
        row[f"{label} mode"] = list(session.executor.teams.values())
    return row


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kernel", nargs="?")
    parser.add_argument("--without-pass", help="compare with and without this pass instead of a kernel")
    parser.add_argument("--models", nargs="+", required=True)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--quantized", choices=["qdq", "qdq_pc", "qoperator", "dynamic"])
    args = parser.parse_args(argv)
    if (args.kernel is None) == (args.without_pass is None):
        parser.error("name a KERNEL or --without-pass PASS (one of the two)")
    for name in args.models:
        print(compare(args.kernel, name, args.batch, args.rounds, args.repeat, args.quantized, args.without_pass),
              flush=True)


if __name__ == "__main__":
    main()
