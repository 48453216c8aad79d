"""A benchmark run says which BLAS kernels numpy ran, and bench.combine will not mix runs of different ones."""

import json
import os

import pytest

from bench import benchmark, combine

ROW = {"model": "squeezenet", "batch": 1, "minfer_ms": 10.0, "ort_ms": 4.0, "minfer_over_ort": 2.5,
       "arena_mib": 1.0, "live_set_mib": 1.0, "naive_mib": 2.0, "arena_over_live": 1.0}


def _run(tmp_path, name, coretype, ratio):
    row = dict(ROW, minfer_over_ort=ratio, minfer_ms=4.0 * ratio)
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"rows": [row], "settings": {"openblas_coretype": coretype}}))
    return str(path)


def test_blas_setting_names_threadpoolctls_architecture_and_the_pin():
    """The run's BLAS line names the architecture threadpoolctl reports and whether the environment pinned it."""
    from threadpoolctl import threadpool_info

    text = benchmark.blas_setting()
    archs = [i["architecture"] for i in threadpool_info() if i.get("user_api") == "blas" and i.get("architecture")]
    assert archs and all(a in text for a in archs)
    pin = os.environ.get("OPENBLAS_CORETYPE")  # read, never changed: tests run under the environment's setting
    assert (f"OPENBLAS_CORETYPE={pin}" if pin else "not pinned") in text


def test_the_markdown_table_names_the_blas_kernels_and_combine_reads_them_back(tmp_path):
    text = benchmark.markdown([ROW], {}, None, "SkylakeX")
    assert "numpy's BLAS (threadpoolctl): SkylakeX" in text
    path = tmp_path / "run.md"
    path.write_text(text)
    assert combine.blas_of(str(path)) == "SkylakeX"
    assert combine.load(str(path))[0]["minfer_over_ort"] == pytest.approx(2.5)


def test_combine_takes_the_median_of_runs_of_one_setting(tmp_path, capsys):
    runs = [_run(tmp_path, f"r{i}", "Haswell", ratio) for i, ratio in enumerate((2.0, 3.0, 2.5))]
    assert combine.main(runs) == 0
    assert "| squeezenet | 1 | 10.0 | 4.0 | 2.50 | 2.00-3.00 |" in capsys.readouterr().out


def test_combine_refuses_runs_of_different_blas_kernels(tmp_path, capsys):
    runs = [_run(tmp_path, "a", "Haswell", 2.0), _run(tmp_path, "b", "SkylakeX", 1.2)]
    assert combine.main(runs) == 2
    captured = capsys.readouterr()
    assert "different BLAS kernels (Haswell, SkylakeX)" in captured.err and "squeezenet" not in captured.out


def test_runs_from_before_the_label_combine_with_either(tmp_path, capsys):
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"rows": [dict(ROW, minfer_over_ort=2.0)]}))
    assert combine.main([str(old), _run(tmp_path, "new", "Haswell", 3.0)]) == 0


def test_onnxruntimes_own_speed_up_over_the_reference_is_reported_and_combined(tmp_path, capsys):
    """Each run shows ref/ORT beside ref/minfer and names where onnxruntime itself is under 50x; combine reads it."""
    rows = [dict(ROW, ref_ms=400.0, ref_over_minfer=40.0, ref_over_ort=100.0),
            dict(ROW, model="resnet50", ref_ms=160.0, ref_over_minfer=16.0, ref_over_ort=40.0)]
    summary = benchmark.summarize(rows, [1])
    assert summary["ort_below_50x"] == ["resnet50 b1 40x"]
    text = benchmark.markdown(rows, summary, None)
    assert "onnxruntime's own speed-up over ReferenceEvaluator is below 50x on: resnet50 b1 40x" in text
    path = tmp_path / "run.md"
    path.write_text(text)
    assert [r["ref_over_ort"] for r in combine.load(str(path))] == [100.0, 40.0]
    old = tmp_path / "old.json"  # runs from before the column: derived from the two times
    old.write_text(json.dumps({"rows": [dict(ROW, ref_ms=400.0, ref_over_minfer=40.0)]}))
    assert combine.load(str(old))[0]["ref_over_ort"] == pytest.approx(100.0)
    assert combine.main([str(old), str(path)]) == 0
    assert "| 2.50 | 2.50-2.50 | 40.0 | 100.0 |" in capsys.readouterr().out
