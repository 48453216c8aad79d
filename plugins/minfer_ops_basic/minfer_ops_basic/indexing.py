"""Kernels: indexing ops."""

from __future__ import annotations

import numpy as np

from minfer_core import kernel

KERNELS: list = []
