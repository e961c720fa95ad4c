"""What the gateway keeps of each (tenant, auto family)'s escalations: the rate the classifier
reads, and thrash protection (a sliding window and a cool-down).

**The rate** (router/classifier.py's `escalation_rate` feature) is a statistic of judged
requests: those that started on the small tier and were judged by the confidence cascade. Each
verdict counts with a weight that halves every `half_life_s`; the rate is the escalated share of
the weights, and there is none (NO_HISTORY) until the weights add up to `min_judged`. So one
escalation cannot move a tenant, and old ones fade. The rate is only measured on requests that
start small, and a high rate starts requests large, where nobody judges them: without more
verdicts it could never fall. So a request the rate alone would send to the large tier starts
small anyway with probability `judge_share` (`EscalationHistory.judge_sample`, drawn from a hash
of the request id: the same id, the same draw on every replica and in every test run).

**Routing thrash** is the small model failing its confidence check, escalating, and both tiers
being paid for. The guard also counts each verdict over the last `window_s` seconds. Once at
least `min_requests` are in the window and the escalated share is over `max_rate`, the pair cools
down: for `cool_down_s` every `auto` request of that tenant starts on the large tier
(router.choose_tier reads `EscalationHistory.cooling_down` and says `thrash_cooldown=rate:0.62`
in the route reason). The window and the rate are cleared when a cool-down starts, so the
requests after it are judged afresh rather than by the escalations that caused it.

In-process, like the admission queue: each gateway replica judges its own share of the traffic.
"""

from __future__ import annotations

import hashlib
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


@dataclass(frozen=True)
class RateRule:
    """How the escalation rate the classifier reads is measured (the module docstring)."""

    half_life_s: float = 60.0  # a verdict's weight halves every this long
    min_judged: float = 5.0  # no rate until the verdicts' weights add up to this
    judge_share: float = 0.1  # of requests the rate alone sends large, the share started small


DEFAULT_RATE = RateRule()


@dataclass
class _Decayed:
    """Judged and escalated requests, each weighing 0.5 ** (age / half-life)."""

    judged: float = 0.0
    escalated: float = 0.0
    at: float = 0.0  # when the weights were last brought up to date

    def decay(self, now: float, half_life_s: float) -> None:
        factor = 0.5 ** (max(now - self.at, 0.0) / half_life_s)
        self.judged *= factor
        self.escalated *= factor
        self.at = now


@dataclass
class _Pair:
    events: deque[tuple[float, bool]] = field(default_factory=lambda: deque(maxlen=MAX_EVENTS))
    escalated: int = 0
    rate: _Decayed = field(default_factory=_Decayed)
    cooling_until: float = float("-inf")
    tripped_rate: float = 0.0


class ThrashGuard:
    def __init__(
        self,
        rule: ThrashRule,
        clock: Callable[[], float] = time.monotonic,
        *,
        rate: RateRule = DEFAULT_RATE,
    ) -> None:
        assert rate.half_life_s > 0, "the rate's half-life must be positive"
        self._rule = rule
        self._rate = rate
        self._clock = clock
        self._pairs: dict[tuple[str, str], _Pair] = {}

    def record(self, tenant: str, family: str, *, escalated: bool) -> None:
        """One `auto` request that started on the small tier of `family` has been judged."""
        now = self._clock()
        pair = self._pairs.setdefault((tenant, family), _Pair())
        if now < pair.cooling_until:
            return  # started on small before the cool-down began; the verdict is already in
        pair.rate.decay(now, self._rate.half_life_s)
        pair.rate.judged += 1.0
        pair.rate.escalated += escalated
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
            pair.rate = _Decayed(at=now)

    def history(self, tenant: str, family: str | None, request_id: str | None = None) -> EscalationHistory:
        """What the classifier reads for one request: the pair's escalation rate now (none below
        `min_judged`), whether it is cooling down, and whether `request_id` is drawn into the
        judged sample."""
        pair = self._pairs.get((tenant, family)) if family is not None else None
        if pair is None:
            return NO_HISTORY
        now = self._clock()
        if now < pair.cooling_until:
            return EscalationHistory(rate=pair.tripped_rate, cooling_down=True)
        self._expire(pair, now)
        pair.rate.decay(now, self._rate.half_life_s)
        if pair.rate.judged < self._rate.min_judged:
            return NO_HISTORY
        return EscalationHistory(
            rate=pair.rate.escalated / pair.rate.judged,
            judge_sample=request_id is not None and _drawn(request_id, self._rate.judge_share),
        )

    def _expire(self, pair: _Pair, now: float) -> None:
        horizon = now - self._rule.window_s
        while pair.events and pair.events[0][0] <= horizon:
            _, escalated = pair.events.popleft()
            pair.escalated -= escalated


def _drawn(request_id: str, share: float) -> bool:
    """Whether the request falls in `share` of all ids: a 64-bit BLAKE2b of the id, scaled to
    [0, 1) (hashlib, not Python's per-process salted hash(), so replicas and test runs agree)."""
    digest = hashlib.blake2b(request_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64 < share
