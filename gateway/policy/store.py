"""PolicyStore: the gateway's live policy set, reloaded from disk without a restart.

A background task polls the directory every `interval` seconds: a cheap stat fingerprint
(names, mtimes, sizes) decides whether to read, and a digest of the contents decides whether to
parse. A broken edit never takes effect: the last good set keeps serving, and the error (with
file and field) is logged once and kept in `last_error` until a good version replaces it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from pathlib import Path

from gateway.policy.errors import PolicyError
from gateway.policy.loader import build_policy_set, policy_files, read_source
from gateway.policy.policy_set import PolicySet, as_extra
from gateway.runtime.tasks import cancel_and_wait
from router.types import TenantPolicy

log = logging.getLogger(__name__)

_Fingerprint = tuple[tuple[str, int, int], ...]


class PolicyStore:
    """`current()` is the last good PolicySet; `start()` loads (raising PolicyError if the files
    are invalid at start-up: better not to start than to start with no tenants) and begins
    polling; `stop()` ends polling. `path=None` serves only the in-memory `extra` policies."""

    def __init__(
        self,
        path: str | Path | None,
        *,
        interval: float = 1.0,
        extra: Sequence[TenantPolicy] = (),
    ) -> None:
        self.path = Path(path) if path is not None else None
        self.interval = interval
        self.extra = tuple(extra)
        self.last_error: PolicyError | None = None
        self._current: PolicySet | None = None
        self._fingerprint: _Fingerprint | None = None
        self._seen_digest: str | None = None  # last contents looked at, good or bad
        self._good_digest: str | None = None  # contents of the set now serving
        self._task: asyncio.Task[None] | None = None

    def current(self) -> PolicySet:
        if self._current is None:
            raise RuntimeError("PolicyStore.start() (or load()) has not run yet")
        return self._current

    def authenticate(self, api_key: str) -> TenantPolicy | None:
        return self.current().authenticate(api_key)

    def load(self) -> PolicySet:
        """Load now, synchronously; raises PolicyError and leaves the store unchanged if invalid."""
        if self.path is None:
            self._current = PolicySet.build(as_extra(self.extra))
            return self._current
        fingerprint = self._stat()
        source = read_source(self.path)
        policies = build_policy_set(source, self.extra)
        self._install(policies, fingerprint, source.digest)
        return policies

    def reload(self) -> bool:
        """Poll once: pick up a changed directory if it is valid. True when a new set was installed.

        Never raises for a bad policy; the error goes to `last_error` and the log instead.
        """
        if self.path is None:
            return False
        try:
            fingerprint = self._stat()
            if fingerprint == self._fingerprint:
                return False
            source = read_source(self.path)
        except (PolicyError, OSError) as exc:
            self._fail(exc if isinstance(exc, PolicyError) else PolicyError(str(self.path), "", str(exc)))
            return False
        self._fingerprint = fingerprint
        if source.digest == self._seen_digest:
            return False  # touched, not changed
        self._seen_digest = source.digest
        if source.digest == self._good_digest:
            # Reverted to what is serving: nothing to install, but the error is over.
            self._clear_error()
            return False
        try:
            policies = build_policy_set(source, self.extra)
        except PolicyError as exc:
            self._fail(exc)
            return False
        self._install(policies, fingerprint, source.digest)
        log.info("policies reloaded: %d tenants", len(policies))
        return True

    async def start(self) -> None:
        if self._current is None:
            await asyncio.to_thread(self.load)
        if self._task is None and self.path is not None:
            self._task = asyncio.create_task(self._poll(), name="policy-store-poll")

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)

    async def __aenter__(self) -> PolicyStore:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                # File reads and YAML parsing stay off the event loop.
                await asyncio.to_thread(self.reload)
            except Exception:  # a bug here must not end hot reload for good
                log.exception("policy reload failed unexpectedly")

    def _stat(self) -> _Fingerprint:
        assert self.path is not None
        stats = []
        for p in policy_files(self.path):
            st = p.stat()
            stats.append((p.name, st.st_mtime_ns, st.st_size))
        return tuple(stats)

    def _install(self, policies: PolicySet, fingerprint: _Fingerprint, digest: str) -> None:
        self._current = policies
        self._fingerprint = fingerprint
        self._seen_digest = self._good_digest = digest
        self._clear_error()

    def _fail(self, error: PolicyError) -> None:
        if self.last_error is None or str(self.last_error) != str(error):
            log.error("policy reload rejected, still serving the last good policies: %s", error)
        self.last_error = error

    def _clear_error(self) -> None:
        if self.last_error is not None:
            log.info("policy error resolved")
        self.last_error = None
