"""Three realistic user models (detector head, OCR recognizer, transformer block) match onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from modelkit import ort_run
from minfer_core import InferenceSession
from realmodels import encoder_block, ocr_recognizer, yolo_head

RTOL, ATOL = 1e-3, 1e-5


def _check(model: onnx.ModelProto, sess: InferenceSession, feeds: dict[str, np.ndarray]) -> None:
    got = sess.run(None, feeds)
    want = ort_run(model, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("passes", ["none", "all"])
def test_yolo_head_matches_onnxruntime(passes):
    """A YOLO-style head (Conv+BN+SiLU/LeakyRelu, Resize-nearest upsample, Concat, Reshape/Transpose, Split/Slice/Sigmoid/Softmax decode) matches onnxruntime."""
    model = yolo_head(seed=0)
    x = np.random.default_rng(1).standard_normal((1, 3, 64, 64)).astype(np.float32)
    _check(model, InferenceSession(model, passes=passes), {"images": x})


@pytest.mark.parametrize("passes", ["none", "all"])
def test_ocr_recognizer_matches_onnxruntime(passes):
    """A PP-OCR-style recognizer (depthwise convs, HardSwish, HardSigmoid SE, Pad, sequence MatMul, Softmax/LogSoftmax) matches onnxruntime."""
    model = ocr_recognizer(seed=0)
    x = np.random.default_rng(2).standard_normal((1, 3, 32, 64)).astype(np.float32)
    _check(model, InferenceSession(model, passes=passes), {"x": x})


@pytest.mark.parametrize("passes", ["none", "all"])
def test_encoder_block_matches_onnxruntime_at_two_shapes(passes):
    """One session of a PyTorch-style encoder block (symbolic batch/seq, masked attention, both LayerNorm forms, erf-GELU) matches onnxruntime at two (batch, seq) shapes."""
    model = encoder_block(seed=0)
    sess = InferenceSession(model, passes=passes)
    rng = np.random.default_rng(3)
    for batch, seq in [(2, 7), (3, 12)]:
        x = rng.standard_normal((batch, seq, 64)).astype(np.float32)
        mask = (rng.random((batch, seq)) > 0.3).astype(np.int64)
        mask[:, 0] = 1  # no fully padded row
        mask[0, :] = 1  # and one row with no padding at all
        _check(model, sess, {"x": x, "attention_mask": mask})
