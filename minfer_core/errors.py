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


class InvalidOutputError(BadFeedError, ValueError):
    """`run` was asked for a name that is not one of the model's outputs (onnxruntime: "Invalid output name").

    A `BadFeedError` because it is a bad argument to `run`, and a `ValueError`
    so that code written for onnxruntime catching ``ValueError`` sees it.
    """


class UnsupportedOptionError(MinferError, ValueError, AttributeError):
    """A session option, provider or keyword minfer does not support; the message lists what it does.

    A `ValueError` for an unsupported value (a provider, a level) and an
    `AttributeError` for an unknown option name, as Python code expects.
    """


class ShapeInferenceError(MinferError):
    """Shapes or dtypes of a node's inputs contradict what its operator accepts."""


class KernelError(MinferError):
    """A kernel failed while preparing or running a node; the message names the node."""


class PassError(MinferError):
    """A pass pipeline is misdeclared (cycle, missing requirement) or a pass broke the graph."""


class MinferWarning(UserWarning):
    """Base class of the warnings minfer emits when it carries on past a problem."""


class PluginWarning(MinferWarning):
    """A plugin failed to load or one of its hooks failed: it contributes nothing this session."""


class PassWarning(MinferWarning):
    """A pass raised or broke the graph: its change was rolled back and the build went on."""
