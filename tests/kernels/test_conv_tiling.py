"""Conv tiling by output channels: the shares cover every channel once and equally, each method computes the
same conv with either preference (1 and 2 threads), and the tuner only times the channel tiling where it differs."""

from __future__ import annotations

import numpy as np
import pytest
from modelkit import conv_case, run_conv_plan

from minfer_ops_conv import conv, tiles, tuner
from minfer_ops_conv.tiles import cut


def _covered(tile_list, n, m, rows):
    seen = np.zeros((n, m, rows), dtype=int)
    for t in tile_list:
        seen[t.image : t.image + t.images, t.m0 : t.m1, t.r0 : t.r1] += 1
    return seen


@pytest.mark.parametrize("split", [2, 3, 4])
@pytest.mark.parametrize("n,m,rows,row_len,row_bytes,budget", [
    (1, 1024, 14, 14, 71_680, 1 << 20),   # resnet50's 256 -> 1024 1x1: rows would give two 7-row tiles
    (1, 40, 9, 11, 1_000, 1 << 20),       # 40 channels: shares of 20 (aligned to 4), not 32 + 8
    (1, 255, 5, 6, 1_000, 1 << 20),       # odd channel count
    (1, 72, 56, 56, 300_000, 1 << 20),    # rows cut to fit the budget too
    (3, 48, 7, 5, 1_000, 1 << 20),        # fewer images than threads
])
def test_channel_tiles_cover_every_channel_once_in_equal_shares(monkeypatch, split, n, m, rows, row_len, row_bytes,
                                                                  budget):
    """Each (image, row block) is cut into one channel share per thread of that image; every element once."""
    monkeypatch.setattr(tiles, "SPLIT", split)
    got = cut(n, m, rows, row_len, row_bytes, budget, 10**9, 128, prefer="channels")
    assert (_covered(got, n, m, rows) == 1).all()
    if n >= split:
        assert got == cut(n, m, rows, row_len, row_bytes, budget, 10**9, 128)  # whole images share out already
        return
    parts = min(-(-split // n), m // tiles.CHANNEL_ALIGN)
    blocks: dict[tuple[int, int, int], list[tuple[int, int]]] = {}
    for t in got:
        blocks.setdefault((t.image, t.r0, t.r1), []).append((t.m0, t.m1))
    for shares in blocks.values():
        assert len(shares) == parts and shares[0][0] == 0 and shares[-1][1] == m
        assert all(a[1] == b[0] for a, b in zip(shares, shares[1:]))  # adjacent: each channel once
        sizes = [m1 - m0 for m0, m1 in shares]
        assert max(sizes) - min(sizes) <= (0 if m % parts == 0 else 1)
    assert len(blocks) == n * -(-rows // max(1, min(rows, budget // row_bytes)))


def test_channel_preference_changes_what_rows_would_cut_at_batch_1(monkeypatch):
    """resnet50's 256 -> 1024 1x1 at 14x14: rows give each thread all 1024 channels, channels 512 and all rows."""
    monkeypatch.setattr(tiles, "SPLIT", 2)
    args = (1, 1024, 14, 14, (256 + 1024) * 14 * 4, 1 << 20, 51_380_224, 128)
    assert [(t.m0, t.m1, t.r0, t.r1) for t in cut(*args)] == [(0, 1024, 0, 7), (0, 1024, 7, 14)]
    assert [(t.m0, t.m1, t.r0, t.r1) for t in cut(*args, prefer="channels")] == [(0, 512, 0, 14), (512, 1024, 0, 14)]


@pytest.mark.parametrize("m,macs", [(16, 10**9), (1024, 1000)])
def test_no_channel_split_when_too_few_channels_or_too_little_work(monkeypatch, m, macs):
    """Fewer than two aligned shares of channels, or a conv not worth splitting: the channel preference cuts as rows."""
    monkeypatch.setattr(tiles, "SPLIT", 2)
    args = (1, m, 14, 14, 1000, 1 << 20, macs)
    assert cut(*args, prefer="channels") == cut(*args)


CASES = [
    # (x shape, w shape, pads, strides): odd sizes; channel counts that do not halve into multiples of 16
    ((1, 24, 13, 11), (40, 24, 1, 1), [0, 0, 0, 0], [1, 1]),     # pointwise, GEMM straight on the input
    ((1, 40, 9, 11), (48, 40, 1, 1), [0, 0, 0, 0], [2, 1]),      # strided pointwise: a copy per tile
    ((1, 33, 5, 6), (255, 33, 1, 1), [0, 0, 0, 0], [1, 1]),      # odd channel count, bias folded into the GEMM
    ((1, 16, 17, 15), (72, 16, 3, 3), [1, 1, 1, 1], [1, 1]),     # im2col
    ((2, 8, 9, 7), (36, 8, 3, 3), [0, 1, 2, 1], [2, 1]),         # im2col, batch 2, uneven pads
    ((3, 12, 8, 10), (64, 12, 3, 3), [1, 1, 1, 1], [1, 1]),      # batch 3
]


@pytest.mark.parametrize("split", [2, 3])
@pytest.mark.parametrize("budget", [1 << 20, 4096])  # 4096: several row blocks per image as well
@pytest.mark.parametrize("folded", [False, True])
@pytest.mark.parametrize("xs,ws,pads,strides", CASES)
def test_both_preferences_compute_the_conv(monkeypatch, xs, ws, pads, strides, folded, budget, split):
    """Rows and channels tilings = reference conv + bias, the epilogue once per element, 1 and 2 threads alike."""
    monkeypatch.setattr(tiles, "MIN_SPLIT_MACS", 1)  # split even these small convs
    monkeypatch.setattr(tiles, "SPLIT", split)
    x, _, b, want, win, p = conv_case(xs, ws, pads, strides, folded)
    method = conv._pointwise if ws[2:] == (1, 1) else conv._im2col
    results = {}
    for prefer in ("rows", "channels"):
        plan = method(win, budget, prefer)
        for threads in (1, 2):
            results[prefer, threads] = run_conv_plan(plan, x, p, b, want, threads)
        assert np.array_equal(results[prefer, 1], results[prefer, 2])  # the same tiles whoever runs them
    if xs[0] < split:
        tiling = method(win, budget, "channels").tiling(x, p)
        assert any(t.m1 - t.m0 < ws[0] for t in tiling)  # the channel plan really cut channels


def test_tuner_times_the_channel_tiling_only_where_it_differs(monkeypatch):
    """At batch 1 the channel plans are candidates of their own; at batch 8 they cut like rows and are dropped."""
    monkeypatch.setattr(tiles, "SPLIT", 2)
    p = conv.pack(np.ones((1024, 256, 1, 1), np.float32), 1, build_time=True)
    win = conv.geo.window((14, 14), (1, 1), clamp_same=True)
    plans = conv.candidates(win, p, 256)
    one = tuner.distinct(plans, np.empty((1, 256, 14, 14), np.float32), p)
    eight = tuner.distinct(plans, np.empty((8, 256, 14, 14), np.float32), p)
    x1 = np.empty((1, 256, 14, 14), np.float32)
    assert any(all(t.m1 - t.m0 == 512 for t in plan.tiling(x1, p)) for plan in one)
    assert any(all(t.m1 - t.m0 == 1024 for t in plan.tiling(x1, p)) for plan in one)
    by_rows = plans[: len(conv.TUNE_BYTES)]  # the rows plans come first (the usual best)
    assert eight == tuner.distinct(by_rows, np.empty((8, 256, 14, 14), np.float32), p)


@pytest.mark.parametrize("xs,ws", [((1, 144, 1, 1), (576, 144, 1, 1)), ((1, 96, 7, 7), (40, 96, 1, 1))])
@pytest.mark.parametrize("folded", [False, True])
def test_small_pointwise_map_of_one_image_is_one_gemm(monkeypatch, xs, ws, folded):
    """A one-image pointwise conv on a small map runs as one GEMM and a bias pass, in one parallel_for range,
    the epilogue once over the whole output, with 1 and 2 threads."""
    from modelkit import spy_parallel_for

    ranges = spy_parallel_for(monkeypatch, conv)
    whole: list[int] = []
    real = conv._whole_image
    monkeypatch.setattr(conv, "_whole_image", lambda *a: whole.append(1) or real(*a))
    x, _, b, want, win, p = conv_case(xs, ws, [0, 0, 0, 0], [1, 1], folded)
    plan = conv._pointwise(win)
    for threads in (1, 2):
        run_conv_plan(plan, x, p, b, want, threads)
    assert whole == [1, 1] and ranges == [1, 1]
