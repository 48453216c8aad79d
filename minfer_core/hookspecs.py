"""pluggy hook specifications of the ``minfer`` project.

Each contribution hook is handed a ``register`` callable; a plugin calls it
with its records. minfer calls each plugin's implementation separately, so it
knows which plugin registered what and checks every record at the door.
"""

from __future__ import annotations

from typing import Callable

import pluggy

hookspec = pluggy.HookspecMarker("minfer")
hookimpl = pluggy.HookimplMarker("minfer")


@hookspec
def register_ops(register: Callable[..., None]) -> None:
    """Make operators known to minfer.

    Call ``register(*defs)`` with `OpDef` records (or lists of them): standard
    ONNX ops claimed with ``onnx_op("Relu", ...)``, custom ops declared with
    ``op("MyOp", domain="com.example", infer=...)``. Two plugins claiming the
    same (domain, op_type) is a reported conflict.
    """


@hookspec
def register_kernels(register: Callable[..., None]) -> None:
    """Provide kernels for operators (yours or another plugin's).

    Call ``register(*kernels)`` with `Kernel` records made by ``@kernel`` (or
    lists or modules' ``KERNELS`` lists of them). For one (domain, op_type,
    since, provider) the highest priority wins; equal priorities from two
    plugins are an `AmbiguousKernelError` unless the user states a preference.
    """


@hookspec
def register_passes(register: Callable[..., None]) -> None:
    """Provide graph optimization passes.

    Call ``register(*passes)`` with `Pass` records. Their declared level and
    ordering (``after``, ``before``, ``requires``) place them in the pipeline.
    """


@hookspec
def register_observers(register: Callable[..., None]) -> None:
    """Provide run observers (profilers, tracers).

    Call ``register(observer)`` with objects that have ``on_node_start(node)``
    and ``on_node_end(node, outputs)`` methods. They are collected once; the
    run loop calls them directly, so having none costs nothing.
    """


def _spec_names() -> list[str]:
    return [n for n, v in globals().items() if callable(v) and n.startswith("register_")]


HOOK_NAMES: tuple[str, ...] = tuple(_spec_names())
