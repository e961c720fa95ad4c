"""The kernels compile for an H100 (sm_90) through Triton's real GPU pipeline, to cubin, on a
machine without a GPU: the compiled path the interpreter-based tests never take."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.engine.triton_backend.conftest import needs_triton

REPO = Path(__file__).resolve().parents[3]


@needs_triton
@pytest.mark.slow
def test_kernels_compile_to_cubin_for_sm90(tmp_path: Path) -> None:
    # Its own process: this session's kernels are interpreter functions, which cannot be compiled.
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)  # an empty cache, so everything really compiles
    proc = subprocess.run(
        [sys.executable, "-m", "tests.engine.triton_backend.gpu_compile", "90"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = proc.stdout.splitlines()
    assert len(lines) == 7 and all("cubin" in line and " 0 bytes" not in line for line in lines)
