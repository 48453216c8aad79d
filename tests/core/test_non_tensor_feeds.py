"""Sequence, optional and map feeds: checked against their declared types; the caller's arrays never come back."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from minfer_core import BadFeedError, InferenceSession
from modelkit import make_model

F = TensorProto.FLOAT


def seq_input(name, elem=F):
    return helper.make_tensor_sequence_value_info(name, elem, None)


def erase_first_model():
    """s -> SequenceInsert(s, x) -> SequenceErase(., 0): the result holds the caller's s[1:] and x."""
    nodes = [helper.make_node("SequenceInsert", ["s", "x"], ["t"]), helper.make_node("SequenceErase", ["t", "zero"], ["u"])]
    model = make_model(nodes, [seq_input("s"), helper.make_tensor_value_info("x", F, [2])], [seq_input("u")],
                       [helper.make_tensor("zero", TensorProto.INT64, [], [0])])
    return InferenceSession(model.SerializeToString())


def test_a_returned_sequence_never_holds_the_callers_arrays():
    """Sequence outputs holding a fed array hold a copy: writing into them leaves the caller's arrays alone."""
    a, b, x = (np.full(2, v, np.float32) for v in (1, 2, 3))
    out = erase_first_model().run(None, {"s": [a, b], "x": x})[0]
    assert [v.tolist() for v in out] == [[2, 2], [3, 3]]
    assert not any(np.may_share_memory(v, w) for v in out for w in (a, b, x))
    out[0][...] = 9
    assert b.tolist() == [2, 2]


@pytest.mark.parametrize("feed, why", [
    (np.ones((2, 2), np.float32), "got ndarray"),
    ([np.ones(2, np.float64)], "float64"),
    ([np.ones(2, np.float32), [1.0, 2.0]], "list"),
])
def test_a_sequence_input_refuses_what_is_not_a_list_of_its_arrays(feed, why):
    """A sequence input takes a list of arrays of its element dtype; anything else is a BadFeedError naming it."""
    with pytest.raises(BadFeedError, match=rf"input 's' is declared seq\(float32.*{why}"):
        erase_first_model().run(None, {"s": feed, "x": np.ones(2, np.float32)})


def test_sequence_feeds_reach_kernels_read_only_and_the_callers_list_is_unchanged():
    """The caller's list keeps its arrays (same objects, same values) after a run."""
    a, b = np.ones(2, np.float32), np.zeros(2, np.float32)
    feed = [a, b]
    erase_first_model().run(None, {"s": feed, "x": np.ones(2, np.float32)})
    assert feed[0] is a and feed[1] is b and a.flags.writeable
