"""Versioned models: which version of a model a request gets, and which nodes serve it.

A rollout plan gives each version a weight. A request's sticky key (its `user` or session
header, else its prefix affinity key) is hashed to a point in [0, total weight); the versions own
consecutive slices of that range in the order the plan lists them. So:

- the same key lands on the same version for as long as the weights are unchanged, on every
  gateway replica (BLAKE2b, not Python's per-process salted hash());
- growing a canary listed first (5 → 50 → 100) only ever moves keys onto it: a key that was on
  the canary stays there;
- a weight of 0 owns no slice: rolling back to 0/100 moves every key off that version at once.

A node's version of a model is what its own /load report says, else what the directory (regions
file, Consul meta) says; a node with neither has an unknown version and takes no rollout traffic.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Iterable

from router.types import ModelVersion, NodeInfo, Rollout

_SPACE = 1 << 64


def rollout_point(key: str) -> float:
    """The key's place in [0, 1): 64 bits of BLAKE2b over it."""
    digest = hashlib.blake2b(b"rollout\xff" + key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / _SPACE


def choose_version(rollout: Rollout, key: str) -> str:
    """The version `key` gets under `rollout` (whose total weight must be positive)."""
    total = rollout.total
    if total <= 0:
        raise ValueError("a rollout needs a positive total weight")
    point = rollout_point(key) * total
    upper = 0
    for version, weight in rollout.weights:
        upper += weight
        if point < upper:
            return version
    # Only reachable through float rounding at the very top of the range.
    return next(version for version, weight in reversed(rollout.weights) if weight > 0)


def node_version(node: NodeInfo, model: str) -> ModelVersion | None:
    """The version of `model` the node serves: its /load report's, else the directory's."""
    if node.load is not None and model in node.load.versions:
        return node.load.versions[model]
    return node.versions.get(model)


def checkpoint_drift(nodes: Iterable[NodeInfo]) -> dict[tuple[str, str], frozenset[str]]:
    """(model, version) -> the distinct checkpoint hashes its replicas advertise, for every version
    whose replicas disagree (more than one hash). Replicas that state no hash are not counted."""
    seen: defaultdict[tuple[str, str], set[str]] = defaultdict(set)
    for node in nodes:
        for model in node.models:
            served = node_version(node, model)
            if served is not None and served.checkpoint:
                seen[(model, served.version)].add(served.checkpoint)
    return {key: frozenset(hashes) for key, hashes in seen.items() if len(hashes) > 1}
