"""Entry point of minfer-passes: registers its passes through the public hook."""

from __future__ import annotations

from minfer_core import hookimpl

PASSES: list = []


@hookimpl
def register_passes(register):
    register(PASSES)
