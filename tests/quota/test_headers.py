"""OpenAI's header formats."""

from __future__ import annotations

import pytest

from gateway.quota.headers import format_duration, retry_after_headers


@pytest.mark.parametrize(
    ("ms", "text"),
    [(0, "0ms"), (120, "120ms"), (1000, "1s"), (1500, "1.5s"), (61_000, "1m1s"), (360_000, "6m0s"),
     (3_723_500, "1h2m3.5s")],
)  # fmt: skip
def test_durations_are_written_like_openai(ms: int, text: str) -> None:
    assert format_duration(ms) == text


@pytest.mark.parametrize(("ms", "seconds"), [(0, "1"), (1, "1"), (1000, "1"), (1001, "2"), (51_000, "51")])
def test_retry_after_is_whole_seconds_at_least_one(ms: int, seconds: str) -> None:
    assert retry_after_headers(ms)["retry-after"] == seconds
