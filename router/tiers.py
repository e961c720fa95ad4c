"""Model tiers: resolving a requested name (or "auto") to a catalog model, and the degrade target.

The "auto" rule (see router/README.md): the large tier when the request is big —
prompt_tokens + max_tokens above `large_above_tokens` — or when an interactive tenant asks for a
long answer — max_tokens above `interactive_long_output`; otherwise the small tier. A missing
max_tokens counts as 0. The first catalog model of the chosen tier the tenant may use wins; if
the tenant may use none of that tier, the first allowed model of the other tier does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from router.errors import ModelNotAllowedError, UnknownModelError
from router.types import AUTO_MODEL, CatalogModel, ModelTier, TenantPolicy


@dataclass(frozen=True)
class AutoRule:
    large_above_tokens: int = 2048
    interactive_long_output: int = 512


DEFAULT_AUTO_RULE = AutoRule()


def auto_tier(
    policy: TenantPolicy, *, prompt_tokens: int, max_tokens: int | None, rule: AutoRule
) -> ModelTier:
    """The tier "auto" asks for; the rule in the module docstring."""
    output = max_tokens or 0
    if prompt_tokens + output > rule.large_above_tokens:
        return "large"
    if policy.traffic_tier == "interactive" and output > rule.interactive_long_output:
        return "large"
    return "small"


def resolve_model(
    requested: str,
    policy: TenantPolicy,
    catalog: Sequence[CatalogModel],
    *,
    prompt_tokens: int,
    max_tokens: int | None,
    rule: AutoRule = DEFAULT_AUTO_RULE,
) -> CatalogModel:
    """The catalog model that serves `requested` for this tenant.

    Raises UnknownModelError (not in the catalog; "auto" with an empty catalog) or
    ModelNotAllowedError (the tenant's `models` exclude it; "auto" when they exclude everything).
    """
    if requested == AUTO_MODEL:
        allowed = [m for m in catalog if policy.allows_model(m.name)]
        if not catalog:
            raise UnknownModelError(requested)
        if not allowed:
            raise ModelNotAllowedError(requested, policy.tenant_id)
        tier = auto_tier(policy, prompt_tokens=prompt_tokens, max_tokens=max_tokens, rule=rule)
        # sorted() is stable, so catalog order decides within a tier.
        return sorted(allowed, key=lambda m: m.tier != tier)[0]
    for model in catalog:
        if model.name == requested:
            if not policy.allows_model(model.name):
                raise ModelNotAllowedError(requested, policy.tenant_id)
            return model
    raise UnknownModelError(requested)


def degrade_model(model: str, policy: TenantPolicy, catalog: Sequence[CatalogModel]) -> CatalogModel | None:
    """The small-tier model that may take `model`'s overflow for this tenant, or None: only for a
    large-tier model, only when the policy allows degrading, only a model the tenant may use."""
    if not policy.allow_degrade:
        return None
    tiers = {m.name: m.tier for m in catalog}
    if tiers.get(model) != "large":
        return None
    return next((m for m in catalog if m.tier == "small" and policy.allows_model(m.name)), None)
