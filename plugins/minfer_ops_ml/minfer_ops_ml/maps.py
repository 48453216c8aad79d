"""ai.onnx.ml ops on maps (Python dicts at run time): ZipMap and DictVectorizer.

ZipMap is what skl2onnx puts after a classifier's probabilities by default
(one {label: probability} per row); DictVectorizer reads a {feature: value}
record. A sequence is a Python list, so ZipMap returns its one output in a
1-tuple (a bare list would read as several outputs).
"""

from __future__ import annotations

import numpy as np

from minfer_core import KernelError, kernel

ML = "ai.onnx.ml"


def _labels(ctx, ints, strings) -> list:
    if (ints is None) == (strings is None):
        raise KernelError(f"node {ctx.node_name!r} ({ctx.op_type}) needs exactly one of classlabels_int64s and "
                          f"classlabels_strings (it has {'both' if ints is not None else 'neither'})")
    return [int(v) for v in ints] if ints is not None else [str(v) for v in strings]


@kernel("ZipMap", domain=ML, since=1, prepare=True, views=False)
def zipmap(ctx, *, classlabels_int64s=None, classlabels_strings=None):
    """ZipMap-1: each row of X as a {label: value} map, the labels from the attribute."""
    labels = _labels(ctx, classlabels_int64s, classlabels_strings)

    def run(x):
        rows = x.reshape(1, -1) if x.ndim == 1 else x
        if rows.ndim != 2 or rows.shape[1] != len(labels):
            raise ValueError(f"ZipMap has {len(labels)} labels, but its input has shape {list(x.shape)}: "
                             f"one column per label is needed")
        return ([dict(zip(labels, row)) for row in rows.tolist()],)

    return run


@kernel("DictVectorizer", domain=ML, since=1, prepare=True, views=False)
def dict_vectorizer(ctx, *, int64_vocabulary=None, string_vocabulary=None):
    """DictVectorizer-1: a {key: value} map as a [1, len(vocabulary)] row, keys placed by the vocabulary, 0 elsewhere."""
    vocabulary = _labels(ctx, int64_vocabulary, string_vocabulary)
    index = {key: i for i, key in enumerate(vocabulary)}
    out = ctx.output_types[0]
    dtype = out.dtype if out is not None and getattr(out, "dtype", None) is not None else None

    def run(x):
        if not isinstance(x, dict):
            raise ValueError(f"DictVectorizer takes a map (a dict), got {type(x).__name__}")
        values = list(x.values())
        kind = dtype or (np.asarray(values).dtype if values else np.dtype(np.float32))
        y = np.zeros((1, len(vocabulary)), dtype=object if kind.kind in "OUS" else kind)
        if kind.kind in "OUS":
            y[...] = ""
        for key, value in x.items():
            at = index.get(int(key) if isinstance(key, (int, np.integer)) else key)
            if at is not None:  # keys outside the vocabulary are dropped, as onnxruntime does
                y[0, at] = value
        return y

    return run


KERNELS = [zipmap, dict_vectorizer]
