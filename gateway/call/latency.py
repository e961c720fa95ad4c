"""One call's latency breakdown as the gateway sees it: the one place that holds it.

The request path feeds it (time spent waiting on upstreams, and each upstream's own breakdown
as it reports it: protocol/timing.py); the client gets it as `Server-Timing` (and on streams in
the usage chunk's `timings` field); `meridian_gateway_overhead_seconds` observes `gateway_s`;
and anything that accounts for the request afterwards (the usage ledger) reads it from
`CallContext.latency`.

`gateway_s`, the gateway's overhead, is the call's total minus the time it waited on upstreams:
every attempt (failed ones and their back-off included, from sending the request to the first
chunk or the whole answer) and, on streams, every wait for the next upstream chunk. What is left
is the gateway's own work: parsing, auth, quota, routing, relaying; on a stream also the time a
slow client takes to read (the relay waits for it before it reads on). A non-streamed answer's
parts add up (the gateway waits while the node works); on a stream the gateway relays while the
node decodes, so `gateway` overlaps `decode` and only the node's parts add up.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from protocol.timing import Timing


@dataclass
class Latency:
    started: float = field(default_factory=time.monotonic)
    ended: float | None = None
    upstream_s: float = 0.0  # waiting on upstreams, all attempts and chunks together
    first_byte: float | None = None  # when the first upstream chunk (or whole answer) arrived
    # Each upstream that answered, in order (a continuation adds one): what it reported.
    upstreams: list[Timing] = field(default_factory=list)

    # -- fed by the request path -----------------------------------------------------------------

    def waited_since(self, since: float) -> None:
        """The request path waited on an upstream from `since` until now."""
        self.upstream_s += time.monotonic() - since

    def answered(self, timing: Timing) -> None:
        """An upstream answered (a whole response, or a stream's first chunk) reporting `timing`."""
        if self.first_byte is None:
            self.first_byte = time.monotonic()
        self.upstreams.append(timing)

    def finished_upstream(self, timing: Timing) -> None:
        """The current upstream's final report (a stream's usage chunk): replaces its first one."""
        if self.upstreams:
            self.upstreams[-1] = timing
        else:
            self.upstreams.append(timing)

    def finish(self) -> None:
        """The call ended (its last byte, or its error): the total stops here. Idempotent."""
        if self.ended is None:
            self.ended = time.monotonic()

    # -- what readers get --------------------------------------------------------------------------

    @property
    def total_s(self) -> float:
        return (self.ended if self.ended is not None else time.monotonic()) - self.started

    @property
    def gateway_s(self) -> float:
        return max(0.0, self.total_s - self.upstream_s)

    @property
    def ttft_s(self) -> float | None:
        """Arrival to the first upstream chunk (streams) or the whole answer (non-streamed)."""
        return None if self.first_byte is None else self.first_byte - self.started

    @property
    def queue_s(self) -> float | None:
        return _sum(t.queue for t in self.upstreams)

    @property
    def prefill_s(self) -> float | None:
        return _sum(t.prefill for t in self.upstreams)

    @property
    def decode_s(self) -> float | None:
        return _sum(t.decode for t in self.upstreams)

    def timing(self) -> Timing:
        """The whole breakdown (a continuation's queue, prefill and decode add to the first's)."""
        return Timing(
            gateway=self.gateway_s,
            queue=self.queue_s,
            prefill=self.prefill_s,
            decode=self.decode_s,
            total=self.total_s,
        )

    def at_first_byte(self) -> Timing:
        """What a stream's headers can say: the gateway's time so far, the queue and prefill."""
        return Timing(gateway=self.gateway_s, queue=self.queue_s, prefill=self.prefill_s)


def _sum(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None
