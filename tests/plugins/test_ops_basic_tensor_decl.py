"""minfer-ops-basic tensor kernels, part 3: what the kernels declare matches what they do.

Attributes and defaults against every onnx version a kernel covers, docstrings,
and the memory-planner declarations (out=, inplace, views).
"""

from __future__ import annotations

import inspect

import numpy as np
import onnx
import pytest
from onnx import helper

from minfer_core import KernelContext, kernels_in
from minfer_ops_basic import detection, generate, indexing, pad, shape, signal

KERNELS = kernels_in(shape, indexing, generate, pad, signal, detection)


def _schema_attributes(schema) -> dict:
    """Attribute name -> ONNX default (None when optional without one, empty when required)."""
    out = {}
    for name, a in schema.attributes.items():
        if a.default_value.type:
            v = helper.get_attribute_value(a.default_value)
            out[name] = v.decode() if isinstance(v, bytes) else v
        else:
            out[name] = inspect.Parameter.empty if a.required else None
    return out


def test_kernels_accept_exactly_the_attributes_of_every_covered_version():
    """A kernel takes each covered version's attributes with ONNX's defaults; the first kernel starts at the op's first version."""
    versions: dict[str, list] = {}
    for s in onnx.defs.get_all_schemas_with_history():
        if s.domain == "":
            versions.setdefault(s.name, []).append(s)
    for k in KERNELS:
        sinces = sorted(x.since for x in KERNELS if x.op_type == k.op_type)
        assert sinces[0] == min(s.since_version for s in versions[k.op_type]), k.op_type
        until = min([s for s in sinces if s > k.since], default=10**6)
        for schema in versions[k.op_type]:
            if k.since <= schema.since_version < until:
                assert k.attribute_defaults == _schema_attributes(schema), (k.op_type, k.since, schema.since_version)


def test_kernels_have_a_docstring_naming_op_and_version():
    """Every kernel's one-line docstring starts with '<OpType>-<since>'."""
    for k in KERNELS:
        assert (k.fn.__doc__ or "").startswith(f"{k.op_type}-{k.since}"), (k.op_type, k.since, k.fn.__doc__)


X = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
I64 = np.int64

# One sample call per out=True kernel: (op_type, since, inputs, attrs).
OUT_CALLS = [
    ("Concat", 4, [X, X], {"axis": -1}),
    ("Concat", 1, [X, X], {}),
    ("Expand", 8, [X[:, :1], np.array([2, 2, 3, 4], I64)], {}),
    ("Tile", 6, [X, np.array([2, 1, 3], I64)], {}),
    ("Tile", 1, [X, np.array(2, I64), np.array(1, I64)], {}),
    ("Gather", 1, [X, np.array([[2, -1]], I64)], {"axis": 2}),
    ("Where", 9, [X > 5, X, np.float32(-1).reshape(())], {}),
    ("Where", 9, [(X % 3 == 0)[:, :1], -X, X], {}),
    ("ScatterElements", 16, [X, np.array([[[0, 2]]], I64), np.ones((1, 1, 2), np.float32)], {"axis": 2, "reduction": "add"}),
    ("ScatterElements", 11, [X, np.array([[[1, 0]]], I64), np.ones((1, 1, 2), np.float32)], {"axis": 1}),
    ("ScatterND", 16, [X, np.array([[1, 2]], I64), np.ones((1, 4), np.float32)], {"reduction": "mul"}),
    ("ScatterND", 11, [X, np.array([[1], [0]], I64), np.zeros((2, 3, 4), np.float32)], {}),
    ("Scatter", 9, [X, np.array([[[1]]], I64), np.zeros((1, 1, 1), np.float32)], {"axis": 0}),
    ("TensorScatter", 24, [X, np.ones((2, 1, 4), np.float32), np.array([2, 0], I64)], {"mode": "circular"}),
    ("ConstantOfShape", 9, [np.array([2, 3], I64)], {"value": np.array([4], np.int32)}),
    ("Trilu", 14, [X, np.array(1, I64)], {"upper": 0}),
    ("CumSum", 11, [X, np.array(1, I64)], {"exclusive": 1, "reverse": 1}),
    ("CumSum", 11, [X, np.array(-1, I64)], {}),
    ("CumProd", 26, [X, np.array(0, I64)], {"exclusive": 1}),
    ("Pad", 18, [X, np.array([1, -1, 2, 0], I64), np.array(5, np.float32), np.array([0, 2], I64)], {}),
    ("Pad", 18, [X, np.array([1, 2], I64), None, np.array([1], I64)], {"mode": "reflect"}),
    ("Pad", 2, [X], {"pads": [0, 0, -1, 0, 0, 0]}),
    ("Pad", 1, [X], {"paddings": [0, 1, 1, 0, 0, 1], "mode": "edge"}),
    ("Pad", 11, [X, np.array([0, 0, 1, 1, 0, 0], I64)], {"mode": "wrap"}),
]


def _kernel(op_type, since):
    return next(k for k in KERNELS if k.op_type == op_type and k.since == since)


def _run(k, inputs, attrs, num_outputs=1):
    """Call a kernel as the engine does, through its factory when it prepares itself."""
    if not k.prepare:
        return k.fn(*inputs, **attrs)
    n = len(inputs)
    ctx = KernelContext("n", k.op_type, k.since, (None,) * n, (None,) * num_outputs, (None,) * n, num_outputs)
    return k.fn(ctx, **attrs)(*inputs)


def test_every_out_kernel_has_a_sample_call():
    """The out= checks below cover every kernel that declares out=True."""
    assert {(k.op_type, k.since) for k in KERNELS if k.out} == {(o, s) for o, s, _, _ in OUT_CALLS}


@pytest.mark.parametrize("op_type, since, inputs, attrs", OUT_CALLS, ids=[f"{o}-{s}" for o, s, _, _ in OUT_CALLS])
def test_out_kernels_write_the_planned_buffer(op_type, since, inputs, attrs):
    """With out= (C-contiguous, exact shape and dtype) a kernel returns that very buffer holding the usual result."""
    k = _kernel(op_type, since)
    want = k.fn(*inputs, **attrs)
    out = np.full(want.shape, 99, want.dtype)
    got = k.fn(*inputs, **attrs, out=out)
    assert got is out and np.array_equal(got, want)


@pytest.mark.parametrize(
    "op_type, since, inputs, attrs",
    [c for c in OUT_CALLS if _kernel(c[0], c[1]).inplace],
    ids=[f"{o}-{s}" for o, s, _, _ in OUT_CALLS if _kernel(o, s).inplace],
)
def test_inplace_kernels_may_write_over_their_input(op_type, since, inputs, attrs):
    """A kernel declaring inplace=(i, ...) gives the same result when out is any such input i itself."""
    k = _kernel(op_type, since)
    want = k.fn(*inputs, **attrs)
    tried = 0
    for i in k.inplace:
        if inputs[i].shape != want.shape or inputs[i].dtype != want.dtype:
            continue  # the engine only aliases an input of the output's shape and dtype
        args = list(inputs)
        args[i] = inputs[i].copy()
        assert k.fn(*args, **attrs, out=args[i]) is args[i]
        assert np.array_equal(args[i], want)
        tried += 1
    assert tried


VIEW_CALLS = [
    ("Reshape", 14, [X, np.array([0, -1], I64)], {}),
    ("Flatten", 1, [X], {"axis": 2}),
    ("Squeeze", 13, [X[None]], {}),
    ("Unsqueeze", 13, [X, np.array([1], I64)], {}),
    ("Identity", 1, [X], {}),
    ("Dropout", 12, [X], {}),
    ("Dropout", 7, [X], {}),
    ("Split", 18, [X], {"axis": 1}),
    ("Transpose", 1, [X], {}),
    ("Slice", 10, [X, np.array([1], I64), np.array([3], I64), np.array([1], I64)], {}),
    ("Pad", 11, [X, np.array([0, 0, -1, 0, 0, 0], I64)], {}),
]


@pytest.mark.parametrize("op_type, since, inputs, attrs", VIEW_CALLS, ids=[c[0] for c in VIEW_CALLS])
def test_views_true_kernels_really_return_views(op_type, since, inputs, attrs):
    """Kernels declaring views=True hand back memory of their input (zero-copy)."""
    k = _kernel(op_type, since)
    assert k.views is True
    outs = _run(k, inputs, attrs, num_outputs=3 if op_type == "Split" else 1)
    for out in outs if isinstance(outs, tuple) else (outs,):
        assert np.shares_memory(out, inputs[0])


def test_views_false_kernels_never_alias_their_inputs():
    """Kernels declaring views=False return fresh memory, for every sample call here."""
    calls = OUT_CALLS + [
        ("Gather", 1, [X, np.array(0, I64)], {}),
        ("GatherElements", 11, [X, np.zeros((1, 1, 1), I64)], {}),
        ("GatherND", 12, [X, np.zeros((2, 0), I64)], {"batch_dims": 1}),
        ("Compress", 9, [X, np.array([True, True])], {"axis": 0}),
        ("Unique", 11, [X], {}),
        ("TopK", 11, [X, np.array([4], I64)], {}),
        ("NonZero", 9, [X], {}),
        ("ReverseSequence", 10, [X, np.array([1, 1, 1], I64)], {}),
        ("Concat", 4, [X], {"axis": 0}),
        ("Expand", 8, [X, np.array([1], I64)], {}),
        ("Tile", 6, [X, np.array([1, 1, 1], I64)], {}),
        ("Shape", 15, [X], {}),
    ]
    for op_type, since, inputs, attrs in calls:
        k = _kernel(op_type, since)
        if k.views is not False:
            continue
        outs = k.fn(*inputs, **attrs)
        for out in outs if isinstance(outs, tuple) else (outs,):
            assert not any(isinstance(x, np.ndarray) and np.shares_memory(out, x) for x in inputs), (op_type, since)


SOFTMAX_CALLS = [(op, since, [x], attrs) for op in ("Softmax", "LogSoftmax", "Hardmax")
                 for since, attrs in ((13, {}), (13, {"axis": 0}), (1, {"axis": 1}))
                 for x in (X, np.zeros((0, 3), np.float32))]


@pytest.mark.parametrize("op_type, since, inputs, attrs", SOFTMAX_CALLS)
def test_the_softmax_family_declares_fresh_results_and_returns_them(op_type, since, inputs, attrs):
    """Softmax, LogSoftmax and Hardmax declare views=False (so a graph output of theirs is not checked each run) and
    never hand back their input's memory, empty inputs and any axis alike; given ``out``, they return it."""
    from minfer_ops_basic import activation

    k = next(k for k in kernels_in(activation) if k.op_type == op_type and k.since == since)
    assert k.views is False
    out = k.fn(*inputs, **attrs)
    assert not np.shares_memory(out, inputs[0])
    buffer = np.empty_like(out)
    assert k.fn(*inputs, **attrs, out=buffer) is buffer
    np.testing.assert_array_equal(buffer, out)
