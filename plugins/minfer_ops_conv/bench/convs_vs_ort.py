"""Per conv shape: minfer's Conv methods vs onnxruntime, interleaved runs, min of reps.

    .venv/bin/python plugins/minfer_ops_conv/bench/convs_vs_ort.py resnet 15   # or: vgg
    ORT_THREADS=1 OPENBLAS_NUM_THREADS=1 ... for single-threaded figures
"""
import sys
import time

import numpy as np
import onnxruntime as ort
from onnx import helper, numpy_helper
from minfer_ops_conv import _geometry as geo, conv as cv, winograd as wg

def ort_sess(x, w, pads, strides):
    node = helper.make_node("Conv", ["x", "w"], ["y"], pads=pads, strides=strides)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", 1, x.shape)], [helper.make_tensor_value_info("y", 1, None)], [numpy_helper.from_array(w, "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 11)]); m.ir_version = 10
    so = ort.SessionOptions(); so.intra_op_num_threads = int(__import__("os").environ.get("ORT_THREADS", "2"))
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])

def bench(fns, reps):
    best = [float("inf")] * len(fns)
    for f in fns: f()
    for _ in range(reps):
        for i, f in enumerate(fns):
            s = time.perf_counter(); f(); best[i] = min(best[i], time.perf_counter() - s)
    return [b * 1e3 for b in best]

rng = np.random.default_rng(0)
shapes = {
 "resnet": [(64,56,64,3,1),(128,28,128,3,1),(256,14,256,3,1),(512,7,512,3,1),(3,224,64,7,2),(64,56,256,1,1),(256,56,64,1,1),(256,14,1024,1,1),(1024,14,256,1,1),(512,7,2048,1,1),(2048,7,512,1,1),(128,56,128,3,2)],
 "vgg": [(3,224,64,3,1),(64,224,64,3,1),(64,112,128,3,1),(128,112,128,3,1),(128,56,256,3,1),(256,56,256,3,1),(256,28,512,3,1),(512,28,512,3,1),(512,14,512,3,1)],
}[sys.argv[1]]
reps = int(sys.argv[2]) if len(sys.argv) > 2 else 10
for (C,H,M,k,s) in shapes:
    x = rng.standard_normal((1,C,H,H)).astype(np.float32); w = (rng.standard_normal((M,C,k,k))*0.05).astype(np.float32)
    p = cv.pack(w,1,True); win = geo.window((H,H),(k,k),pads=[k//2]*4,strides=[s,s])
    y = np.empty((1,M)+win.out_shape, np.float32)
    chosen = cv.plan_for(win, p, C)
    fns = [lambda: cv._im2col(win)(x,p,y) if k > 1 else cv._pointwise(win)(x,p,y), lambda: chosen(x,p,y)]
    names = ["im2col/pw", "chosen"]
    if k == 3 and s == 1 and p.winograd is not None:
        wp = wg.plan(win); fns.append(lambda: wp(x,p,y)); names.append("wino")
    sess = ort_sess(x, w, [k//2]*4, [s,s]); fns.append(lambda: sess.run(None, {"x": x})); names.append("ort")
    r = bench(fns, reps)
    print(f"C{C:4d} H{H:3d} M{M:4d} k{k} s{s}: " + "  ".join(f"{n} {v:7.2f}" for n, v in zip(names, r)) + f"  chosen/ort {r[1]/r[-1]:.2f}", flush=True)
