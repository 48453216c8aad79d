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
    from minfer_parallel.blas import get_blas_threads, set_blas_threads

    before = get_blas_threads()
    if before is None:
        pytest.skip("numpy's BLAS thread count cannot be read here (not OpenBLAS)")
    set_blas_threads(1)
    try:
        ceiling.numpy_gemm_ms(4, 4, 4, repeat=1)
        assert get_blas_threads() == 1
    finally:
        set_blas_threads(before)


def test_gemm_shapes_of_squeezenet_and_the_depthwise_convs_of_shufflenet():
    entries = ceiling.gemm_shapes("squeezenet", 2)
    assert len(entries) == 26  # every Conv of squeezenet 1.0; its classifier is a conv too
    first_options, label = entries[0]
    # conv1 (squeezenet 1.1): 64 filters of 3x3x3, stride 2 -> 111x111, both images in one GEMM; no Winograd (stride 2)
    assert first_options == [[(1, 64, 27, 2 * 111 * 111)]], label
    fire_3x3 = [options for options, label in entries if label.startswith("Conv (64, 16, 3, 3)")][0]
    # im2col (64 x 144 x 2*55*55) or Winograd's 16 GEMMs of 64 x 16 x tiles (2 images, 28x28 tiles each)
    assert fire_3x3 == [[(1, 64, 144, 2 * 55 * 55)], [(16, 64, 16, 2 * 28 * 28)]]
    shuffle = ceiling.gemm_shapes("shufflenet", 1)
    assert shuffle and not any(", 1, 3, 3)" in label for _, label in shuffle)  # depthwise convs have no GEMM
    grouped = [options for options, label in shuffle if label.startswith("Conv (112, 6, 1, 1)")][0]
    assert grouped == [[(4, 28, 6, 56 * 56)]]  # 4 groups of 28 x 6 x 3136


def test_gemm_floor_sums_the_cheaper_option_of_each_node(monkeypatch):
    calls = []

    def fake(m, k, n, repeat=7):
        calls.append((m, k, n))
        return m * k * n * 1e-9

    monkeypatch.setattr(ceiling, "numpy_gemm_ms", fake)
    monkeypatch.setattr(ceiling, "gemm_shapes", lambda name, batch: [
        ([[(1, 10, 10, 10)], [(16, 1, 1, 1)]], "a conv with a Winograd option"),
        ([[(2, 5, 5, 5)]], "a grouped conv"),
    ])
    floor = ceiling.gemm_floor_ms("any", 1)
    assert floor == pytest.approx(16 * 1e-9 + 2 * 125e-9)
    assert sorted(calls) == [(1, 1, 1), (5, 5, 5), (10, 10, 10)]
