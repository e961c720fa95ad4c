"""Configuring `auto`: the gateway's `auto:` section, a tenant's `escalation:` overrides, and the
plan carrying the classifier's choice."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gateway.call.plan import plan_request
from gateway.config import ConfigError, TokenEstimateConfig, config_from_dict
from gateway.escalation import RateRule
from gateway.policy import PolicyError, hash_api_key, load_policy_dir, load_policy_file
from protocol import ChatCompletionRequest, decode_request
from router import AUTO_MODEL, ConfidenceRule, EscalationHistory, EscalationOverrides, rule_for
from router.types import CatalogModel, TenantPolicy

KEY = hash_api_key("sk-test")
CATALOG = (CatalogModel("meridian-small", "small"), CatalogModel("meridian-large", "large"))
BASE: dict[str, Any] = {
    "home_region": "eu-west",
    "catalog": [{"name": "meridian-small", "tier": "small"}],
    "policies": "policies",
    "directory": {"type": "static", "file": "regions.yaml"},
}


def tenant_yaml(escalation: str) -> str:
    return f'tenants:\n  - id: acme\n    api_keys: ["{KEY}"]\n    escalation: {escalation}\n'


def test_a_tenants_escalation_overrides_land_in_its_policy(tmp_path: Path) -> None:
    path = tmp_path / "acme.yaml"
    path.write_text(tenant_yaml("{threshold: -1.5, k_tokens: 6, window: 3}"))

    policy = load_policy_file(path).by_id["acme"]

    assert policy.escalation == EscalationOverrides(threshold=-1.5, k_tokens=6, window=3)
    assert rule_for(ConfidenceRule(), policy.escalation) == ConfidenceRule(
        threshold=-1.5, k_tokens=6, window=3
    )


def test_a_tenant_without_escalation_keeps_the_gateway_defaults(tmp_path: Path) -> None:
    path = tmp_path / "acme.yaml"
    path.write_text(f'tenants:\n  - id: acme\n    api_keys: ["{KEY}"]\n')

    assert load_policy_file(path).by_id["acme"].escalation == EscalationOverrides()


@pytest.mark.parametrize(
    ("escalation", "field", "message"),
    [
        (
            "{threshold: low}",
            "tenants[0].escalation.threshold",
            "Expected `float | null`, got `str`",
        ),
        ("{threshold: true}", "tenants[0].escalation.threshold", "got `bool`"),
        ("{threshold: .nan}", "tenants[0].escalation.threshold", "expected a finite number"),
        ("{k_tokens: 0}", "tenants[0].escalation.k_tokens", "Expected `int` >= 1"),
        ("{k_tokens: 1000}", "tenants[0].escalation.k_tokens", "Expected `int` <= 256"),
        ("{window: 2.5}", "tenants[0].escalation.window", "Expected `int | null`, got `float`"),
        ("{k_tokens: 4, window: 8}", "tenants[0].escalation.window", "cannot exceed k_tokens (4)"),
        ("{treshold: -1}", "tenants[0].escalation.treshold", "did you mean 'threshold'"),
        ("-2.5", "tenants[0].escalation", "Expected `object`, got `float`"),
    ],
)
def test_escalation_errors_name_the_field(tmp_path: Path, escalation: str, field: str, message: str) -> None:
    (tmp_path / "acme.yaml").write_text(tenant_yaml(escalation))

    with pytest.raises(PolicyError) as caught:
        load_policy_dir(tmp_path)

    assert caught.value.field == field
    assert message in caught.value.message


def test_the_auto_section_defaults_to_the_classifier() -> None:
    config = config_from_dict(BASE)

    assert config.auto.to_router().rule == "classifier"
    assert config.auto.escalation.to_router() == ConfidenceRule()
    assert config.auto.escalation_rate.to_rule() == RateRule()


def test_the_auto_section_sets_weights_rule_and_escalation_defaults() -> None:
    config = config_from_dict(
        {
            **BASE,
            "auto": {
                "rule": "length",
                "classifier": {"threshold": 0.8, "weights": {"code": 0.9}},
                "length": {"large_above_tokens": 100},
                "escalation": {"threshold": -1.0, "k_tokens": 4, "window": 2},
                "thrash": {"max_rate": 0.3, "cool_down_s": 10},
                "escalation_rate": {"half_life_s": 30, "min_judged": 8, "judge_share": 0.2},
            },
        }
    )
    auto = config.auto.to_router()

    assert auto.rule == "length" and auto.length.large_above_tokens == 100
    assert auto.classifier.threshold == 0.8 and auto.classifier.code == 0.9
    assert config.auto.escalation.to_router() == ConfidenceRule(threshold=-1.0, k_tokens=4, window=2)
    assert config.auto.thrash.to_rule().max_rate == 0.3
    assert config.auto.escalation_rate.to_rule() == RateRule(half_life_s=30, min_judged=8, judge_share=0.2)


@pytest.mark.parametrize(
    ("auto", "field"),
    [
        ({"rule": "biggest"}, "$.auto.rule"),
        ({"classifier": {"weights": {"cod": 1.0}}}, "$.auto.classifier.weights"),
        ({"escalation": {"k_tokens": 0}}, "$.auto.escalation.k_tokens"),
        ({"escalation": {"k_tokens": 4, "window": 5}}, "$.auto.escalation.window"),
        ({"thrash": {"max_rate": 1.5}}, "$.auto.thrash.max_rate"),
        ({"escalation_rate": {"judge_share": 1.5}}, "$.auto.escalation_rate.judge_share"),
        ({"escalation_rate": {"half_life_s": 0}}, "$.auto.escalation_rate.half_life_s"),
    ],
)
def test_auto_section_errors_name_the_field(auto: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError, match=f"^gateway.yaml: {field.replace('$', '[$]')}"):
        config_from_dict({**BASE, "auto": auto}, source="gateway.yaml")


def chat(content: str, **body: Any) -> tuple[ChatCompletionRequest, dict[str, Any]]:
    payload = {"model": AUTO_MODEL, "messages": [{"role": "user", "content": content}], **body}
    return decode_request(json.dumps(payload).encode(), ChatCompletionRequest), payload


TENANT = TenantPolicy("acme", frozenset())


def test_the_plan_carries_the_classifiers_choice_and_reason() -> None:
    easy = plan_request("chat", *chat("hi", max_tokens=600), TENANT, CATALOG, TokenEstimateConfig())
    hard = plan_request(
        "chat", *chat("Prove, step by step, that 7 * 11 = 77."), TENANT, CATALOG, TokenEstimateConfig()
    )

    assert easy.model.name == "meridian-small" and easy.auto is not None and easy.auto.rule == "classifier"
    assert hard.model.name == "meridian-large" and hard.auto is not None
    assert "reasoning" in hard.auto.reason and "math" in hard.auto.reason


def test_a_tenant_cooling_down_is_planned_on_the_large_tier() -> None:
    plan = plan_request(
        "chat",
        *chat("hi"),
        TENANT,
        CATALOG,
        TokenEstimateConfig(),
        history=EscalationHistory(rate=0.7, cooling_down=True),
    )

    assert plan.model.name == "meridian-large"
    assert plan.auto is not None and plan.auto.reason == "thrash_cooldown=rate:0.70"


def test_a_named_model_has_no_auto_choice() -> None:
    _, body = chat("hi")
    body["model"] = "meridian-small"
    named = decode_request(json.dumps(body).encode(), ChatCompletionRequest)

    assert plan_request("chat", named, body, TENANT, CATALOG, TokenEstimateConfig()).auto is None
