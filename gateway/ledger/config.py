"""The gateway config's `ledger:` section (validated with the rest of the file).

```yaml
ledger:
  worker: embedded            # embedded: a task in each gateway | external: `meridian ledger`
  store:
    type: sqlite              # the embedded default
    path: .meridian/ledger.sqlite   # relative to the config file's folder
  # store: {type: postgres, dsn_env: MERIDIAN_LEDGER_DSN}   # the DSN is a secret: named, not written
  retention_days: 90          # raw events (and minute rollups); hour and day rollups are kept
  operator_keys: ["sha256:..."]   # may query /v1/usage and /v1/costs for any or all tenants
  batch_size: 500             # events per store transaction
  poll_interval_ms: 200       # Redis streams: how long an idle worker waits before reading again
  claim_idle_ms: 30000        # pending entries of a consumer silent this long are taken over
  discover_interval_s: 10     # how often the worker scans Redis for tenants' usage streams
```
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from gateway.config_reader import Section
from gateway.policy.keys import parse_key_hash


class SqliteStoreConfig(Section, tag_field="type", tag="sqlite"):
    path: str = ".meridian/ledger.sqlite"


class PostgresStoreConfig(Section, tag_field="type", tag="postgres"):
    dsn_env: str = "MERIDIAN_LEDGER_DSN"  # the variable holding the DSN (it may hold a password)
    pool_size: Annotated[int, msgspec.Meta(ge=1, le=64)] = 4
    timeout_s: Annotated[float, msgspec.Meta(gt=0)] = 5.0


StoreConfig = SqliteStoreConfig | PostgresStoreConfig


class LedgerConfig(Section):
    enabled: bool = True
    worker: Literal["embedded", "external"] = "embedded"
    store: StoreConfig = msgspec.field(default_factory=SqliteStoreConfig)
    retention_days: Annotated[int, msgspec.Meta(ge=1)] = 90
    operator_keys: list[str] = msgspec.field(default_factory=list)
    batch_size: Annotated[int, msgspec.Meta(ge=1, le=10_000)] = 500
    poll_interval_ms: Annotated[int, msgspec.Meta(ge=1, le=60_000)] = 200
    claim_idle_ms: Annotated[int, msgspec.Meta(ge=100)] = 30_000
    discover_interval_s: Annotated[float, msgspec.Meta(gt=0)] = 10.0
    consumer_group: str = "meridian-ledger"

    def __post_init__(self) -> None:
        for i, key in enumerate(self.operator_keys):
            if parse_key_hash(key) is None:
                raise ValueError(
                    f"operator_keys[{i}]: expected 'sha256:<64 hex digits>' (meridian policy hash-key KEY)"
                )

    def operator_digests(self) -> frozenset[str]:
        return frozenset(d for k in self.operator_keys if (d := parse_key_hash(k)) is not None)
