"""Builders for small but realistic models (detector head, OCR recognizer and text detector, transformer encoder
block, MobileNetV2/V3, a text-orientation classifier), for the tests and for the benchmark's real-model set.

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


# ---------------------------------------------------------------------------------------------
# MobileNetV3 (torchvision export: BatchNormalization unfused, HardSwish, squeeze-excite)
# ---------------------------------------------------------------------------------------------
# per block (kernel, expanded, out, squeeze-excite, HardSwish (else Relu), stride), and the classifier's
# hidden width: torchvision's mobilenet_v3_small / _large tables
MOBILENET_V3 = {
    "small": ((
        (3, 16, 16, True, False, 2), (3, 72, 24, False, False, 2), (3, 88, 24, False, False, 1),
        (5, 96, 40, True, True, 2), (5, 240, 40, True, True, 1), (5, 240, 40, True, True, 1),
        (5, 120, 48, True, True, 1), (5, 144, 48, True, True, 1), (5, 288, 96, True, True, 2),
        (5, 576, 96, True, True, 1), (5, 576, 96, True, True, 1)), 1024),
    "large": ((
        (3, 16, 16, False, False, 1), (3, 64, 24, False, False, 2), (3, 72, 24, False, False, 1),
        (5, 72, 40, True, False, 2), (5, 120, 40, True, False, 1), (5, 120, 40, True, False, 1),
        (3, 240, 80, False, True, 2), (3, 200, 80, False, True, 1), (3, 184, 80, False, True, 1),
        (3, 184, 80, False, True, 1), (3, 480, 112, True, True, 1), (3, 672, 112, True, True, 1),
        (5, 672, 160, True, True, 2), (5, 960, 160, True, True, 1), (5, 960, 160, True, True, 1)), 1280),
}


class _Calibrated(_Graph):
    """A _Graph that runs each node as it is added (onnx's ReferenceEvaluator, on 2-8 random images) and sets each
    BatchNormalization's running mean and variance to its input's statistics, as training leaves them.

    With random weights and made-up statistics the activations of a deep MobileNet fade (a HardSwish halves a small
    signal), and its logits stop depending on the image (measured: another image moved MobileNetV3-small's logits
    by 3e-4 of their range, a PP-LCNet's probabilities not at all): then a comparison against onnxruntime checks
    little. Calibrated, every normalized layer keeps its scale.
    """

    def __init__(self, seed: int, x: str, height: int, width: int) -> None:
        super().__init__(seed)
        # at most 256 pixels a side (beyond, the zero padding's share is small and statistics no longer change)
        # and 2-8 images: on small inputs the deepest maps are 2x2, and their per-channel statistics vary more
        # between images than within one
        height, width = min(height, 256), min(width, 256)
        shape = (min(8, max(2, 2 * 256 * 256 // (height * width))), 3, height, width)
        self.values = {x: np.random.default_rng(seed + 1000).standard_normal(shape).astype(np.float32)}

    def const(self, value, prefix: str = "c", dtype=np.float32) -> str:
        name = super().const(value, prefix, dtype)
        self.values[name] = numpy_helper.to_array(self.inits[-1])
        return name

    def op(self, op_type: str, inputs, n_out: int = 1, **attrs):
        from onnx.reference import ReferenceEvaluator

        inputs = list(inputs)
        if op_type == "BatchNormalization":
            self._calibrate(inputs[0], inputs[3], inputs[4])
        outs = super().op(op_type, inputs, n_out, **attrs)
        node = self.nodes[-1]
        got = ReferenceEvaluator(node).run(None, {i: self.values[i] for i in node.input if i})
        self.values.update(zip(node.output, got))
        return outs

    def _calibrate(self, x: str, mean: str, var: str) -> None:
        value = self.values[x]
        axes = (0, *range(2, value.ndim))
        spread = value.var(axes)
        # a channel nearly constant on these images must not amplify another image's variation many times over
        spread = np.maximum(spread, 0.5 * spread.mean())
        for name, stat in ((mean, value.mean(axes)), (var, spread)):
            at = next(i for i, t in enumerate(self.inits) if t.name == name)
            self.inits[at] = numpy_helper.from_array(stat.astype(np.float32), name)
            self.values[name] = stat.astype(np.float32)


def _divisible(v: float, by: int = 8) -> int:
    """torchvision's _make_divisible: round to a multiple of ``by``, never below 90% of ``v``."""
    out = max(by, int(v + by / 2) // by * by)
    return out + by if out < 0.9 * v else out


def _squeeze_excite(g: _Graph, x: str, c: int, squeeze: int, gate_alpha: float = 1 / 6) -> str:
    """GlobalAveragePool, 1x1 Conv + Relu, 1x1 Conv + HardSigmoid, Mul: the SE block of MobileNetV3/PP-LCNet."""
    s = g.op("GlobalAveragePool", [x])
    s = g.op("Relu", [g.op("Conv", [s, g.weight((squeeze, c, 1, 1)), g.weight((squeeze,), scale=0.1)], kernel_shape=[1, 1])])
    s = g.op("Conv", [s, g.weight((c, squeeze, 1, 1)), g.weight((c,), scale=0.1)], kernel_shape=[1, 1])
    return g.op("Mul", [x, g.op("HardSigmoid", [s], alpha=gate_alpha, beta=0.5)])


def _mobilenet_v3_features(g: _Graph, x: str, variant: str, width: float) -> list[tuple[str, int]]:
    """The MobileNetV3 trunk up to its last 1x1 conv; returns (tensor, channels) of each stride's last block
    (strides 2, 4, 8, 16) and of the last conv (stride 32), for heads that read several scales (FPN)."""
    blocks, _ = MOBILENET_V3[variant]
    cin = _divisible(16 * width)
    h = g.op("HardSwish", [g.conv_bn(x, 3, cin, 3, stride=2)])
    stages: list[tuple[str, int]] = []
    for k, expanded, out, se, hard, stride in blocks:
        expanded, out = _divisible(expanded * width), _divisible(out * width)
        if stride == 2:
            stages.append((h, cin))
        act = "HardSwish" if hard else "Relu"
        y = h if expanded == cin else g.op(act, [g.conv_bn(h, cin, expanded, 1)])
        y = g.op(act, [g.conv_bn(y, expanded, expanded, k, stride=stride, group=expanded)])
        if se:
            y = _squeeze_excite(g, y, expanded, _divisible(expanded // 4))
        y = g.conv_bn(y, expanded, out, 1)
        h = g.op("Add", [y, h]) if stride == 1 and cin == out else y
        cin = out
    last = 6 * cin
    stages.append((g.op("HardSwish", [g.conv_bn(h, cin, last, 1)]), last))
    return stages


def mobilenet_v3(seed: int = 0, *, variant: str = "small", size: int = 224, width: float = 1.0, classes: int = 1000) -> onnx.ModelProto:
    """A MobileNetV3 classifier ("small" or "large") as torchvision exports it at opset 17: 1x3xSxS -> (1, classes) logits.

    Depthwise convs, HardSwish, squeeze-excite (GlobalAveragePool, HardSigmoid gate), BatchNormalization unfused,
    Flatten + Gemm classifier (the export of the eval-mode Dropout is no node). Weights: ~2.5M (small) or
    ~5.5M (large) floats at width 1 and 1000 classes.
    """
    x = "images"
    g = _Calibrated(seed, x, size, size)
    feat, c = _mobilenet_v3_features(g, x, variant, width)[-1]
    hidden = _divisible(MOBILENET_V3[variant][1] * width)
    h = g.op("Flatten", [g.op("GlobalAveragePool", [feat])], axis=1)
    h = g.op("HardSwish", [g.op("Gemm", [h, g.weight((hidden, c)), g.weight((hidden,), scale=0.1)], transB=1)])
    g.nodes.append(helper.make_node("Gemm", [h, g.weight((classes, hidden)), g.weight((classes,), scale=0.1)], ["logits"], transB=1))
    return make_model(g.nodes, [tensor(x, [1, 3, size, size])], [tensor("logits", [1, classes])], g.inits, opset=17)


# ---------------------------------------------------------------------------------------------
# OCR text detector (DBNet / PP-OCR det style)
# ---------------------------------------------------------------------------------------------
def _upsample(g: _Graph, x: str, factor: int) -> str:
    """Resize by ``factor`` with nearest, as torch exports F.interpolate(scale_factor=f) at opset 13."""
    scales = g.const([1.0, 1.0, float(factor), float(factor)], "scales")
    return g.op("Resize", [x, "", scales], mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor")


def _resize_like(g: _Graph, x: str, like: str) -> str:
    """Bilinear Resize of ``x`` to ``like``'s height and width, with the Shape/Slice/Concat arithmetic torch writes
    for F.interpolate(x, size=like.shape[2:], mode="bilinear")."""
    nc = g.op("Slice", [g.op("Shape", [x]), g.const([0], "s", np.int64), g.const([2], "e", np.int64)])
    hw = g.op("Slice", [g.op("Shape", [like]), g.const([2], "s", np.int64), g.const([4], "e", np.int64)])
    sizes = g.op("Concat", [nc, hw], axis=0)
    return g.op("Resize", [x, "", "", sizes], mode="linear", coordinate_transformation_mode="half_pixel")


def ocr_detector(seed: int = 0, *, size: int = 64, width: float = 0.5, fpn: int = 96) -> onnx.ModelProto:
    """A DBNet-style text detector: 1x3xSxS -> (1, 1, S, S) text probability map; S a multiple of 32.

    MobileNetV3-large trunk (x0.5, as PP-OCR's mobile detector), an FPN (1x1 laterals, nearest Resize x2 and Add
    top-down, 3x3 smoothing, the coarser maps resized bilinearly to the finest and concatenated), and DB's
    probability head (3x3 Conv+BN+Relu, two ConvTranspose x2, Sigmoid). ~0.7M weights at the defaults.
    """
    x = "x"
    g = _Calibrated(seed, x, size, size)
    stages = _mobilenet_v3_features(g, x, "large", width)[1:]  # strides 4, 8, 16, 32
    lat = [g.op("Conv", [t, g.weight((fpn, c, 1, 1))], kernel_shape=[1, 1]) for t, c in stages]
    for i in (2, 1, 0):  # top-down: each finer lateral plus the coarser sum upsampled
        lat[i] = g.op("Add", [lat[i], _upsample(g, lat[i + 1], 2)])
    q = fpn // 4
    smooth = [g.op("Conv", [t, g.weight((q, fpn, 3, 3))], kernel_shape=[3, 3], pads=[1] * 4) for t in lat]
    fused = g.op("Concat", [_resize_like(g, t, smooth[0]) for t in smooth[:0:-1]] + [smooth[0]], axis=1)
    h = g.op("Relu", [g.conv_bn(fused, fpn, q, 3)])
    h = g.op("ConvTranspose", [h, g.weight((q, q, 2, 2)), g.weight((q,), scale=0.1)], kernel_shape=[2, 2], strides=[2, 2])
    h = g.op("Relu", [g.op("BatchNormalization", [h, g.const(1 + 0.2 * g.rng.standard_normal(q)), g.const(0.1 * g.rng.standard_normal(q)),
                                                  g.const(0.1 * g.rng.standard_normal(q)), g.const(0.5 + g.rng.random(q))], epsilon=1e-5)])
    h = g.op("ConvTranspose", [h, g.weight((q, 1, 2, 2)), g.weight((1,), scale=0.1)], kernel_shape=[2, 2], strides=[2, 2])
    g.nodes.append(helper.make_node("Sigmoid", [h], ["maps"]))
    return make_model(g.nodes, [tensor(x, [1, 3, size, size])], [tensor("maps", [1, 1, size, size])], g.inits, opset=17)


# ---------------------------------------------------------------------------------------------
# Text-line orientation classifier (PP-LCNet style, as PaddleOCR's angle classifier)
# ---------------------------------------------------------------------------------------------
# per depthwise-separable block (kernel, out, stride, squeeze-excite) at scale 1: PP-LCNet's table
LCNET = ((3, 32, 1, False), (3, 64, 2, False), (3, 64, 1, False), (3, 128, 2, False), (3, 128, 1, False),
         (3, 256, 2, False), *((5, 256, 1, False),) * 5, (5, 512, 2, True), (5, 512, 1, True))


def orientation_classifier(seed: int = 0, *, scale: float = 0.25, height: int = 80, width: int = 160, classes: int = 2) -> onnx.ModelProto:
    """A PP-LCNet classifier (PaddleOCR's text-line orientation model at x0.25, 2 classes): 1x3xHxW -> (1, classes)
    probabilities. Depthwise-separable blocks (depthwise Conv+BN+HardSwish, SE on the last two, pointwise
    Conv+BN+HardSwish), GlobalAveragePool, a 1x1 Conv to 1280 + HardSwish, Flatten, Gemm, Softmax."""
    x = "x"
    g = _Calibrated(seed, x, height, width)
    cin = _divisible(16 * scale)
    h = g.op("HardSwish", [g.conv_bn(x, 3, cin, 3, stride=2)])
    for k, out, stride, se in LCNET:
        out = _divisible(out * scale)
        h = g.op("HardSwish", [g.conv_bn(h, cin, cin, k, stride=stride, group=cin)])
        if se:
            h = _squeeze_excite(g, h, cin, cin // 4)
        h = g.op("HardSwish", [g.conv_bn(h, cin, out, 1)])
        cin = out
    h = g.op("GlobalAveragePool", [h])
    h = g.op("HardSwish", [g.op("Conv", [h, g.weight((1280, cin, 1, 1))], kernel_shape=[1, 1])])
    h = g.op("Gemm", [g.op("Flatten", [h], axis=1), g.weight((classes, 1280)), g.weight((classes,), scale=0.1)], transB=1)
    g.nodes.append(helper.make_node("Softmax", [h], ["probs"], axis=-1))
    return make_model(g.nodes, [tensor(x, [1, 3, height, width])], [tensor("probs", [1, classes])], g.inits, opset=17)


# ---------------------------------------------------------------------------------------------
# MobileNetV2
# ---------------------------------------------------------------------------------------------
# (expansion, channels, blocks, stride) of each stage, torchvision's inverted_residual_setting
MOBILENET_V2 = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]


def _relu6(g: _Graph, x: str) -> str:
    """ReLU6 as torch exports it from opset 11: Clip with constant min and max inputs."""
    return g.op("Clip", [x, g.const(0.0, "zero"), g.const(6.0, "six")])


def mobilenet_v2(seed: int = 0, *, size: int = 224, width: float = 0.5, classes: int = 1000) -> onnx.ModelProto:
    """A MobileNetV2 classifier as torchvision exports it at opset 13: 1x3xSxS -> (1, classes) logits.

    Inverted residuals (1x1 expand, depthwise 3x3, 1x1 project; Add when stride 1 keeps the channels), ReLU6 as
    Clip, BatchNormalization unfused (calibrated, see `_Calibrated`), GlobalAveragePool + Flatten + Gemm. At width
    0.5: ~2M floats of weights, most of them the 1280-wide last conv and the classifier.
    """
    x = "images"
    g = _Calibrated(seed, x, size, size)
    cin = _divisible(32 * width)
    h = _relu6(g, g.conv_bn(x, 3, cin, 3, stride=2))
    for t, c, n, s in MOBILENET_V2:
        out = _divisible(c * width)
        for i in range(n):
            stride = s if i == 0 else 1
            hidden = cin * t
            y = h if t == 1 else _relu6(g, g.conv_bn(h, cin, hidden, 1))
            y = _relu6(g, g.conv_bn(y, hidden, hidden, 3, stride=stride, group=hidden))
            y = g.conv_bn(y, hidden, out, 1)
            h = g.op("Add", [h, y]) if stride == 1 and cin == out else y
            cin = out
    last = _divisible(1280 * max(1.0, width))
    h = _relu6(g, g.conv_bn(h, cin, last, 1))
    h = g.op("Flatten", [g.op("GlobalAveragePool", [h])], axis=1)
    g.nodes.append(helper.make_node("Gemm", [h, g.weight((classes, last)), g.weight((classes,), scale=0.1)], ["logits"], transB=1))
    return make_model(g.nodes, [tensor(x, [1, 3, size, size])], [tensor("logits", [1, classes])], g.inits, opset=13)
