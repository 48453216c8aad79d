"""``pad_conv_fusion``: a zero ``Pad`` before a ``Conv`` becomes the Conv's own padding.

PyTorch and PaddlePaddle exports write an explicit ``Pad -> Conv`` where the
framework padded apart (asymmetric "same" padding, a padding layer): the Pad
copies the whole tensor into a bigger one each run.
The Conv pads its input with zeros itself, so a Pad that pads with zeros
only on the spatial axes is the same as more Conv padding.

Pattern: ``Conv(Pad(X, pads[, value][, axes]), W[, B])`` where

- the Pad's mode is ``constant`` (the default) and its value absent or a
  constant +0.0 (the Conv pads with +0.0; -0.0 is refused: where a window
  reads only padding, the unfused sum may be -0.0 and the folded one +0.0);
- its pads (attribute ``paddings`` in Pad-1, ``pads`` in Pad-2, a constant
  input from Pad-11, over the constant ``axes`` from Pad-18) are all >= 0
  (negative pads crop) and zero on the batch and channel axes (0 and 1);
- the Pad's output is read only by the Conv, as its input 0, and is no
  graph output;
- the Conv's ``auto_pad`` is ``NOTSET`` or ``VALID`` (pads 0); ``SAME_*``
  computes its pads from the input's shape, which the Pad changes.

Replacement: ``Conv(X, W[, B])`` with ``pads`` the old pads (layout
``[x1_begin, x2_begin, ..., x1_end, x2_end, ...]``) plus the Pad's spatial
begins and ends, ``auto_pad`` NOTSET. Exact: every value the Conv reads is
the same, zeros where the Pad wrote zeros; the output shape is the same, as
each spatial size grows by the same amounts before the kernel slides.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minfer_core import Graph, Node

from ._util import const, is_op, opset


def _is_zero(value: Any) -> bool:
    """Whether a Pad's constant value is exactly +0.0 (one element; a NaN or -0.0 is not)."""
    v = np.asarray(value).reshape(-1)
    return v.size == 1 and bool(v[0] == 0) and not np.signbit(v[0])


def _zero_constant(graph: Graph, pad: Node) -> bool:
    """Whether ``pad`` pads with constant +0.0: mode ``constant`` and the value absent or +0.0."""
    if pad.attrs.get("mode", "constant") != "constant":
        return False
    if opset(graph) < 11:
        return _is_zero(pad.attrs.get("value", 0.0))
    if len(pad.inputs) < 3 or not pad.inputs[2]:
        return True
    value = const(graph, pad.inputs[2])
    return value is not None and _is_zero(value)


def _full_pads(graph: Graph, pad: Node, rank: int) -> list[int] | None:
    """The Pad's pads over all ``rank`` axes, ``[begins..., ends...]``; None when not constant or malformed."""
    if opset(graph) < 11:
        pads = pad.attrs.get("pads", pad.attrs.get("paddings"))
    else:
        pads = const(graph, pad.inputs[1]) if len(pad.inputs) > 1 and pad.inputs[1] else None
    if pads is None:
        return None
    pads = [int(p) for p in np.asarray(pads).reshape(-1)]
    axes: list[int] = list(range(rank))
    if opset(graph) >= 18 and len(pad.inputs) > 3 and pad.inputs[3]:
        given = const(graph, pad.inputs[3])
        if given is None:
            return None
        axes = [int(a) + rank if int(a) < 0 else int(a) for a in np.asarray(given).reshape(-1)]
        if len(set(axes)) != len(axes) or not all(0 <= a < rank for a in axes):
            return None
    if len(pads) != 2 * len(axes):
        return None
    full = [0] * (2 * rank)
    for i, axis in enumerate(axes):
        full[axis], full[rank + axis] = pads[i], pads[len(axes) + i]
    return full


def _conv_rank(graph: Graph, conv: Node) -> int | None:
    """The rank of the Conv's input: its kernel's spatial count + 2, or its weight's rank."""
    kernel = conv.attrs.get("kernel_shape")
    if kernel is not None:
        return len(kernel) + 2
    t = graph.type_of(conv.inputs[1])
    return None if t is None or t.shape is None else len(t.shape)


def _conv_pads(conv: Node, spatial: int) -> list[int] | None:
    """The Conv's explicit pads (VALID and absent: zeros); None under SAME_* or when malformed."""
    auto = conv.attrs.get("auto_pad", "NOTSET")
    if auto == "VALID":
        return [0] * (2 * spatial)
    if auto != "NOTSET":
        return None
    pads = [int(p) for p in conv.attrs.get("pads", [0] * (2 * spatial))]
    return pads if len(pads) == 2 * spatial else None


def _fused_pads(graph: Graph, pad: Node, conv: Node) -> list[int] | None:
    """The Conv's pads with the Pad's added, or None when the pair does not fold (see the module docstring)."""
    rank = _conv_rank(graph, conv)
    if rank is None or rank < 3 or not _zero_constant(graph, pad):
        return None
    full, old = _full_pads(graph, pad, rank), _conv_pads(conv, rank - 2)
    if full is None or old is None or min(full) < 0:
        return None
    if any(full[a] or full[rank + a] for a in (0, 1)):  # batch or channel padding: not a Conv pad
        return None
    begins, ends = full[2:rank], full[rank + 2:]
    return [p + q for p, q in zip(old, begins + ends)]


def pad_conv_fusion(graph: Graph) -> bool:
    """Fold a Pad with zeros on the spatial axes into the padding of the Conv that alone reads it."""
    changed = False
    # from the end: in Pad -> Pad -> Conv the second folds first, then the first finds the Conv
    for pad in reversed(graph.topological_order()):
        if not is_op(pad, "Pad"):
            continue
        conv = graph.sole_consumer(pad.outputs[0])
        if not is_op(conv, "Conv") or conv.inputs[0] != pad.outputs[0]:
            continue
        pads = _fused_pads(graph, pad, conv)
        if pads is None:
            continue
        attrs = {k: v for k, v in conv.attrs.items() if k != "auto_pad"}
        attrs["pads"] = pads
        fused = Node("Conv", [pad.inputs[0], *conv.inputs[1:]], conv.outputs, attrs, conv.name, "")
        graph.replace([pad, conv], fused)
        changed = True
    return changed


# ---- property-suite patterns ---------------------------------------------------------------------


# what makes a drawn Pad -> Conv not fold (or "none"): each one alone, so every refusal is seen often
TWISTS = ("none",) * 5 + ("value", "mode", "channel", "crop", "same", "reader")


def patterns() -> Any:
    """The pass's target strategy: Pad (Pad-2 attributes, Pad-11/13 inputs, Pad-18/19 axes) -> Conv (1-D or 2-D).

    Random asymmetric spatial pads (one or two Pads in a row), a Conv with
    random group, kernel, strides, dilations, pads and auto_pad NOTSET or
    VALID; and half the time one reason to refuse (`TWISTS`): a non-zero or
    -0.0 value, an edge or reflect mode, a channel pad, a crop, auto_pad
    SAME_*, or the Pad's output also read elsewhere or a graph output.
    """
    from hypothesis import strategies as st

    from minfer_core.testing import GraphBuilder
    from minfer_core.testing.strategies import has_kernels

    @st.composite
    def graphs(draw: Any) -> Any:
        b = GraphBuilder(opset=draw(st.sampled_from([10, 13, 18, 19])))
        twist = draw(st.sampled_from(TWISTS))
        spatial = draw(st.integers(1, 2))
        shape = (draw(st.integers(1, 2)), draw(st.integers(1, 4)), *(draw(st.integers(1, 5)) for _ in range(spatial)))
        x = b.input(shape)
        for _ in range(draw(st.sampled_from([1, 1, 1, 2]))):  # Pad -> Pad -> Conv: both fold
            full = _draw_pads(draw, shape, twist)
            x = _pad_node(draw, b, x, shape, full, twist)
            shape = tuple(d + full[a] + full[len(shape) + a] for a, d in enumerate(shape))
        if twist == "reader":
            b.output(x if draw(st.booleans()) else b.op("Neg", x))
        y = _conv_node(draw, b, x, shape[1], list(shape[2:]), twist)
        b.output(b.op("Neg", y) if has_kernels("Neg") else y)
        return b.build()

    return graphs()


def _draw_pads(draw: Any, shape: tuple[int, ...], twist: str) -> list[int]:
    """Pads over every axis: spatial 0-2 each (the first begin >= 1), a channel pad or a crop as ``twist`` says."""
    from hypothesis import strategies as st

    rank = len(shape)
    full = [0] * (2 * rank)
    for axis in range(2, rank):
        full[axis], full[rank + axis] = draw(st.integers(1 if axis == 2 else 0, 2)), draw(st.integers(0, 2))
    if twist == "channel":
        full[draw(st.sampled_from([1, rank + 1]))] = 1
    elif twist == "crop" and shape[-1] + full[rank - 1] > 1:
        full[2 * rank - 1] = -1
    return full


def _pad_node(draw: Any, b: Any, x: str, shape: tuple[int, ...], full: list[int], twist: str) -> str:
    """Pad ``x`` by ``full`` in the form of the builder's opset: constant +0.0 unless ``twist`` is value or mode."""
    from hypothesis import strategies as st

    rank, version = len(shape), b.graph.opsets[""]
    fits = all(full[a] < shape[a] and full[rank + a] < shape[a] for a in range(rank))  # reflect's bound
    mode = draw(st.sampled_from(["edge"] + (["reflect"] if fits else []))) if twist == "mode" else "constant"
    value = draw(st.sampled_from([0.5, 0.5, -0.0] if twist == "value" else [None, 0.0]))
    attrs: dict[str, Any] = {} if mode == "constant" and draw(st.booleans()) else {"mode": mode}
    if version < 11:
        return b.op("Pad", x, pads=full, **attrs, **({} if value is None else {"value": value}))
    pads, axes = full, None
    if version >= 18 and twist != "channel" and draw(st.booleans()):
        axes = list(range(2, rank)) if draw(st.booleans()) else list(range(-(rank - 2), 0))
        pads = full[2:rank] + full[rank + 2:]
    inputs = [x, b.const(np.array(pads, dtype=np.int64))]
    if value is not None or axes is not None:
        inputs.append(b.const(np.float32(value)) if value is not None else "")
    if axes is not None:
        inputs.append(b.const(np.array(axes, dtype=np.int64)))
    return b.op("Pad", *inputs, **attrs)


def _conv_node(draw: Any, b: Any, x: str, c: int, sizes: list[int], twist: str) -> str:
    """A Conv on ``x`` (``c`` channels, spatial ``sizes``): random group, kernel, strides, dilations, pads, auto_pad."""
    from hypothesis import strategies as st

    from minfer_core.testing.strategies import floats_array

    group = draw(st.sampled_from([g for g in (1, 2, c) if c % g == 0]))
    m = group * draw(st.integers(1, 2))
    auto = draw(st.sampled_from(["SAME_UPPER", "SAME_LOWER"] if twist == "same" else ["NOTSET"] * 3 + ["absent", "VALID"]))
    attrs: dict[str, Any] = {} if auto == "absent" else {"auto_pad": auto}
    own = [draw(st.integers(0, 1)) for _ in range(2 * len(sizes))] if auto == "NOTSET" else [0] * (2 * len(sizes))
    if auto == "NOTSET" and any(own):
        attrs["pads"] = own
    kernel, dilations = [], []
    for i, size in enumerate(sizes):
        room = size + own[i] + own[len(sizes) + i]
        k, d = draw(st.integers(1, 3)), draw(st.integers(1, 2))
        d = d if (k - 1) * d + 1 <= room else 1
        kernel.append(min(k, room))
        dilations.append(d)
    attrs.update(kernel_shape=kernel, group=group, strides=[draw(st.integers(1, 2)) for _ in sizes])
    if any(d > 1 for d in dilations):
        attrs["dilations"] = dilations
    inputs = [x, b.const(draw(floats_array((m, c // group, *kernel))))]
    if draw(st.booleans()):
        inputs.append(b.const(draw(floats_array((m,)))))
    return b.op("Conv", *inputs, **attrs)
