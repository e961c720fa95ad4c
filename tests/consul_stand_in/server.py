"""Running the stand-in: agents on loopback ports in a background thread, with stop and restart."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from tests.consul_stand_in.catalog import Datacenter
from tests.consul_stand_in.http import AgentServer, Federation

T = TypeVar("T")


class ConsulStandIn:
    """WAN-federated Consul datacenters, one agent (HTTP listener) per datacenter.

    `start()` binds each agent to a loopback port (chosen once, then kept, so a restart comes back
    on the same address). `stop()` resets every open connection like a killed agent. `restart()`
    keeps the catalog (a restarted server with its Raft data) unless `keep_state=False` (a rebuilt
    cluster: services gone and the index starts over, so watchers see it go backwards).
    """

    def __init__(
        self,
        datacenters: tuple[str, ...] = ("dc1",),
        *,
        acl_token: str | None = None,
        min_deregister_after_s: float = 60.0,
        reap_interval_s: float = 30.0,
        tick_s: float = 0.05,
    ) -> None:
        self.datacenter_names = datacenters
        self.acl_token = acl_token
        self._dc_options = {
            "min_deregister_after_s": min_deregister_after_s,
            "reap_interval_s": reap_interval_s,
        }
        self._tick_s = tick_s
        self._datacenters = self._fresh_state()
        self._ports = dict.fromkeys(datacenters, 0)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._agents: list[AgentServer] = []
        self._ticker: asyncio.Task[None] | None = None

    def _fresh_state(self) -> dict[str, Datacenter]:
        return {name: Datacenter(name, **self._dc_options) for name in self.datacenter_names}

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> ConsulStandIn:
        assert self._thread is None, "already running"
        loop = asyncio.new_event_loop()
        ready = threading.Event()
        self._loop = loop
        self._thread = threading.Thread(
            target=self._run, args=(loop, ready), name="consul-stand-in", daemon=True
        )
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("the Consul stand-in did not start")
        self.call_async(self._start_agents)
        return self

    def stop(self) -> None:
        if self._thread is None or self._loop is None:
            return
        self.call_async(self._stop_agents)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
        self._thread = self._loop = None

    def restart(self, *, keep_state: bool = True) -> None:
        self.stop()
        if not keep_state:
            self._datacenters = self._fresh_state()
        self.start()

    @property
    def running(self) -> bool:
        return self._thread is not None

    def __enter__(self) -> ConsulStandIn:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def _run(self, loop: asyncio.AbstractEventLoop, ready: threading.Event) -> None:
        asyncio.set_event_loop(loop)
        loop.call_soon(ready.set)
        loop.run_forever()

    async def _start_agents(self) -> None:
        federation = Federation(self._datacenters, acl_token=self.acl_token)
        self._agents = [
            AgentServer(federation, dc, self._ports[dc], time.monotonic) for dc in self.datacenter_names
        ]
        for agent in self._agents:
            self._ports[agent.dc] = await agent.start()
        self._ticker = asyncio.create_task(self._tick(federation))

    async def _stop_agents(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            await asyncio.gather(self._ticker, return_exceptions=True)
        for agent in self._agents:
            await agent.stop()
        self._agents = []

    async def _tick(self, federation: Federation) -> None:
        # TTL expiry and reaping are time-driven; a short tick keeps them within ~50 ms of due.
        while True:
            now = time.monotonic()
            for name, dc in federation.datacenters.items():
                if dc.tick(now):
                    federation.notify(name)
            await asyncio.sleep(self._tick_s)

    # -- addresses and inspection ------------------------------------------------------------------
    def address(self, dc: str | None = None) -> str:
        """host:port of the agent in `dc` (the first datacenter by default)."""
        return f"127.0.0.1:{self._ports[dc or self.datacenter_names[0]]}"

    def url(self, dc: str | None = None) -> str:
        return f"http://{self.address(dc)}"

    def call(self, fn: Callable[[], T]) -> T:
        """Run `fn` on the stand-in's loop (where its state lives) and return its result."""

        async def wrapper() -> T:
            return fn()

        return self.call_async(wrapper)

    def call_async(self, fn: Callable[[], Coroutine[Any, Any, T]]) -> T:
        assert self._loop is not None, "the stand-in is not running"
        return asyncio.run_coroutine_threadsafe(fn(), self._loop).result(10)

    def datacenter(self, dc: str | None = None) -> Datacenter:
        """The live state of `dc`; read it through `call` while running."""
        return self._datacenters[dc or self.datacenter_names[0]]

    def service_ids(self, dc: str | None = None) -> set[str]:
        state = self.datacenter(dc)
        return self.call(lambda: set(state.services)) if self.running else set(state.services)

    def check_status(self, check_id: str, dc: str | None = None) -> str | None:
        state = self.datacenter(dc)

        def read() -> str | None:
            check = state.checks.get(check_id)
            return check.status if check else None

        return self.call(read) if self.running else read()
