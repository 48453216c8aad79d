"""The ``minfer`` command: run, info, plugins; the pass, runtime and test-tooling commands join from their modules.

Exit codes: 0 success; 1 the model was read but minfer refused or failed it
(a `MinferError`); 2 a mistake on the command line (an unknown option, input
or dim, a file named there that is missing or unreadable, an output folder
that does not exist), always as one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Any, NoReturn, Sequence

import numpy as np

from .errors import BadFeedError, MinferError, ModelLoadError
from .testing.zoo import model_path

MAX_DIM = 2**31 - 1
PASS_LEVELS = ("all", "extended", "basic", "none")


class UsageError(Exception):
    """A mistake on the command line: reported as one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors on one line (usage is one ``--help`` away)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``minfer`` console script; returns the exit code."""
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        _check_output_folders(args)
        return int(args.func(args) or 0)
    except (UsageError, BadFeedError) as exc:
        print(f"minfer: error: {exc}", file=sys.stderr)
        return 2
    except MinferError as exc:
        print(f"minfer: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


def _parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = _Parser(prog="minfer", description="Run and inspect ONNX models with minfer.")
    parser.add_argument("--version", action="version", version=f"minfer {__version__}")
    sub = parser.add_subparsers(metavar="COMMAND")
    run = sub.add_parser("run", help="run a model on given or random inputs")
    run.add_argument("model")
    run.add_argument("--input", "-i", action="append", default=[], metavar="NAME=FILE.npy", help="a feed from a .npy file")
    run.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE",
                     help="size of a symbolic dim for random inputs (dims not given are 1)")
    run.add_argument("--passes", default="all", choices=PASS_LEVELS, help="pass level (default all)")
    run.add_argument("--repeat", type=int, default=1, help="run N times and report the median run time")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--random-weights", action="store_true", help="replace ConstantOfShape weight placeholders "
                     "(as in the onnx wheel's model-zoo files) by random weights")
    run.set_defaults(func=cmd_run)
    plugins = sub.add_parser("plugins", help="list installed plugins and what each contributes")
    plugins.add_argument("--json", action="store_true", help="print JSON")
    plugins.set_defaults(func=cmd_plugins)
    info = sub.add_parser("info", help="a model's ops and which plugin provides each")
    info.add_argument("model")
    info.set_defaults(func=cmd_info)
    _add_optional_commands(sub)
    return parser


def _add_optional_commands(sub: Any) -> None:
    """Commands from other core modules, wired here so the CLI stays one parser."""
    import importlib

    for module in ("minfer_core.cli_passes", "minfer_core.cli_runtime", "minfer_core.testing.commands"):
        try:
            mod = importlib.import_module(module)
        except ImportError:
            continue
        mod.add_commands(sub)


# ---- command-line values ----------------------------------------------------------


def model_arg(name: str) -> str:
    """The model file a command names (or a model shipped with onnx); a UsageError when there is none."""
    from .rawdata import open_regular

    try:
        path = model_path(name)
        with open_regular(path, "model file"):
            return path
    except ModelLoadError as exc:
        raise UsageError(str(exc)) from exc


def _check_output_folders(args: argparse.Namespace) -> None:
    """An output file's folder must exist before any work is done: a long run is not lost at the end."""
    for attr, flag in (("output", "output"), ("profile", "--profile")):
        value = getattr(args, attr, None)
        if isinstance(value, str) and not Path(value).resolve().parent.is_dir():
            raise UsageError(f"{flag} {value!r}: folder {str(Path(value).parent)!r} does not exist; create it first")


def parse_dims(items: Sequence[str], known: Sequence[str]) -> dict[str, int]:
    """``--dim NAME=SIZE`` values, each NAME one of ``known`` (the model's symbolic dims)."""
    dims = {}
    for item in items:
        name, eq, text = item.partition("=")
        if not eq or not name:
            raise UsageError(f"--dim {item!r}: expected NAME=SIZE")
        if name not in known:
            listed = ", ".join(sorted(known)) or "none: every input dim is fixed"
            raise UsageError(f"--dim {item!r}: the model's inputs have no dim named {name!r} (symbolic dims: {listed})")
        if not re.fullmatch(r"\+?[0-9]+", text.strip()) or int(text) > MAX_DIM:
            raise UsageError(f"--dim {item!r}: SIZE must be a whole number from 0 to {MAX_DIM}")
        dims[name] = int(text)
    return dims


def load_npy(item: str, names: Sequence[str]) -> tuple[str, np.ndarray]:
    """An ``--input NAME=FILE.npy`` value: NAME one of the model's inputs, FILE a plain .npy array.

    Pickled (object) arrays are refused, and the file is mapped rather than read,
    so a header that claims more data than the file holds fails before allocating.
    """
    name, eq, path = item.partition("=")
    if not eq or not name or not path:
        raise UsageError(f"--input {item!r}: expected NAME=FILE.npy")
    if name not in names:
        raise UsageError(f"--input {item!r}: the model has no input {name!r} (inputs: {', '.join(names)})")
    from .rawdata import open_regular

    try:
        with open_regular(path, f"--input {name}"):
            pass
        value = np.load(path, mmap_mode="r", allow_pickle=False)
        if not isinstance(value, np.ndarray):
            raise ValueError("it holds several arrays (an .npz archive?)")
        return name, np.array(value)
    except ModelLoadError as exc:
        raise UsageError(str(exc)) from exc
    except (OSError, ValueError, EOFError, TypeError) as exc:
        raise UsageError(f"--input {item!r}: not a readable .npy array ({exc})") from exc


# ---- run -------------------------------------------------------------------


def cmd_run(args: argparse.Namespace) -> int:
    from .session import InferenceSession
    from .testing.zoo import randomized

    model: Any = model_arg(args.model)
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
    """The feeds of a run: the given .npy files, and random arrays of the declared shapes for the rest."""
    from .rawdata import memory_bytes

    inputs = sess.get_inputs()
    given = dict(load_npy(item, [a.name for a in inputs]) for item in args.input)
    symbolic = {str(d) for a in inputs for d in (a.shape or ()) if isinstance(d, str)}
    dims = parse_dims(args.dim, sorted(symbolic))
    rng = np.random.default_rng(args.seed)
    feeds = {}
    for arg in inputs:
        if arg.name in given:
            feeds[arg.name] = given[arg.name]
            continue
        if arg.shape is None:
            raise UsageError(f"input {arg.name!r} has no declared shape: give it with --input {arg.name}=FILE.npy")
        shape = [d if isinstance(d, int) else dims.get(str(d), 1) for d in arg.shape]
        dtype = np.dtype(arg.dtype or np.float32)
        limit = memory_bytes()
        if limit is not None and int(np.prod(shape, dtype=object)) * dtype.itemsize > limit:
            raise UsageError(f"input {arg.name!r} of shape {shape} would not fit in memory; give smaller --dim sizes")
        feeds[arg.name] = _random(rng, dtype, shape)
    return feeds


def _random(rng: np.random.Generator, dtype: np.dtype, shape: list[int]) -> np.ndarray:
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    if dtype.kind in "iub":  # integers 0..9, booleans either way
        return rng.integers(0, 2 if dtype.kind == "b" else 10, shape).astype(dtype)
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
        for label, items in (("ops", p.ops), ("kernels", p.kernels), ("passes", p.passes), ("executors", p.executors)):
            if items:
                print(f"  {label} ({len(items)}): {', '.join(items)}")
    for conflict in reg.conflicts():
        print(f"conflict: {conflict}")
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    from .expand import function_body
    from .onnx_io import load_model
    from .plugins import get_registry, provider_hint

    graph = load_model(model_arg(args.model))
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


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
