"""Kernel and operator records, and the decorators plugins use to declare them.

A kernel is a plain function. Inputs are positional (a missing optional input
is passed as None; trailing missing ones are not passed), attributes are
keyword-only with their ONNX names and defaults::

    @kernel("HardSigmoid", since=6)
    def hard_sigmoid(x, *, alpha=0.2, beta=0.5):
        '''HardSigmoid-6: max(0, min(1, alpha*x + beta)).'''
        return np.clip(alpha * x + beta, 0, 1, dtype=x.dtype)

It returns one array, or a tuple of arrays for an op with several outputs.

A kernel that prepares itself once per node (reads attributes, pre-packs
weights) is declared with ``@kernel(..., prepare=True)``: it receives a
`KernelContext` first, then the attributes as keywords, and returns the plain
callable the run loop will call with the inputs.

Three optional declarations let the engine's memory planner do more (all
default to the old behaviour, so existing kernels need no change):
``out=True`` says the run callable accepts an ``out=`` keyword (a planned
array of the output's shape and dtype) and writes its single output there;
``inplace=(0,)`` says that ``out`` may be the very array passed as input 0
(elementwise ops); ``views=False`` promises the outputs never share memory with
the inputs (held to it in each shape's first run; ``None``: the engine checks).
A preparing kernel may also declare ``packed=(1, 2)``: it copied (pre-packed)
those inputs from ``ctx.constants`` at build time and its run callable
ignores them, so when no other node reads such an initializer the engine
frees it and passes None there (weights are then held once, not twice).

The decorators only annotate: they return frozen records and register
nothing. ``@kernel`` (or ``kernel(...)(fn)`` in a factory) is the one way to
declare a kernel; a plugin hands ``register`` the records, or simply the
modules that hold them (`kernels_in` finds every record a module defines, so
no hand-kept list can forget one).
"""

from __future__ import annotations

import functools
import inspect
from types import ModuleType
from typing import Any, Callable, Iterable, Mapping, Sequence

import attrs
import numpy as np

from .errors import KernelError
from .tensor import TensorType

DEFAULT_PROVIDER = "numpy"


def _int_tuple(values: Iterable[int]) -> tuple[int, ...]:
    return tuple(int(v) for v in values)


@attrs.frozen
class Kernel:
    """An implementation of one op, from opset ``since`` until the next kernel's ``since``."""

    op_type: str
    fn: Callable[..., Any]
    domain: str = ""
    since: int = 1
    provider: str = DEFAULT_PROVIDER
    priority: int = 0
    prepare: bool = False
    plugin: str | None = attrs.field(default=None, eq=False)
    # Memory-planner declarations (see the module docstring); appended last so
    # positional construction by older code keeps working.
    out: bool = False
    inplace: tuple[int, ...] = attrs.field(default=(), converter=_int_tuple)
    views: bool | None = None
    packed: tuple[int, ...] = attrs.field(default=(), converter=_int_tuple)
    # the run callable accepts ``epilogue=fn``: see docs/kernel-contract.md
    epilogue: bool = False
    # ``applies(ctx, attrs) -> bool``: the nodes this kernel can compute (None: every node of its op)
    applies: Callable[[KernelContext, Mapping[str, Any]], bool] | None = attrs.field(default=None, eq=False)

    @property
    def key(self) -> tuple[str, str, int, str]:
        return (self.domain, self.op_type, self.since, self.provider)

    @property
    def attribute_defaults(self) -> dict[str, Any]:
        """The keyword-only parameters of the kernel function, with their defaults."""
        params = inspect.signature(self.fn).parameters.values()
        # ``out`` is the planner's buffer, not an ONNX attribute
        run_only = {"out"} if self.out else set()
        if self.epilogue:
            run_only.add("epilogue")
        return {p.name: p.default for p in params if p.kind is p.KEYWORD_ONLY and p.name not in run_only}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def prepared(self, ctx: KernelContext, attrs: Mapping[str, Any]) -> Callable[..., Any]:
        """The run callable for one node: what the engine, constant folding and the testing kit all call.

        ``attrs`` (the node's) are checked against the function's keyword-only
        parameters (an unknown or missing required one is a KernelError naming
        ``ctx``'s node); a preparing kernel gets ``ctx`` first::

            fn = kern.prepared(KernelContext.of(node, graph), node.attrs)
            outputs = fn(*inputs)
        """
        accepted, required, var_kw = _signature(self.fn)
        where = f"node {ctx.node_name or '<unnamed>'!r} ({ctx.op_type})"
        unknown = [a for a in attrs if a not in accepted]
        if unknown and not var_kw:
            raise KernelError(f"{where} has attribute(s) {unknown} that kernel {self.op_type}-{self.since} from "
                              f"{self.plugin} does not accept (it accepts {sorted(accepted)})")
        absent = sorted(required - set(attrs))
        if absent:
            raise KernelError(f"{where} lacks required attribute(s) {absent}")
        return self.fn(ctx, **attrs) if self.prepare else (functools.partial(self.fn, **attrs) if attrs else self.fn)


@functools.lru_cache(maxsize=None)
def _signature(fn: Callable[..., Any]) -> tuple[frozenset[str], frozenset[str], bool]:
    params = inspect.signature(fn).parameters.values()
    accepted = frozenset(p.name for p in params if p.kind is p.KEYWORD_ONLY)
    required = frozenset(p.name for p in params if p.kind is p.KEYWORD_ONLY and p.default is p.empty)
    return accepted, required, any(p.kind is p.VAR_KEYWORD for p in params)


def kernel(
    op_type: str,
    *,
    since: int = 1,
    domain: str = "",
    provider: str = DEFAULT_PROVIDER,
    priority: int = 0,
    prepare: bool = False,
    out: bool = False,
    inplace: Sequence[int] = (),
    views: bool | None = None,
    packed: Sequence[int] = (),
    epilogue: bool = False,
    applies: Callable[[KernelContext, Mapping[str, Any]], bool] | None = None,
) -> Callable[[Callable[..., Any]], Kernel]:
    """Declare a function as the kernel of ``domain::op_type`` from opset ``since`` on.

    ``out``, ``inplace``, ``views`` and ``packed`` are the memory declarations
    described in the module docstring and docs/kernel-contract.md.
    ``epilogue=True``: the run callable takes ``epilogue=fn`` and calls
    ``fn(y, region)`` on each finished part of its output (a fused op's
    residual and activation applied while that part is still in cache).
    ``applies=fn``: ``fn(ctx, attrs)`` says at build whether this kernel can
    compute a node (a depthwise-only Conv); where several apply, the core
    times them per input shape (`minfer_core.tuning`), else priority decides.
    """
    if inplace and not out:
        raise ValueError(f"kernel {op_type}: inplace=... needs out=True (in-place means writing into out)")
    if packed and not prepare:
        raise ValueError(f"kernel {op_type}: packed=... needs prepare=True (only a factory can capture constants)")

    def wrap(fn: Callable[..., Any]) -> Kernel:
        return Kernel(
            op_type, fn, domain, since, provider, priority, prepare,
            out=out, inplace=inplace, views=views, packed=packed, epilogue=epilogue, applies=applies,
        )

    return wrap


def kernels_in(*modules: ModuleType) -> list[Kernel]:
    """Every `Kernel` record the modules hold at top level, directly or in lists and tuples, each once.

    Records are taken in definition order and deduplicated by identity, so a
    record a module imports from a sibling module counts once.
    """
    found: dict[int, Kernel] = {}
    for module in modules:
        for value in list(vars(module).values()):
            for item in value if isinstance(value, (list, tuple)) else (value,):
                if isinstance(item, Kernel):
                    found.setdefault(id(item), item)
    return list(found.values())


@attrs.frozen(eq=False)
class KernelContext:
    """What a preparing kernel may know about its node at build time.

    ``constants[i]`` is the value of input ``i`` when it is an initializer or
    otherwise known at build time (pre-pack it), else None. ``input_types`` and
    ``output_types`` are the inferred types (None where unknown).
    """

    node_name: str
    op_type: str
    opset: int
    input_types: tuple[TensorType | None, ...]
    output_types: tuple[TensorType | None, ...]
    constants: tuple[np.ndarray | None, ...]
    num_outputs: int
    # a node holding subgraphs (If, Loop, Scan): the outer-scope values they read, passed to the run callable
    # after the node's own inputs (all of those, omitted ones as None), and how to build them (`subgraph_engine`)
    outer: tuple[str, ...] = ()
    outer_types: tuple[Any, ...] = ()
    build: Mapping[str, Any] = attrs.field(factory=dict)

    @classmethod
    def of(cls, node: Any, graph: Any, build: Mapping[str, Any] | None = None) -> KernelContext:
        """The context of ``node`` in ``graph`` (a `Graph`): its types as inferred, its constant inputs."""
        from .graph import implicit_inputs  # here: importing minfer_core (a plugin's first line) loads no IR

        outer = implicit_inputs(node) if graph.holds_subgraphs(node) else ()
        return cls(node.name, node.op_type, graph.opsets.get(node.domain, 1),
                   tuple(graph.type_of(n) if n else None for n in node.inputs),
                   tuple(graph.type_of(n) if n else None for n in node.outputs),
                   tuple(graph.initializers.get(n) if n else None for n in node.inputs), len(node.outputs),
                   outer, tuple(graph.type_of(n) for n in outer), dict(build or {}))


InferFn = Callable[..., Sequence[TensorType | None]]


@attrs.frozen
class OpDef:
    """An operator a plugin makes known: its identity, arity and shape/dtype inference.

    Standard ONNX operators are claimed with `onnx_op`, which reuses onnx's own
    schema (attributes, defaults, shape inference, function body); an ``infer``
    there is a fast path for a new input shape's run, returning None where
    the schema's inference is needed. Custom ops in a plugin's own domain are
    declared with `op` and bring their own ``infer``: a function of the input
    TensorTypes (keyword attributes follow) that returns the output TensorTypes.
    """

    op_type: str
    domain: str = ""
    since: int = 1
    infer: InferFn | None = None
    standard: bool = False
    doc: str = ""
    plugin: str | None = attrs.field(default=None, eq=False)

    @property
    def key(self) -> tuple[str, str]:
        return (self.domain, self.op_type)


def same_as_input(index: int = 0) -> InferFn:
    """An ``infer`` for ops whose single output has the type of input ``index``."""

    def infer(*types: TensorType | None, **_attrs: Any) -> list[TensorType | None]:
        return [types[index]]

    return infer


def op(op_type: str, *, domain: str, since: int = 1, infer: InferFn | None = None, doc: str = "") -> OpDef:
    """Declare a custom operator; ``infer`` defaults to "same type as the first input"."""
    return OpDef(op_type, domain, since, infer or same_as_input(0), standard=False, doc=doc)


def onnx_op(*op_types: str, domain: str = "", infer: InferFn | None = None) -> list[OpDef]:
    """Claim standard ONNX operators; their schemas come from ``onnx.defs`` (``infer``: a fast path, see `OpDef`)."""
    return [OpDef(t, domain, 1, infer, standard=True) for t in op_types]
