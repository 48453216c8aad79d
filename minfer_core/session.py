"""onnxruntime's session API over minfer's Engine: code written for onnxruntime runs by changing the import.

`InferenceSession(path_or_bytes, sess_options, providers)`, `SessionOptions`,
`RunOptions`, `GraphOptimizationLevel`, `ExecutionMode`,
`get_available_providers`, `get_device` and `get_modelmeta` mirror
onnxruntime's; an option, provider or keyword minfer does not support is
refused with the list of what it does (docs/onnxruntime-api.md has the table).
What onnxruntime lacks: ``run(..., intermediate=True)``, and sessions that
pickle (rebuilt from the model bytes and the constructor's options), so
process pools and distributed schedulers can ship them.
"""

from __future__ import annotations

import inspect
import json
import os
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import attrs

from .engine import Engine
from .errors import InvalidOutputError, UnsupportedOptionError
from .graph import Graph
from .onnx_io import ModelSource, load_model, save_model, to_model_proto
from .pipeline import PassSelection, optimize
from .plugins import Registry, active_registry, get_registry
from .session_options import (DOCS, PASS_LEVELS, ExecutionMode, GraphOptimizationLevel, RunOptions, SessionOptions,
                              check_providers, get_available_providers, get_device)

@attrs.frozen
class ModelMetadata:
    """What `InferenceSession.get_modelmeta` returns: onnxruntime's ModelMetadata fields."""

    producer_name: str
    graph_name: str
    domain: str
    description: str
    version: int
    custom_metadata_map: dict[str, str]
    graph_description: str = ""


# ---- the model kept for pickling -------------------------------------------------


@attrs.frozen
class ModelBytes:
    """A session's model as it ships in a pickle: the serialized model, and the folder of its external data."""

    data: bytes
    base_dir: str | None = None

    def load(self) -> Graph:
        return load_model(self.data, base_dir=self.base_dir)


def _kept_source(model: Any) -> Callable[[], ModelBytes]:
    """How to get ``model``'s bytes at pickling time, without a copy held until then.

    A copy would hold every weight twice for the session's life; a reference
    holds nothing more while the caller keeps the model (a path: nothing at all).
    """
    if isinstance(model, ModelBytes):
        return lambda: model
    if isinstance(model, (bytes, bytearray, memoryview)):
        data = bytes(model)  # bytes are immutable: bytes(b) is b
        return lambda: ModelBytes(data)
    if isinstance(model, Graph):
        graph = model.copy()  # the structure, not the arrays: the caller's later edits do not leak in
        return lambda: ModelBytes(to_model_proto(graph).SerializeToString())
    if hasattr(model, "SerializeToString"):  # a ModelProto is mutable: an edit after the build must not ship
        return _unchanged(lambda: _proto_stamp(model), lambda: ModelBytes(model.SerializeToString()),
                          "the ModelProto it was built from")
    path = os.path.abspath(os.fspath(model))
    with_dir = lambda: ModelBytes(Path(path).read_bytes(), os.path.dirname(path))  # noqa: E731
    return _unchanged(lambda: _stamp(path), with_dir, f"its model file {path!r}")


def _unchanged(stamp: Callable[[], Any], read: Callable[[], ModelBytes], what: str) -> Callable[[], ModelBytes]:
    """``read``, refused at pickling time if ``stamp()`` differs from now (the model changed since the build)."""
    before = stamp()

    def get() -> ModelBytes:
        if stamp() != before:
            raise UnsupportedOptionError(f"cannot pickle this session: {what} was edited since the session was built; "
                                         f"build the session again (or from the model's bytes) before pickling it")
        return read()

    return get


def _stamp(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None  # load_model reports the unreadable file
    return st.st_size, st.st_mtime_ns


def _proto_stamp(proto: Any) -> tuple[Any, ...]:
    """What an edit of a ModelProto most likely changes, read without touching its weights.

    (``ByteSize()`` would serialize the whole model: a second copy of every weight for a moment.)
    """
    g = proto.graph
    return (proto.doc_string, proto.model_version, [o.name for o in g.output], [i.name for i in g.input],
            [n.op_type for n in g.node], [t.name for t in g.initializer], len(proto.metadata_props))


def _rebuild(model: ModelBytes, options: dict[str, Any]) -> InferenceSession:
    return InferenceSession(model, **options)


# ---- the session ---------------------------------------------------------------

_ORT_ONLY = ("io_binding", "run_with_iobinding", "run_with_ort_values", "run_with_ortvaluevector", "run_async",
             "set_providers", "get_overridable_initializers", "enable_fallback", "disable_fallback",
             "set_tuning_results", "get_tuning_results", "create_ortvalue_from_shape_and_type")


class InferenceSession(Engine):
    """onnxruntime's ``InferenceSession`` over minfer's `Engine`; it pickles.

    ``path_or_bytes``: a model file, its bytes, an ``onnx.ModelProto`` or a
    minfer `Graph`. ``sess_options`` (`SessionOptions`) and ``providers``
    (only ``"CPUExecutionProvider"``) as onnxruntime takes them; any other
    keyword is one of `Engine`'s (``passes``, ``disabled_passes``,
    ``registry``, ``threads``, ``inter_op``, ``parallel``, ...), else a
    ``TypeError``. Saying the same thing twice (``passes=`` and a non-default
    optimization level, ``threads=`` and ``intra_op_num_threads``) is an error.

    A pickled session carries the model's bytes and these options; unpickling
    builds it again with the plugins installed where it is unpickled (a
    session given ``registry=`` does not pickle).
    """

    def __init__(
        self,
        path_or_bytes: ModelSource | Graph | ModelBytes,
        sess_options: SessionOptions | None = None,
        providers: Sequence[Any] | None = None,
        provider_options: Sequence[Mapping[str, Any]] | None = None,
        *,
        passes: PassSelection | None = None,
        threads: int | str | None = None,
        inter_op: str | None = None,
        **engine_options: Any,
    ) -> None:
        _check_keywords(engine_options)
        if "disabled_passes" in engine_options:  # an iterator would be used up by the first build
            engine_options["disabled_passes"] = tuple(engine_options["disabled_passes"])
        if sess_options is not None and not isinstance(sess_options, SessionOptions):
            raise TypeError(f"sess_options must be a minfer_core.SessionOptions, not {type(sess_options).__name__}")
        opts = SessionOptions() if sess_options is None else _copy_options(sess_options)
        self._providers = check_providers(providers, provider_options)
        self._options = opts
        self._rebuild_args: dict[str, Any] = dict(
            engine_options, sess_options=_copy_options(opts, optimized_model_filepath=""),  # written once only
            providers=self._providers, passes=passes, threads=threads, inter_op=inter_op)
        self._pickled_model = _kept_source(path_or_bytes)
        self._profiler: Any = None
        if opts.enable_profiling:
            from .profile import TraceProfiler

            self._profiler = TraceProfiler()
            self._profile_start_ns = time.time_ns()
        start = time.perf_counter()
        model = path_or_bytes.load() if isinstance(path_or_bytes, ModelBytes) else path_or_bytes
        self._build(model, opts, passes, threads, inter_op, engine_options)
        if self._profiler is not None:
            self._profiler.session_event("session_initialization", 0.0, (time.perf_counter() - start) * 1e6)
            self.program.observers.append(self._profiler)

    def _build(self, model: Any, opts: SessionOptions, passes: PassSelection | None, threads: int | str | None,
               inter_op: str | None, engine_options: dict[str, Any]) -> None:
        level = opts.graph_optimization_level
        passes = _one_of("passes", passes, "graph_optimization_level", PASS_LEVELS[level],
                         level != GraphOptimizationLevel.ORT_ENABLE_ALL)
        threads = _one_of("threads", threads, "intra_op_num_threads", opts.intra_op_num_threads or "auto",
                          opts.intra_op_num_threads != 0)
        parallel_mode = opts.execution_mode == ExecutionMode.ORT_PARALLEL
        inter_op = _one_of("inter_op", inter_op, "execution_mode", "auto" if parallel_mode else None, parallel_mode)
        pass_results = None
        if opts.optimized_model_filepath:
            # optimize once, as `minfer optimize` does, write that, and build the engine from it without passes
            disabled = engine_options.pop("disabled_passes", ())
            model, pass_results = _optimize_and_save(model, engine_options.get("registry"), passes, disabled,
                                                     opts.optimized_model_filepath)
            passes = "none"
        super().__init__(model, passes=passes, threads=threads, inter_op=inter_op, **engine_options)
        if pass_results is not None:
            self.pass_results = pass_results

    # ---- run ---------------------------------------------------------------

    def run(self, output_names: Sequence[str] | None, input_feed: Mapping[str, Any],
            run_options: RunOptions | None = None, *, intermediate: bool = False) -> Any:
        """onnxruntime's ``run``: the outputs named (all, for None or ``[]``) computed from ``input_feed``.

        A name that is not a graph output (an input, an initializer, an
        intermediate value, a typo) raises `InvalidOutputError`. With
        ``intermediate=True`` returns ``(outputs, values)`` as `Engine.run` does.
        """
        names = self._output_names(output_names)
        if not isinstance(input_feed, Mapping):
            raise TypeError(f"input_feed must be a dict of input name -> array, not {type(input_feed).__name__}")
        if run_options is not None and not isinstance(run_options, RunOptions):
            raise TypeError(f"run_options must be a minfer_core.RunOptions, not {type(run_options).__name__}")
        prof = self._profiler
        if prof is None:
            return super().run(names, input_feed, intermediate=intermediate)
        t0 = prof._now_us()
        try:
            return super().run(names, input_feed, intermediate=intermediate)
        finally:
            prof.session_event("model_run", t0, prof._now_us() - t0)

    def _output_names(self, output_names: Sequence[str] | None) -> list[str]:
        outputs = list(self.graph.outputs)
        if isinstance(output_names, (str, bytes)):
            raise TypeError(f"output_names must be a list of names, not a string: write [{output_names!r}]")
        if not output_names:  # onnxruntime: None and [] both mean every output
            return outputs
        names = list(output_names)
        for name in names:
            if name not in outputs:
                raise InvalidOutputError(
                    f"unknown output {name!r}{self._what_is(name)}; the model's outputs are {outputs} "
                    f"(onnxruntime: Invalid output name)")
        return names

    def _what_is(self, name: Any) -> str:
        graph = self.graph
        if name in graph.inputs:
            return " (it is a model input)"
        if name in graph.initializers or name in self.program.released:
            return " (it is an initializer)"
        if name in self.program.slots:
            return " (it is an intermediate value: run(None, feeds, intermediate=True) returns those)"
        return ""

    # ---- onnxruntime's introspection -------------------------------------------

    def get_providers(self) -> list[str]:
        """The providers this session runs on: ``["CPUExecutionProvider"]``."""
        return list(self._providers)

    def get_provider_options(self) -> dict[str, dict[str, str]]:
        """Per provider, its options (none for the CPU provider)."""
        return {p: {} for p in self._providers}

    def get_session_options(self) -> SessionOptions:
        """A copy of the `SessionOptions` this session was built with."""
        return _copy_options(self._options)

    def get_modelmeta(self) -> ModelMetadata:
        """The model's producer, graph name, domain, doc string, version and metadata_props."""
        meta = self.graph.meta
        return ModelMetadata(meta.get("producer_name", ""), self.graph.name, meta.get("domain", ""), meta.get("doc_string", ""),
                             int(meta.get("model_version", 0)), dict(meta.get("metadata_props", {})), meta.get("graph_doc_string", ""))

    def get_profiling_start_time_ns(self) -> int:
        """When profiling started (``time.time_ns()``), or 0 when it is off."""
        return self._profile_start_ns if self._profiler is not None else 0

    def end_profiling(self) -> str:
        """Stop profiling and write the trace (Chrome trace format); returns its path, "" when profiling is off."""
        prof = self._profiler
        if prof is None:
            return ""
        self._profiler = None
        self.program.observers.remove(prof)
        stamp = time.strftime("%Y-%m-%d_%H-%M-%S", time.localtime(self._profile_start_ns / 1e9))
        path = f"{self._options.profile_file_prefix}_{stamp}.json"
        with open(path, "w") as fh:
            json.dump(prof.trace(), fh)
        return path

    def __getattr__(self, name: str) -> Any:
        # only reached for missing attributes: name onnxruntime's methods minfer lacks instead of a bare AttributeError
        if name in _ORT_ONLY:
            raise UnsupportedOptionError(
                f"InferenceSession.{name} is onnxruntime's; minfer does not support it (see {DOCS})")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    # ---- pickling ------------------------------------------------------------

    def __reduce__(self) -> tuple[Any, ...]:
        if self._rebuild_args.get("registry") is not None:
            raise UnsupportedOptionError(
                "a session built with registry= does not pickle: unpickling builds with the plugins installed "
                "where it happens; build it without registry= (use_plugins or MINFER_PLUGINS choose plugins)")
        return _rebuild, (self._pickled_model(), dict(self._rebuild_args))


def _copy_options(opts: SessionOptions, **changes: Any) -> SessionOptions:
    copy = SessionOptions()
    copy.__setstate__({**opts.__getstate__(), **changes})
    return copy


def _check_keywords(engine_options: Mapping[str, Any]) -> None:
    """Keywords beyond onnxruntime's go to `Engine`; one it does not take is a TypeError naming those it does."""
    accepted = set(inspect.signature(Engine.__init__).parameters) - {"self", "model"}
    unknown = sorted(set(engine_options) - accepted)
    if unknown:
        raise TypeError(
            f"InferenceSession() got unexpected keyword argument(s) {unknown}; it takes onnxruntime's sess_options, "
            f"providers, provider_options and minfer's {sorted(accepted)}")


def _one_of(name: str, given: Any, option: str, from_option: Any, option_set: bool) -> Any:
    """A setting given as a minfer keyword or as a SessionOptions attribute; both set is an error."""
    if given is None:
        return from_option
    if option_set:
        raise UnsupportedOptionError(
            f"{name}={given!r} and sess_options.{option} both set how the session runs; give only one of them")
    return given


def _optimize_and_save(model: Any, registry: Registry | None, passes: PassSelection, disabled: Iterable[str],
                       path: str) -> tuple[Graph, list[Any]]:
    """Run the passes once, as ``minfer optimize`` does (pipeline.optimize), and write the result to ``path``."""
    graph = model.copy() if isinstance(model, Graph) else load_model(model)
    graph.validate()
    registry = registry or get_registry()
    with active_registry(registry):
        results = optimize(graph, registry, passes, tuple(disabled))
    save_model(graph, path)
    return graph, results
