"""Shared pytest set-up. Fixture modules used across test folders live in tests/support/."""

import os

import pytest

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

# The modules that take longest (a minute or more each on a slow 2-core machine: vLLM's and
# Triton's interpreters, the gateway-only install, the hostile-input fuzzers) go first.
# `--dist loadscope` hands whole modules to the two workers in collection order, so one of them
# collected last (node_vllm, after the alphabet's gateway and install) runs alone at the end while
# the other worker has nothing left: about a minute of the suite's wall time.
_LONGEST_FIRST = (
    "tests/engine/triton_backend/",
    "tests/node_vllm/",
    "tests/engine/vllm_backend/",
    "tests/install/test_gateway_only_install.py",
    "tests/engine/test_speculative_draft.py",
    "tests/gateway/test_hostile_input.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        return next(
            (i for i, prefix in enumerate(_LONGEST_FIRST) if item.nodeid.startswith(prefix)),
            len(_LONGEST_FIRST),
        )

    items.sort(key=rank)  # stable: the rest keep their order
