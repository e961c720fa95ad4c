"""Content hashes that name full KV blocks for the prefix cache.

A block's hash covers its parent's hash and its own tokens, so equal hashes mean equal whole
prefixes, not just equal blocks. blake2b (16-byte digest) makes collisions a non-issue; the
request's cache_salt goes into the first block only, which is enough to separate every later
block of differently salted requests (tenants never share cache entries unless they share a salt).
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence as SequenceOf

from regional_node.engine.sequence import Sequence

_ROOT = b"\x00" * 16


def hash_block(parent: bytes | None, token_ids: SequenceOf[int], salt: str | None = None) -> bytes:
    h = hashlib.blake2b(parent if parent is not None else _ROOT, digest_size=16)
    if parent is None and salt is not None:
        encoded = salt.encode("utf-8")
        # Length-prefixed so that no salt can be confused with a salt plus leading token bytes.
        h.update(len(encoded).to_bytes(4, "little"))
        h.update(encoded)
    h.update(array("q", token_ids).tobytes())
    return h.digest()


def extend_block_hashes(seq: Sequence, block_size: int) -> list[bytes]:
    """Hash every full block of seq.token_ids not hashed yet; returns seq.block_hashes."""
    hashes = seq.block_hashes
    tokens = seq.token_ids
    while (len(hashes) + 1) * block_size <= len(tokens):
        i = len(hashes)
        parent = hashes[-1] if hashes else None
        hashes.append(hash_block(parent, tokens[i * block_size : (i + 1) * block_size], seq.cache_salt))
    return hashes
