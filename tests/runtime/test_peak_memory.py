"""Building a session holds each weight once: the build's peak stays near the weights, not twice them."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

PROBE = textwrap.dedent(
    """
    import gc, json, sys
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    import minfer_core

    minfer_core.get_registry()

    def status(field):
        for line in open("/proc/self/status"):
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0

    def fc(n, k):  # a fully-connected layer, its weight stored [N, K] as exporters write it (transB=1)
        w = np.random.default_rng(0).standard_normal((n, k)).astype(np.float32)
        node = helper.make_node(sys.argv[1], ["x", "w"], ["y"], **({"transB": 1} if sys.argv[1] == "Gemm" else {}))
        w_init = numpy_helper.from_array(w if sys.argv[1] == "Gemm" else np.ascontiguousarray(w.T), "w")
        graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, k])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, n])], [w_init])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])

    # a small one first: the kernels' libraries are imported and their code compiled or loaded (numba and its
    # LLVM take ~130 MB once a process), which is not what this measures
    minfer_core.InferenceSession(fc(64, 256)).run(None, {"x": np.ones((4, 256), np.float32)})
    n, k = 2048, 8192  # a 64 MiB weight
    model = fc(n, k)
    if sys.argv[2] != "proto":
        open(sys.argv[2], "wb").write(model.SerializeToString())
        model = sys.argv[2]
    gc.collect()
    base = status("VmRSS")  # with "proto", the caller holds the parsed model (the weights once), as bench/memprobe
    open("/proc/self/clear_refs", "w").write("5")
    sess = minfer_core.InferenceSession(model)
    sess.run(None, {"x": np.ones((4, k), np.float32)})
    print(json.dumps({"peak": status("VmHWM") - base, "weights": n * k * 4 / 2**20}))
    """
)


def _probe(op: str, source: str) -> dict[str, float]:
    try:
        open("/proc/self/clear_refs", "w").close()
    except OSError:
        pytest.skip("needs Linux /proc/self/clear_refs to reset the high-water mark")
    out = subprocess.run([sys.executable, "-c", PROBE, op, source], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("op", ["Gemm", "MatMul"])
def test_a_large_weight_is_never_held_twice(op):
    """A 64 MiB Gemm (transB) or MatMul weight: build and first run peak below 1.5x the weight above the
    parsed model (its array is one copy; a transposed or packed second copy would make it 2x)."""
    got = _probe(op, "proto")
    assert got["peak"] < 1.5 * got["weights"], got


def test_loading_from_a_path_holds_the_weight_once(tmp_path):
    """From a file, the weight goes from the file into its array: no protobuf copy beside it (was 2x)."""
    got = _probe("Gemm", str(tmp_path / "fc.onnx"))
    assert got["peak"] < 1.5 * got["weights"], got


