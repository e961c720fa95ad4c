"""Shared pytest set-up. Fixture modules used across test folders live in tests/support/."""

import os

# The triton attention backend's tests run its kernels in Triton's CPU interpreter, which Triton
# picks when it is first imported — and torch._dynamo (pulled in by transformers' generate)
# imports triton whenever it is installed, so the variable must be set before any test runs.
# Only Triton reads it; no test runs compiled Triton kernels (gpu_compile.py compiles without it).
os.environ["TRITON_INTERPRET"] = "1"

pytest_plugins: list[str] = [
    "tests.support.checkpoints",
    "tests.support.redis_server",
    "tests.support.postgres_server",
    "tests.support.redis_cluster",
]
