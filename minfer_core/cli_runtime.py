"""Runtime commands for the ``minfer`` CLI: ``run --profile``, ``profile``, ``memory`` and ``bench``.

`minfer_core.cli` calls `add_commands` with its subparsers, so the CLI stays
one parser while this module owns what it adds.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from typing import Any, Callable


def add_commands(sub: Any) -> None:
    """Add ``--profile`` to ``minfer run`` and the ``profile``, ``memory`` and ``bench`` commands."""
    run = sub.choices.get("run")
    if run is not None:
        run.add_argument("--profile", metavar="TRACE.json", help="write a per-node Chrome trace of the runs")
        run.set_defaults(func=_with_profile(run.get_default("func")))
    mem = sub.add_parser("memory", help="a model's memory plan: arena, live-set bound, naive sum")
    mem.add_argument("model")
    mem.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE", help="size of a symbolic dim")
    mem.add_argument("--passes", default="all")
    mem.add_argument("--seed", type=int, default=0)
    mem.add_argument("--input", "-i", action="append", default=[], metavar="NAME=FILE.npy")
    mem.set_defaults(func=cmd_memory)
    bench = sub.add_parser("bench", help="benchmark against onnxruntime and ReferenceEvaluator (bench/README.md)")
    add_bench_arguments(bench)
    bench.set_defaults(func=cmd_bench)


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``minfer bench`` and ``python -m bench.benchmark``."""
    parser.add_argument("--models", nargs="*", help="subset of the light model names (resnet50, ...) and transformer")
    parser.add_argument("--batches", nargs="*", type=int, default=[1, 8])
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per engine per round")
    parser.add_argument("--rounds", type=int, default=3, help="alternating minfer/onnxruntime rounds")
    parser.add_argument("--threads", type=int, default=2, help="onnxruntime's intra-op threads")
    parser.add_argument("--minfer-threads", type=_thread_count, default="auto",
                        help="numpy BLAS threads for minfer: a count or 'auto' (default; see minfer_core.threads)")
    parser.add_argument("--parallel", choices=("threads", "processes"), default=None,
                        help="how minfer's kernels split their work (default: MINFER_PARALLEL, else threads)")
    parser.add_argument("--ref-repeat", type=int, default=1, help="timed ReferenceEvaluator runs")
    parser.add_argument("--no-ref", action="store_true", help="skip the ReferenceEvaluator")
    parser.add_argument("--no-memory", action="store_true", help="skip the fresh-process peak memory probes")
    parser.add_argument("--json", default=None, help="where to write the results (default bench/results/latest.json)")


def _thread_count(text: str) -> int | str:
    return text if text == "auto" else int(text)


def _with_profile(original: Callable[[argparse.Namespace], int] | None) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        if not getattr(args, "profile", None):
            return original(args) if original else 2
        return cmd_profile(args)

    return run


def _session_and_feeds(args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    from .cli import _feeds
    from .engine import InferenceSession
    from .zoo import model_path

    sess = InferenceSession(model_path(args.model), passes=args.passes)
    return sess, _feeds(sess, args)


def cmd_profile(args: argparse.Namespace) -> int:
    """``minfer run MODEL --profile trace.json``: the runs, traced per node."""
    from .profile import summarize

    sess, feeds = _session_and_feeds(args)
    repeat = max(1, getattr(args, "repeat", 1))
    trace = sess.profile(feeds, args.profile, repeat=repeat)
    print(f"wrote {args.profile} ({len(trace['traceEvents'])} events, Chrome trace format)")
    for op, count, ms, share in summarize(trace):
        print(f"  {op:<24} {count // repeat:5d} nodes {ms / repeat:9.2f} ms/run {share:6.1%}")
    return 0


def cmd_memory(args: argparse.Namespace) -> int:
    """``minfer memory MODEL``: plan the model's memory for its (or the given) input shapes."""
    sess, feeds = _session_and_feeds(args)
    report = sess.memory_report(feeds)
    mib = 1 << 20
    for key, value in report.items():
        shown = f"{value / mib:.2f} MiB" if key.endswith("bytes") else value
        print(f"{key:>24}: {shown}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    """``minfer bench ...``: bench/benchmark.py of a source checkout."""
    root = Path(__file__).resolve().parent.parent
    if (root / "bench" / "benchmark.py").exists() and str(root) not in sys.path:
        sys.path.insert(0, str(root))
    try:
        bench = importlib.import_module("bench.benchmark")
    except ImportError:
        print("minfer bench needs a source checkout (its bench/ folder); run it from the repository", file=sys.stderr)
        return 2
    return int(bench.run_from_args(args))
