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
from .parallel import claim_threads, intra_op_threads, parallel_for, spmd, using_pool
from .workspace import release_scratch, scratch, scratch_bytes
from .tensor import Dim, MapType, OptionalType, SequenceType, Tensor, TensorType

__version__ = "0.1.0"

# the names each module behind the API provides, imported on first use (onnx and the engine are heavy)
_LAZY = {name: module for module, names in {
    "graph": "Graph Node",
    "session": "InferenceSession SessionOptions RunOptions GraphOptimizationLevel ExecutionMode ModelMetadata "
               "get_available_providers get_device",
    "engine": "Engine subgraph_engine",
    "executor": "Executor",
    "binding": "Program",
    "sequential": "SequentialExecutor",
    "plan": "Stage",
    "runloop": "StepFailure",
    "onnx_io": "load_model save_model to_model_proto onnx_dtype",
    "plugins": "use_plugins get_registry",
    "passes": "Pass PassResult",
    "infer": "infer_types",
    "tuning": "choose prepare_node",
}.items() for name in names.split()}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'minfer_core' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"minfer_core.{module}"), name)
    globals()[name] = value
    return value


# every eagerly imported name above, and every lazy one
__all__ = sorted([
    *"""
    AmbiguousKernelError BadFeedError claim_threads Dim InvalidGraphError InvalidOutputError Kernel KernelContext
    KernelError MapType MinferError ModelLoadError OptionalType OpDef PassError PluginLoadError
    RegistrationError SequenceType ShapeInferenceError Tensor TensorType UnsupportedOpError
    UnsupportedOptionError hookimpl hookspec intra_op_threads kernel kernels_in onnx_op op
    parallel_for release_scratch same_as_input scratch scratch_bytes spmd using_pool
    """.split(),
    *_LAZY,
])
