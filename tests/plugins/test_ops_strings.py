"""minfer-ops-basic string support: the string ops, and Cast/Equal/shape ops on object arrays.

Each rule runs the same single-node model through minfer and onnxruntime (the
oracle) and compares outputs exactly: strings are numpy object arrays of str.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from minfer_core import InferenceSession
from minfer_core.testing.ops import ORT_IR_VERSION, onnxruntime_outputs

ort = pytest.importorskip("onnxruntime")


def strings(*values, shape=None):
    """An object array of str (minfer's and onnxruntime's form of a STRING tensor)."""
    out = np.empty(len(values), dtype=object)
    out[:] = list(values)
    return out.reshape(shape or (len(values),))


def elem_type(x: np.ndarray) -> int:
    return TensorProto.STRING if x.dtype == object else helper.np_dtype_to_tensor_dtype(x.dtype)


def both(op_type, opset, inputs, attrs=None, num_outputs=1):
    """(minfer's outputs, onnxruntime's outputs) of one node whose inputs are graph inputs."""
    names = [f"i{i}" for i in range(len(inputs))]
    outs = [f"o{i}" for i in range(num_outputs)]
    node = helper.make_node(op_type, names, outs, **(attrs or {}))
    ins = [helper.make_tensor_value_info(n, elem_type(x), x.shape) for n, x in zip(names, inputs)]
    graph = helper.make_graph([node], "node", ins, [helper.make_empty_tensor_value_info(o) for o in outs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = ORT_IR_VERSION
    feeds = dict(zip(names, inputs))
    return InferenceSession(model).run(None, feeds), onnxruntime_outputs(model, feeds)


def assert_same_as_ort(op_type, opset, inputs, attrs=None, num_outputs=1):
    """minfer and onnxruntime give the same dtype, shape and values on every output."""
    got, want = both(op_type, opset, inputs, attrs, num_outputs)
    for i, (g, w) in enumerate(zip(got, want)):
        assert (g.dtype, g.shape) == (w.dtype, w.shape), f"output {i}: {g.dtype}{g.shape} vs onnxruntime {w.dtype}{w.shape}"
        np.testing.assert_array_equal(g, w, err_msg=f"output {i}")  # NaN equals NaN here
    return got


WORDS = strings("Monday", "tuesday", "WEDNESDAY", "monday", "Ünïcode", "straße", "")
LOCALE = "C.UTF-8"  # onnxruntime's default en_US.UTF-8 is not installed everywhere


@pytest.mark.parametrize("action", ["NONE", "LOWER", "UPPER"])
@pytest.mark.parametrize("sensitive", [0, 1])
def test_string_normalizer_matches_onnxruntime(action, sensitive):
    """StringNormalizer drops stopwords (case-folded unless is_case_sensitive) then changes case letter by letter."""
    attrs = {"locale": LOCALE, "case_change_action": action, "is_case_sensitive": sensitive, "stopwords": ["monday", "WEDNESDAY"]}
    assert_same_as_ort("StringNormalizer", 10, [WORDS], attrs)
    assert_same_as_ort("StringNormalizer", 10, [WORDS.reshape(1, -1)], attrs)


def test_string_normalizer_keeps_one_empty_string_when_all_are_stopwords():
    """Filtering every word out leaves a single empty string, [1] or [1, 1] by the input's rank."""
    attrs = {"locale": LOCALE, "stopwords": ["a", "b"]}
    got = assert_same_as_ort("StringNormalizer", 10, [strings("a", "b", shape=(1, 2))], attrs)
    assert got[0].tolist() == [[""]]


def test_string_concat_broadcasts_like_onnxruntime():
    """StringConcat joins elementwise with numpy broadcasting, UTF-8 and empty strings included."""
    x = strings("a", "bé", "", "ß", shape=(2, 2))
    assert_same_as_ort("StringConcat", 20, [x, strings("!", "?")])
    assert_same_as_ort("StringConcat", 20, [x, strings("_", shape=())])


@pytest.mark.parametrize(
    "attrs", [{}, {"delimiter": ","}, {"delimiter": ",", "maxsplit": 1}, {"delimiter": "ab"}, {"maxsplit": 1}], ids=str
)
def test_string_split_matches_onnxruntime(attrs):
    """StringSplit pads the pieces with "" to the longest row and counts them, whitespace runs when no delimiter."""
    x = strings("a,b,,c", "  one  two three ", "xabyabz", ",", " ", shape=(5,))
    y, z = assert_same_as_ort("StringSplit", 20, [x], attrs, num_outputs=2)
    assert z.dtype == np.int64 and y.shape == (5, int(z.max()))


def test_string_split_of_an_empty_string_is_one_empty_piece_with_a_delimiter():
    """"" split on "," is [""] (count 1) as in onnx's reference and Python; without a delimiter it has no pieces.

    onnxruntime 1.32 counts 0 pieces in both cases; ONNX's text leaves it open, its reference decides.
    """
    y, z = both("StringSplit", 20, [strings("", "a,b")], {"delimiter": ","}, num_outputs=2)[0]
    assert y.tolist() == [["", ""], ["a", "b"]] and z.tolist() == [1, 2]
    y, z = both("StringSplit", 20, [strings("", "a b")], {}, num_outputs=2)[0]
    assert y.tolist() == [["", ""], ["a", "b"]] and z.tolist() == [0, 2]


def test_string_split_of_an_empty_tensor_has_width_zero():
    """An empty input gives pieces of shape input.shape + (0,) and no counts."""
    y, z = both("StringSplit", 20, [strings(shape=(0,))], {"delimiter": ","}, num_outputs=2)[0]
    assert (y.shape, y.dtype, z.shape, z.dtype) == ((0, 0), object, (0,), np.int64)


@pytest.mark.parametrize("pattern", [r"\w+@gmail\.com", r"[a-z]+", r"(ab)*c?", r""])
def test_regex_full_match_matches_onnxruntime(pattern):
    """RegexFullMatch is true only where the whole string matches (not a prefix, not a substring)."""
    x = strings("me@gmail.com", "me@gmail.comx", "abc", "ababc", "", "UPPER", shape=(2, 3))
    got = assert_same_as_ort("RegexFullMatch", 20, [x], {"pattern": pattern})
    assert got[0].dtype == np.bool_


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int64, np.int8, np.uint64, np.bool_])
def test_cast_numbers_to_strings_writes_onnxruntimes_text(dtype):
    """Cast to STRING: integers exactly, floats with 8 significant digits, INF/-INF/NaN, bools as 1/0."""
    floats = [1e8, 1e20, -2.0, 0.0, 1e-5, 123.25, 1 / 3, 65504, np.inf, -np.inf, np.nan, 12345678]
    with np.errstate(over="ignore"):
        x = np.array(floats if np.dtype(dtype).kind == "f" else [0, 1, 100, 7], dtype=np.float64).astype(dtype)
    assert_same_as_ort("Cast", 21, [x], {"to": TensorProto.STRING})


@pytest.mark.parametrize("to", [TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.INT64, TensorProto.INT32, TensorProto.BOOL])
def test_cast_strings_to_numbers_reads_plain_and_scientific_text(to):
    """Cast from STRING reads "3.5", "1E3", "-7" and INF/-INF/NaN in any case, as onnxruntime."""
    words = ["3.5", "1E3", "-7", "0", "+INF", "-inf", "NaN", "1e-5"]
    x = strings(*(words if to in (TensorProto.FLOAT, TensorProto.DOUBLE) else ["-7", "0", "1", "42", "123456"]))
    assert_same_as_ort("Cast", 21, [x], {"to": to})


def test_cast_keeps_large_int64_text_exact():
    """Integer text beyond 2**53 reaches int64 without passing through float64."""
    x = strings(str(2**62 + 1), str(-(2**62) - 1))
    assert_same_as_ort("Cast", 21, [x], {"to": TensorProto.INT64})


def test_string_tensors_pass_through_shape_and_compare_ops():
    """Equal, Concat, Reshape, Identity, Transpose and Where work on object arrays as onnxruntime does."""
    x = strings("a", "bb", "", "d", shape=(2, 2))
    assert_same_as_ort("Equal", 19, [x, strings("bb", "d")])
    assert_same_as_ort("Concat", 21, [x, x], {"axis": 1})
    assert_same_as_ort("Reshape", 21, [x, np.array([4])])
    assert_same_as_ort("Identity", 21, [x])
    assert_same_as_ort("Transpose", 21, [x])
    assert_same_as_ort("Where", 21, [np.array([True, False]), x, strings("p", "q")])


def test_gather_on_strings_takes_whole_rows():
    """Gather on an object array picks the indexed rows (onnxruntime 1.32 blanks some strings here; ONNX says take)."""
    x = strings("a", "bb", "c", "d", shape=(2, 2))
    got = both("Gather", 21, [x, np.array([1, 0])])[0][0]
    assert got.dtype == object and got.tolist() == [["c", "d"], ["a", "bb"]]


TFIDF_POOL = {"ngram_counts": [0, 4], "ngram_indexes": [0, 1, 2, 3, 4, 5, 6], "pool_int64s": [2, 3, 5, 4, 5, 6, 7, 8, 6, 7]}


@pytest.mark.parametrize("mode", ["TF", "IDF", "TFIDF"])
@pytest.mark.parametrize("grams, skips", [((1, 1), 0), ((1, 2), 0), ((2, 2), 3), ((1, 2), 5)], ids=str)
def test_tfidf_vectorizer_on_integers_matches_onnxruntime(mode, grams, skips):
    """TfIdfVectorizer counts pool n-grams over every skip up to max_skip_count, then applies mode and weights."""
    x = np.array([[1, 1, 3, 3, 3, 7], [8, 6, 7, 5, 6, 8]], dtype=np.int64)
    attrs = {"mode": mode, "min_gram_length": grams[0], "max_gram_length": grams[1], "max_skip_count": skips, **TFIDF_POOL}
    if mode != "TF":
        attrs["weights"] = [0.5, 1.0, 2.0, 3.0, 4.0, 1.5, 0.25]
    assert_same_as_ort("TfIdfVectorizer", 9, [x], attrs)
    assert_same_as_ort("TfIdfVectorizer", 9, [x[1].astype(np.int32)], attrs)


def test_tfidf_vectorizer_on_strings_matches_onnxruntime():
    """With pool_strings, string tokens are matched; ngram_indexes scatter the counts into the output."""
    x = strings("the", "cat", "sat", "on", "the", "cat", "mat", "the", shape=(8,))
    attrs = {
        "mode": "TF", "min_gram_length": 1, "max_gram_length": 2, "max_skip_count": 1, "ngram_counts": [0, 3],
        "ngram_indexes": [4, 0, 2, 1, 3], "pool_strings": ["the", "cat", "dog", "the", "cat", "sat", "the"],
    }  # fmt: skip
    got = assert_same_as_ort("TfIdfVectorizer", 9, [x], attrs)
    # "cat" x2, "the cat" x2, "dog" 0, "sat the" x1 (only with one skip, over "on"), "the" x3
    assert got[0].tolist() == [2.0, 2.0, 0.0, 1.0, 3.0]
