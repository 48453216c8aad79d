"""Conv tiling: tiles cover the output once, every method (and tile size) is right with 1 and 2 threads,
the epilogue sees each output element exactly once, and the tuner keeps a correct method."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from modelkit import conv_case, reference_conv, run_conv_plan

from minfer_core.parallel import using_threads
from minfer_ops_conv import conv, tuner, winograd
from minfer_ops_conv.tiles import CHANNEL_ALIGN, MIN_COLUMNS, MIN_SPLIT_MACS, SPLIT, cut


def _covered(tiles, n, m, rows):
    seen = np.zeros((n, m, rows), dtype=int)
    for t in tiles:
        seen[t.image, t.m0 : t.m1, t.r0 : t.r1] += 1
    return seen


@pytest.mark.parametrize("n,m,rows,row_len,row_bytes,budget,macs", [
    (1, 64, 56, 56, 30_000, 1 << 20, 10**8),     # rows split by budget, balanced for the threads
    (1, 512, 7, 7, 150_000, 1 << 20, 10**8),     # narrow rows: split by output channels
    (8, 64, 28, 28, 50_000, 4 << 20, 10**9),     # many images
    (1, 8, 5, 5, 100, 1 << 20, 10**3),           # tiny: one tile
    (3, 40, 1, 1, 10**7, 1 << 10, 10**8),        # one row larger than the budget
    (1, 17, 3, 2, 100, 1 << 20, 10**8),          # too few rows and channels to split well
])
def test_tiles_cover_the_output_exactly_once(n, m, rows, row_len, row_bytes, budget, macs):
    tiles = cut(n, m, rows, row_len, row_bytes, budget, macs)
    assert (_covered(tiles, n, m, rows) == 1).all()
    assert all(t.m0 < t.m1 and t.r0 < t.r1 for t in tiles)
    if macs < MIN_SPLIT_MACS:
        assert len(tiles) == n  # not worth splitting: one tile per image
    elif SPLIT > 1 and n == 1:
        wide = -(-rows // SPLIT) * row_len >= MIN_COLUMNS or m >= 2 * CHANNEL_ALIGN
        # a conv worth splitting gives every thread work, unless its parts would be too narrow to run well
        assert (len(tiles) >= 2) == wide


@pytest.mark.parametrize("n", [4, 5, 8, 9])  # (2 images on 2 threads: one each, no merge)
def test_small_maps_merge_whole_images(n):
    tiles = cut(n, 64, 4, 4, 1000, 4 << 20, 10**9, merge_columns=128)
    assert (_covered_images(tiles, n, 64, 4) == 1).all()
    assert all(t.r0 == 0 and t.r1 == 4 and t.m0 == 0 and t.m1 == 64 for t in tiles)
    assert max(t.images for t in tiles) > 1 and len(tiles) >= min(n, SPLIT)


def test_merged_images_make_a_tile_count_the_threads_share_evenly():
    tiles = cut(8, 64, 7, 7, 1000, 4 << 20, 10**9, merge_columns=128)  # 3 images make 128 columns: 3 + 3 + 2
    assert sum(t.images for t in tiles) == 8 and len(tiles) % SPLIT == 0 and len({t.images for t in tiles}) == 1


def _covered_images(tiles, n, m, rows):
    seen = np.zeros((n, m, rows), dtype=int)
    for t in tiles:
        seen[t.image : t.image + t.images, t.m0 : t.m1, t.r0 : t.r1] += 1
    return seen


def test_row_tiles_are_balanced_for_the_threads():
    tiles = cut(1, 64, 28, 28, 229_000, 4 << 20, 10**8)  # 17 rows fit the budget: 17 + 11 would idle a thread
    sizes = [t.r1 - t.r0 for t in tiles]
    assert len(tiles) % SPLIT == 0 and max(sizes) - min(sizes) <= 1


CASES = [
    # (x shape, w shape, pads, strides): big enough that tiles split, odd sizes
    ((1, 64, 17, 15), (64, 64, 3, 3), [1, 1, 1, 1], [1, 1]),
    ((3, 32, 13, 11), (48, 32, 3, 3), [0, 1, 2, 1], [1, 1]),
    ((2, 24, 20, 21), (40, 24, 1, 1), [0, 0, 0, 0], [1, 1]),
    ((1, 96, 7, 7), (256, 96, 1, 1), [0, 0, 0, 0], [1, 1]),
    ((2, 16, 23, 19), (32, 16, 3, 3), [1, 1, 1, 1], [2, 2]),
    ((1, 3, 40, 40), (16, 3, 7, 7), [3, 3, 3, 3], [2, 2]),
    ((5, 32, 7, 9), (40, 32, 3, 3), [1, 1, 1, 1], [1, 1]),  # small maps: Winograd merges images per GEMM
    ((2, 16, 15, 13), (48, 16, 1, 1), [0, 0, 0, 0], [2, 2]),  # strided pointwise: contiguous copy per tile
    ((1, 40, 9, 11), (24, 40, 1, 1), [0, 0, 0, 0], [2, 1]),   # strided pointwise, more channels in than out
    ((6, 24, 5, 7), (40, 24, 1, 1), [0, 0, 0, 0], [1, 1]),    # small maps, batch: images share a GEMM
    ((5, 16, 9, 9), (24, 16, 1, 1), [0, 0, 0, 0], [2, 2]),    # the same, strided
    ((7, 8, 6, 5), (12, 8, 3, 3), [1, 0, 1, 2], [2, 1]),      # im2col over several images per GEMM
    ((2, 8, 9, 30), (16, 8, 3, 3), [1, 1, 1, 1], [1, 1]),     # Winograd with long rows, few channels: channels first
]


@pytest.mark.parametrize("folded", [False, True])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("xs,ws,pads,strides", CASES)
def test_every_method_with_bias_and_epilogue(monkeypatch, threads, xs, ws, pads, strides, folded):
    """Each candidate (im2col, pointwise, Winograd, both tile sizes) = conv + bias, epilogue once per element.

    ``folded``: the bias was packed with the weights, so the methods that copy their operand add it in the GEMM.
    """
    monkeypatch.setattr(winograd, "MIN_CHANNELS", 1)
    monkeypatch.setattr(winograd, "MIN_OUT_CHANNELS", 1)
    monkeypatch.setattr(winograd, "MIN_TILES", 1)
    monkeypatch.setattr("minfer_ops_conv.tiles.MIN_SPLIT_MACS", 1)  # split even these small convs
    x, w, b, want, win, p = conv_case(xs, ws, pads, strides, folded)
    assert (p.biased is not None) is folded and np.array_equal(p.matrix[0], w.reshape(ws[0], -1))
    plans = conv.candidates(win, p, xs[1])
    assert len(plans) >= 2
    for plan in plans:
        run_conv_plan(plan, x, p, b, want, threads)


def test_tuner_keeps_a_correct_method_per_thread_count(monkeypatch):
    monkeypatch.setattr(conv, "TUNE", True)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 64, 20, 20)).astype(np.float32)
    w = (rng.standard_normal((64, 64, 3, 3)) / 24).astype(np.float32)
    b = rng.standard_normal(64).astype(np.float32)
    win = conv.geo.window((20, 20), (3, 3), pads=[1, 1, 1, 1], clamp_same=True)
    p = conv.pack(w, 1, build_time=True, bias=b)
    plan = conv.plan_for(win, p, 64)
    assert isinstance(plan, conv.Tuned)
    want = reference_conv(x, w, b, [1, 1, 1, 1], [1, 1])
    for threads in (1, 2, 1):
        y = np.empty(want.shape, np.float32)
        with using_threads(threads):
            plan(x, p, y, conv._bias_column(b, 2, np.float32), None)  # tuning runs add the bias to their own result
        np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)
    assert set(plan.choice) == {1, 2} and all(c in plan.plans for c in plan.choice.values())


def test_tuner_times_one_plan_per_distinct_tiling(monkeypatch):
    """Tile budgets that cut an input into the same tiles are one candidate; a batch they cut apart is two."""
    monkeypatch.setattr(conv, "PREFER", ("rows",))  # the channel plans: tests/kernels/test_conv_tiling.py
    p = conv.pack(np.ones((64, 64, 1, 1), np.float32), 1, build_time=True)
    win = conv.geo.window((56, 56), (1, 1), clamp_same=True)
    plans = conv.candidates(win, p, 64)
    assert len(plans) == 2
    assert tuner.distinct(plans, np.empty((1, 64, 56, 56), np.float32), p) == plans[:1]
    assert tuner.distinct(plans, np.empty((8, 64, 56, 56), np.float32), p) == plans
    calls = []

    def counted(plan):
        def run(*args):
            calls.append(plan)
            plan(*args)
        run.tiling, run.__qualname__ = plan.tiling, plan.__qualname__
        return run

    wrapped = [counted(plan) for plan in plans]
    x = np.zeros((1, 64, 56, 56), np.float32)
    assert conv.Tuned(wrapped)._fastest(x, p, np.empty_like(x)) is wrapped[0] and calls == []  # nothing to time


def test_tuning_off_takes_the_first_candidate(monkeypatch):
    monkeypatch.setattr(conv, "TUNE", False)
    w = np.ones((64, 64, 3, 3), np.float32)
    win = conv.geo.window((20, 20), (3, 3), pads=[1, 1, 1, 1], clamp_same=True)
    plan = conv.plan_for(win, conv.pack(w, 1, build_time=True), 64)
    assert not isinstance(plan, conv.Tuned)


@pytest.mark.parametrize("winner,kept", [(0, False), (-1, True)])
def test_winograd_weights_are_held_only_while_a_chosen_method_uses_them(monkeypatch, winner, kept):
    """Tuning makes the Winograd weights; when im2col wins for every shape they are dropped again."""
    monkeypatch.setattr(conv, "TUNE", True)
    monkeypatch.setattr(conv.Tuned, "_fastest", lambda self, x, p, y, bias=None: (p.winograd_weights(), self.plans[winner])[1])
    packs: list[conv.Packed] = []
    real_pack = conv.pack
    monkeypatch.setattr(conv, "pack", lambda *a, **k: packs.append(real_pack(*a, **k)) or packs[-1])
    rng = np.random.default_rng(5)
    w = (rng.standard_normal((64, 64, 3, 3)) / 24).astype(np.float32)

    class Ctx:
        constants = [None, w, None]

    run = conv.conv.fn(Ctx(), pads=[1, 1, 1, 1])
    x = rng.standard_normal((1, 64, 16, 16)).astype(np.float32)
    y = run(x, None)
    np.testing.assert_allclose(y, reference_conv(x, w, np.zeros(64), [1, 1, 1, 1], [1, 1]), rtol=1e-4, atol=1e-4)
    assert packs[0].has_winograd_weights is kept


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("xs,ws,group,pads,strides", [
    ((1, 24, 14, 13), (24, 6, 1, 1), 4, [0, 0, 0, 0], [1, 1]),    # shufflenet-like 1x1 group 4
    ((3, 12, 9, 8), (18, 4, 1, 1), 3, [0, 0, 0, 0], [2, 1]),      # strided, batch 3
    ((1, 16, 11, 10), (8, 8, 3, 3), 2, [1, 1, 1, 1], [1, 1]),     # grouped 3x3 (im2col)
    ((2, 12, 7, 9), (12, 4, 3, 3), 3, [0, 1, 1, 0], [2, 2]),
])
def test_grouped_convs_split_by_group(monkeypatch, threads, xs, ws, group, pads, strides):
    """Grouped convs share whole groups out between threads: conv + bias, the epilogue once per element."""
    monkeypatch.setattr(conv, "MIN_GROUP_SPLIT_MACS", 1)
    rng = np.random.default_rng(sum(xs) + group)
    x = rng.standard_normal(xs).astype(np.float32)
    w = (rng.standard_normal(ws) / np.sqrt(np.prod(ws[1:]))).astype(np.float32)
    b = rng.standard_normal(ws[0]).astype(np.float32)
    cg, mg = xs[1] // group, ws[0] // group
    want = np.concatenate([reference_conv(x[:, k * cg : (k + 1) * cg], w[k * mg : (k + 1) * mg], b[k * mg : (k + 1) * mg],
                                      pads, strides) for k in range(group)], axis=1)
    win = conv.geo.window(xs[2:], ws[2:], strides=strides, pads=pads, clamp_same=True)
    p = conv.pack(w, group, build_time=True)
    for plan in conv.candidates(win, p, xs[1]):
        y = np.full(want.shape, np.nan, dtype=np.float32)
        seen = np.zeros(want.shape, dtype=int)
        lock = threading.Lock()

        def epilogue(out, region):
            with lock:
                seen[region] += 1

        with using_threads(threads):
            plan(x, p, y, conv._bias_column(b, 2, np.float32), epilogue)
        assert (seen == 1).all()
        np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)
    if threads == 2:
        tiles = conv._grouped_tiles(xs[0], p, want.shape[2], 10**9)
        assert len({(t.m0, t.m1) for t in tiles}) == min(group, 2 if xs[0] == 1 else 1)


@pytest.mark.parametrize("c,m,eligible", [(128, 32, True), (64, 64, True), (16, 64, False), (128, 16, False)])
def test_winograd_is_a_candidate_from_64_input_and_32_output_channels(c, m, eligible):
    """Few output channels still pay for Winograd's transforms (densenet's 128 -> 32); few input channels do not."""
    win = conv.geo.window((28, 28), (3, 3), pads=[1, 1, 1, 1], clamp_same=True)
    plans = conv.candidates(win, conv.pack(np.ones((m, c, 3, 3), np.float32), 1, build_time=True), c)
    assert any(getattr(plan, "winograd", False) for plan in plans) is eligible
