"""The policy file schema: a parsed YAML document in, validated TenantPolicy values out.

    tenants:
      - id: acme-eu                      # required
        api_keys: ["sha256:<hex>", ...]  # required; hashes only
        models: "*" | [name, ...]        # default "*"
        residency: {jurisdictions: [...], regions: [...]}   # default: anywhere
        tier: interactive | batch        # default interactive
        limits: {requests_per_minute, tokens_per_minute, concurrent_requests,
                 daily_tokens, max_tokens, context_tokens}  # each default null = unlimited
        allow_commercial: bool           # default false
        allow_degrade: bool              # default false
        fail_mode: open | closed         # default open
        prefix_cache: shared | isolated  # default shared
        safety: {...}                    # default none: no content checks (safety_schema.py)
        trace_content: bool              # default false: no prompt/completion text in traces
        escalation: {threshold, k_tokens, window}  # `auto` cascade; each default: the gateway's

policies/README.md has the full table. The defaults are TenantPolicy's own.
"""

from __future__ import annotations

import math
import re
from typing import Any, get_args

from gateway.policy.fields import (
    Where,
    boolean,
    choice,
    mapping,
    positive_int_or_none,
    shown,
    string,
    string_list,
)
from gateway.policy.keys import parse_key_hash
from gateway.policy.safety_schema import parse_safety
from gateway.safety.policy import SafetyPolicy
from router.confidence import MAX_K_TOKENS
from router.types import (
    EscalationOverrides,
    FailMode,
    PrefixCacheMode,
    Residency,
    TenantLimits,
    TenantPolicy,
    TrafficTier,
)

TENANT_FIELDS = (
    "models",
    "residency",
    "tier",
    "limits",
    "allow_commercial",
    "allow_degrade",
    "fail_mode",
    "prefix_cache",
    "safety",
    "trace_content",
    "escalation",
)
LIMIT_FIELDS = (
    "requests_per_minute",
    "tokens_per_minute",
    "concurrent_requests",
    "daily_tokens",
    "max_tokens",
    "context_tokens",
)
# Tenant ids end up in Redis keys, metrics labels and headers: no braces (Redis Cluster hash
# tags), spaces or colons.
_TENANT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


ParsedTenant = tuple[TenantPolicy, Where, SafetyPolicy | None]


def parse_document(document: Any, file: str) -> list[ParsedTenant]:
    """Every tenant in one file, each with its position (for duplicate errors across files) and
    its content policy (None: no content checks)."""
    root = Where(file)
    if document is None:
        raise root.error("the file is empty; expected a mapping with a 'tenants' list")
    top = mapping(document, root, required=("tenants",), optional=())
    where = root.key("tenants")
    if not isinstance(top["tenants"], list):
        raise where.error("expected a list of tenants")
    parsed = []
    for i, entry in enumerate(top["tenants"]):
        at = where.index(i)
        tenant = parse_tenant(entry, at)
        safety = entry.get("safety")
        parsed.append((tenant, at, parse_safety(safety, at.key("safety")) if safety is not None else None))
    return parsed


def parse_tenant(entry: Any, where: Where) -> TenantPolicy:
    fields = mapping(entry, where, required=("id", "api_keys"), optional=TENANT_FIELDS)
    defaults = TenantPolicy(tenant_id="-", api_key_hashes=frozenset())
    return TenantPolicy(
        tenant_id=_tenant_id(fields["id"], where.key("id")),
        api_key_hashes=_key_hashes(fields["api_keys"], where.key("api_keys")),
        models=_models(fields["models"], where.key("models")) if "models" in fields else defaults.models,
        residency=_residency(fields.get("residency", {}), where.key("residency")),
        traffic_tier=_pick(fields, "tier", where, TrafficTier, defaults.traffic_tier),  # type: ignore[arg-type]
        limits=_limits(fields.get("limits", {}), where.key("limits")),
        allow_commercial=boolean(fields.get("allow_commercial", False), where.key("allow_commercial")),
        allow_degrade=boolean(fields.get("allow_degrade", False), where.key("allow_degrade")),
        fail_mode=_pick(fields, "fail_mode", where, FailMode, defaults.fail_mode),  # type: ignore[arg-type]
        prefix_cache=_pick(fields, "prefix_cache", where, PrefixCacheMode, defaults.prefix_cache),  # type: ignore[arg-type]
        trace_content=boolean(fields.get("trace_content", False), where.key("trace_content")),
        escalation=_escalation(fields.get("escalation", {}), where.key("escalation")),
    )


def _pick(fields: dict[str, Any], name: str, where: Where, literal: Any, default: str) -> str:
    return choice(fields.get(name, default), where.key(name), get_args(literal))


def _tenant_id(value: Any, where: Where) -> str:
    text = string(value, where)
    if not _TENANT_ID.fullmatch(text):
        raise where.error(
            f"expected letters, digits, '.', '_' or '-' (at most 64, starting with a letter or digit), got {text!r}"
        )
    return text


def _key_hashes(value: Any, where: Where) -> frozenset[str]:
    if not isinstance(value, list):
        raise where.error("expected a list of 'sha256:<hex>' key hashes")
    digests = set()
    for i, item in enumerate(value):
        digest = parse_key_hash(item) if isinstance(item, str) and item.startswith("sha256:") else None
        if digest is None:
            # Never echo the value: someone may have pasted a plaintext key, and errors get logged.
            raise where.index(i).error(
                "expected 'sha256:' and 64 hex digits, the hash of a key and never the key itself "
                "(make one with: python -m gateway.policy hash-key KEY)"
            )
        digests.add(digest)
    return frozenset(digests)


def _models(value: Any, where: Where) -> frozenset[str]:
    if value == "*":
        return frozenset({"*"})
    if not isinstance(value, list):
        raise where.error('expected "*" (every model) or a list of model names')
    return frozenset(string_list(value, where))


def _residency(value: Any, where: Where) -> Residency:
    fields = mapping(value, where, required=(), optional=("jurisdictions", "regions"))
    return Residency(
        jurisdictions=frozenset(string_list(fields.get("jurisdictions", []), where.key("jurisdictions"))),
        regions=frozenset(string_list(fields.get("regions", []), where.key("regions"))),
    )


def _limits(value: Any, where: Where) -> TenantLimits:
    fields = mapping(value, where, required=(), optional=LIMIT_FIELDS)
    limits = TenantLimits(
        **{name: positive_int_or_none(fields.get(name), where.key(name)) for name in LIMIT_FIELDS}
    )
    if limits.max_tokens and limits.context_tokens and limits.max_tokens > limits.context_tokens:
        raise where.key("max_tokens").error(
            f"max_tokens ({limits.max_tokens}) cannot exceed context_tokens ({limits.context_tokens})"
        )
    return limits


def _escalation(value: Any, where: Where) -> EscalationOverrides:
    fields = mapping(value, where, required=(), optional=("threshold", "k_tokens", "window"))
    threshold = fields.get("threshold")
    if threshold is not None and (
        isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not math.isfinite(threshold)
    ):
        raise where.key("threshold").error(
            f"expected a number (a mean log-probability, e.g. -2.5), got {shown(threshold)}"
        )
    overrides = EscalationOverrides(
        threshold=None if threshold is None else float(threshold),
        k_tokens=positive_int_or_none(fields.get("k_tokens"), where.key("k_tokens")),
        window=positive_int_or_none(fields.get("window"), where.key("window")),
    )
    if overrides.k_tokens is not None and overrides.k_tokens > MAX_K_TOKENS:
        raise where.key("k_tokens").error(
            f"at most {MAX_K_TOKENS} tokens are held back, got {overrides.k_tokens}"
        )
    if overrides.k_tokens and overrides.window and overrides.window > overrides.k_tokens:
        raise where.key("window").error(
            f"window ({overrides.window}) cannot exceed k_tokens ({overrides.k_tokens})"
        )
    return overrides
