"""Median time of minfer-ops-numba's Softmax kernel (rows.py) and the transformer's MaskedSoftmax-shaped Softmax."""
import sys, time, statistics
import numpy as np
import minfer_ops_numba
from minfer_core import KernelContext, TensorType, get_registry
from minfer_core.parallel import using_threads
print(minfer_ops_numba.__file__)
res = []
for shape in [(1, 4, 128, 128), (8, 4, 128, 128), (1, 768, 4), (1, 16, 37)]:
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32) * 3
    t = TensorType(np.float32, shape)
    ctx = KernelContext("n", "Softmax", 13, (t,), (t,), (None,), 1)
    k = [c for c in get_registry().kernel_candidates("", "Softmax", 13, "numpy", ctx, {"axis": -1}) if "numba" in c.fn.__module__][0]
    fn = k.prepared(ctx, {"axis": -1})
    out = np.empty_like(x)
    for threads in (1, 2):
        with using_threads(threads):
            for _ in range(20): fn(x, out=out)
            ts = []
            for _ in range(300):
                t0 = time.perf_counter(); fn(x, out=out); ts.append(time.perf_counter() - t0)
        res.append(f"{shape} threads {threads}: {statistics.median(ts) * 1e6:.1f} us")
print("\n".join(res))
