"""The gateway config's `providers:` section as typed structs (validated with the rest of the file).

```yaml
providers:
  endpoints:
    - id: openai-us
      kind: openai                 # openai | anthropic
      base_url: https://api.openai.com/v1
      api_key_env: OPENAI_API_KEY  # the NAME of the variable holding the key, never the key
      region: us-east
      jurisdiction: US
      serve_as: fallback           # model | fallback
      models: {llama-3-8b: gpt-4o-mini}   # logical name -> provider's model name
      timeouts: {connect_s: 3, first_byte_s: 60, idle_s: 30}
      breaker: {failure_rate: 0.5, min_calls: 5, window_s: 30, cooldown_s: 15, half_open_probes: 1}
  redis_url: redis://127.0.0.1:6379/0   # share breaker openings (default: the quota's Redis)
  sync_interval_s: 0.5             # how often breaker marks are read from Redis (when shared)
```

Errors name the file and the field: `gateway.yaml: $.providers.endpoints[0].kind: ...`. Rules the
types cannot express are checked in `__post_init__`, which says "field: why" relative to its struct;
the config loader puts that under the struct's path. The API keys themselves are looked up when the
registry is built (`resolve_api_keys`), since the environment is the builder's to give.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Annotated, Literal
from urllib.parse import urlparse

import msgspec

from gateway.config_reader import Section
from gateway.health import BreakerConfig, Cooldown, RollingWindow

ProviderKind = Literal["openai", "anthropic"]
ServeAs = Literal["model", "fallback"]


class ProviderConfigError(Exception):
    """A provider's API key variable is unset; the message names the source and the field."""


class ProviderTimeouts(Section):
    connect_s: float = 3.0  # TCP + TLS connect
    first_byte_s: float = 60.0  # request sent -> response headers (a whole answer, unstreamed)
    idle_s: float = 30.0  # the longest silence between two stream events or body reads

    def __post_init__(self) -> None:
        for name in ("connect_s", "first_byte_s", "idle_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}: must be positive")


class BreakerSettings(Section):
    failure_rate: float = 0.5
    min_calls: int = 5
    window_s: float = 30.0
    cooldown_s: Annotated[float, msgspec.Meta(ge=0)] = 15.0
    half_open_probes: int = 1
    probe_successes: int = 1
    default_retry_after_s: float = 1.0

    def __post_init__(self) -> None:
        self.to_config()  # BreakerConfig's own checks, which name the field

    def to_config(self) -> BreakerConfig:
        return BreakerConfig(
            opens=RollingWindow(
                failure_rate=self.failure_rate, min_calls=self.min_calls, window_s=self.window_s
            ),
            cooldown=Cooldown(self.cooldown_s),
            half_open_probes=self.half_open_probes,
            probe_successes=self.probe_successes,
            default_retry_after_s=self.default_retry_after_s,
        )


class ProviderEntry(Section):
    id: str
    kind: ProviderKind
    base_url: str
    api_key_env: str
    region: str
    jurisdiction: str
    models: dict[str, str]
    serve_as: ServeAs = "fallback"
    timeouts: ProviderTimeouts = msgspec.field(default_factory=ProviderTimeouts)
    breaker: BreakerSettings = msgspec.field(default_factory=BreakerSettings)
    # Anthropic's Messages API requires max_tokens; this fills it when a request has none.
    default_max_tokens: int = 1024
    anthropic_version: str = "2023-06-01"

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", self.id):
            raise ValueError(f"id: {self.id!r} is not a valid id (letters, digits, '-', '_', '.')")
        url = urlparse(self.base_url)
        if url.scheme not in ("http", "https") or not url.netloc:
            raise ValueError(f"base_url: expected an http(s) URL, got {self.base_url!r}")
        if not self.api_key_env:
            raise ValueError("api_key_env: the name of an environment variable is required")
        if not self.models:
            raise ValueError("models: at least one logical model -> provider model mapping is required")
        for logical, remote in self.models.items():
            if not logical or not remote:
                raise ValueError(f"models: empty model name in {logical!r}: {remote!r}")
        if self.default_max_tokens < 1:
            raise ValueError("default_max_tokens: must be at least 1")


class ProvidersConfig(Section):
    endpoints: list[ProviderEntry] = msgspec.field(default_factory=list)
    # Share breaker openings across replicas through this Redis (default: the quota's Redis).
    redis_url: str | None = None
    sync_interval_s: float = 0.5
    store_timeout_s: float = 0.1  # one Redis read or write of breaker marks

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for i, entry in enumerate(self.endpoints):
            if entry.id in seen:
                raise ValueError(f"endpoints[{i}].id: duplicate provider id {entry.id!r}")
            seen.add(entry.id)
        if self.sync_interval_s <= 0:
            raise ValueError("sync_interval_s: must be positive")
        if self.store_timeout_s <= 0:
            raise ValueError("store_timeout_s: must be positive")


def resolve_api_key(entry: ProviderEntry, index: int, env: Mapping[str, str], source: str) -> str:
    # Stripped like the node token: secrets read from files often end in a newline.
    key = env.get(entry.api_key_env, "").strip()
    field = f"{source}: $.providers.endpoints[{index}].api_key_env"
    if not key:
        raise ProviderConfigError(f"{field}: environment variable {entry.api_key_env!r} is not set")
    if "\r" in key or "\n" in key:
        # It goes into a request header, where a line break would end the header.
        raise ProviderConfigError(f"{field}: environment variable {entry.api_key_env!r} holds a line break")
    return key


def resolve_api_keys(
    config: ProvidersConfig, *, env: Mapping[str, str] | None = None, source: str = "<memory>"
) -> dict[str, str]:
    """Each provider's key from the environment, by provider id; a missing one is an error."""
    env = os.environ if env is None else env
    return {e.id: resolve_api_key(e, i, env, source) for i, e in enumerate(config.endpoints)}
