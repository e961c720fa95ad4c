"""asyncio front of the engine: a dedicated thread runs the step loop, never the event loop.

Requests and aborts go to the thread as commands; each step's deltas come back in one
`loop.call_soon_threadsafe` call and are fanned out to per-request asyncio queues. The thread
sleeps on a condition variable when there is nothing to do. A consumer that stops iterating (the
async generator is closed or its task cancelled) aborts its request, so the engine frees its KV
blocks before the next step.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

from regional_node.engine.errors import EngineError, InvalidRequestError, StepFailedError
from regional_node.engine.llm_engine import LLMEngine
from regional_node.engine.outputs import RequestDelta
from regional_node.engine.sampling_params import SamplingParams

_Item = RequestDelta | BaseException


class AsyncEngine:
    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self._cond = threading.Condition()
        self._commands: deque[tuple[str, str, dict[str, Any]]] = deque()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queues: dict[str, asyncio.Queue[_Item]] = {}  # touched on the event loop only
        self._stats: dict[str, Any] = engine.stats()

    # -- lifecycle --------------------------------------------------------------------------------
    async def start(self) -> None:
        if self._thread is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="meridian-engine-step-loop", daemon=True)
        self._thread.start()

    async def shutdown(self) -> None:
        thread = self._thread
        if thread is None:
            return
        with self._cond:
            self._stopping = True
            self._cond.notify()
        await asyncio.to_thread(thread.join)
        self._thread = None
        self._commands.clear()  # adds never processed: their consumers are failed just below
        for queue in self._queues.values():
            queue.put_nowait(EngineError("the engine is shutting down"))

    @property
    def running(self) -> bool:
        return self._thread is not None and not self._stopping

    # -- requests ---------------------------------------------------------------------------------
    async def generate(
        self,
        prompt: list[int] | str,
        params: SamplingParams,
        *,
        request_id: str | None = None,
        tenant: str = "default",
        priority: str = "interactive",
        cache_salt: str | None = None,
        continuation_token_ids: list[int] | None = None,
    ) -> AsyncIterator[RequestDelta]:
        """Stream a request's deltas; the last has finished=True. Bad input raises before any delta."""
        if not self.running:
            raise EngineError("AsyncEngine is not running: await start() first")
        request_id = request_id or uuid.uuid4().hex
        if request_id in self._queues:
            raise InvalidRequestError(f"request id {request_id!r} is already in use", "request_id")
        queue: asyncio.Queue[_Item] = asyncio.Queue()
        self._queues[request_id] = queue
        self._submit(
            "add",
            request_id,
            {
                "prompt": prompt,
                "params": params,
                "tenant": tenant,
                "priority": priority,
                "cache_salt": cache_salt,
                "continuation_token_ids": continuation_token_ids,
            },
        )
        done = False
        try:
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    done = True
                    raise item
                if item.finished:
                    done = True
                yield item
                if done:
                    return
        finally:
            self._queues.pop(request_id, None)
            if not done:
                self._submit("abort", request_id, {})

    async def abort(self, request_id: str) -> None:
        self._submit("abort", request_id, {})

    def stats(self) -> dict[str, Any]:
        """Snapshot taken by the step thread after its latest step (safe to read from any thread)."""
        return dict(self._stats)

    # -- the step thread --------------------------------------------------------------------------
    def _submit(self, kind: str, request_id: str, args: dict[str, Any]) -> None:
        with self._cond:
            self._commands.append((kind, request_id, args))
            self._cond.notify()

    def _run(self) -> None:
        engine = self.engine
        while True:
            with self._cond:
                while not (self._commands or self._stopping or engine.has_unfinished_requests()):
                    self._cond.wait()
                if self._stopping:
                    break
                commands = list(self._commands)
                self._commands.clear()
            out: list[tuple[str, _Item]] = []
            for kind, request_id, args in commands:
                if kind == "abort":
                    engine.abort_request(request_id)
                    continue
                try:
                    engine.add_request(request_id, **args)
                except Exception as exc:  # every failure reaches its caller instead of killing the loop
                    out.append((request_id, exc if isinstance(exc, EngineError) else EngineError(repr(exc))))
            if engine.has_unfinished_requests():
                out.extend(self._step())
            self._stats = engine.stats()
            if out:
                self._deliver(out)
        # Waiting consumers are failed by shutdown(), which also covers adds never processed.
        self.engine.abort_all()

    def _step(self) -> list[tuple[str, _Item]]:
        try:
            return [(d.request_id, d) for d in self.engine.step()]
        except StepFailedError as exc:
            return [(request_id, exc) for request_id in exc.request_ids]
        except Exception as exc:  # a bug outside the model step: fail everything rather than hang
            error = EngineError(f"engine step failed: {exc!r}")
            return [(request_id, error) for request_id in self.engine.abort_all()]

    def _deliver(self, items: list[tuple[str, _Item]]) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            loop.call_soon_threadsafe(self._dispatch, items)
        except RuntimeError:  # the loop closed between the check and the call
            pass

    def _dispatch(self, items: list[tuple[str, _Item]]) -> None:
        for request_id, item in items:
            queue = self._queues.get(request_id)
            if queue is not None:
                queue.put_nowait(item)
