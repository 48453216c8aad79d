"""First-compile against cached-load time of every compiled function, and the size of the cache folder.

Run it twice with an empty cache folder: the first run compiles and fills it, the second loads from it.

    rm -rf /tmp/nbcache; for i in 1 2; do NUMBA_CACHE_DIR=/tmp/nbcache .venv/bin/python \\
        plugins/minfer_ops_numba/bench/compile.py; done
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

start = time.perf_counter()
import numpy as np  # noqa: E402

from minfer_core import KernelContext, TensorType  # noqa: E402
from minfer_ops_numba import _jit, activation, depthwise, pool, resize  # noqa: E402

imported = time.perf_counter() - start
numba_at_import = "numba" in sys.modules


def prepare(kern, op, inputs, consts, attrs) -> float:
    """Seconds to prepare ``kern`` for a node (the factory compiles or loads its compiled functions; the first
    one also imports numba)."""
    types = tuple(None if x is None else TensorType(x.dtype, x.shape) for x in inputs)
    ctx = KernelContext("c", op, 22, types, (None,), tuple(consts) + (None,) * (len(inputs) - len(consts)), 1)
    t = time.perf_counter()
    kern.prepared(ctx, attrs)
    return time.perf_counter() - t


def main() -> None:
    x = np.zeros((1, 8, 9, 9), np.float32)
    w = np.zeros((8, 1, 3, 3), np.float32)
    scales = np.array([1, 1, 2, 2], np.float32)
    dw = dict(group=8, kernel_shape=[3, 3], pads=[1] * 4)
    times = {
        "Conv depthwise (phase_rows, copies)": prepare(depthwise.conv, "Conv", [x, w], [None, w], dw),
        "Conv depthwise rows s1 (wide_rows)": prepare(depthwise.conv_rows, "Conv", [x, w], [None, w], dw),
        "Conv depthwise rows s2 (weighted_rows)": prepare(depthwise.conv_rows, "Conv", [x, w], [None, w],
                                                          dict(dw, strides=[2, 2])),
        "MaxPool (pool_rows)": prepare(pool.max_pool_10, "MaxPool", [x], [], dict(kernel_shape=[3, 3], strides=[2, 2])),
        "AveragePool (+ scale_planes)": prepare(pool.average_pool_19, "AveragePool", [x], [],
                                                dict(kernel_shape=[3, 3], strides=[2, 2])),
        "HardSwish/HardSigmoid": prepare(activation.hard_swish, "HardSwish", [x], [], {}),
        "Resize linear (_planes)": prepare(resize.resize_18, "Resize", [x, None, scales], [None, None, scales],
                                           {"mode": "linear"}),
    }
    print(f"import minfer_core and minfer_ops_numba: {imported:.2f} s (numba imported: {numba_at_import})")
    for name, seconds in times.items():
        print(f"  {name:36} {seconds:.2f} s")
    print(f"  {'total':36} {sum(times.values()):.2f} s")
    folder = _jit.cache_dir()
    size = sum(f.stat().st_size for f in Path(folder).rglob("*") if f.is_file())
    print(f"cache folder {folder}: {size / 1024:.0f} KiB in {sum(1 for _ in Path(folder).rglob('*.nbc'))} files"
          f" (NUMBA_CACHE_DIR={os.environ.get('NUMBA_CACHE_DIR')})")


if __name__ == "__main__":
    main()
