"""A real gateway with commercial providers configured, on tests/gateway's harness (run_gateway:
create_app served by uvicorn in a background thread), plus the tenants provider tests need."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import yaml

from gateway.policy import key_digest
from router.types import Residency, TenantPolicy
from tests.gateway.conftest import NodeProcess, RunningGateway, gateway_config, run_gateway
from tests.providers.conftest import provider_entry
from tests.support.fake_providers import FakeProvider, running
from tests.support.processes import free_port


def tenant(
    tenant_id: str, key: str, *, jurisdictions: tuple[str, ...] = (), commercial: bool = True
) -> TenantPolicy:
    return TenantPolicy(
        tenant_id=tenant_id,
        api_key_hashes=frozenset({key_digest(key)}),
        residency=Residency(jurisdictions=frozenset(jurisdictions)),
        allow_commercial=commercial,
    )


US_KEY, EU_KEY, PRIVATE_KEY = "sk-us-tenant", "sk-eu-tenant", "sk-private-tenant"
TENANTS = (
    tenant("us-co", US_KEY, jurisdictions=("us",)),
    tenant("eu-co", EU_KEY, jurisdictions=("eu",)),
    tenant("private-co", PRIVATE_KEY, commercial=False),  # may run anywhere, but never commercially
)


def listed(node: NodeProcess) -> dict[str, Any]:
    """The regions-file entry of a running node (us-east, jurisdiction us) serving `tiny`."""
    return {
        "node_id": node.node_id,
        "url": node.url,
        "region": "us-east",
        "jurisdiction": "us",
        "models": ["tiny"],
    }


def dead_node(node_id: str, region: str, jurisdiction: str) -> dict[str, Any]:
    """A node the directory lists but nothing answers for: the fleet cannot serve."""
    url = f"http://127.0.0.1:{free_port()}"
    return {
        "node_id": node_id,
        "url": url,
        "region": region,
        "jurisdiction": jurisdiction,
        "models": ["tiny"],
    }


@contextmanager
def running_gateway(
    tmp_path: Path,
    *,
    providers: Sequence[dict[str, Any]],
    nodes: Sequence[dict[str, Any]],
    env: Mapping[str, str],
) -> Iterator[RunningGateway]:
    """A gateway in us-east serving the logical model `tiny` from `nodes` and `providers`."""
    regions = tmp_path / "regions.yaml"
    regions.write_text(yaml.safe_dump({"nodes": list(nodes)}), encoding="utf-8")
    config = gateway_config(
        regions,
        home_region="us-east",
        catalog=[{"name": "tiny", "tier": "small"}],
        providers={"endpoints": list(providers)},
    )
    with run_gateway(config, tenants=TENANTS, env=env) as gateway:
        yield gateway


# The provider each kind's gateway of `one_provider_gateway` lists.
PROVIDER_IDS = {"openai": "a-openai", "anthropic": "a-anthropic"}


@contextmanager
def one_provider_gateway(
    kind: Literal["openai", "anthropic"], node: NodeProcess, folder: Path
) -> Iterator[tuple[RunningGateway, FakeProvider]]:
    """A gateway over a real node and one fake provider of `kind` (tool calls go to the provider)."""
    with running(FakeProvider(kind, api_key=f"sk-{kind}-test")) as fake:
        entry = provider_entry(fake, PROVIDER_IDS[kind], jurisdiction="us")
        with running_gateway(
            folder, providers=[entry], nodes=[listed(node)], env={entry["api_key_env"]: fake.api_key}
        ) as gateway:
            yield gateway, fake
