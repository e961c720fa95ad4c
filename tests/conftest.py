"""Shared pytest set-up. Fixture modules used across test folders live in tests/support/."""

pytest_plugins: list[str] = ["tests.support.checkpoints", "tests.support.redis_server"]
