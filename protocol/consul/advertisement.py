"""How a regional node advertises itself in Consul, and how the gateway reads it back.

Both sides import this one module, so the encoding cannot drift. Consul's service metadata is a flat
map of strings (keys [A-Za-z0-9_-], values <= 512 characters), so the node's models and their tiers
are one value: `models=meridian-small:small,meridian-large:large`. Versioned models add
`versions=meridian-large=v2@1f2e3d4c5b6a7980` (model=version@checkpoint hash; the hash may be empty).
"""

from __future__ import annotations

from dataclasses import dataclass

from protocol.consul.wire import ServiceEntry

SERVICE_NAME = "meridian-node"
META_NODE_ID = "node_id"
META_REGION = "region"
META_JURISDICTION = "jurisdiction"
META_MODELS = "models"
META_SCHEME = "scheme"  # the node's URL scheme: http or https
META_VERSIONS = "versions"  # the versions of its models, for rollouts (absent: none versioned)
# Comma-separated models failing their golden-output probes, not served by the node (absent: none);
# updated while the node runs (regional_node/probes).
META_PROBE_FAILED = "probe_failed"


class MetaError(ValueError):
    """Service metadata Meridian cannot use (the message says which key and why)."""


@dataclass(frozen=True)
class NodeAdvertisement:
    """What a passing Consul instance of meridian-node says about itself."""

    node_id: str
    url: str
    region: str
    jurisdiction: str
    models: frozenset[str]  # logical model names
    versions: tuple[ModelVersionTag, ...] = ()


@dataclass(frozen=True)
class ModelTag:
    name: str
    tier: str


@dataclass(frozen=True)
class ModelVersionTag:
    name: str
    version: str
    checkpoint: str = ""


def encode_versions(versions: list[ModelVersionTag] | tuple[ModelVersionTag, ...]) -> str:
    for tag in versions:
        parts = (tag.name, tag.version, tag.checkpoint)
        if not tag.name or not tag.version or any(c in part for part in parts for c in ",=@"):
            raise MetaError(f"version {tag.version!r} of {tag.name!r} cannot be encoded in Consul meta")
    return ",".join(f"{t.name}={t.version}@{t.checkpoint}" for t in versions)


def decode_versions(value: str) -> tuple[ModelVersionTag, ...]:
    tags = []
    for item in filter(None, (part.strip() for part in value.split(","))):
        name, sep, rest = item.partition("=")
        version, _, checkpoint = rest.partition("@")
        if not sep or not name or not version:
            raise MetaError(f"meta {META_VERSIONS}: {item!r} is not model=version@checkpoint")
        tags.append(ModelVersionTag(name, version, checkpoint))
    return tuple(tags)


def encode_models(models: list[ModelTag] | tuple[ModelTag, ...]) -> str:
    for model in models:
        if not model.name or "," in model.name or not model.tier or any(c in model.tier for c in ",:"):
            raise MetaError(f"model {model.name!r} (tier {model.tier!r}) cannot be encoded in Consul meta")
    return ",".join(f"{m.name}:{m.tier}" for m in models)


def decode_models(value: str) -> tuple[ModelTag, ...]:
    models = []
    for item in filter(None, (part.strip() for part in value.split(","))):
        # rpartition: a model name may itself contain ':' (e.g. "llama3:8b"); the tier never does.
        name, sep, tier = item.rpartition(":")
        if not sep or not name or not tier:
            raise MetaError(f"meta {META_MODELS}: {item!r} is not name:tier")
        models.append(ModelTag(name, tier))
    return tuple(models)


def format_url(scheme: str, host: str, port: int) -> str:
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 literal
    return f"{scheme}://{host}:{port}"


def node_from_entry(entry: ServiceEntry) -> NodeAdvertisement:
    """A passing Consul instance of meridian-node, read back (MetaError if unusable)."""
    meta = entry.Service.Meta or {}
    for key in (META_REGION, META_JURISDICTION, META_MODELS):
        if not meta.get(key):
            raise MetaError(f"service {entry.Service.ID!r} has no meta {key!r}")
    address = entry.address()
    if not address or entry.Service.Port <= 0:
        raise MetaError(f"service {entry.Service.ID!r} has no usable address/port")
    scheme = meta.get(META_SCHEME, "http")
    if scheme not in ("http", "https"):
        raise MetaError(f"service {entry.Service.ID!r}: meta {META_SCHEME} must be http or https")
    return NodeAdvertisement(
        node_id=meta.get(META_NODE_ID) or entry.Service.ID,
        url=format_url(scheme, address, entry.Service.Port),
        region=meta[META_REGION],
        jurisdiction=meta[META_JURISDICTION],
        models=frozenset(model.name for model in decode_models(meta[META_MODELS])),
        versions=decode_versions(meta.get(META_VERSIONS, "")),
    )
