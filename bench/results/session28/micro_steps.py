"""Per-step medians in the run of MobileNetV2 QDQ's qconv_blas convs, pointwise.py's micro-kernel against BLAS, in
one process (the two in turn, block by block).

``env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python bench/results/session28/micro_steps.py [FORMAT]
[ROUNDS]`` from the checkout.
"""

from __future__ import annotations

import gc
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import steps  # noqa: E402  (this folder's per-step profiler)

from bench import models as bench_models  # noqa: E402
from bench.quantized import quantize  # noqa: E402


def main() -> None:
    from minfer_core import Engine
    from minfer_ops_numba.qconv_blas import Product

    fmt = sys.argv[1] if len(sys.argv) > 1 else "qdq"
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    model = bench_models.build("mobilenet_v2", 1)
    model.ir_version = bench_models.ORT_IR_VERSION
    feeds = bench_models.random_feeds(model)
    engine = Engine(quantize(model, fmt, feeds, Path(tempfile.mkdtemp()) / fmt))
    convs = [o for o in gc.get_objects() if isinstance(o, Product) and o.micro]
    runs: dict[bool, list[list[float]]] = {True: [], False: []}
    for _ in range(rounds):
        for micro in (True, False):
            for c in convs:
                c.micro = micro
                c.plans.clear()
            per = steps.profile(engine, feeds, 10)
            runs[micro].append(per)
    nodes = engine.executor.program.step_nodes
    bound = engine.executor.plans.bound[engine.executor.plans.last]
    total = {True: 0.0, False: 0.0}
    for i, node in enumerate(nodes):
        got = {m: statistics.median(r[i] for r in runs[m]) for m in (True, False)}
        if steps.kernel_name(bound[i]) != "qconv_blas.run":
            if abs(got[True] - got[False]) > 15:  # another step that moved: noise, or a cache effect of the change
                print(f"  (step {i:2d} {steps.kernel_name(bound[i])}: {got[True]:7.1f} / {got[False]:7.1f} us)")
            continue
        total[True] += got[True]
        total[False] += got[False]
        print(f"step {i:2d} {node.outputs[0][:28]:<28} micro {got[True]:7.1f} us, blas {got[False]:7.1f} us")
    whole = {m: statistics.median(sum(r) for r in runs[m]) for m in (True, False)}
    print(f"{fmt}: qconv_blas steps micro {total[True]:.0f} us, blas {total[False]:.0f} us; "
          f"all steps {whole[True]:.0f} / {whole[False]:.0f} us")


if __name__ == "__main__":
    main()
