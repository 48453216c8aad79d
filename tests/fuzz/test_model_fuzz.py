"""Mutated real models load, build and run once, or raise a MinferError subclass, in bounded memory and time.

The models are the light model-zoo files shipped in the onnx wheel; each case
applies one to three mutations from `mutations.py` (dims, data types,
attributes, node wiring, opsets, external-data entries, wire bytes), then
loads, builds and runs the result once on random feeds. Memory is capped per
case (RLIMIT_AS, current size + 2 GiB) and a deadline only catches a hang.
``MINFER_FUZZ_LOG=FILE`` appends one JSON line per case (for docs/reliability.md).
Any other exception fails the test unless ``known_failures.txt`` names its type
and the file it came from, with a reason and an owner.
"""

from __future__ import annotations

import json
import os
import random
import signal
import tempfile
import time
import traceback
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minfer_core
from minfer_core import MinferError
from minfer_core.testing.suite import suite_settings
from minfer_core.testing.zoo import model_path

from .mutations import mutate

pytestmark = pytest.mark.fuzz

CI_MODELS = ("light_squeezenet", "light_shufflenet", "light_inception_v1", "light_bvlc_alexnet")
NIGHTLY_MODELS = CI_MODELS + ("light_zfnet512", "light_resnet50", "light_inception_v2", "light_densenet121")
MEMORY_HEADROOM = 2 << 30
CASE_DEADLINE_S = 300  # far beyond any case; only a hang reaches it
MAX_FEED_ELEMENTS = 1 << 24
REPO = Path(__file__).resolve().parents[2]


class CaseHung(BaseException):
    """A case outlived CASE_DEADLINE_S (BaseException: no `except Exception` in the engine swallows it)."""


SUITE = suite_settings()
NIGHTLY = not SUITE.derandomize
# a case costs up to one model run, so CI draws as many cases as a property has examples; nightly four times that
FUZZ_SETTINGS = settings(SUITE, max_examples=SUITE.max_examples * (4 if NIGHTLY else 1))


@lru_cache(maxsize=None)
def _base(name: str) -> bytes:
    """The model's bytes, after one clean load + build + run outside any guard (warming thread pools)."""
    data = Path(model_path(name)).read_bytes()
    sess = minfer_core.InferenceSession(data)
    sess.run(None, _feeds(sess))
    return data


def _feeds(sess: Any) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    feeds = {}
    for arg in sess.get_inputs():
        shape = [d if isinstance(d, int) and d >= 0 else 1 for d in (arg.shape or [1])]
        if int(np.prod(shape, dtype=object)) > MAX_FEED_ELEMENTS:
            raise _Unfeedable(f"input {arg.name!r} of declared shape {shape}")
        dtype = np.dtype(arg.dtype or np.float32)
        feeds[arg.name] = (rng.standard_normal(shape) if dtype.kind == "f" else np.ones(shape)).astype(dtype)
    return feeds


class _Unfeedable(Exception):
    """A declared input too large for the fuzzer to draw (the model is fine; the case stops after build)."""


@contextmanager
def bounded(headroom: int, deadline_s: int) -> Iterator[None]:
    """Cap the address space at its current size + ``headroom`` and fail a case that runs past ``deadline_s``."""
    resource = _resource()
    old = None
    if resource is not None:
        old = resource.getrlimit(resource.RLIMIT_AS)
        limit = _address_space() + headroom
        if old[1] != resource.RLIM_INFINITY:
            limit = min(limit, old[1])
        resource.setrlimit(resource.RLIMIT_AS, (limit, old[1]))

    def hung(*_: Any) -> None:
        raise CaseHung(f"case ran past {deadline_s} s")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(deadline_s)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        if old is not None:
            resource.setrlimit(resource.RLIMIT_AS, old)


def _resource() -> Any:
    try:
        import resource
    except ImportError:
        return None
    return resource if Path("/proc/self/status").exists() else None


def _address_space() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")


def run_case(path: Path) -> tuple[str, str]:
    """(outcome, where): 'ran' or 'unfeedable', a MinferError subclass name, or 'UNEXPECTED <type>' and its origin."""
    try:
        sess = minfer_core.InferenceSession(str(path))
        try:
            feeds = _feeds(sess)
        except _Unfeedable as exc:
            return "unfeedable", str(exc)
        sess.run(None, feeds)
        return "ran", ""
    except MinferError as exc:
        return type(exc).__name__, ""
    except Exception as exc:  # the finding: recorded with the file it came from
        return f"UNEXPECTED {type(exc).__name__}", _origin(exc)


def _origin(exc: BaseException) -> str:
    """The repository file of the innermost frame that raised ``exc`` (or its last frame outside)."""
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if f.filename.startswith(str(REPO)) and "/tests/" not in f.filename]
    frame = (ours or frames)[-1]
    where = os.path.relpath(frame.filename, REPO) if frame.filename.startswith(str(REPO)) else frame.filename
    return f"{where}:{frame.lineno}: {type(exc).__name__}: {str(exc)[:200]}"


def known_failures() -> dict[tuple[str, str], str]:
    """(exception type, repository file) -> reason, from known_failures.txt."""
    known = {}
    for line in (Path(__file__).parent / "known_failures.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            kind, where, reason = line.split(maxsplit=2)
            known[(kind, where)] = reason
    return known


def _log(record: dict[str, Any]) -> None:
    target = os.environ.get("MINFER_FUZZ_LOG")
    if target:
        with open(target, "a") as fh:
            fh.write(json.dumps(record) + "\n")


def fuzz_case(name: str, seed: int, keep: Path | None = None) -> dict[str, Any]:
    """Mutate model ``name`` with ``random.Random(seed)``, then load, build and run it once under the guards.

    ``keep``: a folder to leave the mutated model (and its external data) in, to reproduce a case.
    """
    model = onnx.load_from_string(_base(name))
    with tempfile.TemporaryDirectory(prefix="minfer-fuzz-") as tmp:
        folder = keep or Path(tmp)
        blob, done = mutate(model, random.Random(seed), folder)
        path = folder / "model.onnx"
        path.write_bytes(blob)
        start = time.perf_counter()
        with bounded(MEMORY_HEADROOM, CASE_DEADLINE_S):
            outcome, where = run_case(path)
        seconds = time.perf_counter() - start
    return {"model": name, "seed": seed, "mutations": done, "outcome": outcome, "where": where,
            "seconds": round(seconds, 3)}


@FUZZ_SETTINGS
@given(name=st.sampled_from(NIGHTLY_MODELS if NIGHTLY else CI_MODELS), seed=st.integers(0, 2**32 - 1))
def test_mutated_models_load_build_and_run_or_raise_minfer_errors(name, seed):
    """A mutated model file loads, builds and runs once, or raises a MinferError subclass: nothing else."""
    record = fuzz_case(name, seed)
    _log(record)
    if record["outcome"].startswith("UNEXPECTED"):
        kind, file = record["outcome"].split()[1], record["where"].split(":")[0]
        assert (kind, file) in known_failures(), (
            f"{name} seed {seed} after {record['mutations']}: {record['outcome']} at {record['where']} "
            f"(reproduce: python -m tests.fuzz.test_model_fuzz {name} {seed} FOLDER)"
        )


if __name__ == "__main__":  # python -m tests.fuzz.test_model_fuzz MODEL SEED [FOLDER]: one case, printed
    import sys

    keep = Path(sys.argv[3]) if len(sys.argv) > 3 else None
    print(json.dumps(fuzz_case(sys.argv[1], int(sys.argv[2]), keep), indent=2))
