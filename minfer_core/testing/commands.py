"""The test-tooling commands of the ``minfer`` CLI: ``coverage`` and ``bisect-passes``.

They drive the conformance runner and the pass bisection of this package;
`minfer_core.cli` adds them to its one parser through `add_commands`.
"""

from __future__ import annotations

import argparse
from typing import Any

LEVELS = ("all", "extended", "basic", "none")


def add_commands(sub: Any) -> None:
    """Add ``coverage`` and ``bisect-passes`` to an argparse subparsers object."""
    cov = sub.add_parser("coverage", help="run onnx's node conformance cases and print the coverage table")
    cov.add_argument("--op", action="append", default=[], help="only these op types")
    cov.add_argument("--failures", action="store_true", help="also list each failing case")
    cov.set_defaults(func=cmd_coverage)
    b = sub.add_parser("bisect-passes", help="find the first pass application that moves outputs beyond its tolerance")
    b.add_argument("model")
    b.add_argument("--level", default="all", choices=LEVELS)
    b.add_argument("--disable", action="append", default=[], metavar="NAME")
    b.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    b.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE", help="size of a symbolic input dim")
    b.set_defaults(func=cmd_bisect)


def cmd_coverage(args: argparse.Namespace) -> int:
    """Print the node-case coverage table (``--failures``: each failing case too)."""
    from . import conformance

    cases = conformance.load_cases()
    if args.op:
        cases = [c for c in cases if c.op_type[1] in set(args.op)]
    table = conformance.coverage(cases)
    print(conformance.format_table(table, failures=args.failures))
    return 0


def cmd_bisect(args: argparse.Namespace) -> int:
    """Print the first pass application that moves the outputs beyond its tolerance (exit 1), if any."""
    from ..cli import model_arg, parse_dims
    from ..cli_passes import check_pass_names
    from ..onnx_io import load_model
    from .bisect import bisect, bisect_feeds

    graph = load_model(model_arg(args.model))
    check_pass_names(args.disable)
    symbolic = {d for name in graph.inputs for d in (getattr(graph.types.get(name), "shape", None) or ()) if isinstance(d, str)}
    dims = parse_dims(args.dim, sorted(symbolic))
    found = bisect(graph, args.level, args.disable, bisect_feeds(graph, args.seed, dims))
    if found is None:
        print("every pass application kept the outputs within its tolerance")
        return 0
    result, why = found
    print(f"first offending pass: {result.name} (round {result.round}): {why}")
    return 1
