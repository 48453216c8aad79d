"""``ai.minfer::Requantize``: an integer conv's input conversion and output epilogue as one elementwise op.

``Requantize(X, M, [C], [S], [B]; low, high, divide, rounding, out_scale, activation, activation_params, post_scale,
post_low, post_high, post_dequantize)``, X and the result float32, M, C, S, B one value or one per channel (axis 1):

    v = (X + C) * M             (X / M with ``divide``)
    v = rint(clip(v, low, high))  (``rounding``: round half to even; clip first, as the bounds are integers: the same)
    v = v * out_scale           (when out_scale is not 0: DequantizeLinear's (q - zp) * scale, q - zp being v)
    v = act(v * S + B)          (ChannelAffine's float32 operations in its order; act none, Relu or Clip)
    v = clip(rint(v / post_scale), post_low, post_high)   (when post_scale is not 0: the next QuantizeLinear, centered)
    v = v * post_scale          (``post_dequantize``: its DequantizeLinear too, a QuantizeDequantize rounding)

Each step is the float32 operation of the nodes it stands for, in their order, so the result is theirs bit for bit:
QLinearConv's requantization (onnxruntime's MLAS: the exact accumulator plus bias, times x_scale * w_scale / y_scale,
rounded and saturated), the DequantizeLinear after it and a ChannelAffine (a BatchNormalization between two
quantized convs) after that; or QuantizeLinear of a conv's float input (``divide``, M its scale, the bounds the
8-bit range less the zero point), centered; or a ConvInteger's Cast and Mul by the scales (no ``rounding``).

minfer-ops-conv's integer conv kernels (quant.py) call the registered kernel of this op on each finished output
tile and on their input when a plugin installs one above this numpy kernel (minfer-ops-numba's: one compiled
pass where numpy spends up to eight); with only this one they run their own numpy steps (the same operations).
No pass creates the op as a node.
"""

from __future__ import annotations

from typing import Any, Callable

import attrs
import numpy as np

from minfer_core import KernelContext, KernelError, TensorType, get_registry, kernel, op, prepare_node, same_as_input

MINFER = "ai.minfer"
OP = "Requantize"
ACTIVATIONS = ("", "Relu", "Clip")


def _per_channel(v: np.ndarray | None, ndim: int) -> np.ndarray | None:
    """A one-value or per-channel operand as float32 broadcasting along axis 1 of an ``ndim``-D tensor."""
    if v is None:
        return None
    v = np.asarray(v, np.float32).reshape(-1)
    return v.reshape((-1,) + (1,) * (ndim - 2)) if v.size > 1 else v.reshape(())


def bounds(activation: str, params: list[float] | None) -> tuple[np.float32, np.float32]:
    """The Clip bounds of ``activation_params`` (float32; the unbounded sides infinite)."""
    lo, hi = ([float(v) for v in params or []] + [-np.inf, np.inf])[:2] if activation == "Clip" else (-np.inf, np.inf)
    return np.float32(lo), np.float32(hi)


def affine_stage(part: np.ndarray, s: np.ndarray | None, b: np.ndarray | None, activation: str,
                 clip: tuple[np.float32, np.float32]) -> None:
    """act(part * s + b) in place: ChannelAffine's numpy steps (the product rounded, then the sum)."""
    if s is not None:
        np.multiply(part, s, out=part)
    if b is not None:
        np.add(part, b, out=part)
    if activation == "Relu":
        np.maximum(part, np.float32(0), out=part)
    elif activation == "Clip":
        np.clip(part, clip[0], clip[1], out=part)


def quantize_stage(part: np.ndarray, scale: np.float32, low: float, high: float, dequantize: bool = False) -> None:
    """clip(rint(part / scale), low, high) in place: QuantizeLinear's float32 division and rounding, centered;
    with ``dequantize`` then times scale (the DequantizeLinear after it: QuantizeDequantize's operations)."""
    np.divide(part, scale, out=part)
    np.rint(part, out=part)
    np.clip(part, np.float32(low), np.float32(high), out=part)
    if dequantize:
        np.multiply(part, scale, out=part)


@kernel(OP, domain=MINFER, since=1, out=True, views=False)
def requantize(x, m, c=None, s=None, b=None, *, low=-np.inf, high=np.inf, divide=0, rounding=1, out_scale=0.0,
               activation="", activation_params=None, post_scale=0.0, post_low=-np.inf, post_high=np.inf, post_dequantize=0,
               out=None):
    """ai.minfer::Requantize-1: act(rint(clip((x + c) * m, low, high)) * out_scale * s + b), each step optional,
    then quantized again on the post grid (and dequantized, with ``post_dequantize``)."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"Requantize: activation {activation!r}; known: none, Relu, Clip")
    m, c, s, b = (_per_channel(v, x.ndim) for v in (m, c, s, b))
    v = np.array(x, np.float32) if c is None else np.add(x, c, dtype=np.float32)
    if divide:
        np.divide(v, m, out=v)
    else:
        np.multiply(v, m, out=v)
    if rounding:
        np.clip(v, np.float32(low), np.float32(high), out=v)
        np.rint(v, out=v)
    if out_scale:
        np.multiply(v, np.float32(out_scale), out=v)
    affine_stage(v, s, b, activation, bounds(activation, activation_params))
    if post_scale:
        quantize_stage(v, np.float32(post_scale), post_low, post_high, bool(post_dequantize))
    if out is None:
        return v
    np.copyto(out, v)
    return out


def frozen(v: np.ndarray | None) -> np.ndarray | None:
    """A read-only flat float32 view of a per-channel operand: made once a run, its per-tile slices then go to a
    compiled kernel as they are (one compiled signature, no new view a tile)."""
    if v is None:
        return None
    flat = np.asarray(v, np.float32).reshape(-1).view()
    flat.flags.writeable = False
    return flat


@attrs.frozen
class Compiled:
    """A plugin's kernel of Requantize for one node's attributes, when one is installed above the numpy kernel:
    ``fn(x, m, c, s, b, out=)`` (operands float32, one value or one per channel)."""

    fn: Callable[..., np.ndarray]

    @staticmethod
    def find(name: str, out_type: TensorType | None, operands: tuple[bool, bool, bool],
             **op_attrs) -> "Compiled | None":
        """The registered kernel for these attributes (``operands``: whether C, S, B are given), or None when the
        best is this module's numpy kernel (the conv kernels' own numpy steps then run instead)."""
        if out_type is None or out_type.dtype != np.float32 or out_type.shape is None:
            return None
        rank = len(out_type.shape)
        vector = TensorType(np.float32, (None,))
        types = (out_type, vector, *(vector if given else None for given in operands))
        ctx = KernelContext(name, OP, 1, types, (out_type,), (None,) * 5, 1)
        found = get_registry().select_kernel(MINFER, OP, 1, "numpy", ctx, op_attrs)
        if found is None or found is requantize or rank < 2:
            return None
        return Compiled(found.prepared(ctx, op_attrs))


class DynamicInput:
    """DynamicQuantizeLinear of a conv's float32 input, in the conv's input conversion (`centered_input`).

    Its scale and zero point depend only on the input's min and max: the registered DynamicQuantizeLinear kernel
    computes them from a two-element array of those (so they are that kernel's, to the bit), and the centered
    input clip(rint(x / scale), -zp, 255 - zp) is then what the conv would make of that kernel's uint8 output,
    made in one pass from x. An input holding NaN or an infinity (or empty) runs through the kernel itself.
    """

    def __init__(self, name: str, x_type: TensorType | None) -> None:
        f32 = TensorType(np.float32, None)
        ctx = KernelContext(name, "DynamicQuantizeLinear", 11, (f32,), (TensorType(np.uint8, None), f32,
                                                                          TensorType(np.uint8, None)), (None,), 1)
        found = prepare_node(get_registry(), ctx, {})
        if found is None:
            raise KernelError(f"{name}: ai.minfer::ScaledConvInteger with dynamic_input needs a DynamicQuantizeLinear "
                              f"kernel for float32; none is installed (minfer-ops-basic has one)")
        self.fn, self.name, self.x_type = found[1], name, x_type
        self.steps: dict[tuple[float, float], Compiled | None] = {}  # per centered range: its compiled step

    def __call__(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray | None, tuple | None, np.ndarray]:
        """(the conv's x, its zero point, the rounding that quantizes it on the way in, DynamicQuantizeLinear's
        scale)."""
        if x.size:
            mn, mx = np.min(x), np.max(x)  # NaN propagates into both
            if np.isfinite(mn) and np.isfinite(mx):
                _, scale, zp = self.fn(np.asarray([mn, mx], np.float32))
                low, high = -float(zp), 255.0 - float(zp)
                if (low, high) not in self.steps:  # a racing thread may make it too: the same kernel
                    self.steps[(low, high)] = Compiled.find(self.name, self.x_type, (False, False, False), low=low,
                                                               high=high, divide=1)
                return x, None, (np.float32(scale), low, high, self.steps[(low, high)]), scale
        q, scale, zp = self.fn(x)
        return q, zp, None, scale


@attrs.frozen
class Post:
    """The ChannelAffine stage an integer conv's epilogue ends with (`requantize.affine_stage`)."""

    activation: str
    clip: tuple[np.float32, np.float32]
    grid: tuple[float, float, float] | None = None  # (scale, low, high): the next conv's input quantization
    dequantize: bool = False  # the grid's values times its scale: a QuantizeDequantize rounding, not centered integers

    def apply(self, part: np.ndarray, s: np.ndarray | None, b: np.ndarray | None) -> None:
        """The numpy steps, in place on a dequantized tile (``s``, ``b``: the tile's channels' S and B)."""
        if s is not None or b is not None or self.activation:
            affine_stage(part, s, b, self.activation, self.clip)
        if self.grid is not None:
            quantize_stage(part, np.float32(self.grid[0]), self.grid[1], self.grid[2], self.dequantize)

    def attrs(self) -> dict:
        """As Requantize's attributes."""
        found = {"activation": self.activation, "activation_params": [float(v) for v in self.clip]}
        if self.grid is not None:
            found.update(post_scale=self.grid[0], post_low=self.grid[1], post_high=self.grid[2],
                         post_dequantize=int(self.dequantize))
        return found


def scaled_by(scale: np.ndarray, ndim: int, post: Post | None, s: np.ndarray | None, a: np.ndarray | None,
               compiled: Compiled | None) -> Callable[[np.ndarray, np.ndarray, tuple], None]:
    """The finish writing float32(y) * scale: y's exact integers rounded to float32 as an int32 -> float32 Cast
    rounds them (to nearest even, from float64 chunks too), then the product Mul computes; then ChannelAffine's
    act(. * S + A) (``post``), through the compiled Requantize when one is installed."""
    sv, av = (frozen(v) for v in (s, a))
    shaped = [None if v is None else v.reshape((-1,) + (1,) * (ndim - 2)) for v in (sv, av)]

    def finish(y: np.ndarray, out: np.ndarray, region: tuple) -> None:
        part, dst = y[region], out[region]
        if part.dtype != np.float32:
            part = part.astype(np.float32)
        ch = region[1] if len(region) > 1 else slice(None)
        if compiled is not None:
            compiled.fn(part, scale, None, None if sv is None else sv[ch], None if av is None else av[ch], out=dst)
            return
        np.multiply(part, scale[0], out=dst)
        if post is not None:
            affine_stage(dst, *(None if v is None else v[ch] for v in shaped), post.activation, post.clip)

    return finish


def requantize_into(dst: np.ndarray, v: np.ndarray, scale: np.ndarray, zp: np.float32, info: np.iinfo,
                     y_scale: np.float32 | None = None) -> None:
    """dst = saturate(round-half-even(v * scale) + zp) to the 8-bit range ``info``: in float32, as onnxruntime's
    MLAS requantizes; with ``y_scale``, dst (float32) is that value dequantized, (q - zp) * y_scale, bit for bit
    as DequantizeLinear computes it (the clipped, rounded v is q - zp exactly).

    onnxruntime converts the int32 accumulator to float32 and multiplies by the float32 output scale
    (x_scale * w_scale / y_scale, itself computed in float32); in float64 some products would round to
    the other side of a .5. ``v`` holds exact integers (float32 rounding them is the int32's); it is
    overwritten.
    """
    if v.dtype != np.float32:
        v = v.astype(np.float32)
    v *= scale
    np.clip(v, np.float32(info.min) - zp, np.float32(info.max) - zp, out=v)
    np.rint(v, out=v)
    if y_scale is not None:
        np.multiply(v, y_scale, out=dst)
    else:
        np.add(v, zp, out=dst, casting="unsafe")  # integers in range: the conversion is exact


def rounding_of(scale: np.ndarray, zero_point: np.ndarray, compiled: Compiled | None = None) -> tuple:
    """(scale, low, high, compiled) of QuantizeLinear to ``zero_point``'s 8-bit type, centered (`centered_input`)."""
    info, zp = np.iinfo(np.asarray(zero_point).dtype), float(np.asarray(zero_point).reshape(-1)[0])
    return np.float32(np.asarray(scale).reshape(-1)[0]), info.min - zp, info.max - zp, compiled


def _fixed_scalar(ctx, index: int) -> np.ndarray | None:
    c = ctx.constants[index] if len(ctx.constants) > index else None
    return None if c is None or c.size != 1 else c


def compiled_steps(ctx, float_input: int, float_output: bool, post: Post | None) -> tuple:
    """The compiled Requantize kernels of the input conversion and the epilogue (None each when not installed, or
    when the quantization parameters they bake in are computed)."""
    xs, xz, ys, yz = (_fixed_scalar(ctx, i) for i in (1, 2, 6, 7))
    types = tuple(ctx.input_types) + (None,) * 11
    quantize = epilogue = None
    if float_input == 1 and xs is not None and xz is not None:
        _, low, high, _ = rounding_of(xs, xz)
        quantize = Compiled.find(ctx.node_name, types[0], (False, False, False), low=low, high=high, divide=1)
    if float_output and ys is not None and yz is not None:
        info, zp = np.iinfo(yz.dtype), np.float32(yz.reshape(-1)[0])
        epilogue = Compiled.find(
            ctx.node_name, ctx.output_types[0] if ctx.output_types else None,
            (types[8] is not None, types[9] is not None, types[10] is not None),
            low=float(np.float32(info.min) - zp), high=float(np.float32(info.max) - zp),
            out_scale=float(np.float32(ys.reshape(-1)[0])), **(post.attrs() if post is not None else {}))
    return quantize, epilogue


# ---- the QLinearConv kernels' steps (quant.py): made once a node when its parameters are constants ----------


def output_scale(x_scale, w_scale, y_scale) -> np.ndarray:
    """x_scale * w_scale / y_scale in float32 (one per output channel when w_scale is 1-D)."""
    xs = np.float32(np.asarray(x_scale).reshape(-1)[0])
    ys = np.float32(np.asarray(y_scale).reshape(-1)[0])
    return (xs * np.asarray(w_scale, dtype=np.float32).reshape(-1)) / ys


def registered_rounding(ctx, scale: float, low: float, high: float) -> Callable[..., np.ndarray] | None:
    """The registered ai.minfer::QuantizeDequantize kernel (minfer_passes' op; minfer-ops-numba's compiled loop, which
    runs in place in one pass) for float32 tiles of the node's output, or None when none is installed."""
    out = ctx.output_types[0] if ctx.output_types else None
    if out is None or out.dtype != np.float32:
        return None
    attrs = {"scale": scale, "low": low, "high": high, "post_scale": 0.0, "post_low": 0.0, "post_high": 0.0}
    inner = KernelContext(ctx.node_name, "QuantizeDequantize", 1, (out, None, None), (out,), (None, None, None), 1)
    found = get_registry().select_kernel(MINFER, "QuantizeDequantize", 1, "numpy", inner, attrs)
    return None if found is None else found.prepared(inner, attrs)


def plus_residual(finish: Callable[[np.ndarray, np.ndarray, tuple], None], z: np.ndarray | None,
                  grid: tuple) -> Callable[[np.ndarray, np.ndarray, tuple], None]:
    """``finish``, then + Z and QuantizeDequantize on ``grid`` (scale, low, high, its registered kernel or None) on
    each tile (the Add and the rounding of a quantized residual block's tail, their float32 operations in order)."""
    scale, rounding = np.float32(grid[0]), grid[3]
    if z is None:
        raise ValueError("FloatQLinearConv: residual_rounding needs Z (input 11, of the output's shape); none was given")

    def with_z(y: np.ndarray, out: np.ndarray, region: tuple) -> None:
        finish(y, out, region)
        part = out[region]
        np.add(part, z[region], out=part)
        if rounding is not None:
            rounding(part, None, None, out=part)
        else:
            quantize_stage(part, scale, grid[1], grid[2], True)

    return with_z


def fixed_steps(ctx, held: Any, float_input: int, float_output: bool, post: Post | None,
                quantize: Compiled | None, compiled: Compiled | None) -> "Steps | None":
    """The node's `Steps` made once at build when its weights and quantization parameters are constants and its
    input's rank is known (a quantized model's convs): a run then only converts and convolves."""
    consts = tuple(ctx.constants) + (None,) * 11
    types = tuple(ctx.input_types) + (None,) * 11
    x = types[0]
    needed = (1, 2, 4, 6, 7) + tuple(i for i in (8, 9, 10) if types[i] is not None)
    if held is None or x is None or x.shape is None or any(consts[i] is None for i in needed):
        return None
    values = tuple(consts[i] for i in (1, 2, 4, 6, 7, 8, 9, 10))
    return Steps.of(held, len(x.shape), float_input, float_output, post, quantize, compiled, values)


@attrs.frozen
class Steps:
    """What a FloatQLinearConv/QLinearConv run needs beyond its input: the held weights, the input's rounding and
    the epilogue (``finish``) with its per-channel operands laid out."""

    held: Any  # quant.Held
    rounding: tuple | None  # quant.Rounding
    finish: Callable[[np.ndarray, np.ndarray, tuple], None]

    @staticmethod
    def of(held: Any, ndim: int, float_input: int, float_output: bool, post: Post | None,
           quantize: Compiled | None, compiled: Compiled | None, values: tuple) -> "Steps":
        """The steps for these parameter values: (x_scale, x_zero_point, w_scale, y_scale, y_zero_point, b, s, a)."""
        x_scale, x_zero_point, w_scale, y_scale, y_zero_point, b, s, a = values
        per_channel = output_scale(x_scale, w_scale, y_scale)
        zp = np.float32(np.asarray(y_zero_point).reshape(-1)[0])
        info = np.iinfo(np.asarray(y_zero_point).dtype)
        ys = np.float32(np.asarray(y_scale).reshape(-1)[0]) if float_output else None
        rank = ndim - 2
        bias = None if b is None else b.astype(held.dtype).reshape((-1,) + (1,) * rank)
        scale = per_channel.reshape((-1,) + (1,) * rank) if per_channel.size > 1 else per_channel.reshape(())
        sv, av = (None if v is None else np.asarray(v, np.float32).reshape((-1,) + (1,) * rank) for v in (s, a))
        fast = compiled if compiled is not None and held.dtype == np.float32 and len(held.chunks) == 1 else None
        flat = [frozen(v) for v in (per_channel, bias, sv, av)]

        def finish(y: np.ndarray, out: np.ndarray, region: tuple) -> None:
            part = y[region]
            ch = region[1] if len(region) > 1 else slice(None)
            if fast is not None:  # bias, requantization, dequantization and the affine in one compiled pass
                fast.fn(part, *(v if v is None or v.size == 1 else v[ch] for v in flat), out=out[region])
                return
            if bias is not None:
                part += bias[ch]  # exact: the bound at build counted the bias
            requantize_into(out[region], part, scale[ch] if scale.ndim else scale, zp, info, ys)
            if post is not None:
                post.apply(out[region], None if sv is None else sv[ch], None if av is None else av[ch])

        rounding = rounding_of(x_scale, x_zero_point, quantize) if float_input == 1 else None
        return Steps(held, rounding, finish)


OPS = [op(OP, domain=MINFER, infer=same_as_input(0),
          doc="an integer conv's requantization / input quantization, dequantization and ChannelAffine in one "
              "elementwise step (see requantize.py)")]
