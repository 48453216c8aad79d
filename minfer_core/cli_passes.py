"""The pass commands of the ``minfer`` CLI: ``passes``, ``optimize`` and ``bisect-passes``.

`add_commands` adds them to the CLI's subparsers; `minfer_core.cli` wires it.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import numpy as np

from .errors import PassError

STANDARD_DOMAINS = ("", "ai.onnx", "ai.onnx.ml")


def add_commands(sub: Any) -> None:
    """Add ``passes``, ``optimize`` and ``bisect-passes`` to an argparse subparsers object."""
    p = sub.add_parser("passes", help="list installed passes: plugin, level, ordering, tolerance")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--level", default="all", help="also print the order this level runs in (default all)")
    p.set_defaults(func=cmd_passes)
    o = sub.add_parser("optimize", help="write the optimized model and print what each pass changed")
    o.add_argument("model", help="input .onnx (or a model shipped with onnx, e.g. light_resnet50)")
    o.add_argument("output", help="output .onnx")
    o.add_argument("--level", default="all", help="basic, extended, all or none (default all)")
    o.add_argument("--disable", action="append", default=[], metavar="NAME", help="a pass not to run (repeatable)")
    o.add_argument("--portable", action="store_true", help="standard ONNX ops only: lower minfer's fused ops back")
    o.add_argument("--json", action="store_true", help="print the per-pass record as JSON")
    o.set_defaults(func=cmd_optimize)
    b = sub.add_parser("bisect-passes", help="find the first pass application that moves outputs beyond its tolerance")
    b.add_argument("model")
    b.add_argument("--level", default="all")
    b.add_argument("--disable", action="append", default=[], metavar="NAME")
    b.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    b.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE", help="size of a symbolic input dim")
    b.set_defaults(func=cmd_bisect)


# ---- passes ------------------------------------------------------------------


def _pass_row(p: Any) -> dict[str, Any]:
    return {
        "name": p.name, "plugin": p.plugin, "level": p.level, "role": p.role, "after": list(p.after),
        "before": list(p.before), "requires": list(p.requires), "rtol": p.rtol, "atol": p.atol,
        "target_strategy": p.patterns is not None, "summary": p.summary,
    }


def cmd_passes(args: argparse.Namespace) -> int:
    from .pipeline import select_passes
    from .plugins import get_registry

    reg = get_registry()
    rows = [_pass_row(p) for p in reg.passes]
    order = [p.name for p in select_passes(reg, args.level)]
    if args.json:
        print(json.dumps({"passes": rows, "order": {args.level: order}}, indent=2))
        return 0
    for r in rows:
        print(f"{r['name']}  [{r['plugin']}]  level={r['level']}" + (f" role={r['role']}" if r["role"] != "optimize" else ""))
        ordering = [f"{k}={','.join(r[k])}" for k in ("after", "before", "requires") if r[k]]
        print(f"    tolerance rtol={r['rtol']:g} atol={r['atol']:g}" + (f"  {' '.join(ordering)}" if ordering else ""))
        if r["summary"]:
            print(f"    {r['summary']}")
    print(f"order ({args.level}): {' -> '.join(order)}")
    return 0


# ---- optimize -------------------------------------------------------------


def optimize_graph(graph: Any, level: Any = "all", disabled: Any = (), portable: bool = False) -> list[Any]:
    """Optimize ``graph`` in place as ``minfer optimize`` does; returns the pass records."""
    from .pipeline import optimize, order_passes, run_passes
    from .plugins import get_registry

    reg = get_registry()
    results = optimize(graph, reg, level, disabled)
    if portable:
        lowering = order_passes([p for p in reg.passes if p.role == "portable" and p.name not in set(disabled)])
        results += run_passes(graph, lowering)
        custom = sorted({f"{n.domain}::{n.op_type}" for n in graph.nodes if n.domain not in STANDARD_DOMAINS})
        if custom:
            raise PassError(f"--portable: no installed portable pass lowers {custom} to standard ops")
        for domain in [d for d in graph.opsets if d not in STANDARD_DOMAINS]:
            del graph.opsets[domain]
    return results


def cmd_optimize(args: argparse.Namespace) -> int:
    from .onnx_io import load_model, save_model
    from .pipeline import summarize
    from .zoo import model_path

    graph = load_model(model_path(args.model))
    before = len(graph.nodes)
    results = optimize_graph(graph, args.level, args.disable, args.portable)
    save_model(graph, args.output)
    table = summarize(results)
    if args.json:
        print(json.dumps({"nodes_before": before, "nodes_after": len(graph.nodes), "passes": table,
                          "applications": [r.describe() for r in results]}, indent=2))
        return 0
    for name, row in table.items():
        print(f"{name:28s} x{row['applications']:<3d} removed {row['removed']:5d}  added {row['added']:5d}  net {row['delta']:+d}")
    print(f"{args.model}: {before} -> {len(graph.nodes)} nodes; wrote {args.output}" + (" (portable)" if args.portable else ""))
    return 0


# ---- bisect-passes ----------------------------------------------------------


def _feeds(graph: Any, seed: int, dims: dict[str, int]) -> dict[str, np.ndarray]:
    from .testing.builder import random_array

    rng = np.random.default_rng(seed)
    feeds = {}
    for name in graph.inputs:
        t = graph.types.get(name)
        if t is None or t.shape is None:
            raise PassError(f"input {name!r} has no declared shape; bisect-passes cannot draw a feed for it")
        shape = [d if isinstance(d, int) else dims.get(str(d), 1) for d in t.shape]
        feeds[name] = random_array(rng, shape, t.dtype)
    return feeds


def bisect(graph: Any, level: Any = "all", disabled: Any = (), feeds: dict[str, np.ndarray] | None = None,
           log: Any = print) -> tuple[Any, str] | None:
    """Apply the pipeline one pass at a time; return (record, why) for the first application that
    moves the outputs beyond that pass's tolerance, or None when none does."""
    from .pipeline import MAX_ROUNDS, apply_pass, select_passes
    from .plugins import get_registry
    from .testing.checks import outputs_mismatch, run_graph

    passes = select_passes(get_registry(), level, disabled)
    feeds = feeds if feeds is not None else _feeds(graph, 0, {})
    current = run_graph(graph, feeds)
    for round_ in range(1, MAX_ROUNDS + 1):
        changed = False
        for p in passes:
            result = apply_pass(graph, p, round_=round_)
            if not result.changed:
                continue
            changed = True
            outputs = run_graph(graph, feeds)
            why = outputs_mismatch(current, outputs, p.rtol, p.atol, graph.outputs)
            log(f"{result.describe()}: " + ("BEYOND TOLERANCE" if why else "ok"))
            if why:
                return result, why
            current = outputs
        if not changed:
            break
    return None


def cmd_bisect(args: argparse.Namespace) -> int:
    from .onnx_io import load_model
    from .zoo import model_path

    graph = load_model(model_path(args.model))
    dims = {k: int(v) for k, _, v in (d.partition("=") for d in args.dim)}
    found = bisect(graph, args.level, args.disable, _feeds(graph, args.seed, dims))
    if found is None:
        print("every pass application kept the outputs within its tolerance")
        return 0
    result, why = found
    print(f"first offending pass: {result.name} (round {result.round}): {why}")
    return 1
