"""The standard ONNX backend API (``onnx.backend.base.Backend``) over minfer's Engine.

This is what lets onnx's own conformance cases run against minfer::

    rep = minfer_core.testing.backend.prepare(model)
    outputs = rep.run([x])          # or rep.run({"x": x})
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep, Device, DeviceType

from ..engine import Engine


class MinferRep(BackendRep):
    """A prepared model; ``run`` takes a list (graph input order) or a dict and returns outputs in graph order."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        names = self.engine.graph.inputs
        if isinstance(inputs, Mapping):
            feeds = dict(inputs)
        else:
            if isinstance(inputs, np.ndarray):
                inputs = [inputs]
            feeds = dict(zip(names, inputs))
        return tuple(self.engine.run(None, feeds))


class MinferBackend(Backend):
    """minfer as an ONNX backend (CPU only)."""

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> MinferRep:
        return MinferRep(Engine(model, **kwargs))

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU", **kwargs: Any) -> tuple[np.ndarray, ...]:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(
        cls, node: onnx.NodeProto, inputs: Sequence[np.ndarray], device: str = "CPU", outputs_info: Any = None, **kwargs: Any
    ) -> tuple[np.ndarray, ...]:
        opset = kwargs.pop("opset_version", None) or onnx.defs.onnx_opset_version()
        in_infos = [
            onnx.helper.make_tensor_value_info(name, onnx.helper.np_dtype_to_tensor_dtype(np.asarray(x).dtype), np.shape(x))
            for name, x in zip(node.input, inputs)
            if name
        ]
        out_infos = [onnx.helper.make_empty_tensor_value_info(name) for name in node.output if name]
        graph = onnx.helper.make_graph([node], "run_node", in_infos, out_infos)
        model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid(node.domain or "", opset)])
        feeds = {name: np.asarray(x) for name, x in zip(node.input, inputs) if name}
        return tuple(Engine(model).run(None, feeds))

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return Device(device).type == DeviceType.CPU


prepare = MinferBackend.prepare
run_model = MinferBackend.run_model
run_node = MinferBackend.run_node
supports_device = MinferBackend.supports_device
