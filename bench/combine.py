"""Medians over several `bench.benchmark` runs: on a shared machine one run's figures move by 10-20%.

    .venv/bin/python -m bench.combine bench/results/run1.json bench/results/run2.json bench/results/run3.json

Reads each run's JSON (or its markdown table) and prints, per model and
batch, the median of minfer's and onnxruntime's times, the median of the
per-run ratios (each run measured both engines in alternating rounds, so a
run's ratio is the fairer figure), the spread of those ratios, the medians of
the other ratios the runs have (without numba, first run / median cold and
warm, runs 2..N max / median, peak memory minfer/ORT), and the geo-means over
the light models and over the real-model set.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any, Sequence

from bench.models import group_of

COLUMNS = {"minfer ms": "minfer_ms", "ORT ms": "ort_ms", "ref ms": "ref_ms", "minfer/ORT": "minfer_over_ort",
           "ref/minfer": "ref_over_minfer", "ref/ORT": "ref_over_ort", "minfer no-numba ms": "minfer_nonumba_ms"}
# further ratios a run may hold (the JSON only): their medians get a column when any run has them
EXTRA = {"no numba/ORT": "nonumba_over_ort", "first/median cold": "first_cold_over_median",
         "first/median warm": "first_warm_over_median", "runs 2..N max/median": "later_max_over_median",
         "peak minfer/ORT": "peak_over_ort"}


def load(path: str) -> list[dict[str, Any]]:
    """The rows of one run: from its JSON, or parsed from its markdown table."""
    text = Path(path).read_text()
    if path.endswith(".json"):
        data = json.loads(text)
        return _with_ref_over_ort(data["rows"] if isinstance(data, dict) else data)
    lines = _first_table(text.splitlines())
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = []
    for line in lines[2:]:
        cells = dict(zip(header, (c.strip() for c in line.strip("|").split("|"))))
        row: dict[str, Any] = {"model": cells["model"], "batch": int(cells["b"])}
        for column, key in COLUMNS.items():
            value = cells.get(column, "-")
            if value not in ("-", ""):
                row[key] = float(value)
        rows.append(row)
    return _with_ref_over_ort(rows)


def _first_table(lines: list[str]) -> list[str]:
    """The lines of the first Markdown table (a run's file has a per-model table after the summary lines)."""
    start = next((i for i, line in enumerate(lines) if line.startswith("|")), len(lines))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return lines[start:end]


def _with_ref_over_ort(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Runs before the ref/ORT column have both times: derive it."""
    for row in rows:
        if "ref_over_ort" not in row and row.get("ref_ms") and row.get("ort_ms"):
            row["ref_over_ort"] = row["ref_ms"] / row["ort_ms"]
    return rows


def blas_of(path: str) -> str | None:
    """The BLAS kernels a run was measured under, when its file says (runs before session 5 do not).

    Session 7 on: threadpoolctl's architecture and whether OPENBLAS_CORETYPE pinned it; before: the pin alone.
    """
    text = Path(path).read_text()
    if path.endswith(".json"):
        data = json.loads(text)
        return data.get("settings", {}).get("openblas_coretype") if isinstance(data, dict) else None
    for line in text.splitlines():
        if line.startswith(("numpy's BLAS kernels (OPENBLAS_CORETYPE): ", "numpy's BLAS (threadpoolctl): ")):
            return line.split(": ", 1)[1].strip()
    return None


def numba_of(path: str) -> str | None:
    """Whether a run's "minfer" ran with the numba plugin, when its JSON says (runs before the setting do not):
    its minfer is another engine than that of a run without it. "both" runs measured it with the plugin."""
    if not path.endswith(".json"):
        return None
    data = json.loads(Path(path).read_text())
    mode = data.get("settings", {}).get("numba") if isinstance(data, dict) else None
    return None if mode is None else "with numba" if mode in ("with", "both") else "without numba"


def combine(runs: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    keyed: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for rows in runs:
        for row in rows:
            keyed.setdefault((row["model"], row["batch"]), []).append(row)
    out = []
    for (model, batch), rows in sorted(keyed.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        ratios = [r["minfer_over_ort"] for r in rows]
        out.append({"model": model, "batch": batch, "runs": len(rows),
                    "minfer_ms": statistics.median(r["minfer_ms"] for r in rows),
                    "ort_ms": statistics.median(r["ort_ms"] for r in rows),
                    "ratio": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
                    **{key: statistics.median(r[key] for r in rows if r.get(key)) if any(r.get(key) for r in rows) else None
                       for key in ("ref_over_minfer", "ref_over_ort", *EXTRA.values())}})
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.combine")
    parser.add_argument("runs", nargs="+", help="bench.benchmark results (.json, or the .md table)")
    args = parser.parse_args(argv)
    settings = {blas_of(p) for p in args.runs} - {None}
    if len(settings) > 1:
        # numpy's GEMM runs at about twice the rate with OpenBLAS's own kernels here: a median across both is no figure
        print(f"these runs were measured under different BLAS kernels ({', '.join(sorted(settings))}): "
              "combine runs of one setting", file=sys.stderr)
        return 2
    numba = {numba_of(p) for p in args.runs} - {None}
    if len(numba) > 1:
        print(f"these runs measured minfer with different numba settings ({', '.join(sorted(numba))}): "
              "combine runs of one setting", file=sys.stderr)
        return 2
    rows = combine([load(p) for p in args.runs])
    print(f"medians over {len(args.runs)} runs\n")
    extra = {title: key for title, key in EXTRA.items() if any(r[key] for r in rows)}
    print("| model | b | minfer ms | ORT ms | minfer/ORT (median) | range over runs | ref/minfer | ref/ORT |"
          + "".join(f" {t} |" for t in extra))
    print("|---|---|---|---|---|---|---|---|" + "---|" * len(extra))
    for r in rows:
        ref, ref_ort = (f"{r[k]:.1f}" if r[k] else "-" for k in ("ref_over_minfer", "ref_over_ort"))
        print(f"| {r['model']} | {r['batch']} | {r['minfer_ms']:.1f} | {r['ort_ms']:.1f} | {r['ratio']:.2f} | "
              f"{r['ratio_min']:.2f}-{r['ratio_max']:.2f} | {ref} | {ref_ort} |"
              + "".join(f" {r[k]:.2f} |" if r[k] else " - |" for k in extra.values()))
    for batch in sorted({r["batch"] for r in rows}):
        for group in ("light", "real"):
            ratios = [r["ratio"] for r in rows if r["batch"] == batch and group_of(r["model"]) == group]
            if ratios:
                print(f"\nbatch {batch}: geo-mean of the median ratios over {len(ratios)} {group} models "
                      f"{_geomean(ratios):.2f}, worst {max(ratios):.2f}"
                      + "".join(f"; {t} {_geomean(vs):.2f}" for t, k in extra.items()
                                if (vs := [r[k] for r in rows if r["batch"] == batch and group_of(r["model"]) == group and r[k]])))
    return 0


def _geomean(xs: list[float]) -> float:
    return math.exp(sum(map(math.log, xs)) / len(xs))


if __name__ == "__main__":
    sys.exit(main())
