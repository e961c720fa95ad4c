"""Retry-After parsing: seconds, milliseconds and every HTTP-date form, always in GMT."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from gateway.upstreams.providers.errors import parse_retry_after

NOW = 1_700_000_000.0  # Tue, 14 Nov 2023 22:13:20 GMT


@pytest.fixture
def new_york_time(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A host whose local time is not UTC: HTTP-dates must still be read as GMT."""
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.mark.parametrize(
    "value",
    [
        "Tue, 14 Nov 2023 22:14:20 GMT",  # IMF-fixdate
        "Tuesday, 14-Nov-23 22:14:20 GMT",  # obsolete RFC 850
        "Tue Nov 14 22:14:20 2023",  # obsolete asctime: no zone, and it means GMT
        "Tue, 14 Nov 2023 22:14:20 -0000",
    ],
)
def test_http_date_is_read_as_gmt_whatever_the_local_zone(new_york_time: None, value: str) -> None:
    assert parse_retry_after({"retry-after": value}, now=NOW) == pytest.approx(60.0)


@pytest.mark.parametrize("header", ["retry-after", "retry-after-ms"])
@pytest.mark.parametrize("value", ["inf", "nan", "1e400"])
def test_non_finite_retry_after_is_ignored(header: str, value: str) -> None:
    """An infinite wait would take the target out until the gateway restarts."""
    assert parse_retry_after({header: value}, now=NOW) is None
