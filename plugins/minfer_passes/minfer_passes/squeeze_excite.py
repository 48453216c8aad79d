"""``squeeze_excite_fusion``: a squeeze-and-excitation block as one ``ai.minfer::SqueezeExcite`` node.

Pattern (MobileNetV3's, PP-LCNet's and EfficientNet's SE blocks, after
activation_fusion): ``Mul(X, s)`` where s = act2(Conv2(act1(Conv1(
GlobalAveragePool(X))))), each Conv a 1x1 kernel on the 1x1 pooled map
(group 1, no pads, constant weights, a constant bias or none, no residual)
plain or a FusedConv with any activation; the pooled mean, the hidden
values and s each read by the next node alone and none a graph output, X
float32 or float64 of rank 4. A block computes four tiny steps (a pooling, two products
of a few hundred values, the gate's product over X): the engine's per-step
cost, not the work, is most of their time.

Replacement: ``SqueezeExcite(X, W1, B1, W2, B2)`` with the two Convs' weights
as given ((M, C, 1, 1) and (C, M, 1, 1); a missing bias ""), attributes
``inner_activation`` / ``inner_activation_params`` (Conv1's) and
``activation`` / ``activation_params`` (Conv2's), computing
``X * act2(W2 @ act1(W1 @ mean(X) + B1) + B2)`` per image, the mean over H
and W. The numpy kernel here does it in one call of a dozen numpy calls;
the pooling's sum and the products' order differ from the unfused kernels'
by float32 rounding (rtol 1e-5 / atol 1e-6). ``--portable`` writes the four
steps back (GlobalAveragePool, Conv [+ activation] twice, Mul).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minfer_core import Graph, Node, kernel, op, same_as_input

from ._util import MINFER_DOMAIN, const, dtype_of, fresh, has_kernel, is_op, other_input
from .activation import activation_nodes
from .ops import ACTIVATIONS

OP = "SqueezeExcite"
# float16 stays unfused: the kernels here would pool and multiply in float16, where the standard kernels widen
WIDE = (np.dtype(np.float32), np.dtype(np.float64))

# ---- the pass ------------------------------------------------------------------------------


def _pointwise(graph: Graph, node: Node | None, channels: int) -> tuple[str, str, str, list[float]] | None:
    """(W, B or "", activation, its params) of a Conv/FusedConv that is a plain product of the pooled values:
    a 1x1 kernel, group 1, no pads, constant weights of ``channels`` input channels, no residual."""
    if node is None or len(node.outputs) != 1:
        return None
    fused = node.domain == MINFER_DOMAIN and node.op_type == "FusedConv"
    if not (fused or is_op(node, "Conv")) or len(node.inputs) < 2 or (len(node.inputs) > 3 and node.inputs[3]):
        return None
    a = node.attrs
    if a.get("group", 1) != 1 or any(a.get("pads", [0] * 4)) or a.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
        return None
    w = const(graph, node.inputs[1])
    if w is None or w.ndim != 4 or w.shape[1:] != (channels, 1, 1) or w.dtype != dtype_of(graph, node.inputs[0]):
        return None
    bias = node.inputs[2] if len(node.inputs) > 2 else ""
    if bias and (const(graph, bias) is None or const(graph, bias).shape != (w.shape[0],)):
        return None
    activation = a.get("activation", "") if fused else ""
    if activation and activation not in ACTIVATIONS:
        return None
    return node.inputs[1], bias, activation, [float(p) for p in a.get("activation_params", [])]


def _block(graph: Graph, pool: Node) -> tuple[list[Node], list[str], dict[str, Any]] | None:
    """The SE block starting at GlobalAveragePool ``pool``: (its nodes, the fused node's inputs, attributes)."""
    if not is_op(pool, "GlobalAveragePool"):
        return None
    x = pool.inputs[0]
    t = graph.type_of(x)
    if t is None or t.shape is None or len(t.shape) != 4 or not isinstance(t.shape[1], int) or t.dtype not in WIDE:
        return None
    c = t.shape[1]
    outputs = set(graph.outputs)
    conv1 = graph.sole_consumer(pool.outputs[0])
    first = _pointwise(graph, conv1, c)
    if first is None or conv1.inputs[0] != pool.outputs[0]:
        return None
    hidden = const(graph, first[0]).shape[0]
    conv2 = graph.sole_consumer(conv1.outputs[0])
    second = _pointwise(graph, conv2, hidden)
    if second is None or conv2.inputs[0] != conv1.outputs[0] or const(graph, second[0]).shape[0] != c:
        return None
    mul = graph.sole_consumer(conv2.outputs[0])
    if not is_op(mul, "Mul") or other_input(mul, conv2.outputs[0]) != x:
        return None
    if {pool.outputs[0], conv1.outputs[0], conv2.outputs[0]} & outputs:
        return None
    attrs = {"inner_activation": first[2], "inner_activation_params": first[3], "activation": second[2],
             "activation_params": second[3]}
    inputs = [x, first[0], first[1], second[0], second[1]]
    while not inputs[-1]:  # B2 absent: the node ends at W2 (ONNX leaves trailing optional inputs out)
        inputs.pop()
    return [pool, conv1, conv2, mul], inputs, attrs


def squeeze_excite_fusion(graph: Graph) -> bool:
    """Fuse GlobalAveragePool -> 1x1 Conv [act] -> 1x1 Conv [act] -> Mul(X, .) into ai.minfer::SqueezeExcite."""
    if not has_kernel(graph, MINFER_DOMAIN, OP):
        return False
    changed = False
    for pool in list(graph.nodes):
        found = _block(graph, pool) if pool in graph.nodes else None
        if found is None:
            continue
        nodes, inputs, attrs = found
        graph.opsets.setdefault(MINFER_DOMAIN, 1)
        graph.replace(nodes, Node(OP, inputs, nodes[-1].outputs, attrs, nodes[-1].name, MINFER_DOMAIN))
        changed = True
    return changed


# ---- the kernel ----------------------------------------------------------------------------


def _matrix(w: np.ndarray) -> np.ndarray:
    """(M, K, 1, 1) weights as the (K, M) matrix the pooled rows multiply."""
    return np.ascontiguousarray(w.reshape(w.shape[0], -1).T)


def _checked(x: np.ndarray, m1: np.ndarray, m2: np.ndarray) -> None:
    """X (N, C, H, W) against the weights as matrices, (C, M) and (M, C)."""
    if x.ndim != 4 or m1.shape[0] != x.shape[1] or m2.shape != (m1.shape[1], x.shape[1]):
        raise ValueError(f"SqueezeExcite: X {list(x.shape)} needs W1 (M, C, 1, 1) and W2 (C, M, 1, 1); got "
                         f"{[m1.shape[1], m1.shape[0], 1, 1]} and {[m2.shape[1], m2.shape[0], 1, 1]}")


# views=False: the result is the planned buffer or a fresh array; inplace: each element of X is read (by the mean,
# then once by the product) before its element of the output is written; packed: constant weights are held as the
# matrices the products take (the engine frees the originals: every SqueezeExcite kernel holds its own)
@kernel(OP, domain=MINFER_DOMAIN, prepare=True, out=True, inplace=(0,), views=False, packed=(1, 3))
def squeeze_excite(ctx: Any, *, inner_activation: str = "", inner_activation_params: list[float] | None = None,
                   activation: str = "", activation_params: list[float] | None = None) -> Any:
    """ai.minfer::SqueezeExcite-1: X * act2(W2 @ act1(W1 @ mean(X) + B1) + B2), one call of numpy steps."""
    for name in (inner_activation, activation):
        if name and name not in ACTIVATIONS:
            raise ValueError(f"SqueezeExcite: unknown activation {name!r}; known: {', '.join(ACTIVATIONS)}")
    act1, p1 = ACTIVATIONS.get(inner_activation), [float(p) for p in inner_activation_params or []]
    act2, p2 = ACTIVATIONS.get(activation), [float(p) for p in activation_params or []]
    consts = tuple(ctx.constants) + (None,) * 5
    held = {i: _matrix(consts[i]) for i in (1, 3) if consts[i] is not None}  # the constants as matrices, once

    def run(x: np.ndarray, w1: np.ndarray | None, b1: np.ndarray | None = None, w2: np.ndarray | None = None,
            b2: np.ndarray | None = None, *, out: np.ndarray | None = None) -> np.ndarray:
        m1 = held[1] if w1 is None or w1 is consts[1] else _matrix(w1)  # None: the engine freed the packed constant
        if w2 is None and 3 not in held:
            raise ValueError("SqueezeExcite: W2 (its fourth input) is required")
        m2 = held[3] if w2 is None or w2 is consts[3] else _matrix(w2)
        _checked(x, m1, m2)
        n, c = x.shape[:2]
        y = np.empty(x.shape, x.dtype) if out is None else out
        if x.size == 0:
            return y
        with np.errstate(over="ignore"):
            mean = np.add.reduce(x.reshape(n, c, -1), axis=2)
            np.divide(mean, x.dtype.type(x.shape[2] * x.shape[3]), out=mean)
            hidden = np.matmul(mean, m1)
            if b1 is not None:
                hidden += b1
            if act1 is not None:
                act1(hidden, p1)
            gate = np.matmul(hidden, m2)
            if b2 is not None:
                gate += b2
            if act2 is not None:
                act2(gate, p2)
        np.multiply(x, gate.reshape(n, c, 1, 1), out=y)
        return y

    return run


KERNELS = [squeeze_excite]
OPS = [op(OP, domain=MINFER_DOMAIN, infer=same_as_input(0),
          doc="a squeeze-and-excitation block: X * act2(Conv2(act1(Conv1(GlobalAveragePool(X))))), 1x1 convs")]


# ---- --portable ------------------------------------------------------------------------------


def expand_squeeze_excite(graph: Graph, node: Node) -> None:
    """SqueezeExcite -> GlobalAveragePool, Conv [+ activation], Conv [+ activation], Mul."""
    x, w1, b1, w2, b2 = (list(node.inputs) + [""] * 5)[:5]
    a = node.attrs
    name = node.name or OP
    t = graph.type_of(x)
    pooled = fresh(graph, f"{name}_pooled")
    new = [Node("GlobalAveragePool", [x], [pooled], {}, fresh(graph, f"{name}_pool"), "")]
    steps = [(new[:], None if t is None else t.shape[1])]  # (nodes, the channels of their outputs)
    src = pooled
    for w, b, act, params, step in ((w1, b1, a.get("inner_activation", ""), a.get("inner_activation_params", []), "fc1"),
                                    (w2, b2, a.get("activation", ""), a.get("activation_params", []), "fc2")):
        dst = fresh(graph, f"{name}_{step}")
        nodes = [Node("Conv", [src, w, b] if b else [src, w], [dst], {"kernel_shape": [1, 1]},
                      fresh(graph, f"{name}_{step}"), "")]
        if act:
            done = fresh(graph, f"{name}_{step}_act")
            nodes += activation_nodes(graph, act, [float(p) for p in params], dst, done, fresh(graph, f"{name}_act"))
            dst = done
        weights = const(graph, w)
        steps.append((nodes, None if weights is None else weights.shape[0]))
        new += nodes
        src = dst
    new.append(Node("Mul", [x, src], list(node.outputs), {}, name, ""))
    if t is not None and t.shape is not None:
        for nodes, channels in steps:  # the pooled map's values: (N, channels, 1, 1)
            for v in (o for nd in nodes for o in nd.outputs):
                graph.types[v] = type(t)(t.dtype, (t.shape[0], channels, 1, 1))
    graph.replace([node], new)


# ---- property-suite patterns --------------------------------------------------------------


def patterns() -> Any:
    """The pass's target strategy: an SE block in random context.

    The convs plain or FusedConv with an activation, with or without bias; in
    some examples one spoiler: the pooled mean or the gate also read
    elsewhere (or a graph output), the second conv grouped, the first one's
    activation a node of its own (the pass alone leaves it; the pipeline
    fuses it first), or the Mul of another value than the pooled one (none
    of those may fuse).
    """
    from hypothesis import strategies as st

    from minfer_core.testing import GraphBuilder
    from minfer_core.testing.strategies import expose, floats_array, has_kernels

    acts = ("Relu", "HardSigmoid", "Sigmoid", "HardSwish", "Clip")

    def activation(draw: Any, act: str) -> tuple[dict[str, Any], list[float]]:
        """The activation's ONNX attributes and minfer's activation_params."""
        if act == "HardSigmoid":
            alpha = draw(st.sampled_from([0.2, 1 / 6]))
            return {"alpha": alpha, "beta": 0.5}, [alpha, 0.5]
        return {}, [0.0, 6.0] if act == "Clip" else []

    @st.composite
    def graphs(draw: Any) -> Any:
        # one spoiler at most, so that most examples are blocks the pass must fuse
        spoiler = draw(st.sampled_from(["none", "none", "none", "expose pooled", "expose gate", "grouped", "node",
                                        "other"]))
        b = GraphBuilder(opset=draw(st.sampled_from([14, 17])))
        n, c, h, w = draw(st.integers(1, 2)), draw(st.integers(1, 6)), draw(st.integers(1, 5)), draw(st.integers(1, 5))
        x = b.input((n, c, h, w))
        if draw(st.booleans()) and has_kernels("Relu"):
            x = b.op("Relu", x)
        hidden = draw(st.integers(1, 4))
        pooled = b.op("GlobalAveragePool", x)
        if spoiler == "expose pooled":
            expose(draw, b, pooled)
        v = pooled
        for step, (m, k) in enumerate(((hidden, c), (c, hidden))):
            grouped = spoiler == "grouped" and step == 1 and k > 1 and m % k == 0
            attrs: dict[str, Any] = {"kernel_shape": [1, 1]} | ({"group": k} if grouped else {})
            inputs = [v, b.const(draw(floats_array((m, k // k if grouped else k, 1, 1))))]
            if draw(st.booleans()):
                inputs.append(b.const(draw(floats_array((m,)))))
            form = "node" if spoiler == "node" and step == 0 else draw(st.sampled_from(["plain", "fused"]))
            act = draw(st.sampled_from(acts))
            act_attrs, params = activation(draw, act)
            if form == "fused":  # as activation_fusion leaves it
                v = b.op("FusedConv", *inputs, domain=MINFER_DOMAIN, activation=act, activation_params=params, **attrs)
                continue
            v = b.op("Conv", *inputs, **attrs)
            if form == "node":  # an activation node between: the pass alone leaves it (the pipeline fuses it first)
                extra = [b.const(np.float32(0)), b.const(np.float32(6))] if act == "Clip" else []
                v = b.op(act, v, *extra, **act_attrs)
        if spoiler == "expose gate":
            expose(draw, b, v)
        other = b.input((n, c, h, w)) if spoiler == "other" else x
        y = b.op("Mul", *((other, v) if draw(st.booleans()) else (v, other)))
        b.output(b.op("Neg", y) if has_kernels("Neg") else y)
        return b.build()

    return graphs()
