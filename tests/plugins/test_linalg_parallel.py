"""MatMul and Gemm split large products over the intra-op threads: same results, each output part written once."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from minfer_core import KernelContext
from minfer_core.parallel import using_threads
from minfer_ops_basic import linalg

RNG = np.random.default_rng(7)


def f32(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def prepared(k, op, consts, **attrs):
    ctx = KernelContext("n", op, 13, (None,) * len(consts), (None,), tuple(consts), 1)
    return k.fn(ctx, **attrs)


class Parts:
    """An epilogue that records each region it is handed and checks the regions never overlap."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.hits = np.zeros(shape, np.int64)
        self.regions: list[tuple[slice, ...]] = []
        self.threads: set[str] = set()
        self.lock = threading.Lock()

    def __call__(self, y: np.ndarray, region: tuple[slice, ...]) -> None:
        with self.lock:
            self.hits[region] += 1
            self.regions.append(region)
            self.threads.add(threading.current_thread().name)
        np.maximum(y[region], 0, out=y[region])  # a fused Relu, applied part by part


@pytest.fixture
def split_everything(monkeypatch):
    """Split every product, however small, over two threads (the threshold is for speed, not correctness)."""
    monkeypatch.setattr(linalg, "SPLIT_WORK", 0)
    with using_threads(2):
        yield


MATMUL_CASES = [
    ((64, 16), (16, 8)),  # more rows than columns: rows split
    ((3, 16), (16, 40)),  # columns split, with a last block narrower than COLUMN_BLOCK
    ((2, 5, 16), (16, 8)),  # stacked A, one B: rows of one merged GEMM, split along the batch axis
    ((1, 33, 16), (16, 8)),  # stacked A with a unit batch: rows split along axis 1
    ((1, 2, 16), (16, 70)),  # stacked A, wide B: columns
    ((2, 3, 9, 16), (2, 3, 16, 5)),  # batched: independent products
    ((4, 1, 6, 8), (3, 8, 7)),  # batched with broadcasting on both sides
    ((1, 1, 40, 8), (1, 1, 8, 6)),  # a batch of one: rows
    ((5, 8), (3, 8, 30)),  # a 2-D A against a batch of B's
]


@pytest.mark.parametrize("sa,sb", MATMUL_CASES)
@pytest.mark.parametrize("const_b", [False, True])
def test_matmul_split_matches_numpy(split_everything, sa, sb, const_b):
    """MatMul on two threads equals numpy's matmul (float tolerance), into a planned buffer too."""
    a, b = f32(*sa), f32(*sb)
    run = prepared(linalg.matmul_1, "MatMul", (None, b if const_b else None))
    want = np.matmul(a, b)
    got = run(a, None if const_b else b)
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    buf = np.full(want.shape, np.nan, np.float32)
    assert run(a, None if const_b else b, out=buf) is buf
    np.testing.assert_allclose(buf, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("sa,sb", MATMUL_CASES)
def test_matmul_epilogue_covers_the_output_once(split_everything, sa, sb):
    """The epilogue is handed disjoint regions covering the output once, after each is final."""
    a, b = f32(*sa), f32(*sb)
    want = np.maximum(np.matmul(a, b), 0)
    parts = Parts(want.shape)
    got = prepared(linalg.matmul_1, "MatMul", (None, None))(a, b, epilogue=parts)
    assert (parts.hits == 1).all()
    assert len(parts.regions) >= 2, "a split product hands over more than one part"
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("attrs", [{}, {"transA": 1}, {"transB": 1}, {"alpha": 0.5, "beta": 2.0},
                                   {"transA": 1, "transB": 1, "alpha": -1.5}])
@pytest.mark.parametrize("c_shape", [None, (24,), (1, 24), (40, 1), (40, 24)])
@pytest.mark.parametrize("const", [False, True])
def test_gemm_split_matches_the_formula(split_everything, attrs, c_shape, const):
    """Gemm on two threads computes alpha * A' @ B' + beta * C, C broadcast, constant or not."""
    a = f32(16, 40) if attrs.get("transA") else f32(40, 16)
    b = f32(24, 16) if attrs.get("transB") else f32(16, 24)
    c = None if c_shape is None else f32(*c_shape)
    run = prepared(linalg.gemm, "Gemm", (None, b, c) if const else (None, None, None), **attrs)
    ap = a.T if attrs.get("transA") else a
    bp = b.T if attrs.get("transB") else b
    want = attrs.get("alpha", 1.0) * ap @ bp + (0 if c is None else attrs.get("beta", 1.0) * c)
    args = (a, b) if c is None else (a, b, c)
    parts = Parts(want.shape)
    got = run(*args, epilogue=parts)
    np.testing.assert_allclose(got, np.maximum(want, 0), rtol=1e-5, atol=1e-5)
    assert (parts.hits == 1).all() and len(parts.regions) >= 2
    buf = np.empty(want.shape, np.float32)
    assert run(*args, out=buf) is buf
    np.testing.assert_allclose(buf, want, rtol=1e-5, atol=1e-5)


def test_both_threads_work_on_a_large_product():
    """At the real threshold a fully-connected layer (1 x 2048 @ 2048 x 4096) is split in two parts."""
    a, w = f32(1, 2048), f32(4096, 2048)
    run = prepared(linalg.gemm, "Gemm", (None, w, None), transB=1)
    serial = run(a, None)
    parts = Parts(serial.shape)
    with using_threads(2):
        got = run(a, None, epilogue=parts)
    assert len(parts.regions) == 2  # which thread takes which part is up to the pool
    np.testing.assert_allclose(got, np.maximum(serial, 0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("sa,sb", [((2, 3), (3, 4)), ((1, 8), (8, 8)), ((3,), (3, 5)), ((4, 3), (3,))])
def test_tiny_products_are_not_split(sa, sb):
    """Below the threshold (and for vectors) the product is computed whole: one region, no hand-over."""
    a, b = f32(*sa), f32(*sb)
    parts = Parts(np.matmul(a, b).shape)
    with using_threads(2):
        prepared(linalg.matmul_1, "MatMul", (None, None))(a, b, epilogue=parts)
    assert parts.regions == [(slice(None),) * parts.hits.ndim]


@pytest.mark.parametrize("dtype", [np.float16, np.float64, np.int64])
def test_other_dtypes_keep_their_dtype_when_split(split_everything, dtype):
    """float16 (computed in float32), float64 and int64 products come back in their own dtype."""
    a = (f32(12, 8) * 4).astype(dtype)
    b = (f32(8, 20) * 4).astype(dtype)
    want = np.matmul(a.astype(np.float64), b.astype(np.float64))
    got = prepared(linalg.matmul_1, "MatMul", (None, b))(a, None)
    assert got.dtype == dtype
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=2e-3 if dtype == np.float16 else 1e-9, atol=0.05)


def test_constant_weights_are_held_once():
    """A float32 weight is read in place (Gemm's transB one as a transposed view): no packing copy."""
    a, w, c = f32(2, 16), f32(8, 16), f32(8)
    gemm_run = prepared(linalg.gemm, "Gemm", (None, w, c), transB=1)
    held = [cell.cell_contents for cell in gemm_run.__closure__ if isinstance(cell.cell_contents, np.ndarray)]
    assert any(np.shares_memory(h, w) for h in held)
    assert not any(h.nbytes >= w.nbytes and not np.shares_memory(h, w) for h in held), "a copy of the weight"
    np.testing.assert_allclose(gemm_run(a, None, None), a @ w.T + c, rtol=1e-5, atol=1e-6)
    scaled = prepared(linalg.gemm, "Gemm", (None, w, None), transB=1, alpha=2.0)  # scaling needs its own array
    np.testing.assert_allclose(scaled(a, None), 2 * a @ w.T, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(w, w.copy())  # the original is never written


@pytest.mark.parametrize("sa,sb", [((40, 16), (16, 24)), ((2, 9, 16), (16, 40)), ((3, 5, 8), (3, 8, 6)), ((16,), (16, 3))])
def test_integer_products_stay_exact_when_split(split_everything, sa, sb):
    """MatMulInteger and QLinearMatMul give exactly the integer results on two threads."""
    a = RNG.integers(-128, 128, sa).astype(np.int8)
    b = RNG.integers(0, 256, sb).astype(np.uint8)
    want = np.matmul(a.astype(np.int64), b.astype(np.int64) - 7)
    got = prepared(linalg.matmul_integer, "MatMulInteger", (None,) * 4)(a, b, None, np.array(7, np.uint8))
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, want)
    one = np.array(1.0, np.float32)
    q = prepared(linalg.qlinear_matmul, "QLinearMatMul", (None,) * 8)(
        a, one, np.array(0, np.int8), b, one, np.array(7, np.uint8), np.array(64.0, np.float32), np.array(0, np.int8))
    np.testing.assert_array_equal(q, np.clip(np.rint(want / 64.0), -128, 127).astype(np.int8))
