"""The pass commands of the ``minfer`` CLI: ``passes`` and ``optimize`` (``bisect-passes``: testing/commands.py).

`add_commands` adds them to the CLI's subparsers; `minfer_core.cli` wires it.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from .errors import PassError

STANDARD_DOMAINS = ("", "ai.onnx", "ai.onnx.ml")
LEVELS = ("all", "extended", "basic", "none")


def add_commands(sub: Any) -> None:
    """Add ``passes`` and ``optimize`` to an argparse subparsers object."""
    p = sub.add_parser("passes", help="list installed passes: plugin, level, ordering, tolerance")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--level", default="all", choices=LEVELS, help="also print the order this level runs in (default all)")
    p.set_defaults(func=cmd_passes)
    o = sub.add_parser("optimize", help="write the optimized model and print what each pass changed")
    o.add_argument("model", help="input .onnx (or a model shipped with onnx, e.g. light_resnet50)")
    o.add_argument("output", help="output .onnx")
    o.add_argument("--level", default="all", choices=LEVELS, help="pass level (default all)")
    o.add_argument("--disable", action="append", default=[], metavar="NAME", help="a pass not to run (repeatable)")
    o.add_argument("--portable", action="store_true", help="standard ONNX ops only: lower minfer's fused ops back")
    o.add_argument("--json", action="store_true", help="print the per-pass record as JSON")
    o.set_defaults(func=cmd_optimize)


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
    from .cli import model_arg
    from .onnx_io import load_model, save_model
    from .pipeline import summarize

    graph = load_model(model_arg(args.model))
    check_pass_names(args.disable)
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


def check_pass_names(names: list[str]) -> None:
    """``--disable NAME``: each NAME an installed pass (a typo would otherwise be ignored)."""
    from .cli import UsageError
    from .plugins import get_registry

    installed = sorted(p.name for p in get_registry().passes)
    for name in names:
        if name not in installed:
            raise UsageError(f"--disable {name!r}: no installed pass has that name (installed: {', '.join(installed)})")
