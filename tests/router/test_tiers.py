"""resolve_model: names to catalog models, "auto" to a tier (classifier, length rule, thrash
cool-down), and the two refusals."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from router import (
    AUTO_MODEL,
    AutoRule,
    CatalogModel,
    ModelNotAllowedError,
    RoutingError,
    UnknownModelError,
    resolve_model,
)
from router.classifier import ClassifierWeights, EscalationHistory, RequestFeatures
from router.tiers import AutoPolicy, auto_family, choose_tier, escalation_model
from tests.router.builders import CATALOG, LARGE, SMALL, tenant

INTERACTIVE = tenant(traffic_tier="interactive")
BATCH = tenant(traffic_tier="batch")
LENGTH = AutoPolicy(rule="length")


def resolve(
    requested: str,
    policy=INTERACTIVE,
    *,
    prompt: int = 10,
    max_tokens: int | None = 100,
    auto: AutoPolicy = LENGTH,
    **features: object,
) -> str:
    request = RequestFeatures(prompt_tokens=prompt, max_tokens=max_tokens, **features)  # type: ignore[arg-type]
    return resolve_model(requested, policy, CATALOG, features=request, auto=auto).model.name


def test_a_named_model_resolves_to_itself() -> None:
    assert resolve(LARGE) == LARGE
    assert resolve(SMALL) == SMALL


def test_a_named_model_carries_no_auto_choice() -> None:
    request = RequestFeatures(prompt_tokens=1, max_tokens=1)

    assert resolve_model(LARGE, INTERACTIVE, CATALOG, features=request).auto is None


def test_unknown_model_is_refused_as_unknown() -> None:
    with pytest.raises(UnknownModelError) as caught:
        resolve("gpt-17")

    assert caught.value.model == "gpt-17"
    assert isinstance(caught.value, RoutingError)


def test_model_outside_the_tenants_list_is_refused_as_not_allowed() -> None:
    with pytest.raises(ModelNotAllowedError) as caught:
        resolve(LARGE, tenant(models=(SMALL,), tenant_id="frugal"))

    assert "frugal" in caught.value.message and LARGE in caught.value.message


# -- the classifier, the default rule --------------------------------------------------------


def test_the_classifier_is_the_default_rule() -> None:
    assert AutoPolicy().rule == "classifier"
    # The length rule sends "hi" with max_tokens 600 from an interactive tenant to large.
    assert resolve(AUTO_MODEL, prompt=5, max_tokens=600, auto=AutoPolicy()) == SMALL
    assert resolve(AUTO_MODEL, prompt=5, max_tokens=600, auto=LENGTH) == LARGE


def test_the_classifier_sends_a_short_hard_prompt_to_large() -> None:
    chosen = resolve(
        AUTO_MODEL, prompt=20, max_tokens=50, auto=AutoPolicy(), has_math=True, asks_reasoning=True
    )

    assert chosen == LARGE


def test_the_classifier_reads_the_tenants_traffic_tier_from_its_policy() -> None:
    weights = ClassifierWeights(interactive=1.0)
    request = RequestFeatures(prompt_tokens=1, max_tokens=1, traffic_tier="batch")

    assert choose_tier(INTERACTIVE, request, AutoPolicy(classifier=weights)).tier == "large"
    assert choose_tier(BATCH, request, AutoPolicy(classifier=weights)).tier == "small"


def test_a_tenant_cooling_down_starts_large_whatever_the_rule() -> None:
    history = EscalationHistory(rate=0.8, cooling_down=True)
    request = RequestFeatures(prompt_tokens=1, max_tokens=1, history=history)

    for auto in (AutoPolicy(), LENGTH):
        choice = choose_tier(INTERACTIVE, request, auto)
        assert choice.tier == "large" and choice.reason == "thrash_cooldown=rate:0.80"


def test_the_auto_choice_says_when_the_tenant_lacks_the_chosen_tier() -> None:
    request = RequestFeatures(prompt_tokens=1, max_tokens=1)
    resolved = resolve_model(AUTO_MODEL, tenant(models=(LARGE,)), CATALOG, features=request)

    assert resolved.model.name == LARGE
    assert resolved.auto is not None and resolved.auto.tier == "large"
    assert resolved.auto.reason.endswith(",no_small_allowed")


def test_an_escalation_goes_to_the_first_large_model_the_tenant_may_use() -> None:
    assert escalation_model(INTERACTIVE, CATALOG) == CatalogModel(LARGE, "large")
    assert escalation_model(tenant(models=(SMALL,)), CATALOG) is None


def test_the_family_is_the_small_model_auto_starts_on() -> None:
    assert auto_family(INTERACTIVE, CATALOG) == SMALL
    assert auto_family(tenant(models=(LARGE,)), CATALOG) is None


# -- the length rule, still reachable with rule: length -------------------------------------


def test_auto_picks_small_for_a_short_request() -> None:
    assert resolve(AUTO_MODEL, prompt=200, max_tokens=200) == SMALL


def test_auto_picks_large_when_prompt_plus_output_exceed_the_threshold() -> None:
    assert resolve(AUTO_MODEL, BATCH, prompt=2000, max_tokens=49) == LARGE
    assert resolve(AUTO_MODEL, BATCH, prompt=2000, max_tokens=48) == SMALL


def test_auto_picks_large_for_an_interactive_tenant_asking_for_a_long_answer() -> None:
    assert resolve(AUTO_MODEL, INTERACTIVE, prompt=10, max_tokens=513) == LARGE


def test_auto_keeps_a_batch_tenant_on_small_for_a_long_answer_under_the_threshold() -> None:
    assert resolve(AUTO_MODEL, BATCH, prompt=10, max_tokens=513) == SMALL


def test_auto_counts_a_missing_max_tokens_as_zero() -> None:
    assert resolve(AUTO_MODEL, INTERACTIVE, prompt=10, max_tokens=None) == SMALL


def test_auto_falls_back_to_the_other_tier_when_the_tenant_lacks_the_chosen_one() -> None:
    only_large = tenant(models=(LARGE,))

    assert resolve(AUTO_MODEL, only_large, prompt=10, max_tokens=10) == LARGE


def test_auto_with_no_allowed_model_is_refused_as_not_allowed() -> None:
    with pytest.raises(ModelNotAllowedError):
        resolve(AUTO_MODEL, tenant(models=("something-else",)))


def test_auto_with_an_empty_catalog_is_unknown() -> None:
    with pytest.raises(UnknownModelError):
        resolve_model(AUTO_MODEL, INTERACTIVE, (), features=RequestFeatures(prompt_tokens=1, max_tokens=1))


def test_auto_takes_the_first_catalog_model_of_the_tier() -> None:
    catalog = (
        CatalogModel("small-a", "small"),
        CatalogModel("small-b", "small"),
        CatalogModel("big", "large"),
    )
    request = RequestFeatures(prompt_tokens=1, max_tokens=1)

    assert resolve_model(AUTO_MODEL, INTERACTIVE, catalog, features=request).model.name == "small-a"


def test_auto_thresholds_are_a_rule_object() -> None:
    rule = AutoPolicy(rule="length", length=AutoRule(large_above_tokens=100, interactive_long_output=50))

    assert resolve(AUTO_MODEL, BATCH, prompt=90, max_tokens=20, auto=rule) == LARGE


@given(
    prompt=st.integers(0, 10_000),
    max_tokens=st.one_of(st.none(), st.integers(1, 10_000)),
    interactive=st.booleans(),
    flags=st.tuples(st.booleans(), st.booleans(), st.booleans()),
    rule=st.sampled_from(["classifier", "length"]),
)
def test_auto_always_returns_a_model_the_tenant_may_use(
    prompt: int, max_tokens: int | None, interactive: bool, flags: tuple[bool, bool, bool], rule: str
) -> None:
    policy = tenant(traffic_tier="interactive" if interactive else "batch", models=(SMALL,))
    request = RequestFeatures(
        prompt_tokens=prompt,
        max_tokens=max_tokens,
        has_code=flags[0],
        has_math=flags[1],
        asks_reasoning=flags[2],
    )

    resolved = resolve_model(AUTO_MODEL, policy, CATALOG, features=request, auto=AutoPolicy(rule=rule))  # type: ignore[arg-type]

    assert resolved.model.name == SMALL
