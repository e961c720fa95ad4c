"""The triton backend's tests run its kernels on the CPU, in Triton's interpreter.

`@triton.jit` picks compiled or interpreted when it decorates, and triton.language decorates its
own helpers (tl.cdiv, ...) when triton is first imported, so TRITON_INTERPRET=1 must be set before
anything imports triton. So the tests here never import it at collection (`needs_triton` only
looks for it); a session fixture sets the variable the first time one of them runs, and restores
it when the session ends (Triton also reads it at launch time). Nothing else in the suite
imports triton (the torch backend never does); processes started by later tests inherit a
variable that only Triton reads.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator

import pytest

needs_triton = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None,
    reason="the triton backend's tests need the triton package (in the test extra)",
)


@pytest.fixture(scope="session", autouse=True)
def triton_interpreter() -> Iterator[None]:
    before = os.environ.get("TRITON_INTERPRET")
    if "triton" in sys.modules and before != "1":
        pytest.fail("triton was imported before TRITON_INTERPRET=1 was set: its kernels are compiled")
    os.environ["TRITON_INTERPRET"] = "1"
    from regional_node.engine.attention import triton_kernels

    assert triton_kernels.INTERPRETED
    yield
    if before is None:
        del os.environ["TRITON_INTERPRET"]
    else:
        os.environ["TRITON_INTERPRET"] = before
