"""onnx's node conformance cases against minfer: a cached case list, a runner, a coverage table.

``collect_testcases()`` takes seconds, so the cases are pickled once per onnx
version under ``$MINFER_CACHE`` (default ``~/.cache/minfer``).
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any, Iterable

import attrs
import numpy as np
import onnx

from ..errors import UnsupportedOpError


@attrs.frozen
class Case:
    """One node case: a single-node model and its data sets."""

    name: str
    model: bytes
    data_sets: list[Any]
    rtol: float
    atol: float

    @property
    def proto(self) -> onnx.ModelProto:
        return onnx.ModelProto.FromString(self.model)

    @property
    def op_type(self) -> tuple[str, str]:
        node = self.proto.graph.node[0]
        return (node.domain if node.domain != "ai.onnx" else "", node.op_type)


def cache_dir() -> Path:
    return Path(os.environ.get("MINFER_CACHE", Path.home() / ".cache" / "minfer"))


def load_cases() -> list[Case]:
    """Every onnx node case, from the cache (built on first use for this onnx version)."""
    path = cache_dir() / f"node-cases-onnx-{onnx.__version__}.pkl"
    if path.exists():
        try:
            return pickle.loads(path.read_bytes())
        except (pickle.UnpicklingError, AttributeError, ImportError, EOFError):
            pass  # written by another minfer version (its Case class lived elsewhere) or cut short: rebuild it
    import warnings

    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        raw = collect_testcases()
    cases = [Case(c.name, c.model.SerializeToString(), list(c.data_sets or []), c.rtol, c.atol) for c in raw if c.model is not None]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".partial")
    tmp.write_bytes(pickle.dumps(cases))
    os.replace(tmp, path)
    return cases


def run_case(case: Case) -> None:
    """Run one case through minfer's backend; raises AssertionError on a mismatch."""
    from . import backend

    rep = backend.prepare(case.proto)
    for inputs, expected in case.data_sets:
        got = rep.run([_array(x) for x in inputs])
        expected = [_array(x) for x in expected]
        assert len(got) >= len(expected), f"{case.name}: {len(got)} outputs, expected {len(expected)}"
        for i, (g, e) in enumerate(zip(got, expected)):
            assert_similar(g, e, case.rtol, case.atol, f"{case.name} output {i}")


def _array(value: Any) -> Any:
    if isinstance(value, onnx.TensorProto):
        return onnx.numpy_helper.to_array(value)
    return value


def assert_similar(got: Any, expected: Any, rtol: float, atol: float, what: str) -> None:
    """Compare as onnx's backend runner does: dtype, shape, then values within rtol/atol.

    A sequence (a list) compares element by element; an empty optional is None on both sides.
    """
    if expected is None or got is None:
        assert got is None and expected is None, f"{what}: {type(got).__name__}, expected {type(expected).__name__}"
        return
    if isinstance(expected, list):
        assert isinstance(got, list), f"{what}: {type(got).__name__}, expected a sequence"
        assert len(got) == len(expected), f"{what}: a sequence of {len(got)}, expected {len(expected)}"
        for i, (g, e) in enumerate(zip(got, expected)):
            assert_similar(g, e, rtol, atol, f"{what}[{i}]")
        return
    expected = np.asarray(expected)
    got = np.asarray(got)
    assert got.dtype == expected.dtype, f"{what}: dtype {got.dtype}, expected {expected.dtype}"
    assert got.shape == expected.shape, f"{what}: shape {got.shape}, expected {expected.shape}"
    if expected.dtype == object or expected.dtype.kind in "biuUS":
        np.testing.assert_array_equal(got, expected, err_msg=what)
    else:
        np.testing.assert_allclose(
            got.astype(np.float64), expected.astype(np.float64), rtol=rtol, atol=atol, err_msg=what, equal_nan=True
        )


def claimed(case: Case) -> bool:
    """Whether installed plugins claim every op the case's model uses.

    A case that needs anything no plugin claims (control flow in an ``_expanded``
    case, say) and fails for that reason is 'unsupported', not failed.
    """
    from ..graph import Graph
    from ..onnx_io import load_model
    from ..plugins import get_registry

    reg = get_registry()
    graph: Graph = load_model(case.proto)
    for domain, op_type in graph.op_types():
        if (domain, op_type) not in reg.ops and (domain, op_type) not in reg.kernels:
            return False
    return True


def _has_body(schema: Any) -> bool:
    return bool(schema.function_opset_versions or schema.context_dependent_function_opset_versions)


def coverage(cases: Iterable[Case]) -> dict[str, dict[str, Any]]:
    """Per op type: the plugin claiming it and cases passed/total."""
    from ..plugins import get_registry

    reg = get_registry()
    table: dict[str, dict[str, Any]] = {}
    for case in cases:
        domain, op_type = case.op_type
        key = f"{domain}::{op_type}" if domain else op_type
        row = table.setdefault(key, {"plugin": _owner(reg, domain, op_type), "passed": 0, "total": 0, "failed": []})
        row["total"] += 1
        try:
            run_case(case)
            row["passed"] += 1
        except (AssertionError, Exception) as exc:
            row["failed"].append((case.name, "unsupported" if isinstance(exc, UnsupportedOpError) else str(exc)[:200]))
    return table


def _owner(reg: Any, domain: str, op_type: str) -> str:
    claims = reg.ops.get((domain, op_type))
    if claims:
        return ",".join(sorted({str(c.plugin) for c in claims}))
    if onnx.defs.has(op_type, domain) and _has_body(onnx.defs.get_schema(op_type, domain=domain)):
        return "(function body)"
    return "-"


def format_table(table: dict[str, dict[str, Any]], *, failures: bool = False) -> str:
    """The coverage table as Markdown, with totals over claimed and all ops."""
    lines = ["| op type | provided by | passed / total |", "|---|---|---|"]
    passed = total = 0
    for op_type, row in sorted(table.items()):
        lines.append(f"| {op_type} | {row['plugin']} | {row['passed']} / {row['total']} |")
        passed, total = passed + row["passed"], total + row["total"]
        if failures:
            lines.extend(f"|  | {name} | {why.splitlines()[0] if why else ''} |" for name, why in row["failed"])
    lines.append(f"| **all** | | **{passed} / {total}** |")
    return "\n".join(lines)
