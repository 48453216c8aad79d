"""Winograd F(2x2, 3x3) for 3x3 stride-1 convs, as 16 batched GEMMs."""

from __future__ import annotations

import numpy as np

from . import _geometry as geo


def applies(w: geo.Window, p) -> bool:
    """Not enabled until measured faster than im2col."""
    return False


def plan(w: geo.Window):
    raise NotImplementedError
