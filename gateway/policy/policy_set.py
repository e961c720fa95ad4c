"""PolicySet: one consistent, immutable view of every tenant, indexed by id and by key hash."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from gateway.policy.errors import Where
from gateway.policy.keys import key_digest, parse_key_hash
from gateway.safety.policy import SafetyPolicy
from router.types import TenantPolicy

# Where in-memory policies (PolicyStore's `extra`, e.g. the demo tenant) are said to come from.
EXTRA_SOURCE = "<in-memory>"


@dataclass(frozen=True)
class PolicySet:
    by_id: Mapping[str, TenantPolicy]
    by_key_hash: Mapping[str, TenantPolicy]  # bare hex SHA-256 → tenant
    sources: Mapping[str, str]  # tenant id → file (or EXTRA_SOURCE) it came from
    # tenant id → content policy; a tenant without one has no content checks (gateway/safety).
    safety: Mapping[str, SafetyPolicy] = field(default_factory=lambda: MappingProxyType({}))

    @classmethod
    def empty(cls) -> PolicySet:
        return cls.build([])

    @classmethod
    def build(
        cls, tenants: Iterable[tuple[TenantPolicy, Where]], safety: Mapping[str, SafetyPolicy] | None = None
    ) -> PolicySet:
        """Index tenants; raise PolicyError on a duplicate id or a key hash held by two tenants."""
        by_id: dict[str, TenantPolicy] = {}
        by_key: dict[str, TenantPolicy] = {}
        sources: dict[str, str] = {}
        places: dict[str, Where] = {}
        for policy, where in tenants:
            if policy.tenant_id in by_id:
                first = places[policy.tenant_id]
                raise where.key("id").error(
                    f"duplicate tenant id {policy.tenant_id!r} (first defined at {first.file}: {first.path})"
                )
            by_id[policy.tenant_id] = policy
            sources[policy.tenant_id] = where.file
            places[policy.tenant_id] = where
            for stored in sorted(policy.api_key_hashes):
                # TenantPolicy holds bare hex; accept "sha256:<hex>" too, so in-memory policies
                # built with hash_api_key() authenticate the same way.
                digest = parse_key_hash(stored)
                if digest is None:
                    raise where.key("api_keys").error("not a SHA-256 hex digest")
                owner = by_key.get(digest)
                if owner is not None and owner.tenant_id != policy.tenant_id:
                    raise where.key("api_keys").error(
                        f"key hash sha256:{digest[:12]}… is also a key of tenant {owner.tenant_id!r}; "
                        "one key must identify one tenant"
                    )
                by_key[digest] = policy
        return cls(
            MappingProxyType(by_id),
            MappingProxyType(by_key),
            MappingProxyType(sources),
            MappingProxyType(dict(safety or {})),
        )

    def safety_for(self, tenant_id: str) -> SafetyPolicy | None:
        return self.safety.get(tenant_id)

    def get(self, tenant_id: str) -> TenantPolicy | None:
        return self.by_id.get(tenant_id)

    def authenticate(self, api_key: str) -> TenantPolicy | None:
        """The tenant whose key this is, or None.

        The lookup is by the SHA-256 of the presented key, so a timing difference in the dict
        lookup reveals only facts about a hash the caller cannot steer. A hit is a match: the dict
        is keyed by the parsed digests of the tenants' keys (re-parsing them on every request
        cost more than the hash itself).
        """
        if not api_key:
            return None
        return self.by_key_hash.get(key_digest(api_key))

    def __len__(self) -> int:
        return len(self.by_id)

    def __iter__(self) -> Iterator[TenantPolicy]:
        return iter(self.by_id.values())


def as_extra(policies: Iterable[TenantPolicy]) -> list[tuple[TenantPolicy, Where]]:
    """In-memory policies, positioned for PolicySet.build's error messages."""
    return [(p, Where(EXTRA_SOURCE, f"extra[{i}]")) for i, p in enumerate(policies)]
