"""The batch runner: a task in each gateway that takes lines from the shared store under a
lease, runs them through the request pipeline at the batch traffic tier, ends batches (writing
their output and error files), and calls their `callback_url`.

Calls go down: the runner drives the pipeline as a front door does (it is the front door of the
requests it holds), and the store decides who holds what. A line refused for capacity (429/503:
the batch tier stepped back for interactive traffic, or every upstream was full) is given back
and retried later, up to `max_attempts`; any other error is that line's answer, in the error file.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import socket
import time
from typing import Any

import httpx

from gateway.batches.callbacks import CallbackEgress, CallbackRefused, networks
from gateway.batches.config import BatchesConfig
from gateway.batches.errors import BatchStoreUnavailable
from gateway.batches.input import ENDPOINTS
from gateway.batches.objects import batch_object
from gateway.batches.records import BatchRecord, ClaimedLine, FileRecord, LineResult, LineUsage
from gateway.batches.storage import FileStorage
from gateway.batches.store import BatchStore
from gateway.call.pipeline import RequestPipeline
from gateway.errors import to_api_error
from gateway.metrics import GatewayMetrics
from gateway.policy import PolicyStore
from gateway.runtime.tasks import cancel_and_wait
from protocol import APIError, ChatCompletionRequest, CompletionRequest
from protocol.chunk import to_builtins
from protocol.openai import decode_request_and_object

logger = logging.getLogger(__name__)

_REQUEST_TYPES = {"chat": ChatCompletionRequest, "completions": CompletionRequest}
_RETRYABLE = (429, 503)


class BatchRunner:
    def __init__(
        self,
        config: BatchesConfig,
        store: BatchStore,
        storage: FileStorage,
        pipeline: RequestPipeline,
        policies: PolicyStore,
        metrics: GatewayMetrics,
    ) -> None:
        """A line's error is mapped as the same request's would be (gateway/errors.py)."""
        self._config = config
        self._store = store
        self._storage = storage
        self._pipeline = pipeline
        self._policies = policies
        self._metrics = metrics
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{os.urandom(4).hex()}"
        self._running: dict[tuple[str, int], tuple[asyncio.Task[None], ClaimedLine]] = {}
        self._callbacks: dict[str, asyncio.Task[None]] = {}
        self._egress = CallbackEgress(networks(config.callback_allowed_networks))
        # Built once: httpx would build one per client, loading the CA bundle (50-100 ms of CPU)
        # on the event loop that serves every request, at each batch's callback.
        self._tls = httpx.create_ssl_context()
        self._wake = asyncio.Event()

    async def run(self) -> None:
        while True:
            try:
                await self._claim()
                if self._running:
                    await self._renew()
                for batch, ending in await self._store.claim_finishable(
                    self.owner, time.time(), self._config.lease_s
                ):
                    await self._end(batch, ending)
                await self._start_callbacks()
            except BatchStoreUnavailable as exc:
                logger.warning("batch runner: store unavailable (will retry): %s", exc)
            except Exception:
                logger.exception("batch runner: unexpected error (will retry)")
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), self._config.poll_interval_s)
            except TimeoutError:
                pass

    async def stop(self) -> None:
        """Running lines are cancelled; their leases lapse and another gateway (or this one,
        restarted) runs them again."""
        for task in [*(task for task, _ in self._running.values()), *self._callbacks.values()]:
            await cancel_and_wait(task)

    async def _claim(self) -> None:
        free = self._config.concurrency - len(self._running)
        if free <= 0:
            return
        for line in await self._store.claim_lines(self.owner, time.time(), self._config.lease_s, free):
            key = (line.batch_id, line.line_no)
            task = asyncio.create_task(self._run_line(line), name=f"batch line {key}")
            self._running[key] = (task, line)
            self._metrics.batch_lines_running.set(len(self._running))
            task.add_done_callback(lambda _, key=key: self._line_done(key))

    async def _renew(self) -> None:
        """Keeps the running lines' leases; aborts those whose batch was cancelled (the pipeline
        closes their node requests) and gives them back unanswered."""
        stopped = await self._store.renew(self.owner, list(self._running), time.time() + self._config.lease_s)
        for key in stopped:
            task, line = self._running.get(key, (None, None))
            if task is not None and line is not None:
                await cancel_and_wait(task)
                await self._store.retry_line(self.owner, line, 0.0)

    def wake(self) -> None:
        """New work (a batch created or cancelled): look now, not at the next poll."""
        self._wake.set()

    def _line_done(self, key: tuple[str, int]) -> None:
        self._running.pop(key, None)
        self._metrics.batch_lines_running.set(len(self._running))
        self._wake.set()

    async def _run_line(self, line: ClaimedLine) -> None:
        pipeline = self._pipeline
        ctx = pipeline.start_call({})
        try:
            policy = self._policies.current().get(line.tenant_id)
            if policy is None:
                raise APIError(f"Tenant '{line.tenant_id}' no longer exists.", code="tenant_not_found")
            ctx.tenant = dataclasses.replace(policy, traffic_tier="batch")
            ctx.api_key_id = line.api_key_id
            endpoint = ENDPOINTS[line.url]
            parsed, body = decode_request_and_object(json.dumps(line.body).encode(), _REQUEST_TYPES[endpoint])
            result = await pipeline.complete(ctx, endpoint, parsed, body)
        except Exception as exc:
            error = to_api_error(exc, request_id=ctx.request_id)
            pipeline.record(ctx, str(error.status_code), stream=False)
            if error.status_code in _RETRYABLE and line.attempts + 1 < self._config.max_attempts:
                wait = _retry_after(error) or min(60.0, 2.0**line.attempts)
                await self._store.retry_line(self.owner, line, time.time() + wait)
                self._count(line, "retried")
                return
            response = {
                "status_code": error.status_code,
                "request_id": ctx.request_id,
                "body": error.to_body(),
            }
            await self._finish(line, "failed", response, LineUsage(0, 0, 0))
            return
        pipeline.record(ctx, "200", stream=False)
        body = to_builtins(result)
        response = {"status_code": 200, "request_id": ctx.request_id, "body": body}
        await self._finish(line, "completed", response, _usage(body))

    async def _finish(
        self, line: ClaimedLine, status: str, response: dict[str, Any], usage: LineUsage
    ) -> None:
        if await self._store.finish_line(self.owner, line, status, response, usage):
            self._count(line, status)
            return
        self._count(line, "dropped")
        logger.warning(
            "batch %s line %d: lease lost while running; answer dropped", line.batch_id, line.line_no
        )

    def _count(self, line: ClaimedLine, outcome: str) -> None:
        self._metrics.labelled(self._metrics.batch_lines, line.tenant_id, outcome).inc()

    async def _end(self, batch: BatchRecord, ending: str) -> None:
        """Writes the output and error files and ends the batch (under the batch's lease)."""
        outputs, errors = [], []
        for line in await self._store.lines(batch.id):
            record = _output_line(line, ending)
            (outputs if line.status == "completed" else errors).append(record)
        now = int(time.time())
        files: list[FileRecord] = []
        ids: dict[str, str | None] = {"output": None, "error": None}
        for kind, records in (("output", outputs), ("error", errors)):
            if not records:
                continue
            data = "".join(json.dumps(r) + "\n" for r in records).encode()
            file_id = "file-" + os.urandom(12).hex()
            await self._storage.put(file_id, data)
            ids[kind] = file_id
            files.append(
                FileRecord(
                    file_id, batch.tenant_id, f"{batch.id}_{kind}.jsonl", "batch_output", len(data), now
                )
            )
        ended = await self._store.end_batch(
            self.owner, batch.id, ending, now, ids["output"], ids["error"], files
        )
        if not ended:  # another gateway took the batch over: its files are the ones
            for f in files:
                await self._storage.delete(f.id)
            return
        self._metrics.labelled(self._metrics.batches_ended, batch.tenant_id, ending).inc()
        self._metrics.labelled(self._metrics.batch_duration, ending).observe(max(0, now - batch.created_at))
        logger.info("batch %s %s: %d answered, %d errors", batch.id, ending, len(outputs), len(errors))

    async def _start_callbacks(self) -> None:
        for batch in await self._store.callbacks_due():
            if batch.id not in self._callbacks and batch.callback_url:
                task = asyncio.create_task(self._call_back(batch), name=f"batch callback {batch.id}")
                self._callbacks[batch.id] = task
                task.add_done_callback(lambda _, bid=batch.id: self._callbacks.pop(bid, None))

    async def _call_back(self, batch: BatchRecord) -> None:
        """POSTs the batch object to its callback_url, with doubling waits; at least once (a
        gateway that dies before marking it sent leaves it for the next to send again)."""
        assert batch.callback_url is not None
        config = self._config
        if (unusable := unusable_url(batch.callback_url)) is not None:
            # No try could succeed, and httpx would raise outside its HTTPError: the task would
            # die with the callback still pending, to be started again at every poll. Batches
            # are checked for this when made; one stored before that check can have it.
            logger.warning("batch %s: not called back, its callback_url %s", batch.id, unusable)
            await self._store.callback_done(batch.id)
            return
        async with httpx.AsyncClient(timeout=config.callback_timeout_s, verify=self._tls) as client:
            for attempt in range(config.callback_attempts):
                try:
                    answer = await self._egress.post(client, batch.callback_url, batch_object(batch))
                    if answer.status_code < 300:
                        break
                    why = f"HTTP {answer.status_code}"
                except CallbackRefused as exc:
                    logger.warning("batch %s: not called back, its callback_url: %s", batch.id, exc)
                    break
                except (httpx.HTTPError, OSError) as exc:  # OSError: the host name did not resolve
                    why = f"{type(exc).__name__}: {exc}"
                logger.warning("batch %s callback attempt %d failed: %s", batch.id, attempt + 1, why)
                if attempt + 1 < config.callback_attempts:
                    await asyncio.sleep(2.0**attempt)
        await self._store.callback_done(batch.id)


def unusable_url(url: str) -> str | None:
    """Why a callback could not be POSTed to `url`, or None."""
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, ValueError) as exc:  # idna's errors are ValueErrors
        return f"is not a valid URL: {exc}"
    if parsed.scheme not in ("http", "https") or not parsed.raw_host:
        return "must be an absolute http(s) URL with a host"
    if parsed.port is not None and parsed.port > 65535:
        return f"has port {parsed.port}, over 65535"
    return None


def _output_line(line: LineResult, ending: str) -> dict[str, Any]:
    """One line of the output or error file, in OpenAI's format."""
    record: dict[str, Any] = {
        "id": f"batch_req_{line.batch_id.removeprefix('batch_')}_{line.line_no}",
        "custom_id": line.custom_id,
        "response": None,
        "error": None,
    }
    if line.status == "pending":  # never ran: the batch was cancelled or expired first
        code = "batch_cancelled" if ending == "cancelled" else "batch_expired"
        record["error"] = {"code": code, "message": f"The batch was {ending} before this request ran."}
    else:
        record["response"] = line.result
    return record


def _usage(body: dict[str, Any]) -> LineUsage:
    """The answer's tokens, from its OpenAI `usage` (chat and completions read the same)."""
    usage = body.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    return LineUsage(
        int(usage.get("prompt_tokens") or 0),
        int(details.get("cached_tokens") or 0),
        int(usage.get("completion_tokens") or 0),
    )


def _retry_after(error: APIError) -> float | None:
    try:
        return float(error.headers["retry-after"])
    except (KeyError, ValueError):
        return None
