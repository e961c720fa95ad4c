"""Tenant policy: YAML files in policies/ validated into router.types.TenantPolicy, served live."""

from gateway.policy.errors import PolicyError
from gateway.policy.keys import hash_api_key, key_digest
from gateway.policy.loader import load_policy_dir, load_policy_file
from gateway.policy.policy_set import EXTRA_SOURCE, PolicySet
from gateway.policy.store import PolicyStore

__all__ = [
    "EXTRA_SOURCE",
    "PolicyError",
    "PolicySet",
    "PolicyStore",
    "hash_api_key",
    "key_digest",
    "load_policy_dir",
    "load_policy_file",
]
