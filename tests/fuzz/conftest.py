"""The fuzz stage: mutated real models and random value-dependent graphs (runs in the normal suite)."""

from __future__ import annotations


def pytest_configure(config):
    config.addinivalue_line("markers", "fuzz: the fuzz stage (bounded under minfer-ci, long under minfer-nightly)")
