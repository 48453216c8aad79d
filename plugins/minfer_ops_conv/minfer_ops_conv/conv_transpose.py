"""Kernels: ConvTranspose (one GEMM, then col2im scatter-add) and Col2Im."""

from __future__ import annotations

import itertools

import numpy as np

from minfer_core import kernel


def scatter_taps(cols: np.ndarray, canvas: tuple[int, ...], strides, dilations, offset) -> np.ndarray:
    """col2im: add cols (N, C, *kernel, *blocks) into a zero (N, C, *canvas), tap by tap.

    Block b of tap t lands at offset + t*dilation + b*stride along each spatial dim.
    """
    rank = len(canvas)
    n, c = cols.shape[:2]
    kernel, blocks = cols.shape[2 : 2 + rank], cols.shape[2 + rank :]
    out = np.zeros((n, c) + tuple(canvas), dtype=cols.dtype)
    for tap in itertools.product(*(range(k) for k in kernel)):
        dst = tuple(
            slice(o + t * d, o + t * d + (b - 1) * s + 1, s)
            for o, t, d, b, s in zip(offset, tap, dilations, blocks, strides)
        )
        out[(slice(None), slice(None)) + dst] += cols[(slice(None), slice(None)) + tap]
    return out


def _transpose_pads(in_shape, kernel, strides, dilations, pads, auto_pad, output_padding, output_shape):
    """(begin pads, output spatial shape) following the ConvTranspose spec's formulas."""
    n = len(in_shape)
    full = [s * (i - 1) + op + (k - 1) * d + 1 for s, i, op, k, d in zip(strides, in_shape, output_padding, kernel, dilations)]
    if output_shape is None and auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        output_shape = [i * s for i, s in zip(in_shape, strides)]
    if output_shape is not None:
        output_shape = list(output_shape)[-n:]
        total = [f - o for f, o in zip(full, output_shape)]
        if auto_pad == "SAME_UPPER":
            begin = [t // 2 for t in total]
        else:
            begin = [t - t // 2 for t in total]
        return begin, output_shape
    p = list(pads) if pads else [0] * 2 * n
    if auto_pad == "VALID":
        p = [0] * 2 * n
    return p[:n], [f - b - e for f, b, e in zip(full, p[:n], p[n:])]


@kernel("ConvTranspose", since=1, prepare=True, packed=(1, 2))
def conv_transpose(ctx, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, output_padding=None,
                   output_shape=None, pads=None, strides=None):
    """ConvTranspose-1/11/22: the GEMM W^T @ X per group, then a col2im scatter-add and crop."""
    consts = tuple(ctx.constants) + (None,) * 3
    # constant weights and bias are kept here (packed=(1, 2)): run never reads them then
    fixed = _pack(consts[1], group) if consts[1] is not None else None
    fixed_bias = consts[2]

    def run(x, w, b=None):
        wt, kernel, mg = fixed if fixed is not None else _pack(w, group)
        b = fixed_bias if fixed_bias is not None else b
        rank = x.ndim - 2
        st = strides or [1] * rank
        dil = dilations or [1] * rank
        opad = output_padding or [0] * rank
        begin, out_shape = _transpose_pads(x.shape[2:], kernel, st, dil, pads, auto_pad, opad, output_shape)
        n, c = x.shape[:2]
        xs = x.reshape(n, group, c // group, -1)
        cols = np.stack([np.matmul(wt, xs[i]) for i in range(n)])  # (N, G, Mg*K, P)
        cols = cols.reshape((n, group * mg) + tuple(kernel) + x.shape[2:])
        # canvas covers both the full transposed extent and the requested output window
        shift = [max(0, -b_) for b_ in begin]
        full = [s * (i - 1) + (k - 1) * d + 1 for s, i, k, d in zip(st, x.shape[2:], kernel, dil)]
        canvas = [sh + max(f, b_ + o) for sh, f, b_, o in zip(shift, full, begin, out_shape)]
        y = scatter_taps(cols, tuple(canvas), st, dil, shift)
        crop = tuple(slice(sh + b_, sh + b_ + o) for sh, b_, o in zip(shift, begin, out_shape))
        y = np.ascontiguousarray(y[(slice(None), slice(None)) + crop])
        if b is not None:
            y += b.reshape((-1,) + (1,) * rank)
        return y

    return run


def _pack(w: np.ndarray, group: int) -> tuple[np.ndarray, tuple[int, ...], int]:
    """W[C, M/G, *k] as per-group (M/G * prod(k), C/G) matrices (the GEMM's left operand), kernel, M/G."""
    c = w.shape[0]
    return np.ascontiguousarray(w.reshape(group, c // group, -1).transpose(0, 2, 1)), tuple(w.shape[2:]), w.shape[1]


@kernel("Col2Im", since=18)
def col2im(x, image_shape, block_shape, *, dilations=None, pads=None, strides=None):
    """Col2Im-18: sum sliding blocks (N, C*prod(block), L) back into an image (N, C, *image_shape)."""
    image = [int(v) for v in image_shape]
    block = [int(v) for v in block_shape]
    rank = len(image)
    dil = dilations or [1] * rank
    st = strides or [1] * rank
    p = pads or [0] * 2 * rank
    blocks = [(i + p[d] + p[d + rank] - (k - 1) * dl - 1) // s + 1 for d, (i, k, dl, s) in enumerate(zip(image, block, dil, st))]
    n = x.shape[0]
    cols = x.reshape((n, -1) + tuple(block) + tuple(blocks))
    canvas = tuple(i + p[d] + p[d + rank] for d, i in enumerate(image))
    y = scatter_taps(cols, canvas, st, dil, [0] * rank)
    crop = tuple(slice(p[d], p[d] + i) for d, i in enumerate(image))
    return np.ascontiguousarray(y[(slice(None), slice(None)) + crop])


