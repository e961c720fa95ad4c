"""The policy file schema: typed structs read by gateway/config_reader.py (as the gateway's config
is), then turned into the router's TenantPolicy values.

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

policies/README.md has the full table. Strict on purpose: a policy is security configuration, and a
value that only looks right (the string "1000" for a limit, a misspelt key) must fail loudly
rather than silently lift a limit.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Literal

import msgspec

from gateway.config_reader import FieldError, Section, convert
from gateway.policy.errors import PolicyError, Where
from gateway.policy.keys import parse_key_hash
from gateway.policy.safety_schema import SafetySection
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

Name = Annotated[str, msgspec.Meta(min_length=1)]
# null: no limit. Booleans and floats are not integers here.
Limit = Annotated[int, msgspec.Meta(gt=0)] | None
# Tenant ids end up in Redis keys, metrics labels and headers: no braces (Redis Cluster hash
# tags), spaces or colons.
_TENANT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_DEFAULT = TenantPolicy(tenant_id="-", api_key_hashes=frozenset())


class ResidencySection(Section):
    jurisdictions: list[Name] = []
    regions: list[Name] = []


class LimitsSection(Section):
    requests_per_minute: Limit = None
    tokens_per_minute: Limit = None
    concurrent_requests: Limit = None
    daily_tokens: Limit = None
    max_tokens: Limit = None
    context_tokens: Limit = None

    def __post_init__(self) -> None:
        if self.max_tokens and self.context_tokens and self.max_tokens > self.context_tokens:
            raise ValueError(
                f"max_tokens: max_tokens ({self.max_tokens}) cannot exceed context_tokens ({self.context_tokens})"
            )


class EscalationSection(Section):
    threshold: Annotated[float, msgspec.Meta(description="a mean log-probability, e.g. -2.5")] | None = None
    k_tokens: Annotated[int, msgspec.Meta(gt=0, le=MAX_K_TOKENS)] | None = None
    window: Annotated[int, msgspec.Meta(gt=0)] | None = None

    def __post_init__(self) -> None:
        if self.threshold is not None and not math.isfinite(self.threshold):
            raise ValueError(
                f"threshold: expected a finite number (a mean log-probability), got {self.threshold}"
            )
        if self.k_tokens and self.window and self.window > self.k_tokens:
            raise ValueError(f"window: window ({self.window}) cannot exceed k_tokens ({self.k_tokens})")


class TenantSection(Section):
    id: str
    api_keys: list[str]
    models: Literal["*"] | list[Name] = "*"
    residency: ResidencySection = ResidencySection()
    tier: TrafficTier = _DEFAULT.traffic_tier
    limits: LimitsSection = LimitsSection()
    allow_commercial: bool = _DEFAULT.allow_commercial
    allow_degrade: bool = _DEFAULT.allow_degrade
    fail_mode: FailMode = _DEFAULT.fail_mode
    prefix_cache: PrefixCacheMode = _DEFAULT.prefix_cache
    safety: SafetySection | None = None
    trace_content: bool = _DEFAULT.trace_content
    escalation: EscalationSection = EscalationSection()

    def __post_init__(self) -> None:
        if not _TENANT_ID.fullmatch(self.id):
            raise ValueError(
                "id: expected letters, digits, '.', '_' or '-' (at most 64, starting with a letter or "
                f"digit), got {self.id!r}"
            )
        for i, item in enumerate(self.api_keys):
            if not item.startswith("sha256:") or parse_key_hash(item) is None:
                # Never echo the value: someone may have pasted a plaintext key, and errors get logged.
                raise ValueError(
                    f"api_keys[{i}]: expected 'sha256:' and 64 hex digits, the hash of a key and never "
                    "the key itself (make one with: python -m gateway.policy hash-key KEY)"
                )

    def policy(self) -> TenantPolicy:
        limits, escalation = self.limits, self.escalation
        return TenantPolicy(
            tenant_id=self.id,
            api_key_hashes=frozenset(parse_key_hash(key) for key in self.api_keys),  # type: ignore[misc]
            models=frozenset({"*"}) if self.models == "*" else frozenset(self.models),
            residency=Residency(
                jurisdictions=frozenset(self.residency.jurisdictions),
                regions=frozenset(self.residency.regions),
            ),
            traffic_tier=self.tier,
            limits=TenantLimits(**msgspec.structs.asdict(limits)),
            allow_commercial=self.allow_commercial,
            allow_degrade=self.allow_degrade,
            fail_mode=self.fail_mode,
            prefix_cache=self.prefix_cache,
            trace_content=self.trace_content,
            escalation=EscalationOverrides(
                threshold=escalation.threshold, k_tokens=escalation.k_tokens, window=escalation.window
            ),
        )


class PolicyFile(Section):
    tenants: list[TenantSection]


ParsedTenant = tuple[TenantPolicy, Where, SafetyPolicy | None]


def parse_document(document: Any, file: str) -> list[ParsedTenant]:
    """Every tenant in one file, each with its position (for duplicate errors across files) and
    its content policy (None: no content checks)."""
    if document is None:
        raise PolicyError(file, "", "the file is empty; expected a mapping with a 'tenants' list")
    try:
        parsed = convert(document, PolicyFile)
    except FieldError as exc:
        raise PolicyError(file, exc.path.removeprefix("$").removeprefix("."), exc.message) from None
    return [
        (tenant.policy(), Where(file, f"tenants[{i}]"), tenant.safety.policy() if tenant.safety else None)
        for i, tenant in enumerate(parsed.tenants)
    ]
