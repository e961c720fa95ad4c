"""The gateway's Responses API runs: kept in memory, bounded in number and time, each run by a
task the store owns (so a background run outlives the request that started it, and every run is
cancelled when the gateway stops).

In memory on purpose for now: a gateway restart loses every stored response and ends every
background run, and with several workers or replicas a response is only known to the one that
created it. Only the tenant that created a response can see it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict

from gateway.call.context import CallContext
from gateway.call.pipeline import RequestPipeline
from gateway.errors import to_api_error
from gateway.responses.config import ResponsesConfig
from gateway.responses.errors import ResponsesBusy
from gateway.responses.run import Run
from gateway.runtime.tasks import cancel_and_wait
from gateway.translate.chat_request import ChatRequest

logger = logging.getLogger(__name__)


class ResponseStore:
    def __init__(self, config: ResponsesConfig, pipeline: RequestPipeline) -> None:
        self._config = config
        self._pipeline = pipeline
        self._runs: OrderedDict[str, Run] = OrderedDict()  # oldest first

    def start(self, run: Run, ctx: CallContext, chat: ChatRequest) -> None:
        """Keep `run` and drive it in a task of its own (the pipeline's stream of `chat`, read to
        its end into the run); ResponsesBusy when there is no room."""
        self._make_room(background=run.request.background)
        self._runs[run.id] = run
        run.task = asyncio.create_task(self._drive(ctx, run, chat), name=f"response {run.id}")
        run.task.add_done_callback(lambda _: self._forget_unstored(run))

    async def _drive(self, ctx: CallContext, run: Run, chat: ChatRequest) -> None:
        pipeline = self._pipeline
        try:
            try:
                stream = await pipeline.stream(ctx, "chat", chat.parsed, chat.body)
            except Exception as exc:
                # Errors before the first token are the foreground request's HTTP error.
                error = chat.in_request_terms(to_api_error(exc, request_id=ctx.request_id))
                pipeline.record(ctx, str(error.status_code), stream=False)
                error.headers = {**ctx.headers, **error.headers}
                run.failed_to_open({"code": error.code or error.error_type, "message": error.message}, error)
                return
            try:
                await run.started(ctx.model)
                async for item in stream.items():
                    await run.feed(item)
                run.ended()
            finally:
                await stream.aclose()
        except asyncio.CancelledError:
            run.cancelled()
            raise

    def get(self, response_id: str, tenant_id: str) -> Run | None:
        """The tenant's own response, or None (unknown, expired, or another tenant's)."""
        run = self._runs.get(response_id)
        if run is None or run.tenant_id != tenant_id:
            return None
        if self._expired(run, time.time()):
            del self._runs[response_id]
            return None
        return run

    async def cancel(self, run: Run) -> None:
        """Stops the run: its task is cancelled, which closes the pipeline's stream (the node
        aborts the request and frees its KV blocks) and settles the quota."""
        if run.task is not None and not run.task.done():
            await cancel_and_wait(run.task)
        run.cancelled()

    async def delete(self, run: Run) -> None:
        await self.cancel(run)
        self._runs.pop(run.id, None)

    async def stop(self) -> None:
        """The gateway is stopping: every run still going is cancelled."""
        running = [run for run in self._runs.values() if run.task is not None and not run.task.done()]
        for run in running:
            await self.cancel(run)
        self._runs.clear()

    def _forget_unstored(self, run: Run) -> None:
        if not run.request.store:
            self._runs.pop(run.id, None)

    def _expired(self, run: Run, now: float) -> bool:
        return run.completed_at is not None and now - run.completed_at > self._config.ttl_s

    def _make_room(self, *, background: bool) -> None:
        config = self._config
        if background:
            running = sum(1 for r in self._runs.values() if r.request.background and not r.finished)
            if running >= config.max_background:
                raise ResponsesBusy(
                    f"Too many background responses are running ({config.max_background}); retry later."
                )
        now = time.time()
        for response_id in [r.id for r in self._runs.values() if self._expired(r, now)]:
            del self._runs[response_id]
        if len(self._runs) < config.max_stored:
            return
        oldest_finished = next((r.id for r in self._runs.values() if r.finished), None)
        if oldest_finished is None:
            raise ResponsesBusy(f"The gateway holds {config.max_stored} running responses; retry later.")
        del self._runs[oldest_finished]
