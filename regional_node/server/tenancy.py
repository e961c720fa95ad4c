"""Who a request is for, from the gateway's `x-meridian-*` hints: tenant, priority, cache salt.

A node trusts these headers because only the gateway (holding the node token) may call it; a
user running a node alone gets sensible defaults from the OpenAI `user` field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, cast

from protocol import InvalidRequestError

Priority = Literal["interactive", "batch"]
PRIORITIES: tuple[Priority, ...] = ("interactive", "batch")

TENANT_HEADER = "x-meridian-tenant"
PRIORITY_HEADER = "x-meridian-priority"
CACHE_SALT_HEADER = "x-meridian-cache-salt"
DEFAULT_TENANT = "anonymous"
# Tenant names become metric labels; a cap keeps one odd client from bloating every series.
MAX_TENANT_LENGTH = 128


@dataclass(frozen=True)
class Tenancy:
    tenant: str
    priority: Priority
    cache_salt: str | None


def tenancy_from(headers: Mapping[str, str], user: str | None) -> Tenancy:
    """Read the hints; an unknown priority is a 400 rather than a silent downgrade."""
    tenant = (headers.get(TENANT_HEADER) or "").strip() or (user or "").strip() or DEFAULT_TENANT
    priority = (headers.get(PRIORITY_HEADER) or "interactive").strip().lower()
    if priority not in PRIORITIES:
        raise InvalidRequestError(
            f"Header {PRIORITY_HEADER} must be one of {', '.join(PRIORITIES)}, got {priority!r}.",
            param=PRIORITY_HEADER,
        )
    salt = (headers.get(CACHE_SALT_HEADER) or "").strip() or None
    return Tenancy(tenant=tenant[:MAX_TENANT_LENGTH], priority=cast(Priority, priority), cache_salt=salt)
