"""API keys are stored only as SHA-256 hashes: `sha256:<64 hex digits>`.

Make one for a policy file with `python -m gateway.policy hash-key KEY` (or with no KEY, read
from stdin, which keeps the key out of the shell history).
"""

from __future__ import annotations

import hashlib
import re

PREFIX = "sha256:"
_HEX = re.compile(r"[0-9a-f]{64}")


def key_digest(api_key: str) -> str:
    """Bare lowercase hex SHA-256 of a key, as TenantPolicy.api_key_hashes holds it.

    A plain hash (no salt, no stretching) is enough because API keys are long random strings,
    not passwords: there is nothing to brute-force, and a per-request KDF would cost latency.
    """
    return hashlib.sha256(api_key.encode()).hexdigest()


def hash_api_key(api_key: str) -> str:
    """The `sha256:<hex>` form that goes into a policy file's `api_keys`."""
    return PREFIX + key_digest(api_key)


def parse_key_hash(text: str) -> str | None:
    """The bare hex digest of a `sha256:<hex>` (or bare hex) string; None if it is not one."""
    digest = text.removeprefix(PREFIX).lower()
    return digest if _HEX.fullmatch(digest) else None


def api_key_id(api_key: str) -> str:
    """A short, stable id for a key, safe to store and show: not the key, nor the hash policies
    match (12 hex digits of a differently prefixed SHA-256 cannot be used to find the key)."""
    return "key_" + hashlib.sha256(b"meridian-key-id:" + api_key.encode()).hexdigest()[:12]
