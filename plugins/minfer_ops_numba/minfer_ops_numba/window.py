"""Where a sliding window goes over a 2-D input: pads and output size, resolved as minfer-ops-conv resolves them."""

from __future__ import annotations

import math
from typing import NamedTuple, Sequence


class Window(NamedTuple):
    """Pads before each spatial dim (``begin``), the declared pads after it (``end``) and the output size."""

    begin: tuple[int, ...]
    end: tuple[int, ...]
    out_shape: tuple[int, ...]


def window(in_shape: Sequence[int], kernel: Sequence[int], strides: Sequence[int], dilations: Sequence[int],
           pads: Sequence[int] | None, auto_pad: str = "NOTSET", ceil_mode: int = 0,
           clamp_same: bool = False) -> Window:
    """Pads and output size as onnxruntime (and minfer-ops-conv) compute them.

    ``clamp_same``: Conv never pads SAME by a negative amount; the pools do (stride above the kernel: leading
    cells are skipped). With ``ceil_mode`` the last window may run past the declared pads; those cells never
    count as data, and a window must start inside the input or its leading pad.
    """
    rank = len(in_shape)
    span = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        out = [math.ceil(i / s) for i, s in zip(in_shape, strides)]
        total = [(o - 1) * s + e - i for o, s, e, i in zip(out, strides, span, in_shape)]
        if clamp_same:
            total = [max(0, t) for t in total]
        upper, lower = [int(t / 2) for t in total], [int((t + 1) / 2) for t in total]  # C-style, as onnxruntime
        begin = upper if auto_pad == "SAME_UPPER" else lower
        return Window(tuple(begin), tuple(t - b for t, b in zip(total, begin)), tuple(out))
    p = list(pads) if pads and auto_pad != "VALID" else [0] * (2 * rank)
    out = []
    for d, (i, s, e) in enumerate(zip(in_shape, strides, span)):
        size = (i + p[d] + p[d + rank] - e) / s + 1
        o = math.ceil(size) if ceil_mode else math.floor(size)
        if ceil_mode and (o - 1) * s >= i + p[d]:
            o -= 1
        out.append(max(o, 0))
    return Window(tuple(p[:rank]), tuple(p[rank:]), tuple(out))
