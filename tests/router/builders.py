"""Small builders so router tests state only what matters to them."""

from __future__ import annotations

from router import CatalogModel, FleetSnapshot, NodeInfo, NodeLoad, ProviderInfo, Residency, TenantPolicy

LARGE = "meridian-large"
SMALL = "meridian-small"
CATALOG = (CatalogModel(SMALL, "small"), CatalogModel(LARGE, "large"))

JURISDICTION_OF = {
    "eu-west": "eu",
    "eu-central": "eu",
    "us-east": "us",
    "us-west": "us",
    "ap-south": "in",
}


def node(
    node_id: str,
    region: str = "eu-west",
    *,
    models: tuple[str, ...] = (LARGE,),
    healthy: bool = True,
    kv: float | None = None,
    waiting: int = 0,
) -> NodeInfo:
    return NodeInfo(
        node_id=node_id,
        url=f"http://{node_id}.internal:9000",
        region=region,
        jurisdiction=JURISDICTION_OF[region],
        models=frozenset(models),
        healthy=healthy,
        load=None if kv is None else NodeLoad(kv_cache_usage=kv, waiting_tokens=waiting),
    )


def provider(
    provider_id: str, region: str = "us-east", *, models: tuple[str, ...] = (LARGE,), healthy: bool = True
) -> ProviderInfo:
    return ProviderInfo(
        provider_id=provider_id,
        kind="openai",
        region=region,
        jurisdiction=JURISDICTION_OF[region],
        models=frozenset(models),
        healthy=healthy,
    )


def fleet(*nodes: NodeInfo, providers: tuple[ProviderInfo, ...] = ()) -> FleetSnapshot:
    return FleetSnapshot(nodes=nodes, providers=providers)


def tenant(
    *,
    jurisdictions: tuple[str, ...] = (),
    regions: tuple[str, ...] = (),
    allow_commercial: bool = False,
    allow_degrade: bool = False,
    models: tuple[str, ...] = ("*",),
    traffic_tier: str = "interactive",
    prefix_cache: str = "shared",
    tenant_id: str = "acme",
) -> TenantPolicy:
    return TenantPolicy(
        tenant_id=tenant_id,
        api_key_hashes=frozenset(),
        models=frozenset(models),
        residency=Residency(jurisdictions=frozenset(jurisdictions), regions=frozenset(regions)),
        traffic_tier=traffic_tier,  # type: ignore[arg-type]
        allow_commercial=allow_commercial,
        allow_degrade=allow_degrade,
        prefix_cache=prefix_cache,  # type: ignore[arg-type]
    )


EU_TENANT = tenant(jurisdictions=("eu",))
ANYWHERE = tenant()
