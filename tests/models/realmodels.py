"""Builders for three small but realistic models (detector head, OCR recognizer, transformer encoder block).

Each builder takes a seed and returns an ``onnx.ModelProto`` with random float32 weights, built
with ``onnx.helper`` the way exporters write such graphs (BatchNormalization left unfused, shape
arithmetic through Shape/Gather/Concat, decomposed LayerNorm and GELU, ...).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from modelkit import make_model, tensor

F = TensorProto.FLOAT


class _Graph:
    """A tiny graph builder: named initializers and nodes with auto-generated output names."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._n = 0

    def name(self, prefix: str) -> str:
        self._n += 1
        return f"{prefix}_{self._n}"

    def const(self, value, prefix: str = "c", dtype=np.float32) -> str:
        n = self.name(prefix)
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), n))
        return n

    def weight(self, shape, scale: float | None = None, prefix: str = "w") -> str:
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else int(shape[0])
        s = scale if scale is not None else 1.0 / np.sqrt(max(fan_in, 1))
        return self.const(self.rng.standard_normal(shape) * s, prefix)

    def op(self, op_type: str, inputs, n_out: int = 1, **attrs):
        outs = [self.name(op_type.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=self.name("n_" + op_type), **attrs))
        return outs[0] if n_out == 1 else outs

    # composite blocks -------------------------------------------------------------------------
    def conv_bn(self, x: str, cin: int, cout: int, k: int, stride: int = 1, pad: int | None = None, group: int = 1, bias: bool = False) -> str:
        pad = k // 2 if pad is None else pad
        inputs = [x, self.weight((cout, cin // group, k, k))]
        if bias:
            inputs.append(self.weight((cout,), scale=0.1))
        y = self.op("Conv", inputs, kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4, group=group)
        scale = self.const(1.0 + 0.2 * self.rng.standard_normal(cout))
        b = self.const(0.1 * self.rng.standard_normal(cout))
        mean = self.const(0.1 * self.rng.standard_normal(cout))
        var = self.const(0.5 + self.rng.random(cout))
        return self.op("BatchNormalization", [y, scale, b, mean, var], epsilon=1e-3, momentum=0.97)

    def silu(self, x: str) -> str:
        return self.op("Mul", [x, self.op("Sigmoid", [x])])


# ---------------------------------------------------------------------------------------------
# 1. YOLO-style detector head
# ---------------------------------------------------------------------------------------------
YOLO_CLASSES = 4
YOLO_ANCHORS = 3


def yolo_head(seed: int = 0) -> onnx.ModelProto:
    """1x3x64x64 -> detections (1, 3*16*16, 5+C), plus the raw head map."""
    g = _Graph(seed)
    c = YOLO_CLASSES
    no = 5 + c
    x = "images"
    h = g.silu(g.conv_bn(x, 3, 8, 3, stride=2))  # 32x32
    p3 = g.op("LeakyRelu", [g.conv_bn(h, 8, 16, 3, stride=2)], alpha=0.1)  # 16x16
    p4 = g.silu(g.conv_bn(p3, 16, 32, 3, stride=2))  # 8x8
    lat = g.silu(g.conv_bn(p4, 32, 16, 1))  # 8x8
    roi = g.const(np.zeros(0, np.float32), "roi")
    scales = g.const([1.0, 1.0, 2.0, 2.0], "scales")
    up = g.op("Resize", [lat, roi, scales], mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor")  # 16x16
    cat = g.op("Concat", [up, p3], axis=1)  # 32 ch
    f = g.silu(g.conv_bn(cat, 32, 16, 3))
    f = g.op("LeakyRelu", [g.conv_bn(f, 16, 16, 1)], alpha=0.01)
    head = g.op("Conv", [f, g.weight((YOLO_ANCHORS * no, 16, 1, 1), scale=1.0), g.weight((YOLO_ANCHORS * no,), scale=0.1)], kernel_shape=[1, 1])
    r5 = g.op("Reshape", [head, g.const([1, YOLO_ANCHORS, no, 16, 16], "shape5", np.int64)])
    tr = g.op("Transpose", [r5], perm=[0, 1, 3, 4, 2])  # 1,3,16,16,no
    pred = g.op("Reshape", [tr, g.const([1, -1, no], "shape3", np.int64)])  # 1,768,no
    box, obj, cls = g.op("Split", [pred, g.const([4, 1, c], "split", np.int64)], n_out=3, axis=2)
    ax = g.const([2], "ax", np.int64)
    xy = g.op("Slice", [box, g.const([0], "s0", np.int64), g.const([2], "e0", np.int64), ax])
    wh = g.op("Slice", [box, g.const([2], "s1", np.int64), g.const([2**62], "e1", np.int64), ax, g.const([1], "st", np.int64)])
    xy = g.op("Mul", [g.op("Sigmoid", [xy]), g.const(2.0)])
    wh = g.op("Mul", [g.op("Exp", [g.op("Clip", [wh, "", g.const(4.0)])]), g.const(8.0)])
    obj = g.op("Sigmoid", [obj])
    cls = g.op("Softmax", [cls], axis=-1)
    det = g.op("Concat", [xy, wh, obj, cls], axis=2)
    g.nodes.append(helper.make_node("Identity", [det], ["detections"]))
    g.nodes.append(helper.make_node("Identity", [head], ["head"]))
    n = YOLO_ANCHORS * 16 * 16
    return make_model(
        g.nodes,
        [tensor(x, [1, 3, 64, 64])],
        [tensor("detections", [1, n, no]), tensor("head", [1, YOLO_ANCHORS * no, 16, 16])],
        g.inits,
        opset=13,
    )


# ---------------------------------------------------------------------------------------------
# 2. OCR recognizer (PP-OCR / CRNN style)
# ---------------------------------------------------------------------------------------------
OCR_VOCAB = 37


def ocr_recognizer(seed: int = 0) -> onnx.ModelProto:
    """1x3x32x64 image -> per-column class probabilities (1, T=16, 37) and log-probabilities."""
    g = _Graph(seed)
    x = "x"
    h = g.op("HardSwish", [g.conv_bn(x, 3, 16, 3, stride=2)])  # 16x32
    h = g.op("HardSwish", [g.conv_bn(h, 16, 16, 3, group=16)])  # depthwise
    # squeeze-and-excitation with HardSigmoid gate (PaddleOCR's slope 0.2, offset 0.5)
    s = g.op("GlobalAveragePool", [h])
    s = g.op("Relu", [g.op("Conv", [s, g.weight((4, 16, 1, 1)), g.weight((4,), scale=0.1)], kernel_shape=[1, 1])])
    s = g.op("Conv", [s, g.weight((16, 4, 1, 1)), g.weight((16,), scale=0.1)], kernel_shape=[1, 1])
    s = g.op("HardSigmoid", [s], alpha=0.2, beta=0.5)
    h = g.op("Mul", [h, s])
    h = g.op("HardSwish", [g.conv_bn(h, 16, 32, 1)])  # pointwise
    h = g.op("Pad", [h, g.const([0, 0, 1, 1, 0, 0, 1, 1], "pads", np.int64), g.const(0.0, "pv")], mode="constant")
    h = g.op("HardSwish", [g.conv_bn(h, 32, 32, 3, stride=1, pad=0, group=32)])  # 16x32, depthwise
    h = g.op("Pad", [h, g.const([0, 0, 0, 1, 0, 0, 0, 1], "pads", np.int64)], mode="reflect")  # 16x34
    h = g.op("HardSwish", [g.conv_bn(h, 32, 48, 3, stride=1, pad=0)])  # 14x32
    h = g.op("MaxPool", [h], kernel_shape=[2, 2], strides=[2, 2])  # 7x16
    h = g.op("AveragePool", [h], kernel_shape=[7, 1], strides=[7, 1])  # 1x16
    seq = g.op("Transpose", [h], perm=[0, 3, 1, 2])  # N, W=T, C, 1
    seq = g.op("Reshape", [seq, g.const([0, 0, -1], "seqshape", np.int64)])  # N, T, 48
    logits = g.op("Add", [g.op("MatMul", [seq, g.weight((48, OCR_VOCAB), scale=3.0)]), g.weight((OCR_VOCAB,), scale=0.1)])
    g.nodes.append(helper.make_node("Softmax", [logits], ["probs"], axis=2))
    g.nodes.append(helper.make_node("LogSoftmax", [logits], ["logprobs"], axis=-1))
    return make_model(
        g.nodes,
        [tensor(x, [1, 3, 32, 64])],
        [tensor("probs", [1, 16, OCR_VOCAB]), tensor("logprobs", [1, 16, OCR_VOCAB])],
        g.inits,
        opset=17,
    )


# ---------------------------------------------------------------------------------------------
# 3. Transformer encoder block (PyTorch-export style, opset 17, symbolic batch and seq)
# ---------------------------------------------------------------------------------------------
D_MODEL, HEADS, D_FF = 64, 4, 128


def encoder_block(seed: int = 0) -> onnx.ModelProto:
    """x (batch, seq, 64) and mask (batch, seq) int64 (1 keep, 0 pad) -> (batch, seq, 64)."""
    g = _Graph(seed)
    d, nh, dh = D_MODEL, HEADS, D_MODEL // HEADS
    x, mask = "x", "attention_mask"

    # pre-attention LayerNormalization (the fused op)
    ln1 = g.op("LayerNormalization", [x, g.const(1 + 0.1 * g.rng.standard_normal(d)), g.const(0.1 * g.rng.standard_normal(d))], axis=-1, epsilon=1e-5)

    def linear(t: str, din: int, dout: int) -> str:  # (b, s, din) @ (din, dout) broadcasting + bias
        return g.op("Add", [g.op("MatMul", [t, g.weight((din, dout))]), g.weight((dout,), scale=0.1)])

    q, k, v = (linear(ln1, d, d) for _ in range(3))

    # shape arithmetic as torch.onnx writes it
    shp = g.op("Shape", [x])
    b = g.op("Gather", [shp, g.const(0, "i0", np.int64)], axis=0)
    s = g.op("Gather", [shp, g.const(1, "i1", np.int64)], axis=0)
    ax0 = g.const([0], "ax0", np.int64)
    b1 = g.op("Unsqueeze", [b, ax0])
    s1 = g.op("Unsqueeze", [s, ax0])
    heads_shape = g.op("Concat", [b1, s1, g.const([nh], "nh", np.int64), g.const([dh], "dh", np.int64)], axis=0)

    def split_heads(t: str, perm) -> str:
        return g.op("Transpose", [g.op("Reshape", [t, heads_shape])], perm=perm)

    qh = split_heads(q, [0, 2, 1, 3])  # b, h, s, dh
    kh = split_heads(k, [0, 2, 3, 1])  # b, h, dh, s
    vh = split_heads(v, [0, 2, 1, 3])
    scores = g.op("Div", [g.op("MatMul", [qh, kh]), g.const(np.sqrt(dh))])  # b, h, s, s

    # attention mask: positions with mask == 0 get a large negative score
    pad = g.op("Equal", [mask, g.const(0, "zero", np.int64)])  # b, s
    pad = g.op("Unsqueeze", [pad, g.const([1, 2], "ax12", np.int64)])  # b, 1, 1, s
    pad = g.op("Expand", [pad, g.op("Shape", [scores])])  # b, h, s, s
    scores = g.op("Where", [pad, g.const(np.float32(-1e9), "neg"), scores])
    attn = g.op("Softmax", [scores], axis=-1)
    ctx = g.op("Transpose", [g.op("MatMul", [attn, vh])], perm=[0, 2, 1, 3])  # b, s, h, dh
    ctx = g.op("Reshape", [ctx, g.op("Concat", [b1, s1, g.const([d], "dm", np.int64)], axis=0)])
    h = g.op("Add", [x, linear(ctx, d, d)])  # residual

    # decomposed LayerNorm (as older exporters write it)
    mean = g.op("ReduceMean", [h], axes=[-1], keepdims=1)
    cen = g.op("Sub", [h, mean])
    var = g.op("ReduceMean", [g.op("Pow", [cen, g.const(2.0)])], axes=[-1], keepdims=1)
    std = g.op("Sqrt", [g.op("Add", [var, g.const(1e-5)])])
    ln2 = g.op("Add", [g.op("Mul", [g.op("Div", [cen, std]), g.const(1 + 0.1 * g.rng.standard_normal(d))]), g.const(0.1 * g.rng.standard_normal(d))])

    # MLP with erf-GELU: 0.5 * x * (1 + erf(x / sqrt(2)))
    u = linear(ln2, d, D_FF)
    gelu = g.op("Mul", [g.op("Mul", [u, g.op("Add", [g.op("Erf", [g.op("Div", [u, g.const(np.sqrt(2.0))])]), g.const(1.0)])]), g.const(0.5)])
    out = g.op("Add", [h, linear(gelu, D_FF, d)])
    g.nodes.append(helper.make_node("Identity", [out], ["y"]))
    return make_model(
        g.nodes,
        [tensor(x, ["batch", "seq", d]), tensor(mask, ["batch", "seq"], TensorProto.INT64)],
        [tensor("y", ["batch", "seq", d])],
        g.inits,
        opset=17,
    )
