"""minfer-ops-basic random generators: distributions, dtype/shape rules, and seeding.

Values cannot match onnxruntime's (another generator), so the distributions
are checked statistically on large seeded draws (deterministic, yet each
bound is a few standard errors wide so a wrong distribution fails), and
dtypes and shapes are compared with onnxruntime's on the same node.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from minfer_core import InferenceSession
from minfer_core.testing.ops import ORT_IR_VERSION, onnxruntime_outputs

N = 200_000
SEED = 7.0


def node_model(op_type, opset, inputs=(), **attrs):
    """A one-node model whose inputs (arrays) are graph inputs ``i0, i1...``, and its feeds."""
    names = [f"i{i}" for i in range(len(inputs))]
    node = helper.make_node(op_type, names, ["y"], **attrs)
    ins = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(x.dtype), x.shape) for n, x in zip(names, inputs)]
    graph = helper.make_graph([node], "node", ins, [helper.make_empty_tensor_value_info("y")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = ORT_IR_VERSION
    return model, dict(zip(names, inputs))


def draw(op_type, opset, inputs=(), **attrs):
    """One run of the node in a fresh minfer session."""
    model, feeds = node_model(op_type, opset, inputs, **attrs)
    return InferenceSession(model).run(None, feeds)[0]


def chi2_bound(df: int, z: float = 3.72) -> float:
    """Chi-square quantile at the normal quantile z (3.72: p = 1e-4), Wilson-Hilferty's approximation."""
    k = 2.0 / (9.0 * df)
    return df * (1.0 - k + z * math.sqrt(k)) ** 3


def assert_frequencies(counts: np.ndarray, probs: np.ndarray) -> None:
    """Pearson's chi-square of the observed counts against n * probs stays under the p = 1e-4 bound."""
    expected = counts.sum() * probs
    stat = float(((counts - expected) ** 2 / expected).sum())
    assert stat < chi2_bound(len(probs) - 1), f"chi-square {stat:.1f} for counts {counts.tolist()} vs {expected.round(1).tolist()}"


def assert_moments(x: np.ndarray, mean: float, var: float) -> None:
    """Sample mean and variance within 5 standard errors of the given ones (normal-ish tails)."""
    x = x.astype(np.float64)
    n = x.size
    assert abs(x.mean() - mean) < 5 * math.sqrt(var / n), f"mean {x.mean()} vs {mean}"
    assert abs(x.var() - var) < 5 * var * math.sqrt(2.0 / n) * 1.5, f"variance {x.var()} vs {var}"  # 1.5: uniform's kurtosis


@pytest.mark.parametrize("opset", [1, 22])
def test_random_normal_has_the_asked_mean_and_scale(opset):
    """RandomNormal draws N(mean, scale**2): moments of 200k draws within 5 standard errors."""
    y = draw("RandomNormal", opset, shape=[N], mean=3.0, scale=0.5, seed=SEED)
    assert y.dtype == np.float32 and y.shape == (N,)
    assert_moments(y, 3.0, 0.25)
    inside = np.abs(y - 3.0) < 0.5  # one sigma holds 68.27% of a normal
    assert_frequencies(np.bincount(inside, minlength=2), np.array([1 - 0.682689, 0.682689]))


@pytest.mark.parametrize("opset", [1, 22])
def test_random_uniform_stays_in_low_high_with_uniform_moments(opset):
    """RandomUniform draws U[low, high): every value inside, flat over ten bins, moments of the uniform."""
    y = draw("RandomUniform", opset, shape=[N], low=-2.0, high=6.0, seed=SEED, dtype=TensorProto.DOUBLE)
    assert y.dtype == np.float64 and y.min() >= -2.0 and y.max() < 6.0
    assert_moments(y, 2.0, 64.0 / 12.0)
    assert_frequencies(np.histogram(y, bins=10, range=(-2.0, 6.0))[0], np.full(10, 0.1))


def test_like_ops_take_the_input_shape_and_type_unless_dtype_says():
    """RandomNormalLike/RandomUniformLike: output shaped like the input, typed like it or by dtype."""
    x = np.zeros((300, 400), dtype=np.float16)
    y = draw("RandomUniformLike", 22, [x], seed=SEED, low=1.0, high=3.0)
    assert y.dtype == np.float16 and y.shape == x.shape and y.min() >= 1.0 and y.max() <= 3.0
    assert_moments(y, 2.0, 4.0 / 12.0)
    ints = np.zeros((300, 400), dtype=np.int32)
    z = draw("RandomNormalLike", 22, [ints], seed=SEED, dtype=TensorProto.DOUBLE, mean=-1.0, scale=2.0)
    assert z.dtype == np.float64 and z.shape == ints.shape
    assert_moments(z, -1.0, 4.0)


ORT_CASES = [  # onnxruntime 1.32 implements these ops up to opset 21 (versions 1, 7, 15), in float and double
    ("RandomNormal", 21, (), {"shape": [2, 3]}),
    ("RandomUniform", 1, (), {"shape": [2, 0, 3], "dtype": TensorProto.DOUBLE}),
    ("RandomUniformLike", 1, (np.zeros((2, 3), np.float64),), {}),
    ("RandomNormalLike", 21, (np.zeros((5,), np.int64),), {"dtype": TensorProto.FLOAT}),
    ("Multinomial", 21, (np.zeros((3, 4), np.float32),), {"sample_size": 5}),
    ("Multinomial", 7, (np.zeros((2, 4), np.float32),), {"dtype": TensorProto.INT64}),
    ("Bernoulli", 21, (np.full((2, 3), 0.5, np.float32),), {}),
    ("Bernoulli", 15, (np.full((4,), 0.5, np.float64),), {"dtype": TensorProto.INT32}),
    ("Bernoulli", 21, (np.full((4,), 0.5, np.float32),), {"dtype": TensorProto.BOOL}),
]


@pytest.mark.parametrize("op_type, opset, inputs, attrs", ORT_CASES, ids=[f"{c[0]}-{c[1]}-{i}" for i, c in enumerate(ORT_CASES)])
def test_dtype_and_shape_match_onnxruntime(op_type, opset, inputs, attrs):
    """Each generator's output dtype and shape are onnxruntime's for the same node (values differ by design)."""
    pytest.importorskip("onnxruntime")
    model, feeds = node_model(op_type, opset, inputs, seed=SEED, **attrs)
    want = onnxruntime_outputs(model, feeds)[0]
    got = InferenceSession(model).run(None, feeds)[0]
    assert (got.dtype, got.shape) == (want.dtype, want.shape)


HALF_CASES = [  # opset 22 adds bfloat16; onnxruntime has no kernel, so onnx's inferred type is the oracle
    ("RandomNormal", (), {"shape": [2, 3], "dtype": TensorProto.FLOAT16}),
    ("RandomUniform", (), {"shape": [4], "dtype": TensorProto.BFLOAT16}),
    ("RandomNormalLike", (np.zeros((2, 2), np.float16),), {"dtype": TensorProto.BFLOAT16}),
    ("Multinomial", (np.zeros((2, 3), np.float16),), {"sample_size": 4}),
    ("Bernoulli", (np.full((3,), 0.5, np.float16),), {"dtype": TensorProto.UINT8}),
]


@pytest.mark.parametrize("op_type, inputs, attrs", HALF_CASES, ids=[c[0] for c in HALF_CASES])
def test_half_precision_outputs_have_onnxs_inferred_type(op_type, inputs, attrs):
    """float16/bfloat16 generators return exactly the type and shape onnx infers (the engine checks it too)."""
    model, feeds = node_model(op_type, 22, inputs, seed=SEED, **attrs)
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True).graph.output[0].type.tensor_type
    got = InferenceSession(model).run(None, feeds)[0]
    assert got.dtype == onnx.helper.tensor_dtype_to_np_dtype(inferred.elem_type)
    assert got.shape == tuple(d.dim_value for d in inferred.shape.dim)


def test_multinomial_frequencies_follow_the_softmax_of_the_logits():
    """Multinomial samples class i with probability softmax(input)[i], per row (chi-square per row)."""
    probs = np.array([[0.1, 0.2, 0.3, 0.4], [0.7, 0.05, 0.05, 0.2]])
    y = draw("Multinomial", 7, [np.log(probs).astype(np.float32)], sample_size=50_000, seed=SEED)
    assert y.dtype == np.int32 and y.shape == (2, 50_000) and y.min() >= 0 and y.max() <= 3
    for row, p in zip(y, probs):
        assert_frequencies(np.bincount(row, minlength=4), p)


def test_multinomial_never_samples_a_class_of_zero_probability():
    """A class whose logit is -inf is never drawn; huge logits do not overflow."""
    logits = np.array([[-np.inf, 1000.0, 1000.0, -np.inf]], dtype=np.float32)
    y = draw("Multinomial", 22, [logits], sample_size=10_000, seed=SEED, dtype=TensorProto.INT64)
    assert set(np.unique(y).tolist()) == {1, 2}


def test_bernoulli_frequencies_follow_the_probabilities():
    """Bernoulli gives 1 with probability input[i]: chi-square of the ones per probability level."""
    levels = np.array([0.0, 0.1, 0.5, 0.9, 1.0])
    x = np.repeat(levels, 40_000).astype(np.float32)
    y = draw("Bernoulli", 15, [x], seed=SEED).reshape(len(levels), -1)
    assert y.dtype == np.float32 and set(np.unique(y).tolist()) <= {0.0, 1.0}
    ones = y.sum(axis=1)
    assert ones[0] == 0 and ones[-1] == 40_000  # p = 0 and p = 1 are certain
    for k, p in zip(ones[1:-1], levels[1:-1]):
        assert_frequencies(np.array([40_000 - k, k]), np.array([1 - p, p]))


@pytest.mark.parametrize(
    "op_type, inputs, attrs",
    [
        ("RandomNormal", (), {"shape": [64]}),
        ("RandomUniform", (), {"shape": [64]}),
        ("RandomNormalLike", (np.zeros(64, np.float32),), {}),
        ("RandomUniformLike", (np.zeros(64, np.float32),), {}),
        ("Multinomial", (np.zeros((1, 16), np.float32),), {"sample_size": 64}),
        ("Bernoulli", (np.full(64, 0.5, np.float32),), {}),
    ],
    ids=["RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"],
)
def test_a_seed_repeats_its_draws_and_no_seed_draws_afresh(op_type, inputs, attrs):
    """Same seed: same values across runs and sessions; another seed or none: other values each run."""
    model, feeds = node_model(op_type, 22, inputs, seed=SEED, **attrs)
    first = InferenceSession(model)
    a, b = first.run(None, feeds)[0], first.run(None, feeds)[0]
    c = InferenceSession(node_model(op_type, 22, inputs, seed=SEED, **attrs)[0]).run(None, feeds)[0]
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, c)
    other = InferenceSession(node_model(op_type, 22, inputs, seed=SEED + 1, **attrs)[0]).run(None, feeds)[0]
    assert not np.array_equal(a, other)
    unseeded = InferenceSession(node_model(op_type, 22, inputs, **attrs)[0])
    assert not np.array_equal(unseeded.run(None, feeds)[0], unseeded.run(None, feeds)[0])


def test_an_unseeded_generator_of_a_constant_input_is_not_folded():
    """RandomUniformLike of an initializer still draws afresh each run (constant folding must not freeze it)."""
    node = helper.make_node("RandomUniformLike", ["c"], ["y"])
    init = helper.make_tensor("c", TensorProto.FLOAT, [64], np.zeros(64, np.float32))
    graph = helper.make_graph([node], "g", [], [helper.make_empty_tensor_value_info("y")], [init])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])
    model.ir_version = ORT_IR_VERSION
    sess = InferenceSession(model)
    assert not np.array_equal(sess.run(None, {})[0], sess.run(None, {})[0])
