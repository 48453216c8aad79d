"""minfer: an ONNX inference engine in Python + numpy whose core knows no operator.

This module is the public API: plugins import only what ``__all__`` lists.
Heavy pieces (onnx, the engine) load lazily on first use.
"""

from __future__ import annotations

from typing import Any

from .errors import (
    AmbiguousKernelError,
    BadFeedError,
    InvalidGraphError,
    InvalidOutputError,
    KernelError,
    MinferError,
    ModelLoadError,
    PassError,
    PluginLoadError,
    RegistrationError,
    ShapeInferenceError,
    UnsupportedOpError,
    UnsupportedOptionError,
)
from .hookspecs import hookimpl, hookspec
from .kernel import Kernel, KernelContext, OpDef, kernel, kernels_in, onnx_op, op, same_as_input
from .parallel import intra_op_threads, parallel_for, spmd, using_pool
from .workspace import release_scratch, scratch, scratch_bytes
from .tensor import Dim, Tensor, TensorType

__version__ = "0.1.0"

_LAZY = {
    "Graph": "graph",
    "Node": "graph",
    "InferenceSession": "session",
    "SessionOptions": "session",
    "RunOptions": "session",
    "GraphOptimizationLevel": "session",
    "ExecutionMode": "session",
    "ModelMetadata": "session",
    "get_available_providers": "session",
    "get_device": "session",
    "Engine": "engine",
    "Executor": "executor",
    "Program": "binding",
    "SequentialExecutor": "sequential",
    "Stage": "plan",
    "StepFailure": "runloop",
    "load_model": "onnx_io",
    "save_model": "onnx_io",
    "to_model_proto": "onnx_io",
    "use_plugins": "plugins",
    "get_registry": "plugins",
    "Pass": "passes",
    "PassResult": "passes",
    "onnx_dtype": "onnx_io",
    "infer_types": "infer",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'minfer_core' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"minfer_core.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    "AmbiguousKernelError",
    "BadFeedError",
    "Dim",
    "Engine",
    "Executor",
    "ExecutionMode",
    "Graph",
    "GraphOptimizationLevel",
    "InferenceSession",
    "InvalidGraphError",
    "InvalidOutputError",
    "Kernel",
    "KernelContext",
    "KernelError",
    "MinferError",
    "ModelLoadError",
    "ModelMetadata",
    "Node",
    "OpDef",
    "Pass",
    "PassError",
    "PassResult",
    "PluginLoadError",
    "Program",
    "RegistrationError",
    "RunOptions",
    "SessionOptions",
    "SequentialExecutor",
    "ShapeInferenceError",
    "Stage",
    "StepFailure",
    "Tensor",
    "TensorType",
    "UnsupportedOpError",
    "UnsupportedOptionError",
    "get_available_providers",
    "get_device",
    "get_registry",
    "hookimpl",
    "hookspec",
    "infer_types",
    "intra_op_threads",
    "kernel",
    "kernels_in",
    "load_model",
    "onnx_dtype",
    "onnx_op",
    "op",
    "parallel_for",
    "release_scratch",
    "same_as_input",
    "save_model",
    "scratch",
    "scratch_bytes",
    "spmd",
    "to_model_proto",
    "use_plugins",
    "using_pool",
]
