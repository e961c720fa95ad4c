"""Prefix affinity by rendezvous (highest-random-weight) hashing.

Every (key, id) pair gets a stable pseudo-random weight; ids are ranked by weight. The same key
therefore ranks the same ids the same way on every gateway replica and across restarts, and
removing one id never reorders the others — so one system prompt keeps landing on the node whose
prefix cache already holds it, and losing a node only moves the keys that lived on it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable


def rendezvous_weight(key: str, target_id: str) -> int:
    """The weight of `target_id` for `key`: 64 bits of BLAKE2b over both.

    hashlib, not hash(): Python salts str hashes per process, which would give every gateway
    replica a different order and defeat the prefix cache.
    """
    # A separator byte that cannot occur in UTF-8 text keeps ("ab", "c") apart from ("a", "bc").
    data = key.encode() + b"\xff" + target_id.encode()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def rendezvous_rank(key: str, ids: Iterable[str]) -> tuple[str, ...]:
    """`ids` (deduplicated) from the highest weight for `key` to the lowest.

    Ties (a 1-in-2^64 event) fall back to the id itself so the order is total and deterministic.
    """
    return tuple(sorted(set(ids), key=lambda i: (-rendezvous_weight(key, i), i)))
