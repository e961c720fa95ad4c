"""resolve_model: names to catalog models, "auto" to a tier, and the two refusals."""

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
from tests.router.builders import CATALOG, LARGE, SMALL, tenant

INTERACTIVE = tenant(traffic_tier="interactive")
BATCH = tenant(traffic_tier="batch")


def resolve(requested: str, policy=INTERACTIVE, *, prompt: int = 10, max_tokens: int | None = 100) -> str:
    return resolve_model(requested, policy, CATALOG, prompt_tokens=prompt, max_tokens=max_tokens).name


def test_a_named_model_resolves_to_itself() -> None:
    assert resolve(LARGE) == LARGE
    assert resolve(SMALL) == SMALL


def test_unknown_model_is_refused_as_unknown() -> None:
    with pytest.raises(UnknownModelError) as caught:
        resolve("gpt-17")

    assert caught.value.model == "gpt-17"
    assert isinstance(caught.value, RoutingError)


def test_model_outside_the_tenants_list_is_refused_as_not_allowed() -> None:
    with pytest.raises(ModelNotAllowedError) as caught:
        resolve(LARGE, tenant(models=(SMALL,), tenant_id="frugal"))

    assert "frugal" in caught.value.message and LARGE in caught.value.message


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
        resolve_model(AUTO_MODEL, INTERACTIVE, (), prompt_tokens=1, max_tokens=1)


def test_auto_takes_the_first_catalog_model_of_the_tier() -> None:
    catalog = (
        CatalogModel("small-a", "small"),
        CatalogModel("small-b", "small"),
        CatalogModel("big", "large"),
    )

    assert resolve_model(AUTO_MODEL, INTERACTIVE, catalog, prompt_tokens=1, max_tokens=1).name == "small-a"


def test_auto_thresholds_are_a_rule_object() -> None:
    rule = AutoRule(large_above_tokens=100, interactive_long_output=50)

    chosen = resolve_model(AUTO_MODEL, BATCH, CATALOG, prompt_tokens=90, max_tokens=20, rule=rule)

    assert chosen.name == LARGE


@given(
    prompt=st.integers(0, 10_000),
    max_tokens=st.one_of(st.none(), st.integers(1, 10_000)),
    interactive=st.booleans(),
)
def test_auto_always_returns_a_model_the_tenant_may_use(
    prompt: int, max_tokens: int | None, interactive: bool
) -> None:
    policy = tenant(traffic_tier="interactive" if interactive else "batch", models=(SMALL,))

    chosen = resolve_model(AUTO_MODEL, policy, CATALOG, prompt_tokens=prompt, max_tokens=max_tokens)

    assert chosen.name == SMALL
