"""The live rollout plans, reloaded from the gateway's config file, and checkpoint drift.

Rollback has to be instant, so a rollout is the one part of the gateway config that reloads
without a restart: every `interval_s` the config file's modification time is checked; a changed
file is validated whole (a broken file is logged and the last good plans stay in force) and only
its catalog's `rollout:` sections are taken. Any other change still needs a restart, and the log
says so. A config that did not come from a file (tests, `meridian up`) has nothing to reload.

The same loop compares the checkpoint hashes that replicas of one model version advertise
(router.rollout.checkpoint_drift): a disagreement sets `meridian_gateway_version_drift` and is
logged as a warning once per change, since two replicas answering one version differently is
exactly what a rollout's version pinning cannot see.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from pathlib import Path

import msgspec
from prometheus_client import CollectorRegistry, Gauge

from gateway.config import ConfigError, GatewayConfig, load_config
from gateway.runtime.tasks import cancel_and_wait
from router.rollout import checkpoint_drift
from router.types import FleetSnapshot, Rollout

logger = logging.getLogger(__name__)


class RolloutPlans:
    def __init__(
        self,
        config: GatewayConfig,
        snapshot: Callable[[], FleetSnapshot],
        registry: CollectorRegistry,
        *,
        interval_s: float = 1.0,
    ) -> None:
        self._config = config
        self._plans: Mapping[str, Rollout] = config.rollouts()
        self._snapshot = snapshot
        self._interval_s = interval_s
        path = Path(config.source)
        self._path = path if path.is_file() else None
        self._mtime_ns = self._current_mtime()
        self._drift: dict[tuple[str, str], frozenset[str]] = {}
        self._task: asyncio.Task[None] | None = None
        self._drift_gauge = Gauge(
            "meridian_gateway_version_drift",
            "Distinct checkpoint hashes advertised by replicas of one model version (set while above 1).",
            ["model", "version"],
            registry=registry,
        )

    def current(self) -> Mapping[str, Rollout]:
        return self._plans

    async def start(self) -> None:
        self._task = asyncio.create_task(self._watch(), name="rollout-watch")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    def reload(self) -> bool:
        """Re-read the config file's rollouts; True when they changed."""
        if self._path is None:
            return False
        try:
            fresh = load_config(self._path)
        except ConfigError as exc:
            logger.error("rollout reload rejected, keeping the last good plans: %s", exc)
            return False
        if [e.name for e in fresh.catalog] != [e.name for e in self._config.catalog]:
            logger.error("rollout reload rejected: the catalog's models changed, which needs a restart")
            return False
        unchanged = msgspec.structs.replace(
            fresh,
            catalog=[
                msgspec.structs.replace(new, rollout=old.rollout, versions=old.versions)
                for new, old in zip(fresh.catalog, self._config.catalog, strict=True)
            ],
        )
        if unchanged != self._config:
            logger.warning(
                "the gateway config changed beyond rollouts: only the rollouts take effect before a restart"
            )
        plans = fresh.rollouts()
        if plans == self._plans:
            return False
        self._config = msgspec.structs.replace(self._config, catalog=fresh.catalog)
        self._plans = plans  # one reference swap: a request sees the old plans or the new
        logger.info("rollouts reloaded: %s", _describe(plans))
        return True

    def check_drift(self) -> None:
        drift = checkpoint_drift(self._snapshot().nodes)
        for key in self._drift.keys() - drift.keys():
            self._drift_gauge.remove(*key)
        for (model, version), hashes in drift.items():
            self._drift_gauge.labels(model, version).set(len(hashes))
            if self._drift.get((model, version)) != hashes:
                logger.warning(
                    "checkpoint drift: replicas of %s version %s advertise different checkpoints %s",
                    model,
                    version,
                    sorted(hashes),
                )
        self._drift = drift

    def _current_mtime(self) -> int | None:
        try:
            return self._path.stat().st_mtime_ns if self._path is not None else None
        except OSError:
            return None

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                self.check_drift()
                mtime = self._current_mtime()
                if mtime is not None and mtime != self._mtime_ns:
                    self._mtime_ns = mtime
                    await asyncio.to_thread(self.reload)
            except Exception:  # a bug here must not end reloading for good
                logger.exception("rollout watch failed unexpectedly")


def _describe(plans: Mapping[str, Rollout]) -> str:
    if not plans:
        return "none"
    return "; ".join(
        f"{model}: " + ", ".join(f"{version}={weight}" for version, weight in plan.weights)
        for model, plan in plans.items()
    )
