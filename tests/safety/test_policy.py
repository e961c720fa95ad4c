"""A tenant's `safety:` section: validated with errors naming file and field, mapped to actions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.policy import PolicyError, load_policy_file
from gateway.safety.policy import SafetyPolicy, strongest

KEY = "sha256:" + "ab" * 32


def policy_from(tmp_path: Path, safety: Any) -> SafetyPolicy | None:
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump({"tenants": [{"id": "t", "api_keys": [KEY], "safety": safety}]}))
    return load_policy_file(path).safety_for("t")


def test_tenant_without_safety_section_has_no_content_policy(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump({"tenants": [{"id": "t", "api_keys": [KEY]}]}))
    assert load_policy_file(path).safety_for("t") is None


def test_groups_expand_and_single_rules_override_them(tmp_path: Path) -> None:
    policy = policy_from(tmp_path, {"rules": {"phone": "flag", "pii": "redact", "secrets": "block"}})
    assert policy is not None
    assert policy.rules["phone"] == "flag"
    assert policy.rules["email"] == "redact" and policy.rules["iban"] == "redact"
    assert policy.rules["openai_key"] == "block" and policy.rules["private_key"] == "block"


def test_defaults_check_both_sides_and_add_the_classifier_on_input_when_categories_are_set(
    tmp_path: Path,
) -> None:
    policy = policy_from(
        tmp_path, {"classifier": {"categories": {"injection": {"threshold": 0.5, "action": "block"}}}}
    )
    assert policy is not None
    assert policy.input == {"rules", "blocklist", "classifier"}
    assert policy.output == {"rules", "blocklist"}
    assert policy.fail_mode == "open" and policy.log_content is False


@pytest.mark.parametrize(
    ("safety", "field", "words"),
    [
        ({"rules": {"emial": "block"}}, "tenants[0].safety.rules.emial", "unknown rule"),
        ({"rules": {"email": "delete"}}, "tenants[0].safety.rules.email", "expected one of block, redact, flag"),
        ({"input": ["rules", "vibes"]}, "tenants[0].safety.input[1]", "Invalid enum value 'vibes'"),
        ({"output": ["classifier"]}, "tenants[0].safety.output", "needs classifier.categories"),
        ({"blocklist": [{"regex": "(", "action": "block"}]}, "tenants[0].safety.blocklist[0].regex", "invalid regular expression"),
        ({"blocklist": [{"regex": "a*", "action": "block"}]}, "tenants[0].safety.blocklist[0].regex", "matches empty text"),
        ({"blocklist": [{"words": ["x"], "regex": "y", "action": "flag"}]}, "tenants[0].safety.blocklist[0]", "exactly one of"),
        ({"blocklist": [{"words": [], "action": "flag"}]}, "tenants[0].safety.blocklist[0].words", "length >= 1"),
        ({"classifier": {"categories": {"tox": {"threshold": 1.5, "action": "block"}}}}, "tenants[0].safety.classifier.categories.tox.threshold", "Expected `float` <= 1.0"),
        ({"fail_mode": "maybe"}, "tenants[0].safety.fail_mode", "Invalid enum value 'maybe'"),
        ({"hold_back_chars": 10}, "tenants[0].safety.hold_back_chars", "Expected `int` >= 96"),
        ({"log_contents": True}, "tenants[0].safety.log_contents", "did you mean 'log_content'"),
    ],
)  # fmt: skip
def test_invalid_safety_sections_name_the_field(tmp_path: Path, safety: Any, field: str, words: str) -> None:
    with pytest.raises(PolicyError) as caught:
        policy_from(tmp_path, safety)
    assert caught.value.field == field
    assert words in caught.value.message


def test_classifier_scores_map_to_actions_at_their_thresholds(tmp_path: Path) -> None:
    policy = policy_from(
        tmp_path,
        {
            "classifier": {
                "categories": {
                    "injection": {"threshold": 0.8, "action": "block"},
                    "toxicity": {"threshold": 0.5, "action": "flag"},
                }
            }
        },
    )
    assert policy is not None
    assert policy.scores_to_decisions({"injection": 0.79, "toxicity": 0.1}) == []
    assert policy.scores_to_decisions({"injection": 0.8, "toxicity": 0.6}) == [
        ("injection", 0.8, "block"),
        ("toxicity", 0.6, "flag"),
    ]
    with pytest.raises(KeyError):
        policy.scores_to_decisions({"toxicity": 0.1})  # the model lacks a category: a check error


def test_block_outranks_redact_outranks_flag() -> None:
    assert strongest(["flag", "redact"]) == "redact"
    assert strongest(["redact", "block", "flag"]) == "block"
    assert strongest([]) is None


def test_example_policies_load_with_their_safety_sections() -> None:
    from gateway.policy import load_policy_dir

    policies = load_policy_dir(Path(__file__).resolve().parents[2] / "policies")
    assert any(policies.safety_for(t.tenant_id) is not None for t in policies)
