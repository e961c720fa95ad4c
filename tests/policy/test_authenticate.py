"""Authentication: a presented key maps to its tenant by SHA-256, and nothing else does."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from gateway.policy import PolicyError, PolicySet, hash_api_key, load_policy_dir
from gateway.policy.policy_set import as_extra
from router import TenantPolicy

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "policies"


@pytest.fixture(scope="module")
def examples() -> PolicySet:
    return load_policy_dir(EXAMPLES)


def test_hash_api_key_is_prefixed_sha256() -> None:
    assert hash_api_key("abc") == "sha256:" + hashlib.sha256(b"abc").hexdigest()


@pytest.mark.parametrize(
    ("key", "tenant_id"),
    [
        ("sk-meridian-eu-example", "acme-eu"),
        ("sk-meridian-us-example", "initech-us"),
        ("sk-meridian-batch-example", "globex-batch"),
    ],
)
def test_example_keys_authenticate_as_their_tenants(examples: PolicySet, key: str, tenant_id: str) -> None:
    policy = examples.authenticate(key)

    assert policy is not None and policy.tenant_id == tenant_id


@pytest.mark.parametrize("key", ["", "sk-meridian-eu-exampl", "SK-MERIDIAN-EU-EXAMPLE", hash_api_key("x")])
def test_wrong_keys_authenticate_as_nobody(examples: PolicySet, key: str) -> None:
    assert examples.authenticate(key) is None


def test_a_stored_hash_is_not_itself_a_key(examples: PolicySet) -> None:
    stored = next(iter(examples.by_id["acme-eu"].api_key_hashes))

    assert examples.authenticate(stored) is None
    assert examples.authenticate("sha256:" + stored) is None


def test_in_memory_policies_may_hold_hashes_in_either_form() -> None:
    bare = TenantPolicy("bare", frozenset({hashlib.sha256(b"k1").hexdigest()}))
    prefixed = TenantPolicy("prefixed", frozenset({hash_api_key("k2")}))

    policies = PolicySet.build(as_extra([bare, prefixed]))

    assert policies.authenticate("k1") is bare
    assert policies.authenticate("k2") is prefixed


def test_an_in_memory_policy_with_a_garbage_hash_is_refused() -> None:
    with pytest.raises(PolicyError, match=r"extra\[0\]\.api_keys"):
        PolicySet.build(as_extra([TenantPolicy("t", frozenset({"plaintext"}))]))
