"""A regional node's presence in Consul: register on start, keep a TTL check honest, leave on stop.

The node tells Consul it is healthy (a TTL check) instead of Consul probing it: the node knows best
whether it can serve (`/ready`: models loaded and warmed), and it works without Consul reaching the
node's port. If the node dies without deregistering, the TTL expires (critical: out of the passing
set) and `DeregisterCriticalServiceAfter` makes Consul drop it altogether.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Annotated, Literal

import msgspec

from protocol.consul.advertisement import (
    META_JURISDICTION,
    META_MODELS,
    META_NODE_ID,
    META_PROBE_FAILED,
    META_REGION,
    META_SCHEME,
    META_VERSIONS,
    SERVICE_NAME,
    ModelTag,
    ModelVersionTag,
    encode_models,
    encode_versions,
)
from protocol.consul.client import ConsulClient, ConsulConfig, ConsulError, ConsulNotFound
from protocol.consul.wire import ServiceCheck, ServiceRegistration, go_duration, meta_problems

logger = logging.getLogger(__name__)

_WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::", "[::]"})


class ConsulRegistrationConfig(ConsulConfig, frozen=True, forbid_unknown_fields=True):
    """The node config's `consul:` section: where the agent is, plus how to register."""

    service: str = SERVICE_NAME
    # The node heartbeats every ttl_s / 3; under a second the TTL would round to nothing.
    ttl_s: Annotated[float, msgspec.Meta(ge=1)] = 10.0
    deregister_critical_after_s: Annotated[float, msgspec.Meta(gt=0)] = 60.0  # Consul's minimum is 1 minute
    # The address the gateway should dial. Default: the node's listen host, or, when it listens on
    # all interfaces, none at all, so that consumers use the Consul agent's node address.
    advertise_address: str | None = None
    url_scheme: Literal["http", "https"] = "http"
    retry_max_s: Annotated[float, msgspec.Meta(gt=0)] = (
        10.0  # longest pause between registration attempts while Consul is down
    )


class RegistrationError(ValueError):
    """The node cannot describe itself to Consul (e.g. metadata Consul would reject)."""


def build_registration(
    config: ConsulRegistrationConfig,
    *,
    node_id: str,
    region: str,
    jurisdiction: str,
    host: str,
    port: int,
    models: Sequence[tuple[str, str]],
    versions: Sequence[ModelVersionTag] = (),
) -> ServiceRegistration:
    """The service definition for one node; `models` are (name, tier) pairs, `versions` those
    of its models that are versioned."""
    address = config.advertise_address if config.advertise_address is not None else host
    address = "" if address in _WILDCARD_HOSTS else address
    meta = {
        META_NODE_ID: node_id,
        META_REGION: region,
        META_JURISDICTION: jurisdiction,
        META_MODELS: encode_models(tuple(ModelTag(name, tier) for name, tier in models)),
        META_SCHEME: config.url_scheme,
    }
    if versions:
        meta[META_VERSIONS] = encode_versions(tuple(versions))
    problems = meta_problems(meta)
    if problems:
        raise RegistrationError("Consul would reject this node's metadata: " + "; ".join(problems))
    service_id = f"{node_id}-{address or 'agent'}:{port}"
    tags = [f"region={region}", f"jurisdiction={jurisdiction}", *(f"model={name}" for name, _ in models)]
    return ServiceRegistration(
        Name=config.service,
        ID=service_id,
        Address=address,
        Port=port,
        Tags=tags,
        Meta=meta,
        Check=ServiceCheck(
            CheckID=f"service:{service_id}",
            Name=f"{node_id} ready",
            TTL=go_duration(config.ttl_s),
            DeregisterCriticalServiceAfter=go_duration(config.deregister_critical_after_s),
            Status="critical",  # out of the passing set until the first heartbeat proves readiness
            Notes="passes while the node's /ready would answer 200",
        ),
    )


class ConsulRegistration:
    """Keeps one service registered and its TTL check reflecting `readiness()`."""

    def __init__(
        self,
        client: ConsulClient,
        registration: ServiceRegistration,
        readiness: Callable[[], bool],
        *,
        retry_max_s: Annotated[float, msgspec.Meta(gt=0)] = 10.0,
        failing_models: Callable[[], Sequence[str]] = tuple,
    ) -> None:
        """`failing_models`: the models failing their golden probes, published in the service's
        meta (META_PROBE_FAILED) at each heartbeat that finds them changed."""
        assert registration.Check is not None and registration.Check.CheckID, (
            "needs a TTL check with a CheckID"
        )
        self._client = client
        self._registration = registration
        self._readiness = readiness
        self._check_id = registration.Check.CheckID
        self._interval_s = _ttl_seconds(registration.Check.TTL) / 3
        self._retry_max_s = retry_max_s
        self._failing_models = failing_models
        self._registered = False
        self._unreachable = False
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def service_id(self) -> str:
        return self._registration.ID

    @property
    def check_id(self) -> str:
        return self._check_id

    async def start(self) -> None:
        """Register now if Consul answers (a down Consul does not stop the node), then heartbeat."""
        with contextlib.suppress(ConsulError):
            await self._register()
        self._task = asyncio.create_task(self._run(), name=f"consul-heartbeat-{self.service_id}")

    def readiness_changed(self) -> None:
        """Heartbeat now instead of at the next interval (e.g. when warm-up finishes)."""
        self._wake.set()

    async def stop(self) -> None:
        """Stop heartbeating and deregister, so the gateway stops routing here at once."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if not self._registered:
            return
        try:
            await self._client.deregister_service(self.service_id)
            logger.info("deregistered %s from Consul", self.service_id)
        except ConsulError as exc:
            # The TTL expires and DeregisterCriticalServiceAfter removes it anyway.
            logger.warning("could not deregister %s from Consul: %s", self.service_id, exc)
        self._registered = False

    async def _register(self) -> None:
        try:
            await self._client.register_service(self._registration)
        except ConsulError as exc:
            self._report(exc)
            raise
        self._registered = True
        self._recovered()
        logger.info("registered %s in Consul as %s", self.service_id, self._registration.Name)

    async def _run(self) -> None:
        backoff = min(1.0, self._retry_max_s)
        while True:
            if not self._registered:
                try:
                    await self._register()
                except ConsulError:
                    await self._sleep(backoff)
                    backoff = min(backoff * 2, self._retry_max_s)
                    continue
                backoff = min(1.0, self._retry_max_s)
            try:
                await self._heartbeat()
            except ConsulNotFound:
                # The agent lost us (restarted without state, or reaped us after a long pause).
                logger.warning("Consul no longer knows %s; registering again", self.service_id)
                self._registered = False
                continue
            except ConsulError as exc:
                self._report(exc)
            else:
                self._recovered()
            await self._sleep(self._interval_s)

    async def _heartbeat(self) -> None:
        try:
            ready = bool(self._readiness())
        except Exception:
            logger.exception("readiness check failed; reporting not ready")
            ready = False
        await self._publish_probes(ready)
        if ready:
            await self._client.update_ttl(self._check_id, "pass", "ready")
        else:
            await self._client.update_ttl(self._check_id, "fail", "not ready")

    async def _publish_probes(self, ready: bool) -> None:
        """Register again with the failing models in meta when they changed (Consul replaces a
        service's meta only by registering it again); the check keeps the state it has."""
        meta = dict(self._registration.Meta)
        failing = ",".join(sorted(self._failing_models()))
        if failing:
            meta[META_PROBE_FAILED] = failing
        else:
            meta.pop(META_PROBE_FAILED, None)
        if meta == self._registration.Meta:
            return
        check = self._registration.Check
        assert check is not None
        registration = msgspec.structs.replace(
            self._registration,
            Meta=meta,
            Check=msgspec.structs.replace(check, Status="passing" if ready else "critical"),
        )
        await self._client.register_service(registration)
        self._registration = registration
        logger.info("Consul meta of %s: models failing their probes: %s", self.service_id, failing or "none")

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), seconds)
        self._wake.clear()

    def _report(self, exc: ConsulError) -> None:
        # Once per outage: a node retrying every few seconds must not flood its log.
        if not self._unreachable:
            self._unreachable = True
            logger.warning("Consul call for %s failed (%s); retrying in the background", self.service_id, exc)

    def _recovered(self) -> None:
        if self._unreachable:
            self._unreachable = False
            logger.info("Consul reachable again for %s", self.service_id)


def _ttl_seconds(ttl: str) -> float:
    if ttl.endswith("ms"):
        return float(ttl[:-2]) / 1000
    if ttl.endswith("s"):
        return float(ttl[:-1])
    raise ValueError(f"TTL {ttl!r} is not in the seconds/milliseconds form go_duration writes")
