"""The usage ledger: every settled request's usage event, priced, stored durably and queryable.

Settlement appends the event atomically (gateway/quota: the Redis script's XADD, or the
in-process outbox); `LedgerWorker` moves events into a `LedgerStore` (SQLite or PostgreSQL)
idempotently by request id; gateway/api/usage_routes.py serves /v1/usage and /v1/costs from it.
See README.md.
"""

from gateway.ledger.config import LedgerConfig
from gateway.ledger.event import UsageEvent, decode_event, encode_event
from gateway.ledger.prices import ModelPrice, PriceTable

__all__ = ["LedgerConfig", "ModelPrice", "PriceTable", "UsageEvent", "decode_event", "encode_event"]
