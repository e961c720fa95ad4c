"""`batches:` in the gateway config: the Files and Batches APIs.

```yaml
batches:
  enabled: true
  storage_dir: .meridian/batch-files   # uploaded and output files (relative to the config file)
  max_file_bytes: 10485760             # an upload over this is refused (also bounded by server.max_body_bytes)
  max_lines: 50000                     # requests per input file
  max_enqueued_lines: 200000           # a tenant's requests waiting in its running batches; a batch past it fails
  lease_s: 30                          # a claimed line is this gateway's for this long (renewed while it runs)
  concurrency: 4                       # lines one gateway runs at once
  max_attempts: 5                      # tries of a line refused for capacity before it fails
  poll_interval_s: 0.5                 # how often an idle runner looks for work
  callback_allowed_networks: []        # non-public networks callback_urls may reach (e.g. 10.20.0.0/16)
```

A `callback_url` is the tenant's choice: one that points at an address that is not globally
routable (the gateway's own network, a cloud metadata service) is not called unless its network is
listed in `callback_allowed_networks` (batches/callbacks.py).

The batch state lives in the ledger's database (`ledger.store`: SQLite or PostgreSQL): several
gateways sharing it share the work.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from gateway.batches.callbacks import networks


class BatchesConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    enabled: bool = True
    storage_dir: str = ".meridian/batch-files"
    max_file_bytes: Annotated[int, msgspec.Meta(ge=1)] = 10 * 1024 * 1024
    max_lines: Annotated[int, msgspec.Meta(ge=1)] = 50_000
    # OpenAI's "enqueued token limit", in requests: what one tenant may have waiting at once, so a
    # tenant cannot queue days of work ahead of the others. A batch that would pass it is created
    # `failed` (its `errors` say why), as OpenAI fails one at validation.
    max_enqueued_lines: Annotated[int, msgspec.Meta(ge=1)] = 200_000
    lease_s: Annotated[float, msgspec.Meta(gt=0)] = 30.0
    concurrency: Annotated[int, msgspec.Meta(ge=1, le=256)] = 4
    max_attempts: Annotated[int, msgspec.Meta(ge=1, le=100)] = 5
    poll_interval_s: Annotated[float, msgspec.Meta(gt=0)] = 0.5
    # Tries of a callback_url POST, with doubling waits from 1 s.
    callback_attempts: Annotated[int, msgspec.Meta(ge=1, le=20)] = 5
    callback_timeout_s: Annotated[float, msgspec.Meta(gt=0)] = 10.0
    # Networks that are not globally routable which callbacks may reach anyway (CIDRs): an internal
    # receiver's; `make up` lists loopback. Everything else non-public is refused.
    callback_allowed_networks: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # The runner renews its leases between polls: a poll longer than that would let them lapse.
        if self.poll_interval_s > self.lease_s / 3:
            raise ValueError("batches.poll_interval_s: must be at most a third of lease_s")
        try:
            networks(self.callback_allowed_networks)
        except ValueError as exc:
            raise ValueError(f"batches.callback_allowed_networks: not a network ({exc})") from None
