"""The usage event: one per request that reached the quota stage and was settled.

It travels as JSON (one Redis Stream entry field, or one item of the in-process outbox) from the
settlement to the ledger worker, which writes it to the store. The latency fields come from the
call's breakdown (CallContext.latency, gateway/call/latency.py); the node-side ones (queue
wait, prefill, decode) are None where no node reported them (a provider, a failed call).
"""

from __future__ import annotations

import msgspec


class UsageEvent(msgspec.Struct, kw_only=True, frozen=True):
    request_id: str
    ts_ms: int  # settlement time, gateway wall clock, ms since the epoch
    tenant_id: str
    api_key_id: str  # a short hash of the key (gateway/policy/keys.py:api_key_id), never the key
    model_requested: str  # the catalog model the plan chose (after "auto" tiering)
    model: str  # the model that served it ("-" when nothing did)
    tier: str  # the tenant's traffic tier
    region: str = "-"
    jurisdiction: str = "-"
    upstream: str = "-"  # node id or provider id
    route_reason: str = "-"
    status: str  # ok | failed | stream_error | incomplete | escalated (the small tier's part)
    stream: bool = False
    prompt_tokens: int = 0  # cached ones included, as OpenAI counts them
    cached_tokens: int = 0
    completion_tokens: int = 0
    usage_estimated: bool = False  # no upstream usage reached the gateway; counts are its own
    cost_usd: float = 0.0
    price_version: str = ""
    total_ms: float = 0.0
    gateway_overhead_ms: float | None = None  # total minus the time spent waiting on upstreams
    ttft_ms: float | None = None  # request received -> first upstream chunk (or whole answer)
    queue_wait_ms: float | None = None  # node side, as the node reported it
    prefill_ms: float | None = None
    decode_ms: float | None = None
    retries: int = 0  # failed targets before the one that answered
    continuations: int = 0  # stream continuations on another upstream after a break
    degraded: bool = False  # admission served it from the small tier
    safety: bool = False  # a content check redacted or blocked something (gateway/safety)
    model_version: str = ""  # the version of `model` that served it (rollouts); "": unversioned


_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(UsageEvent)
# One settlement's entry: one event, or several settled together (an escalated `auto` request's
# small-tier attempt beside its answer) as a JSON array, so they are written or lost together.
_ENTRY_DECODER = msgspec.json.Decoder(UsageEvent | list[UsageEvent])


def encode_event(event: UsageEvent) -> bytes:
    return _ENCODER.encode(event)


def encode_events(events: list[UsageEvent]) -> bytes:
    return _ENCODER.encode(events[0] if len(events) == 1 else events)


def decode_event(data: bytes | str) -> UsageEvent:
    """msgspec.DecodeError / ValidationError for a malformed entry."""
    return _DECODER.decode(data)


def decode_events(data: bytes | str) -> list[UsageEvent]:
    """The events of one entry (encode_event's or encode_events'); errors as decode_event."""
    decoded = _ENTRY_DECODER.decode(data)
    return decoded if isinstance(decoded, list) else [decoded]
