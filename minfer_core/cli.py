"""The ``minfer`` command: run, info, plugins, coverage, and the pass commands."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .errors import MinferError
from .zoo import model_path


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``minfer`` console script; returns the exit code."""
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except MinferError as exc:
        print(f"minfer: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="minfer", description="Run and inspect ONNX models with minfer.")
    sub = parser.add_subparsers(metavar="COMMAND")
    run = sub.add_parser("run", help="run a model on given or random inputs")
    run.add_argument("model")
    run.add_argument("--input", "-i", action="append", default=[], metavar="NAME=FILE.npy", help="a feed from a .npy file")
    run.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE", help="size of a symbolic dim for random inputs")
    run.add_argument("--passes", default="all", help="pass level: all, extended, basic, none (default all)")
    run.add_argument("--repeat", type=int, default=1, help="run N times and report the median run time")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument(
        "--random-weights",
        action="store_true",
        help="replace ConstantOfShape weight placeholders (as in the onnx wheel's model-zoo files) by random weights",
    )
    run.set_defaults(func=cmd_run)
    plugins = sub.add_parser("plugins", help="list installed plugins and what each contributes")
    plugins.add_argument("--json", action="store_true", help="print JSON")
    plugins.set_defaults(func=cmd_plugins)
    info = sub.add_parser("info", help="a model's ops and which plugin provides each")
    info.add_argument("model")
    info.set_defaults(func=cmd_info)
    cov = sub.add_parser("coverage", help="run onnx's node conformance cases and print the coverage table")
    cov.add_argument("--op", action="append", default=[], help="only these op types")
    cov.add_argument("--failures", action="store_true", help="also list each failing case")
    cov.set_defaults(func=cmd_coverage)
    _add_optional_commands(sub)
    return parser


def _add_optional_commands(sub: Any) -> None:
    """Commands from other core modules, wired here so the CLI stays one parser."""
    import importlib

    for module in ("minfer_core.cli_passes", "minfer_core.cli_runtime"):
        try:
            mod = importlib.import_module(module)
        except ImportError:
            continue
        mod.add_commands(sub)


# ---- run -------------------------------------------------------------------


def cmd_run(args: argparse.Namespace) -> int:
    from .engine import InferenceSession

    from .zoo import randomized

    model: Any = model_path(args.model)
    if args.random_weights:
        model = randomized(model, seed=args.seed)
    start = time.perf_counter()
    sess = InferenceSession(model, passes=args.passes)
    build = time.perf_counter() - start
    feeds = _feeds(sess, args)
    times, outputs = [], []
    for _ in range(max(1, args.repeat)):
        t0 = time.perf_counter()
        outputs = sess.run(None, feeds)
        times.append(time.perf_counter() - t0)
    for arg, value in zip(sess.get_outputs(), outputs):
        flat = np.asarray(value).reshape(-1)
        print(f"{arg.name}: shape {tuple(np.shape(value))} dtype {np.asarray(value).dtype} first values {flat[:5].tolist()}")
    print(f"build {build * 1000:.1f} ms, run {np.median(times) * 1000:.2f} ms (median of {len(times)})")
    return 0


def _feeds(sess: Any, args: argparse.Namespace) -> dict[str, np.ndarray]:
    given = {}
    for item in args.input:
        name, _, path = item.partition("=")
        given[name] = np.load(path)
    dims = {k: int(v) for k, _, v in (d.partition("=") for d in args.dim)}
    rng = np.random.default_rng(args.seed)
    feeds = {}
    for arg in sess.get_inputs():
        if arg.name in given:
            feeds[arg.name] = given[arg.name]
            continue
        shape = [d if isinstance(d, int) else dims.get(str(d), 1) for d in arg.shape]
        feeds[arg.name] = _random(rng, np.dtype(arg.dtype or np.float32), shape)
    return feeds


def _random(rng: np.random.Generator, dtype: np.dtype, shape: list[int]) -> np.ndarray:
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    if dtype.kind in "iu":
        return rng.integers(0, 10, shape).astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, shape).astype(bool)
    return np.zeros(shape, dtype)


# ---- plugins / info ----------------------------------------------------------


def cmd_plugins(args: argparse.Namespace) -> int:
    from .plugins import get_registry

    reg = get_registry()
    if args.json:
        print(json.dumps({"plugins": [p.as_dict() for p in reg.plugins.values()], "conflicts": reg.conflicts()}, indent=2))
        return 0
    for p in sorted(reg.plugins.values(), key=lambda p: p.name):
        where = f"{p.distribution} {p.version}" if p.distribution else "registered in code"
        print(f"{p.name} ({where})")
        if p.error:
            print(f"  FAILED TO LOAD: {p.error}")
        for label, items in (("ops", p.ops), ("kernels", p.kernels), ("passes", p.passes)):
            if items:
                print(f"  {label} ({len(items)}): {', '.join(items)}")
    for conflict in reg.conflicts():
        print(f"conflict: {conflict}")
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    from .expand import function_body
    from .onnx_io import load_model
    from .plugins import get_registry, provider_hint

    graph = load_model(model_path(args.model))
    reg = get_registry()
    counts: dict[tuple[str, str], int] = {}
    for node in graph.nodes:
        counts[(node.domain, node.op_type)] = counts.get((node.domain, node.op_type), 0) + 1
    print(f"{args.model}: {len(graph.nodes)} nodes, opsets {graph.opsets}")
    missing = 0
    for (domain, op_type), n in sorted(counts.items(), key=lambda kv: kv[0][1]):
        name = f"{domain}::{op_type}" if domain else op_type
        node = next(x for x in graph.nodes if (x.domain, x.op_type) == (domain, op_type))
        kern = reg.select_kernel(domain, op_type, graph.opsets.get(domain, 1))
        if kern is not None:
            source = f"{kern.plugin} (kernel {op_type}-{kern.since})"
        elif function_body(graph, node) is not None:
            source = "ONNX function body (expanded at build)"
        else:
            missing += 1
            hint = provider_hint(domain, op_type)
            source = "MISSING: " + (f"install {hint}" if hint else "no known plugin provides it")
        print(f"  {name:28s} x{n:<4d} {source}")
    return 1 if missing else 0


# ---- coverage --------------------------------------------------------------


def cmd_coverage(args: argparse.Namespace) -> int:
    from . import conformance

    cases = conformance.load_cases()
    if args.op:
        cases = [c for c in cases if c.op_type[1] in set(args.op)]
    table = conformance.coverage(cases)
    print(conformance.format_table(table, failures=args.failures))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
