"""Prices from the gateway config's model catalog, and what a request's usage costs.

```yaml
price_table_version: "2026-11"
catalog:
  - name: meridian-large
    tier: large
    price: {input: 3.0, cached_input: 0.3, output: 15.0}    # USD per million tokens
    provider_prices:                                        # by the provider's model name
      claude-sonnet-4: {input: 3.0, cached_input: 0.3, output: 15.0}
```

A request served by a provider is priced with the provider model's entry when there is one (the
endpoint's `models:` map says which provider model served the logical one), else the catalog
model's. Cached prompt tokens are priced at `cached_input` (default: `input`); prompt tokens
include the cached ones, as OpenAI counts them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated

import msgspec

PerMillion = Annotated[float, msgspec.Meta(ge=0)]


class ModelPrice(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """USD per million tokens."""

    input: PerMillion
    output: PerMillion
    cached_input: PerMillion | None = None  # default: the input price

    def cost_usd(self, prompt_tokens: int, cached_tokens: int, completion_tokens: int) -> float:
        cached = min(max(cached_tokens, 0), max(prompt_tokens, 0))
        uncached = max(prompt_tokens, 0) - cached
        cached_price = self.input if self.cached_input is None else self.cached_input
        # One division at the end: fewer rounding steps than per-token prices.
        return (uncached * self.input + cached * cached_price + max(completion_tokens, 0) * self.output) / 1e6


FREE = ModelPrice(input=0.0, output=0.0)


@dataclass(frozen=True)
class PriceTable:
    version: str
    # (logical model) -> price, and (logical model, upstream id) -> the provider model's price
    models: Mapping[str, ModelPrice]
    provider_models: Mapping[tuple[str, str], ModelPrice]

    def price(self, model: str, upstream: str) -> ModelPrice:
        return self.provider_models.get((model, upstream)) or self.models.get(model) or FREE

    @classmethod
    def build(
        cls,
        version: str,
        catalog: Iterable[tuple[str, ModelPrice | None, Mapping[str, ModelPrice]]],
        provider_models: Iterable[tuple[str, Mapping[str, str]]],
    ) -> PriceTable:
        """`catalog`: (name, price, provider_prices by provider model name); `provider_models`:
        (endpoint id, logical name -> provider model name)."""
        models: dict[str, ModelPrice] = {}
        by_provider_model: dict[str, dict[str, ModelPrice]] = {}
        for name, price, provider_prices in catalog:
            if price is not None:
                models[name] = price
            by_provider_model[name] = dict(provider_prices)
        routed: dict[tuple[str, str], ModelPrice] = {}
        for endpoint_id, mapping in provider_models:
            for logical, provider_model in mapping.items():
                price = by_provider_model.get(logical, {}).get(provider_model)
                if price is not None:
                    routed[(logical, endpoint_id)] = price
        return cls(version=version, models=models, provider_models=routed)
