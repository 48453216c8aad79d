"""TensorType (dtype + shape with int or symbolic dims) and Tensor (a typed array)."""

from __future__ import annotations

from typing import Any, Iterable, Union

import attrs
import numpy as np

Dim = Union[int, str, None]
"""A dimension: a known size, a symbolic name shared across values, or None (unknown)."""


def _as_dtype(value: Any) -> np.dtype:
    return np.dtype(value)


def _as_shape(value: Iterable[Any] | None) -> tuple[Dim, ...] | None:
    if value is None:
        return None
    return tuple(d if (d is None or isinstance(d, str)) else int(d) for d in value)


@attrs.frozen
class TensorType:
    """The static type of a value: element dtype and shape.

    ``shape`` is None when even the rank is unknown; a dim is an int, a symbolic
    name such as ``"batch"`` (two dims with the same name are equal), or None.
    """

    dtype: np.dtype = attrs.field(converter=_as_dtype)
    shape: tuple[Dim, ...] | None = attrs.field(default=None, converter=_as_shape)

    @property
    def rank(self) -> int | None:
        return None if self.shape is None else len(self.shape)

    @property
    def is_static(self) -> bool:
        """True when every dim is a known int."""
        return self.shape is not None and all(isinstance(d, int) for d in self.shape)

    @property
    def nbytes(self) -> int | None:
        """Bytes of a tensor of this type, or None when the shape is not static."""
        if not self.is_static:
            return None
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize  # type: ignore[arg-type]

    def __str__(self) -> str:
        dims = "?" if self.shape is None else "x".join("?" if d is None else str(d) for d in self.shape)
        return f"{self.dtype.name}[{dims}]"


class _NonTensor:
    """A value type with no tensor shape: the memory planner leaves such values out of the arena."""

    shape = rank = nbytes = None
    is_static = False


@attrs.frozen
class SequenceType(_NonTensor):
    """A sequence of ``elem`` values (a TensorType, or None when unknown): at run time a Python list of arrays."""

    elem: Any = None

    def __str__(self) -> str:
        return f"seq({self.elem or '?'})"


@attrs.frozen
class OptionalType(_NonTensor):
    """An optional ``elem`` (a TensorType or SequenceType): at run time the value, or None when empty."""

    elem: Any = None

    def __str__(self) -> str:
        return f"optional({self.elem or '?'})"


@attrs.frozen
class MapType(_NonTensor):
    """A map from ``key`` (an integer or string dtype) to ``value`` values: at run time a Python dict (ai.onnx.ml)."""

    key: np.dtype = attrs.field(converter=_as_dtype)
    value: Any = None

    def __str__(self) -> str:
        return f"map({self.key.name},{self.value or '?'})"


ValueType = Union[TensorType, SequenceType, OptionalType, MapType]


@attrs.frozen(eq=False)
class Tensor:
    """A numpy array with its TensorType; `view` reshapes without copying."""

    data: np.ndarray

    @property
    def type(self) -> TensorType:
        return TensorType(self.data.dtype, self.data.shape)

    def view(self, shape: tuple[int, ...]) -> Tensor:
        """A Tensor sharing this one's memory with a new shape; raises if a copy would be needed."""
        out = self.data.view()
        out.shape = shape  # assigning .shape raises instead of silently copying
        return Tensor(out)
