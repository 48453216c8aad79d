"""The benchmark's summary and Markdown: the full table per model and batch, then one row per model of ratios.

The per-model table gives, for each batch (``b1, b8``): minfer/onnxruntime; the same without the numba plugin
(when it is installed); minfer's first run of the shape over its steady median, cold (fresh process, empty
caches) and warm (a second process after one ran the shape); onnxruntime's first run over its median; the
slowest of runs 2..N over the median (minfer's, then onnxruntime's); and peak memory minfer/onnxruntime.
Geo-means over the light models and over the real-model set close it.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from bench.models import group_of

# (column title, row key): the per-model table's ratios, each geo-meaned per set and batch
METRICS = (
    ("minfer/ORT", "minfer_over_ort"),
    ("minfer/ORT without numba", "nonumba_over_ort"),
    ("first run / median, cold", "first_cold_over_median"),
    ("first run / median, warm", "first_warm_over_median"),
    ("first run / median, cold, without numba", "nonumba_first_cold_over_median"),
    ("ORT first run / median", "ort_first_over_median"),
    ("runs 2..N max / median", "later_max_over_median"),
    ("ORT runs 2..N max / median", "ort_later_max_over_median"),
    ("peak memory minfer/ORT", "peak_over_ort"),
    ("peak memory minfer/ORT without numba", "nonumba_peak_over_ort"),
)
SETS = ("light", "real")


def geomean(xs: Sequence[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def summarize(rows: list[dict[str, Any]], batches: Sequence[int]) -> dict[str, Any]:
    """Geo-mean and worst minfer/onnxruntime over the light models per batch (``b1``, ...), each ratio's geo-mean
    per set and batch (``sets``), and the worst speed-ups over the ReferenceEvaluator."""
    out: dict[str, Any] = {}
    for b in batches:
        light = [r for r in rows if r["batch"] == b and group_of(r["model"]) == "light"]
        if light:
            worst = max(light, key=lambda r: r["minfer_over_ort"])
            out[f"b{b}"] = {
                "geomean_minfer_over_ort": geomean([r["minfer_over_ort"] for r in light]),
                "max_minfer_over_ort": worst["minfer_over_ort"],
                "max_model": worst["model"],
                "models": len(light),
            }
    out["sets"] = {s: {f"b{b}": _set_means([r for r in rows if r["batch"] == b and group_of(r["model"]) == s])
                       for b in batches} for s in SETS}
    refs = [r["ref_over_minfer"] for r in rows if "ref_over_minfer" in r]
    if refs:
        out["min_ref_over_minfer"] = min(refs)
    ort_refs = [r for r in rows if "ref_over_ort" in r]
    if ort_refs:
        out["ort_below_50x"] = [f"{r['model']} b{r['batch']} {r['ref_over_ort']:.0f}x"
                                for r in sorted(ort_refs, key=lambda r: r["ref_over_ort"]) if r["ref_over_ort"] < 50]
    return out


def _set_means(rows: list[dict[str, Any]]) -> dict[str, Any]:
    means: dict[str, Any] = {"models": len(rows)}
    for _, key in METRICS:
        values = [r[key] for r in rows if r.get(key)]
        if values:
            means[key] = geomean(values)
    return means


def markdown(rows: list[dict[str, Any]], summary: dict[str, Any], overhead: dict[str, float] | None,
             blas: str | None = None) -> str:
    """The run as Markdown: the full table, the summary lines, then the per-model ratio table."""
    lines = _full_table(rows) + [""] + _summary_lines(summary, blas, overhead)
    if rows:
        cell = ", ".join(f"b{b}" for b in sorted({r["batch"] for r in rows}))
        lines += ["", f"Per model (each cell: {cell}):", ""] + per_model_table(rows, summary)
    return "\n".join(lines)


def _full_table(rows: list[dict[str, Any]]) -> list[str]:
    head = ("| model | b | minfer ms | ORT ms | ref ms | minfer/ORT | ref/minfer | ref/ORT | arena MiB | live-set MiB "
            "| naive MiB | arena/live | minfer peak MB | ORT peak MB | minfer run MB | ORT run MB | minfer no-numba ms |")
    lines = [head, "|" + "---|" * 17]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['batch']} | {r['minfer_ms']:.1f} | {r['ort_ms']:.1f} | {_f(r.get('ref_ms'), 0)} "
            f"| {r['minfer_over_ort']:.2f} | {_f(r.get('ref_over_minfer'), 1)} | {_f(r.get('ref_over_ort'), 1)} "
            f"| {_f(r.get('arena_mib'), 2)} | {_f(r.get('live_set_mib'), 2)} | {_f(r.get('naive_mib'), 1)} "
            f"| {_f(r.get('arena_over_live'), 3)} "
            f"| {_f(r.get('minfer_peak_mb'), 1)} | {_f(r.get('onnxruntime_peak_mb'), 1)} "
            f"| {_f(r.get('minfer_run_peak_mb'), 1)} | {_f(r.get('onnxruntime_run_peak_mb'), 1)} "
            f"| {_f(r.get('minfer_nonumba_ms'), 1)} |"
        )
    return lines


def _summary_lines(summary: dict[str, Any], blas: str | None, overhead: dict[str, float] | None) -> list[str]:
    lines = []
    for key, s in summary.items():
        if key.startswith("b") and key[1:].isdigit():
            lines.append(f"batch {key[1:]}: geo-mean minfer/ORT {s['geomean_minfer_over_ort']:.2f} over {s['models']} "
                         f"light models, worst {s['max_minfer_over_ort']:.2f} ({s['max_model']})")
    for key, s in summary.get("sets", {}).get("real", {}).items():
        if s.get("minfer_over_ort"):
            lines.append(f"batch {key[1:]}: geo-mean minfer/ORT {s['minfer_over_ort']:.2f} over {s['models']} real models")
    if "min_ref_over_minfer" in summary:
        lines.append(f"slowest speed-up over ReferenceEvaluator: {summary['min_ref_over_minfer']:.1f}x")
    if summary.get("ort_below_50x"):
        lines.append("onnxruntime's own speed-up over ReferenceEvaluator is below 50x on: "
                     + ", ".join(summary["ort_below_50x"]))
    if blas:
        lines.append(f"numpy's BLAS (threadpoolctl): {blas}")
    if overhead:
        lines.append(
            f"run loop: {overhead['per_node_us']:.2f} us/node on a {overhead['nodes']}-node chain of tiny Adds, "
            f"of which the kernels {overhead['kernel_us']:.2f} us: overhead {overhead['overhead_us']:.2f} us/node"
        )
    return lines


def per_model_table(rows: list[dict[str, Any]], summary: dict[str, Any]) -> list[str]:
    """One row per model (cells ``b1, b8``), then a geo-mean row per set; a column no row has is left out."""
    metrics = [(title, key) for title, key in METRICS if any(r.get(key) for r in rows)]
    batches = sorted({r["batch"] for r in rows})
    lines = ["| model | set | " + " | ".join(t for t, _ in metrics) + " |", "|---|---|" + "---|" * len(metrics)]
    by_model: dict[str, dict[int, dict[str, Any]]] = {}
    for r in rows:
        by_model.setdefault(r["model"], {})[r["batch"]] = r
    for model, per_batch in by_model.items():
        cells = [", ".join(_f(per_batch.get(b, {}).get(key), 2) for b in batches) for _, key in metrics]
        lines.append(f"| {model} | {group_of(model)} | " + " | ".join(cells) + " |")
    for s in SETS:
        means = summary.get("sets", {}).get(s, {})
        if any(means.get(f"b{b}", {}).get("models") for b in batches):
            cells = [", ".join(_f(means.get(f"b{b}", {}).get(key), 2) for b in batches) for _, key in metrics]
            lines.append(f"| **geo-mean {s}** | | " + " | ".join(cells) + " |")
    return lines


def _f(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"
