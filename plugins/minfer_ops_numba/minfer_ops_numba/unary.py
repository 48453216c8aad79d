"""Sigmoid alone (float32): elementwise.py's compiled loop on a one-step program.

A Sigmoid that no neighbour fuses with (minfer-passes'
``elementwise_fusion`` takes chains of two ops or more) ran numpy's kernel:
Sigmoid is a few ufunc passes over the tensor (exp(-x), + 1, 1 / that), each
a call whose overhead outweighs the work on a small tensor (a detector's
[1, 768, 1] objectness Sigmoid: 10 us against onnxruntime's 2) and a pass
over memory on a large one (an OCR detector's lone Sigmoid on its
probability map: 112-164 us against 16-19). Here it is the one-step program
``ops=["Sigmoid"], args=[0, -1, -1]`` of minfer-ops-numba's FusedElementwise
kernel: one compiled loop, exp as that module's float32 polynomial, which
vectorizes (within 3 ulps of np.exp), in the numpy kernel's order: exp(-x),
+ 1, 1 / that. Not numpy's bits, then: the core times both kernels per node.
One kernel, one thread: [1, 768, 1] 2.5 us (numpy's 5.4), [1, 8, 32, 32] 6.5
(10.7), [1, 1, 320, 320] 57 (80), [1, 24, 160, 160] 320 (456). An Exp alone
stays numpy's: np.exp's own vector loop beat the polynomial (1.6 against 2.5
us at [1, 768, 1], 197 against 303 at [1, 24, 160, 160]).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minfer_core import kernel

from . import elementwise  # the module, not its kernel record: the plugin finds records in its modules' names
from ._jit import PRIORITY


def _program(op_type: str) -> dict[str, Any]:
    """The FusedElementwise attributes of ``op_type`` applied to input 0 alone."""
    return {"ops": [op_type], "args": [0, -1, -1], "constants": np.zeros(0, np.float32)}


def _applies(ctx: Any, attrs: dict[str, Any]) -> bool:
    """float32 in and out: what FusedElementwise's kernel takes for the one-step program."""
    return elementwise._applies(ctx, _program(ctx.op_type))


def _one_step(op_type: str, since: int) -> Any:
    """The kernel of ``op_type`` from opset ``since``: FusedElementwise's run callable for its one-step program."""

    def prepare(ctx: Any) -> Any:
        return elementwise.fused_elementwise.prepared(ctx, _program(op_type))

    prepare.__name__ = prepare.__qualname__ = op_type.lower()
    prepare.__doc__ = f"{op_type}-{since} and later, float32: one compiled loop (the module docstring)."
    # inplace: element i of the input is read only for element i of the output, before it is written
    return kernel(op_type, since=since, priority=PRIORITY, prepare=True, out=True, inplace=(0,), views=False,
                  applies=_applies)(prepare)


# from opset 6 for every later one, as minfer-ops-basic's kernel (a newer ``since`` would hide theirs from the
# core's timing: the candidates are the newest ``since`` that applies)
sigmoid = _one_step("Sigmoid", 6)
