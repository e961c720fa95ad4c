"""The region-directory seam: who is in the fleet (static file or Consul)."""

from __future__ import annotations

from typing import Protocol

from router.types import NodeInfo


class RegionDirectory(Protocol):
    """Membership of regional nodes. Health and load are overlaid by the gateway's probes.

    `snapshot()` never does I/O: implementations refresh in the background (`start`) and keep
    serving the last membership they saw when their source is unreachable.
    """

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def snapshot(self) -> tuple[NodeInfo, ...]: ...
