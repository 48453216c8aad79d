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

    Call ``register(*kernels)`` with `Kernel` records made by ``@kernel``,
    lists of them, or modules: a module stands for every record it defines
    (`kernels_in`), so no hand-kept list can forget one. Selection takes the
    newest ``since`` not above the model's opset, then the highest priority;
    equal priorities from two plugins are an `AmbiguousKernelError` unless
    the user states a preference.
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


@hookspec
def register_executors(register: Callable[..., None]) -> None:
    """Provide executors: ways of running a built model's steps (threads, a process team).

    Call ``register(*executors)`` with `Executor` records. A session picks
    one by name (``parallel=``); without a name the highest ``priority``
    installed runs. The core's "sequential" (priority 0) is always there;
    choosing a name two plugins registered is an error naming both.
    """


def _spec_names() -> list[str]:
    return [n for n, v in globals().items() if callable(v) and n.startswith("register_")]


HOOK_NAMES: tuple[str, ...] = tuple(_spec_names())
