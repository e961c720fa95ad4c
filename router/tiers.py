"""Model tiers: resolving a requested name (or "auto") to a catalog model, and the degrade target.

"auto" starts on the tier one rule picks (`AutoPolicy.rule`, router/README.md "model: auto"):
- `classifier` (the default): router/classifier.py's linear score over the request's features;
- `length`, the rule before it: the large tier when the request is big — prompt_tokens +
  max_tokens above `large_above_tokens` — or when an interactive tenant asks for a long answer —
  max_tokens above `interactive_long_output`; otherwise the small tier. A missing max_tokens
  counts as 0.
Either way, a tenant in its thrash cool-down (its `auto` traffic escalated too often lately)
starts on the large tier. The first catalog model of the chosen tier the tenant may use wins; if
the tenant may use none of that tier, the first allowed model of the other tier does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from router.classifier import DEFAULT_WEIGHTS, ClassifierWeights, RequestFeatures, TierChoice, classify
from router.errors import ModelNotAllowedError, UnknownModelError
from router.types import AUTO_MODEL, CatalogModel, ModelTier, TenantPolicy

AutoRuleName = Literal["classifier", "length"]


@dataclass(frozen=True)
class AutoRule:
    """The length rule's thresholds."""

    large_above_tokens: int = 2048
    interactive_long_output: int = 512


DEFAULT_AUTO_RULE = AutoRule()


@dataclass(frozen=True)
class AutoPolicy:
    """How "auto" picks its starting tier (the gateway config's `auto:` section)."""

    rule: AutoRuleName = "classifier"
    classifier: ClassifierWeights = DEFAULT_WEIGHTS
    length: AutoRule = DEFAULT_AUTO_RULE


DEFAULT_AUTO = AutoPolicy()


@dataclass(frozen=True)
class Resolved:
    model: CatalogModel
    auto: TierChoice | None = None  # how "auto" chose; None for a named model


def auto_tier(
    policy: TenantPolicy, *, prompt_tokens: int, max_tokens: int | None, rule: AutoRule
) -> ModelTier:
    """The tier the length rule asks for; the rule in the module docstring."""
    output = max_tokens or 0
    if prompt_tokens + output > rule.large_above_tokens:
        return "large"
    if policy.traffic_tier == "interactive" and output > rule.interactive_long_output:
        return "large"
    return "small"


def choose_tier(
    policy: TenantPolicy, features: RequestFeatures, auto: AutoPolicy = DEFAULT_AUTO
) -> TierChoice:
    """The tier an "auto" request starts on, with the reason for the route header."""
    if features.history.cooling_down:
        return TierChoice(
            "large", f"thrash_cooldown=rate:{features.history.rate:.2f}", rule="thrash_cooldown"
        )
    if auto.rule == "length":
        tier = auto_tier(
            policy, prompt_tokens=features.prompt_tokens, max_tokens=features.max_tokens, rule=auto.length
        )
        return TierChoice(
            tier, f"length={features.prompt_tokens + (features.max_tokens or 0)}", rule="length"
        )
    return classify(replace(features, traffic_tier=policy.traffic_tier), auto.classifier)


def auto_family(policy: TenantPolicy, catalog: Sequence[CatalogModel]) -> str | None:
    """The model family whose escalations the thrash guard counts for this tenant's "auto"
    traffic: the small-tier model it starts on (None when the tenant may use no small model)."""
    return next((m.name for m in catalog if m.tier == "small" and policy.allows_model(m.name)), None)


def escalation_model(policy: TenantPolicy, catalog: Sequence[CatalogModel]) -> CatalogModel | None:
    """The large-tier model an `auto` request that started small escalates to: the first the
    tenant may use (None: it may use none, so it cannot escalate)."""
    return next((m for m in catalog if m.tier == "large" and policy.allows_model(m.name)), None)


def resolve_model(
    requested: str,
    policy: TenantPolicy,
    catalog: Sequence[CatalogModel],
    *,
    features: RequestFeatures,
    auto: AutoPolicy = DEFAULT_AUTO,
) -> Resolved:
    """The catalog model that serves `requested` for this tenant (and for "auto", why).

    Raises UnknownModelError (not in the catalog; "auto" with an empty catalog) or
    ModelNotAllowedError (the tenant's `models` exclude it; "auto" when they exclude everything).
    """
    if requested == AUTO_MODEL:
        allowed = [m for m in catalog if policy.allows_model(m.name)]
        if not catalog:
            raise UnknownModelError(requested)
        if not allowed:
            raise ModelNotAllowedError(requested, policy.tenant_id)
        choice = choose_tier(policy, features, auto)
        # sorted() is stable, so catalog order decides within a tier.
        model = sorted(allowed, key=lambda m: m.tier != choice.tier)[0]
        if model.tier != choice.tier:
            choice = replace(choice, tier=model.tier, reason=f"{choice.reason},no_{choice.tier}_allowed")
        return Resolved(model, choice)
    for model in catalog:
        if model.name == requested:
            if not policy.allows_model(model.name):
                raise ModelNotAllowedError(requested, policy.tenant_id)
            return Resolved(model)
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
