"""Thrash protection: a sliding escalation rate per (tenant, model family), and a cool-down.

Routing thrash is the small model failing its confidence check, escalating, and both tiers being
paid for. The guard counts each `auto` request that started on the small tier, and whether the
cascade escalated it, over the last `window_s` seconds per (tenant, family). Once at least
`min_requests` are in the window and the escalated share is over `max_rate`, the pair cools down:
for `cool_down_s` every `auto` request of that tenant starts on the large tier (router.choose_tier
reads `EscalationHistory.cooling_down` and says `thrash_cooldown=rate:0.62` in the route reason).
The window is cleared when a cool-down starts, so the requests after it are judged afresh rather
than by the escalations that caused it.

In-process, like the admission queue: each gateway replica judges its own share of the traffic.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from router.classifier import NO_HISTORY, EscalationHistory

# Events kept per (tenant, family): enough for any sensible window at thousands of requests/s
# over a short window, and a bound on memory whatever the traffic.
MAX_EVENTS = 4096


@dataclass(frozen=True)
class ThrashRule:
    window_s: float = 300.0
    max_rate: float = 0.5  # cool down when more than this share of the window escalated
    min_requests: int = 20  # no verdict on fewer requests than this
    cool_down_s: float = 120.0


@dataclass
class _Pair:
    events: deque[tuple[float, bool]] = field(default_factory=lambda: deque(maxlen=MAX_EVENTS))
    escalated: int = 0
    cooling_until: float = float("-inf")
    tripped_rate: float = 0.0


class ThrashGuard:
    def __init__(self, rule: ThrashRule, clock: Callable[[], float] = time.monotonic) -> None:
        self._rule = rule
        self._clock = clock
        self._pairs: dict[tuple[str, str], _Pair] = {}

    def record(self, tenant: str, family: str, *, escalated: bool) -> None:
        """One `auto` request that started on the small tier of `family` has been judged."""
        now = self._clock()
        pair = self._pairs.setdefault((tenant, family), _Pair())
        if now < pair.cooling_until:
            return  # started on small before the cool-down began; the verdict is already in
        self._expire(pair, now)
        if len(pair.events) == MAX_EVENTS and pair.events[0][1]:
            pair.escalated -= 1  # the deque is about to drop its oldest event
        pair.events.append((now, escalated))
        pair.escalated += escalated
        rate = pair.escalated / len(pair.events)
        if len(pair.events) >= self._rule.min_requests and rate > self._rule.max_rate:
            pair.cooling_until = now + self._rule.cool_down_s
            pair.tripped_rate = rate
            pair.events.clear()
            pair.escalated = 0

    def history(self, tenant: str, family: str | None) -> EscalationHistory:
        """The pair's escalation rate now, and whether it is cooling down (what the classifier reads)."""
        pair = self._pairs.get((tenant, family)) if family is not None else None
        if pair is None:
            return NO_HISTORY
        now = self._clock()
        if now < pair.cooling_until:
            return EscalationHistory(rate=pair.tripped_rate, cooling_down=True)
        self._expire(pair, now)
        if not pair.events:
            return NO_HISTORY
        return EscalationHistory(rate=pair.escalated / len(pair.events))

    def _expire(self, pair: _Pair, now: float) -> None:
        horizon = now - self._rule.window_s
        while pair.events and pair.events[0][0] <= horizon:
            _, escalated = pair.events.popleft()
            pair.escalated -= escalated
