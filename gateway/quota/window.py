"""Sliding-window arithmetic over per-bucket counters: the Python reference for the Lua scripts.

A window is a mapping bucket index -> amount, where bucket `i` covers server time
[i * bucket_ms, (i + 1) * bucket_ms). A check at time `now` counts every bucket whose index is
in [slot - buckets_per_window, slot] (slot = now // bucket_ms): that span starts at least
`window_ms` and at most `window_ms + bucket_ms` before `now`. Counting one bucket too many is what
makes the limit exact (never more than `limit` inside ANY `window_ms` span) at the price of
keeping usage up to one bucket longer than a perfect sliding log would. Unlike a token bucket
(GCRA) it does not allow a full burst plus a full refill inside one window.

`gateway/quota/lua/*.lua` mirror these functions line for line; tests compare the two.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from dataclasses import dataclass

DAY_MS = 86_400_000


@dataclass(frozen=True)
class Geometry:
    """Window length and bucket width; the window must be a whole number of buckets."""

    window_ms: int = 60_000
    bucket_ms: int = 1_000

    def __post_init__(self) -> None:
        assert self.bucket_ms > 0 and self.window_ms % self.bucket_ms == 0, self

    @property
    def buckets(self) -> int:
        return self.window_ms // self.bucket_ms

    def slot(self, now_ms: int) -> int:
        return now_ms // self.bucket_ms

    def expires_at(self, index: int) -> int:
        """Server time at which bucket `index` stops counting."""
        return (index + self.buckets + 1) * self.bucket_ms


@dataclass(frozen=True)
class WindowRead:
    used: int
    live: tuple[tuple[int, int], ...]  # (bucket index, amount), oldest first


def read_window(buckets: MutableMapping[int, int], now_ms: int, geo: Geometry) -> WindowRead:
    """Drop buckets that no longer count and sum the rest."""
    oldest = geo.slot(now_ms) - geo.buckets
    for index in [i for i in buckets if i < oldest]:
        del buckets[index]
    # Zero buckets (fully refunded) are kept until they age out but do not delay the reset time.
    live = tuple(sorted((i, amount) for i, amount in buckets.items() if amount > 0))
    return WindowRead(used=sum(amount for _, amount in live), live=live)


def wait_ms(read: WindowRead, cost: int, limit: int, now_ms: int, geo: Geometry) -> int:
    """How long until `cost` more fits under `limit`, assuming nothing else is admitted meanwhile.

    Walks buckets oldest first: the wait ends when enough of them have left the window.
    """
    need = read.used + cost - limit
    if need <= 0:
        return 0
    freed = 0
    for index, amount in read.live:
        freed += amount
        if freed >= need:
            return geo.expires_at(index) - now_ms
    # Only reachable when cost > limit, which callers reject before asking.
    return geo.window_ms


def reset_ms(read: WindowRead, now_ms: int, geo: Geometry) -> int:
    """How long until the window is empty again (OpenAI's x-ratelimit-reset-* meaning)."""
    if not read.live:
        return 0
    return geo.expires_at(read.live[-1][0]) - now_ms
