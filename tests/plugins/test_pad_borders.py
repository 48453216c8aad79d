"""Pad's reflect, edge and wrap borders, written by slices into the planned buffer, equal numpy's np.pad."""

from __future__ import annotations

import numpy as np
import pytest

from minfer_ops_basic.pad import _pad


def cases(mode: str, count: int = 400):
    """Seeded (x, pads): ranks 1-4, dims 0-5, pads -2..4 per side (negative ones crop first, as in onnxruntime)."""
    rng = np.random.default_rng({"reflect": 1, "edge": 2, "wrap": 3}[mode])
    for _ in range(count):
        rank = int(rng.integers(1, 5))
        x = rng.standard_normal(tuple(int(d) for d in rng.integers(0, 6, rank))).astype(np.float32)
        yield x, [int(p) for p in rng.integers(-2, 5, 2 * rank)]


def expected(x: np.ndarray, pads: list[int], mode: str) -> np.ndarray | None:
    """np.pad of the cropped x, or None where np.pad refuses (a reflection or wrap of an empty axis)."""
    rank = x.ndim
    width = [(pads[i], pads[rank + i]) for i in range(rank)]
    cropped = x[tuple(slice(max(-b, 0), n - max(-e, 0)) for n, (b, e) in zip(x.shape, width))]
    try:
        return np.pad(cropped, [(max(b, 0), max(e, 0)) for b, e in width], mode=mode)
    except ValueError:
        return None


@pytest.mark.parametrize("mode", ["reflect", "edge", "wrap"])
def test_pad_borders_equal_np_pad(mode):
    """Reflect/edge/wrap Pad equals np.pad for every rank, crop and width (reflections wider than the axis
    too), into a fresh array and into a planned buffer whose old contents must all be overwritten."""
    checked = 0
    for x, pads in cases(mode):
        want = expected(x, pads, mode)
        if want is None:
            continue
        checked += 1
        np.testing.assert_array_equal(_pad(x, pads, mode), want, err_msg=f"{x.shape} {pads}")
        out = np.full(want.shape, np.nan, np.float32)
        assert _pad(x, pads, mode, out=out) is out
        np.testing.assert_array_equal(out, want, err_msg=f"{x.shape} {pads} into out")
    assert checked > 200
