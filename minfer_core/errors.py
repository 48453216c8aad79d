"""minfer's exception hierarchy: one base class, one subclass per kind of failure."""

from __future__ import annotations


class MinferError(Exception):
    """Base class of every error minfer raises on purpose."""


class ModelLoadError(MinferError):
    """A model file or ModelProto could not be read (malformed, truncated, unsafe path)."""


class InvalidGraphError(MinferError):
    """The graph breaks an IR rule: a cycle, a dangling value, a duplicate output name."""


class UnsupportedOpError(MinferError):
    """One or more nodes use an operator that no installed plugin implements."""


class AmbiguousKernelError(MinferError):
    """Two plugins offer the same op or kernel at equal priority and nothing says which wins."""


class PluginLoadError(MinferError):
    """A plugin failed to import or declares a hook implementation minfer does not know."""


class RegistrationError(MinferError):
    """A plugin handed something invalid to a `register` callable."""


class BadFeedError(MinferError):
    """A feed passed to `run` is missing, unknown, or has the wrong shape or dtype."""


class ShapeInferenceError(MinferError):
    """Shapes or dtypes of a node's inputs contradict what its operator accepts."""


class KernelError(MinferError):
    """A kernel failed while preparing or running a node; the message names the node."""


class PassError(MinferError):
    """A pass pipeline is misdeclared (cycle, missing requirement) or a pass broke the graph."""
