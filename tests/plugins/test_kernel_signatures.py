"""Every first-party kernel's signature is its ONNX schema: same attributes, same defaults."""

from __future__ import annotations

import math

import onnx
import pytest
from onnx import helper

from minfer_core import get_registry

FIRST_PARTY = ("minfer-ops-basic", "minfer-ops-conv", "minfer-ops-ml")


def standard_kernels():
    reg = get_registry()
    found = []
    for (domain, op_type), kernels in reg.kernels.items():
        for k in kernels:
            if k.plugin in FIRST_PARTY and onnx.defs.has(op_type, domain):
                found.append(k)
    return sorted(found, key=lambda k: (k.op_type, k.since))


def versions_covered(kernel):
    """The schema since_versions this kernel serves: from its since up to its plugin's next kernel."""
    siblings = sorted(
        k.since for k in get_registry().kernels[(kernel.domain, kernel.op_type)] if k.plugin == kernel.plugin and k.provider == kernel.provider
    )
    later = [s for s in siblings if s > kernel.since]
    upper = later[0] - 1 if later else onnx.defs.onnx_opset_version()
    versions = set()
    for v in range(kernel.since, upper + 1):
        try:
            versions.add(onnx.defs.get_schema(kernel.op_type, v, kernel.domain).since_version)
        except onnx.defs.SchemaError:
            continue
    return sorted(versions)


def schema_default(attr):
    if attr.default_value is None or attr.default_value.type == 0:
        return None
    value = helper.get_attribute_value(attr.default_value)
    if isinstance(value, list):
        return [v.decode() if isinstance(v, bytes) else v for v in value]
    return value.decode() if isinstance(value, bytes) else value


def same(a, b):
    if isinstance(a, float) or isinstance(b, float):
        return a is not None and b is not None and math.isclose(float(a), float(b), rel_tol=1e-6)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return list(a) == list(b)
    return a == b


KERNELS = standard_kernels()


@pytest.mark.parametrize("kernel", KERNELS, ids=[f"{k.op_type}-{k.since}" for k in KERNELS])
def test_kernel_accepts_every_schema_attribute_with_its_default(kernel):
    """A kernel takes each attribute of the versions it serves, defaulting as onnx.defs does."""
    params = kernel.attribute_defaults
    import inspect

    has_var_kw = any(p.kind is p.VAR_KEYWORD for p in inspect.signature(kernel.fn).parameters.values())
    for version in versions_covered(kernel):
        schema = onnx.defs.get_schema(kernel.op_type, version, kernel.domain)
        for name, attr in schema.attributes.items():
            if name not in params:
                assert has_var_kw, f"{kernel.op_type}-{version}: attribute {name!r} not accepted by the kernel"
                continue
            want = schema_default(attr)
            got = params[name]
            if want is None:
                continue  # required, or optional without a default: any Python default is fine
            assert got is not inspect.Parameter.empty and same(got, want), (
                f"{kernel.op_type}-{version}: attribute {name!r} defaults to {got!r} in the kernel, {want!r} in onnx.defs"
            )
