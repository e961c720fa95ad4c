"""Policy validation: valid files load, and every error names the file and the field."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.policy import PolicyError, hash_api_key, load_policy_dir, load_policy_file
from gateway.policy.schema import parse_document
from router import Residency, TenantLimits

KEY = hash_api_key("sk-test")
OTHER_KEY = hash_api_key("sk-other")

FULL = f"""
tenants:
  - id: acme
    api_keys: ["{KEY}"]
    models: [meridian-small]
    residency: {{jurisdictions: [eu], regions: [eu-west]}}
    tier: batch
    limits:
      requests_per_minute: 10
      tokens_per_minute: 1000
      concurrent_requests: 2
      daily_tokens: 100000
      max_tokens: 256
      context_tokens: 1024
    allow_commercial: true
    allow_degrade: true
    fail_mode: closed
    prefix_cache: isolated
    trace_content: true
"""


def write(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.write_text(text)
    return path


def test_every_field_lands_in_the_tenant_policy(tmp_path: Path) -> None:
    policy = load_policy_file(write(tmp_path, "acme.yaml", FULL)).by_id["acme"]

    assert policy.api_key_hashes == {KEY.removeprefix("sha256:")}
    assert policy.models == {"meridian-small"}
    assert policy.residency == Residency(jurisdictions=frozenset({"eu"}), regions=frozenset({"eu-west"}))
    assert policy.traffic_tier == "batch"
    assert policy.limits == TenantLimits(10, 1000, 2, 100000, 256, 1024)
    assert (policy.allow_commercial, policy.allow_degrade) == (True, True)
    assert (policy.fail_mode, policy.prefix_cache) == ("closed", "isolated")
    assert policy.trace_content


def test_only_id_and_api_keys_are_required(tmp_path: Path) -> None:
    text = f'tenants:\n  - id: minimal\n    api_keys: ["{KEY}"]\n'

    policy = load_policy_file(write(tmp_path, "min.yaml", text)).by_id["minimal"]

    assert policy.models == {"*"}
    assert policy.residency == Residency()
    assert policy.limits == TenantLimits()
    assert (policy.traffic_tier, policy.fail_mode, policy.prefix_cache) == ("interactive", "open", "shared")
    assert not policy.allow_commercial and not policy.allow_degrade
    assert not policy.trace_content


def test_a_directory_merges_every_yaml_file(tmp_path: Path) -> None:
    write(tmp_path, "a.yaml", f'tenants:\n  - id: a\n    api_keys: ["{KEY}"]\n')
    write(tmp_path, "b.yml", f'tenants:\n  - id: b\n    api_keys: ["{OTHER_KEY}"]\n')
    write(tmp_path, "notes.md", "not a policy")

    policies = load_policy_dir(tmp_path)

    assert set(policies.by_id) == {"a", "b"}
    assert policies.sources["b"] == str(tmp_path / "b.yml")


def tenant_with(field_yaml: str) -> str:
    return f'tenants:\n  - id: acme\n    api_keys: ["{KEY}"]\n{field_yaml}'


@pytest.mark.parametrize(
    ("text", "field", "message"),
    [
        (
            tenant_with("    limits: {tokens_per_minute: lots}\n"),
            "tenants[0].limits.tokens_per_minute",
            "Expected `int | null`, got `str`",
        ),
        (
            tenant_with("    limits: {requests_per_minute: 0}\n"),
            "tenants[0].limits.requests_per_minute",
            "Expected `int` >= 1",
        ),
        (tenant_with("    limits: {max_tokens: 1.5}\n"), "tenants[0].limits.max_tokens", "got `float`"),
        (tenant_with("    limits: {daily_tokens: true}\n"), "tenants[0].limits.daily_tokens", "got `bool`"),
        (
            tenant_with("    limits: {max_tokens: 2048, context_tokens: 1024}\n"),
            "tenants[0].limits.max_tokens",
            "cannot exceed context_tokens",
        ),
        (
            tenant_with("    limits: {token_per_minute: 5}\n"),
            "tenants[0].limits.token_per_minute",
            "did you mean",
        ),
        (
            tenant_with("    residancy: {jurisdictions: [eu]}\n"),
            "tenants[0].residancy",
            "did you mean 'residency'",
        ),
        (
            tenant_with("    residency: {jurisdictions: eu}\n"),
            "tenants[0].residency.jurisdictions",
            "Expected `array`",
        ),
        (
            tenant_with("    residency: {regions: [eu-west, 3]}\n"),
            "tenants[0].residency.regions[1]",
            "Expected `str`, got `int`",
        ),
        (tenant_with("    tier: realtime\n"), "tenants[0].tier", "Invalid enum value 'realtime'"),
        (tenant_with("    fail_mode: maybe\n"), "tenants[0].fail_mode", "Invalid enum value 'maybe'"),
        (
            tenant_with("    prefix_cache: private\n"),
            "tenants[0].prefix_cache",
            "Invalid enum value 'private'",
        ),
        (
            tenant_with('    allow_commercial: "true"\n'),
            "tenants[0].allow_commercial",
            "Expected `bool`, got `str`",
        ),
        (
            tenant_with("    trace_content: yes please\n"),
            "tenants[0].trace_content",
            "Expected `bool`, got `str`",
        ),
        (tenant_with("    models: all\n"), "tenants[0].models", "Invalid enum value 'all'"),
        (tenant_with("    models: [meridian-small, '']\n"), "tenants[0].models[1]", "length >= 1"),
        ("tenants:\n  - api_keys: []\n", "tenants[0].id", "required field is missing"),
        ("tenants:\n  - id: acme\n", "tenants[0].api_keys", "required field is missing"),
        ('tenants:\n  - id: "a{b}"\n    api_keys: []\n', "tenants[0].id", "letters, digits"),
        (
            "tenants:\n  - id: acme\n    api_keys: [sk-live-plaintext]\n",
            "tenants[0].api_keys[0]",
            "never the key",
        ),
        ("tenants:\n  - id: acme\n    api_keys: ['sha256:abc']\n", "tenants[0].api_keys[0]", "64 hex digits"),
        (
            "tenants:\n  - id: acme\n    api_keys: 'sha256:abc'\n",
            "tenants[0].api_keys",
            "Expected `array`, got `str`",
        ),
        ("tenants: {id: acme}\n", "tenants", "Expected `array`, got `object`"),
        ("tenants:\n  - just-a-string\n", "tenants[0]", "Expected `object`, got `str`"),
        ("tenant: []\n", "tenant", "did you mean 'tenants'"),
        ("", "", "the file is empty"),
        ("tenants: [\n", "", "invalid YAML at line 2"),
    ],
)
def test_every_error_names_file_and_field(tmp_path: Path, text: str, field: str, message: str) -> None:
    path = write(tmp_path, "eu.yaml", text)

    with pytest.raises(PolicyError) as caught:
        load_policy_dir(tmp_path)

    error = caught.value
    assert (error.file, error.field) == (str(path), field)
    assert message in error.message
    assert str(error).startswith(f"{path}: {field}: " if field else f"{path}: ")


def test_a_plaintext_key_is_never_echoed_in_the_error(tmp_path: Path) -> None:
    write(tmp_path, "eu.yaml", "tenants:\n  - id: acme\n    api_keys: [sk-live-supersecret]\n")

    with pytest.raises(PolicyError) as caught:
        load_policy_dir(tmp_path)

    assert "supersecret" not in str(caught.value)


# Anything that is not a key hash, in any position of the list and beside valid hashes.
_NOT_A_HASH = st.text(min_size=6).filter(lambda text: not text.startswith("sha256:"))


def _api_keys_error(keys: list[str]) -> PolicyError:
    with pytest.raises(PolicyError) as caught:
        parse_document({"tenants": [{"id": "acme", "api_keys": keys}]}, "eu.yaml")
    return caught.value


@settings(max_examples=200, deadline=None)
@given(secret=_NOT_A_HASH, before=st.integers(0, 2))
def test_no_value_in_api_keys_is_ever_echoed(secret: str, before: int) -> None:
    # The error is the same whatever the value was: nothing of it can leak into a log.
    error = _api_keys_error([KEY] * before + [secret])
    assert error.field == f"tenants[0].api_keys[{before}]"
    assert str(error) == str(_api_keys_error([KEY] * before + ["<not a hash>"]))


def test_the_spec_example_error_reads_as_documented(tmp_path: Path) -> None:
    write(tmp_path, "eu.yaml", tenant_with("    limits: {tokens_per_minute: lots}\n"))

    with pytest.raises(PolicyError) as caught:
        load_policy_dir(tmp_path)

    assert str(caught.value) == (
        f"{tmp_path}/eu.yaml: tenants[0].limits.tokens_per_minute: Expected `int | null`, got `str`"
    )


def test_duplicate_tenant_ids_across_files_are_an_error(tmp_path: Path) -> None:
    write(tmp_path, "a.yaml", f'tenants:\n  - id: acme\n    api_keys: ["{KEY}"]\n')
    write(tmp_path, "b.yaml", f'tenants:\n  - id: acme\n    api_keys: ["{OTHER_KEY}"]\n')

    with pytest.raises(PolicyError) as caught:
        load_policy_dir(tmp_path)

    assert (caught.value.file, caught.value.field) == (str(tmp_path / "b.yaml"), "tenants[0].id")
    assert "duplicate tenant id 'acme'" in caught.value.message
    assert str(tmp_path / "a.yaml") in caught.value.message


def test_one_key_hash_in_two_tenants_is_an_error(tmp_path: Path) -> None:
    text = (
        f'tenants:\n  - id: a\n    api_keys: ["{KEY}"]\n  - id: b\n    api_keys: ["{OTHER_KEY}", "{KEY}"]\n'
    )
    write(tmp_path, "keys.yaml", text)

    with pytest.raises(PolicyError) as caught:
        load_policy_dir(tmp_path)

    assert caught.value.field == "tenants[1].api_keys"
    assert "also a key of tenant 'a'" in caught.value.message


def test_a_missing_directory_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="does not exist"):
        load_policy_dir(tmp_path / "nope")


def test_key_hashes_are_case_insensitive(tmp_path: Path) -> None:
    write(tmp_path, "a.yaml", f'tenants:\n  - id: a\n    api_keys: ["sha256:{KEY[7:].upper()}"]\n')

    assert load_policy_dir(tmp_path).authenticate("sk-test") is not None
