"""Sessions pickle: rebuilt from the model bytes and the options, so process pools and Dask can ship them."""

from __future__ import annotations

import functools
import logging
import multiprocessing
import os
import pickle
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import minfer_core
from modelkit import make_model, tensor
from minfer_core import GraphOptimizationLevel, InferenceSession, SessionOptions, UnsupportedOptionError

TIMEOUT = 120  # seconds a pool may take to answer before the test fails instead of hanging


def conv_model() -> onnx.ModelProto:
    """A small Conv -> Relu -> GlobalAveragePool model with weights (something worth shipping)."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b")
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("GlobalAveragePool", ["r"], ["y"], name="pool"),
    ]
    return make_model(nodes, [tensor("x", ["N", 3, 8, 8])], [tensor("y", ["N", 4, 1, 1])], [w, b])


def batch(n: int = 6) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(1)
    return [{"x": rng.standard_normal((2, 3, 8, 8)).astype(np.float32)} for _ in range(n)]


def assert_same(got: list, want: list) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g[0], w[0])


def sources(tmp_path):
    model = conv_model()
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    return {"bytes": model.SerializeToString(), "path": str(path), "proto": model,
            "graph": minfer_core.load_model(model)}


@pytest.mark.parametrize("kind", ["bytes", "path", "proto", "graph"])
def test_a_session_pickles_from_any_model_source(tmp_path, kind):
    """A session built from bytes, a path, a ModelProto or a Graph unpickles into one that gives the same outputs."""
    so = SessionOptions()
    so.intra_op_num_threads = 1
    so.graph_optimization_level = GraphOptimizationLevel.ORT_ENABLE_BASIC
    sess = InferenceSession(sources(tmp_path)[kind], so, disabled_passes=["constant_folding"])
    copy = pickle.loads(pickle.dumps(sess))
    assert copy is not sess and copy.get_session_options() == so
    assert [r.name for r in copy.pass_results] == [r.name for r in sess.pass_results]
    feeds = batch(1)[0]
    assert_same([copy.run(None, feeds)], [sess.run(None, feeds)])


def test_a_model_file_changed_after_build_is_refused_at_pickling(tmp_path):
    """Pickling a path-built session whose file changed since is an error, not a different model shipped."""
    path = tmp_path / "m.onnx"
    path.write_bytes(conv_model().SerializeToString())
    sess = InferenceSession(str(path))
    changed = conv_model()
    changed.doc_string = "retrained"
    path.write_bytes(changed.SerializeToString())
    with pytest.raises(UnsupportedOptionError, match="model file .* was edited since the session was built"):
        pickle.dumps(sess)


def test_a_model_proto_edited_after_build_is_refused_at_pickling():
    """Pickling a ModelProto-built session whose proto was edited since is an error, not the edited model shipped."""
    model = conv_model()
    sess = InferenceSession(model)
    model.doc_string = "retrained"
    with pytest.raises(UnsupportedOptionError, match="ModelProto it was built from was edited"):
        pickle.dumps(sess)


def test_external_data_is_found_from_the_original_folder(tmp_path):
    """A path-built model with external data unpickles by reading its data from the model's folder."""
    model = conv_model()
    onnx.save_model(model, str(tmp_path / "ext.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="ext.bin", size_threshold=0)
    sess = InferenceSession(str(tmp_path / "ext.onnx"))
    copy = pickle.loads(pickle.dumps(sess))
    feeds = batch(1)[0]
    assert_same([copy.run(None, feeds)], [sess.run(None, feeds)])


def test_unpickling_does_not_rewrite_the_optimized_model(tmp_path):
    """optimized_model_filepath is written by the build, not again by every unpickled copy."""
    so = SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "opt.onnx")
    sess = InferenceSession(conv_model(), so)
    os.remove(tmp_path / "opt.onnx")
    copy = pickle.loads(pickle.dumps(sess))
    assert not (tmp_path / "opt.onnx").exists()
    assert copy.get_session_options().optimized_model_filepath == ""


def test_a_session_with_its_own_registry_does_not_pickle():
    """registry= cannot travel: pickling says so instead of building with other plugins elsewhere."""
    sess = InferenceSession(conv_model(), registry=minfer_core.get_registry())
    with pytest.raises(UnsupportedOptionError, match="registry="):
        pickle.dumps(sess)


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_process_pool_map_matches_a_serial_run(method):
    """Mapping a batch over ProcessPoolExecutor (each start method) gives the serial run's outputs."""
    if method not in multiprocessing.get_all_start_methods():
        pytest.skip(f"start method {method!r} is not available on this platform")
    sess = InferenceSession(conv_model(), threads=1)
    feeds = batch()
    want = [sess.run(None, f) for f in feeds]
    with ProcessPoolExecutor(max_workers=2, mp_context=multiprocessing.get_context(method)) as pool:
        got = list(pool.map(functools.partial(sess.run, None), feeds, timeout=TIMEOUT))
    assert_same(got, want)


def test_dask_distributed_map_matches_a_serial_run():
    """Mapping a batch over Dask's local distributed scheduler (2 worker processes) gives the serial outputs."""
    extra = "dask.distributed is a test extra: pip install 'minfer-core[test]'"
    distributed = pytest.importorskip("distributed", reason=extra)
    sess = InferenceSession(conv_model(), threads=1)
    feeds = batch()
    want = [sess.run(None, f) for f in feeds]
    with distributed.LocalCluster(processes=True, n_workers=2, threads_per_worker=1, dashboard_address=None,
                                  silence_logs=logging.ERROR) as cluster, distributed.Client(cluster) as client:
        shipped = client.scatter(sess, broadcast=True)  # one rebuild per worker, not one per task
        futures = client.map(InferenceSession.run, [shipped] * len(feeds), [None] * len(feeds), feeds, pure=False)
        got = client.gather(futures)
        assert len(client.run(os.getpid)) == 2
    assert_same(got, want)
