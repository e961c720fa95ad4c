"""The audit log: one record per safety decision, appended as a JSON line, and counted.

A record names the request, tenant, layer, rule or category, action, score, side (input or
output) and check latency, with a SHA-256 of the checked text. The text itself is kept only for
tenants whose policy says `log_content: true`, and then with secrets and personal data redacted.
`action` is `block`, `redact`, `flag`, `pass`, `unscanned` (a check that was off, not ready or
failed open: never recorded as `pass`) or `error` (a check that failed closed).

The sink is a JSONL file (the embedded default; `safety.audit_path`), written by one background
task so a slow disk never stalls a request; `read_audit` is the operator's query
(`meridian safety audit`).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram

from gateway.runtime.tasks import cancel_and_wait
from gateway.safety.rules import redact_secrets

logger = logging.getLogger(__name__)
# Lines waiting for the writer; past this the newest are dropped and counted (an audit gap is
# logged loudly rather than growing memory without bound).
_MAX_PENDING = 10_000


@dataclass(frozen=True)
class AuditRecord:
    ts: float
    request_id: str
    tenant: str
    where: str  # input | output
    layer: str  # rules | blocklist | classifier | none
    name: str  # rule or category ("-" for a layer-wide pass)
    action: str
    score: float | None
    latency_ms: float
    text_sha256: str
    text: str | None = None


def text_digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


class SafetyMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.decisions = Counter(
            "meridian_gateway_safety_decisions",
            "Safety decisions by tenant, layer and action (pass, block, redact, flag, unscanned, error).",
            ["tenant", "layer", "action"],
            registry=registry,
        )
        self.check_seconds = Histogram(
            "meridian_gateway_safety_check_seconds",
            "Time one safety check took, by layer and side (input, output).",
            ["layer", "where"],
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
            registry=registry,
        )
        self._decision_children: dict[tuple[str, str, str], Any] = {}

    def decided(self, tenant: str, layer: str, action: str) -> None:
        """Counts one decision. The children are remembered: every call records at least two
        (`unscanned` sides included), and labels() validates and locks each time."""
        key = (tenant, layer, action)
        child = self._decision_children.get(key)
        if child is None:
            child = self._decision_children[key] = self.decisions.labels(tenant, layer, action)
        child.inc()


class AuditLog:
    """Records decisions: counted always, appended to `path` when one is configured."""

    def __init__(self, path: str | None, metrics: SafetyMetrics) -> None:
        self.path = Path(path) if path else None
        self.metrics = metrics
        self.dropped = 0
        self._queue: asyncio.Queue[str] | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self.path is not None and self._task is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._queue = asyncio.Queue(_MAX_PENDING)
            self._task = asyncio.create_task(self._write(), name="safety-audit-writer")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None and self._queue is not None:
            try:
                await asyncio.wait_for(self._queue.join(), timeout=5)
            except TimeoutError:
                logger.error("safety audit: %d records not written at shutdown", self._queue.qsize())
        await cancel_and_wait(task)

    def record(
        self,
        *,
        request_id: str,
        tenant: str,
        where: str,
        layer: str,
        name: str,
        action: str,
        score: float | None,
        latency_s: float,
        text: str,
        log_content: bool,
    ) -> None:
        self.metrics.decided(tenant, layer, action)
        if self._queue is None:
            return
        entry = AuditRecord(
            ts=round(time.time(), 6),
            request_id=request_id,
            tenant=tenant,
            where=where,
            layer=layer,
            name=name,
            action=action,
            score=None if score is None else round(score, 6),
            latency_ms=round(latency_s * 1000, 3),
            text_sha256=text_digest(text),
            text=redact_secrets(text) if log_content else None,
        )
        try:
            self._queue.put_nowait(json.dumps(asdict(entry), ensure_ascii=False))
        except asyncio.QueueFull:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 1000 == 0:
                logger.error("safety audit: the writer is behind, %d records dropped", self.dropped)

    async def flush(self) -> None:
        """Until every record so far is on disk (tests and shutdown)."""
        if self._queue is not None:
            await self._queue.join()

    async def _write(self) -> None:
        assert self._queue is not None and self.path is not None
        queue, path = self._queue, self.path
        while True:
            lines = [await queue.get()]
            while not queue.empty() and len(lines) < 512:
                lines.append(queue.get_nowait())
            try:
                await asyncio.to_thread(_append, path, lines)
            except OSError:
                logger.exception("safety audit: cannot append to %s", path)
            finally:
                for _ in lines:
                    queue.task_done()


def _append(path: Path, lines: list[str]) -> None:
    with open(path, "a", encoding="utf-8") as sink:
        sink.write("\n".join(lines) + "\n")


def read_audit(
    path: str | Path,
    *,
    tenant: str | None = None,
    request_id: str | None = None,
    action: str | None = None,
) -> Iterator[dict[str, Any]]:
    """The records in an audit file that match every given filter, oldest first. A last line the
    writer has not finished yet (no newline) is not a record yet, and is left out."""
    with open(path, encoding="utf-8") as source:
        for line in source:
            if not line.strip() or not line.endswith("\n"):
                continue
            record = json.loads(line)
            if tenant is not None and record.get("tenant") != tenant:
                continue
            if request_id is not None and record.get("request_id") != request_id:
                continue
            if action is not None and record.get("action") != action:
                continue
            yield record
