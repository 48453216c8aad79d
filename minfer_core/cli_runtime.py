"""Runtime commands for the ``minfer`` CLI: ``run --profile``, ``profile``, ``memory`` and ``tune``.

The benchmark is a checkout tool, ``python -m bench.benchmark`` (bench/README.md), not a
command: it needs the repository's bench/ folder and onnxruntime, which a wheel has neither of.

`minfer_core.cli` calls `add_commands` with its subparsers, so the CLI stays
one parser while this module owns what it adds.
"""

from __future__ import annotations

import argparse
from typing import Any, Callable


def add_commands(sub: Any) -> None:
    """Add ``--profile`` to ``minfer run`` and the ``profile``, ``memory`` and ``tune`` commands."""
    run = sub.choices.get("run")
    if run is not None:
        run.add_argument("--profile", metavar="TRACE.json", help="write a per-node Chrome trace of the runs")
        run.set_defaults(func=_with_profile(run.get_default("func")))
    mem = sub.add_parser("memory", help="a model's memory plan: arena, live-set bound, naive sum")
    mem.add_argument("model")
    mem.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE", help="size of a symbolic dim")
    mem.add_argument("--passes", default="all", choices=("all", "extended", "basic", "none"))
    mem.add_argument("--seed", type=int, default=0)
    mem.add_argument("--input", "-i", action="append", default=[], metavar="NAME=FILE.npy")
    mem.set_defaults(func=cmd_memory)
    tune = sub.add_parser("tune", help="time the kernel and method choices for given input sizes; store them")
    tune.add_argument("model")
    tune.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE[,SIZE...]",
                      help="sizes of a symbolic dim: every combination runs once")
    tune.add_argument("--passes", default="all", choices=("all", "extended", "basic", "none"))
    tune.add_argument("--seed", type=int, default=0)
    tune.add_argument("--input", "-i", action="append", default=[], metavar="NAME=FILE.npy")
    tune.set_defaults(func=cmd_tune)


def _with_profile(original: Callable[[argparse.Namespace], int] | None) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        if not getattr(args, "profile", None):
            return original(args) if original else 2
        return cmd_profile(args)

    return run


def _session_and_feeds(args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    from .cli import _feeds, model_arg
    from .session import InferenceSession

    sess = InferenceSession(model_arg(args.model), passes=args.passes)
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


def cmd_tune(args: argparse.Namespace) -> int:
    """``minfer tune MODEL --dim N=1,8``: one run per combination of sizes, so its choices are made and stored."""
    import itertools
    import os
    from unittest.mock import patch

    from .cli import UsageError, _feeds
    from .tuning import TUNE_ENV, store

    if os.environ.get(TUNE_ENV) == "0":
        raise UsageError(f"{TUNE_ENV}=0 turns tuning off: unset it to tune")
    sess, _ = _session_and_feeds(argparse.Namespace(**{**vars(args), "dim": []}))
    dims = [(name, sizes.split(",")) for name, _, sizes in (d.partition("=") for d in args.dim)]
    before = len(store().data)
    with patch.dict(os.environ, {TUNE_ENV: "all"}):  # every size timed, not only each node's first
        for combo in itertools.product(*(sizes for _, sizes in dims)):
            args.dim = [f"{name}={size}" for (name, _), size in zip(dims, combo)]
            sess.run(None, _feeds(sess, args))
            print(f"tuned {' '.join(args.dim) or 'the declared shapes'}")
    print(f"{len(store().data) - before} new choice(s) stored in {store().path}")
    return 0
