"""Shared pytest set-up. Fixture modules used across test folders live in tests/support/."""

import functools
import os
import ssl
from typing import Any

import httpx._transports.default as httpx_transports

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


def _share_the_default_ssl_context() -> None:
    """httpx builds a new SSL context for every client it makes, loading certifi's CA bundle into
    it: 50-100 ms of CPU each on this project's machines. The tests make thousands, all speaking
    plain HTTP to loopback (each `httpx.get`, so every poll of a starting server; each SDK client):
    two modules alone spent 23 s of CPU on them. So the default context (verify=True, no client
    certificate) is built once and shared, as httpx's docs advise; a test that sets up TLS passes
    its own context and gets it. An httpx without this function fails here, loudly."""
    build = httpx_transports.create_ssl_context
    shared = functools.cache(lambda trust_env: build(verify=True, trust_env=trust_env))

    def create_ssl_context(verify: Any = True, cert: Any = None, trust_env: bool = True) -> ssl.SSLContext:
        if verify is True and cert is None:
            return shared(trust_env)
        return build(verify=verify, cert=cert, trust_env=trust_env)

    httpx_transports.create_ssl_context = create_ssl_context


_share_the_default_ssl_context()
