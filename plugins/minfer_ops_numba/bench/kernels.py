"""numba kernels against the numpy kernels they override, per kernel, on MobileNet-style shapes.

Both are prepared for the same node and called with ``out=`` (as the engine
calls them), alternating, and the medians are printed: the host is shared,
so only interleaved runs in one process compare. Also prints the first-call
compile (or cache-load) time of each kernel. Run from the checkout:

    .venv/bin/python plugins/minfer_ops_numba/bench/kernels.py [--threads 1 2] [--runs 21]

``--depthwise`` instead times every depthwise candidate the core chooses among (depthwise.py's phase planes,
row loops and vector rows, channels.py's, depthwise_blocked.py's), interleaved, on the depthwise cases.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from minfer_core import KernelContext, TensorType, get_registry
from minfer_core.parallel import using_threads
from minfer_ops_numba import activation, channels, depthwise, depthwise_blocked, pool, resize

DEPTHWISE = {"phase": depthwise.conv, "rows": depthwise.conv_rows, "channels": channels.conv_channels,
             "blocked": depthwise_blocked.conv_blocked, "vector": depthwise.conv_vector}


def _ctx(op, inputs, consts):
    types = tuple(None if x is None else TensorType(x.dtype, x.shape) for x in inputs)
    return KernelContext("bench", op, 22, types, (None,), tuple(consts) + (None,) * (len(inputs) - len(consts)), 1)


def cases(rng):
    """(label, numba kernel, op, inputs, constants, attributes)."""
    def dw(n, c, h, k=3, s=1):
        x = rng.standard_normal((n, c, h, h), dtype=np.float32)
        w = rng.standard_normal((c, 1, k, k), dtype=np.float32)
        b = rng.standard_normal(c, dtype=np.float32)
        attrs = dict(group=c, kernel_shape=[k, k], strides=[s, s], pads=[k // 2] * 4)
        return (f"dwconv {n}x{c}x{h}x{h} k{k} s{s}", depthwise.conv, "Conv", [x, w, b], [None, w, b], attrs)

    def pl(kern, op, shape, **attrs):
        return (f"{op} {'x'.join(map(str, shape))} k{attrs['kernel_shape'][0]} s{attrs.get('strides', [1])[0]}",
                kern, op, [rng.standard_normal(shape, dtype=np.float32)], [], attrs)

    def act(kern, shape):
        return (f"{kern.op_type} {'x'.join(map(str, shape))}", kern, kern.op_type,
                [rng.standard_normal(shape, dtype=np.float32)], [], {})

    def rs(shape, coordinates):
        x, scales = rng.standard_normal(shape, dtype=np.float32), np.array([1, 1, 2, 2], np.float32)
        return (f"Resize linear x2 {'x'.join(map(str, shape))}", resize.resize_18, "Resize", [x, None, scales],
                [None, None, scales], dict(mode="linear", coordinate_transformation_mode=coordinates))

    yield from [dw(1, 32, 112), dw(1, 96, 112, s=2), dw(1, 144, 56), dw(1, 144, 56, s=2), dw(1, 192, 28),
                dw(1, 384, 14), dw(1, 960, 7), dw(1, 672, 14, k=5), dw(8, 32, 112), dw(8, 144, 56, s=2),
                dw(8, 384, 14)]
    yield from [pl(pool.max_pool_10, "MaxPool", (1, 64, 112, 112), kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4),
                pl(pool.max_pool_10, "MaxPool", (8, 64, 112, 112), kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4),
                pl(pool.max_pool_10, "MaxPool", (1, 192, 28, 28), kernel_shape=[3, 3], strides=[1, 1], pads=[1] * 4),
                pl(pool.average_pool_19, "AveragePool", (1, 256, 28, 28), kernel_shape=[3, 3], pads=[1] * 4),
                pl(pool.average_pool_19, "AveragePool", (1, 128, 56, 56), kernel_shape=[2, 2], strides=[2, 2]),
                pl(pool.average_pool_19, "AveragePool", (8, 256, 28, 28), kernel_shape=[3, 3], pads=[1] * 4)]
    yield from [act(activation.hard_swish, (1, 16, 112, 112)), act(activation.hard_swish, (1, 96, 28, 28)),
                act(activation.hard_swish, (8, 96, 56, 56)), act(activation.hard_sigmoid, (1, 72, 1, 1)),
                act(activation.hard_sigmoid, (8, 240, 28, 28))]
    yield from [rs((1, 256, 20, 20), "asymmetric"), rs((1, 64, 56, 56), "half_pixel"),
                rs((8, 128, 40, 40), "half_pixel")]


def median_us(times):
    return statistics.median(times) * 1e6


def depthwise_candidates(threads: list[int], runs: int) -> None:
    """Each depthwise candidate's median (us) per depthwise case and thread count, interleaved run by run."""
    print(f"{'case':34} {'thr':>3} " + " ".join(f"{name:>9}" for name in DEPTHWISE))
    for label, _, op, inputs, consts, attrs in cases(np.random.default_rng(0)):
        if not label.startswith("dwconv"):
            continue
        ctx = _ctx(op, inputs, consts)
        fns = {name: kern.prepared(ctx, attrs) for name, kern in DEPTHWISE.items() if kern.applies(ctx, attrs)}
        for count in threads:
            with using_threads(count):
                outs = {name: fn(*inputs) for name, fn in fns.items()}  # first calls: per-shape planning
                times: dict[str, list[float]] = {name: [] for name in fns}
                for _ in range(runs):
                    for name, fn in fns.items():
                        t = time.perf_counter(); fn(*inputs, out=outs[name]); times[name].append(time.perf_counter() - t)  # noqa: E501, E702
            cells = [f"{median_us(times[name]):9.1f}" if name in fns else f"{'-':>9}" for name in DEPTHWISE]
            print(f"{label:34} {count:>3} " + " ".join(cells))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--runs", type=int, default=21)
    ap.add_argument("--depthwise", action="store_true", help="time the depthwise candidates against each other")
    args = ap.parse_args()
    if args.depthwise:
        return depthwise_candidates(args.threads, args.runs)
    rng = np.random.default_rng(0)
    print(f"{'case':34} {'thr':>3} {'numba us':>9} {'numpy us':>9} {'speedup':>7}  prepare s (compile/load)")
    for label, kern, op, inputs, consts, attrs in cases(rng):
        ctx = _ctx(op, inputs, consts)
        start = time.perf_counter()
        fast = kern.prepared(ctx, attrs)
        prep = time.perf_counter() - start
        numpy_kernel = get_registry().select_kernel("", op, kern.since)
        ref = numpy_kernel.prepared(ctx, attrs)
        ref_out = {} if numpy_kernel.out else None  # numpy's HardSwish allocates its result
        for threads in args.threads:
            with using_threads(threads):
                y = ref(*inputs)
                y = y[0] if isinstance(y, tuple) else y
                out_a, out_b = np.empty_like(y), np.empty_like(y)
                fast(*inputs, out=out_a)
                kw = {} if ref_out is None else {"out": out_b}
                ref(*inputs, **kw)  # the numpy kernel's first call tunes its method
                ta, tb = [], []
                for _ in range(args.runs):
                    t = time.perf_counter(); fast(*inputs, out=out_a); ta.append(time.perf_counter() - t)  # noqa: E702
                    t = time.perf_counter(); ref(*inputs, **kw); tb.append(time.perf_counter() - t)  # noqa: E702
            a, b = median_us(ta), median_us(tb)
            print(f"{label:34} {threads:>3} {a:9.1f} {b:9.1f} {b / a:7.2f}  {prep:.3f}")
            prep = 0.0


if __name__ == "__main__":
    main()
