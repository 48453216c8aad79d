"""onnx's node conformance cases against minfer_core.testing.backend.

Every case of an op that an installed plugin claims (or that runs through its
ONNX function body) must pass, or be listed in expected_failures.txt with a
reason. Cases whose op nothing provides are skipped as unsupported.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from minfer_core import UnsupportedOpError
from minfer_core.testing.conformance import claimed, load_cases, run_case

EXPECTATIONS = Path(__file__).with_name("expected_failures.txt")


def expected_failures() -> dict[str, str]:
    """case name -> written reason, from expected_failures.txt (``name: reason`` lines)."""
    table = {}
    for line in EXPECTATIONS.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, _, reason = line.partition(":")
            assert reason.strip(), f"expected_failures.txt: {name} has no written reason"
            table[name.strip()] = reason.strip()
    return table


CASES = load_cases()
EXPECTED = expected_failures()


def test_every_expected_failure_names_a_real_case():
    """expected_failures.txt lists only cases that exist."""
    names = {c.name for c in CASES}
    assert not set(EXPECTED) - names


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_node_case(case):
    """The case's outputs match onnx's expected outputs (shape, dtype, rtol/atol of the case)."""
    if case.name in EXPECTED:
        pytest.xfail(EXPECTED[case.name])
    is_claimed = claimed(case)
    try:
        run_case(case)
    except UnsupportedOpError as exc:
        if is_claimed:
            raise
        pytest.skip(f"unsupported: no installed plugin provides {case.op_type[1]} ({str(exc).splitlines()[-1].strip()})")
