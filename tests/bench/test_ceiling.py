"""bench.ceiling's GEMM comparison: both engines timed on the shape asked for, figures consistent."""

import pytest

pytest.importorskip("onnxruntime")

from bench import ceiling  # noqa: E402


def test_gemm_gap_reports_both_engines_on_each_shape():
    rows = ceiling.gemm_gap([(8, 16, 32), (4, 8, 2)], rounds=1)
    assert [(r["m"], r["k"], r["n"]) for r in rows] == [(8, 16, 32), (4, 8, 2)]
    for r in rows:
        assert r["numpy_ms"] > 0 and r["ort_ms"] > 0
        assert r["ratio"] == pytest.approx(r["numpy_ms"] / r["ort_ms"])
        flop = 2 * r["m"] * r["k"] * r["n"]
        assert r["numpy_gflops"] == pytest.approx(flop / r["numpy_ms"] / 1e6)
        assert r["ort_gflops"] == pytest.approx(flop / r["ort_ms"] / 1e6)


def test_numpy_gemm_leaves_the_blas_thread_count_as_it_was():
    from minfer_core.threads import get_blas_threads, set_blas_threads

    before = get_blas_threads()
    if before is None:
        pytest.skip("numpy's BLAS thread count cannot be read here (not OpenBLAS)")
    set_blas_threads(1)
    try:
        ceiling.numpy_gemm_ms(4, 4, 4, repeat=1)
        assert get_blas_threads() == 1
    finally:
        set_blas_threads(before)
