"""A light model-zoo model: minfer vs onnxruntime (2 threads), interleaved rounds so other load hits both; medians.

    .venv/bin/python plugins/minfer_ops_conv/bench/model_vs_ort.py light_resnet50 8
"""
import os, sys, time
import numpy as np, onnx, onnxruntime as ort
from minfer_core import InferenceSession
from minfer_core.testing.zoo import randomized

name = sys.argv[1]; rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 6
model = randomized(name, seed=1)
sess = InferenceSession(model)
(inp,) = sess.get_inputs()
x = np.random.default_rng(2).standard_normal(inp.shape).astype(np.float32)
so = ort.SessionOptions(); so.intra_op_num_threads = 2; so.log_severity_level = 3
m2 = onnx.ModelProto(); m2.CopyFrom(model); m2.ir_version = min(m2.ir_version, 10)
o = ort.InferenceSession(m2.SerializeToString(), so, providers=["CPUExecutionProvider"])
feeds = {inp.name: x}
tm, to = [], []
for f in (lambda: sess.run(None, feeds), lambda: o.run(None, feeds)):
    f(); f()
for _ in range(rounds):
    for f, acc in ((lambda: sess.run(None, feeds), tm), (lambda: o.run(None, feeds), to)):
        time.sleep(0.25)  # let the other engine's spinning worker threads go idle
        for _ in range(3):
            t = time.perf_counter(); f(); acc.append(time.perf_counter() - t)
err = np.abs(sess.run(None, feeds)[0] - o.run(None, feeds)[0]).max()
m, r = 1e3 * np.median(tm), 1e3 * np.median(to)
print(f"{name}: minfer median {m:.1f} ms, onnxruntime median {r:.1f} ms, ratio {m/r:.2f}  (min {1e3*min(tm):.1f} / {1e3*min(to):.1f}, max|diff| {err:.1e}, OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE')})")
