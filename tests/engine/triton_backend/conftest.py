"""The triton backend's tests run its kernels on the CPU, in Triton's interpreter.

`@triton.jit` picks compiled or interpreted when it decorates, and triton.language decorates its
own helpers (tl.cdiv, ...) when triton is first imported; torch._dynamo imports triton whenever
it is installed. So TRITON_INTERPRET=1 is set in tests/conftest.py, before any test runs; the
fixture here only checks that it took effect.
"""

from __future__ import annotations

import importlib.util

import pytest

needs_triton = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None,
    reason="the triton backend's tests need the triton package (in the test extra)",
)


@pytest.fixture(autouse=True)
def triton_interpreter() -> None:
    from regional_node.engine.attention import triton_kernels

    if not triton_kernels.INTERPRETED:
        pytest.fail("the triton kernels were imported without TRITON_INTERPRET=1: they would need a GPU")
