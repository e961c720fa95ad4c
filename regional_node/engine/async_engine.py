"""asyncio front of the engine: a dedicated thread runs the step loop, never the event loop.

Requests and aborts go to the thread as commands; each step's deltas come back in one
`loop.call_soon_threadsafe` call and are fanned out to per-request asyncio queues. The thread
sleeps on a condition variable when there is nothing to do. A consumer that stops iterating (the
async generator is closed or its task cancelled) aborts its request, so the engine frees its KV
blocks before the next step.

Admission (admission.py) happens here, on the event loop, before a request becomes a command: a
request its tier's queue cannot take is refused with QueueFullError at its first `anext`, having
taken nothing (no command, no engine request, no blocks). The check counts the engine's waiting
tokens as of the step thread's last snapshot *plus* every add not yet in that snapshot, under the
lock the snapshot is published with, so requests arriving together cannot all pass a check made
against the same stale queue.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from regional_node.cpu_share import CpuShare
from regional_node.engine import admission
from regional_node.engine.admission import QueueLimits, QueueState
from regional_node.engine.block_hash import hash_block
from regional_node.engine.errors import EngineError, InvalidRequestError, StepFailedError
from regional_node.engine.llm_engine import LLMEngine
from regional_node.engine.outputs import RequestDelta
from regional_node.engine.sampling_params import SamplingParams
from regional_node.engine.sequence import PRIORITY_RANK
from regional_node.engine.tokenizer import Tokenizer

_Item = RequestDelta | BaseException


@dataclass
class _Command:
    kind: Literal["add", "abort"]
    request_id: str
    args: dict[str, Any] = field(default_factory=dict)
    # An add's prompt tokens, counted as waiting (in `_unpublished`) until the step thread
    # publishes a snapshot that holds them.
    tier: str | None = None
    tokens: int = 0


class AsyncEngine:
    def __init__(
        self, engine: LLMEngine, limits: QueueLimits | None = None, *, cpu_share: CpuShare | None = None
    ) -> None:
        """`cpu_share`: the cores, compute threads and niceness the step thread computes with
        (regional_node/cpu_share.py); None leaves it as the process is."""
        self.engine = engine
        self.limits = limits or QueueLimits()
        self.cpu_share = cpu_share
        self._cond = threading.Condition()
        self._commands: deque[_Command] = deque()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queues: dict[str, asyncio.Queue[_Item]] = {}  # touched on the event loop only
        self._stats: dict[str, Any] = engine.stats()
        # Adds submitted but not yet in `_stats`: tokens and requests per tier (guarded by `_cond`).
        self._unpublished: dict[str, int] = dict.fromkeys(PRIORITY_RANK, 0)
        self._unpublished_requests: dict[str, int] = dict.fromkeys(PRIORITY_RANK, 0)

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
        with self._cond:
            self._commands.clear()  # adds never processed: their consumers are failed just below
            self._unpublished = dict.fromkeys(PRIORITY_RANK, 0)
            self._unpublished_requests = dict.fromkeys(PRIORITY_RANK, 0)
        for queue in self._queues.values():
            queue.put_nowait(EngineError("the engine is shutting down"))

    @property
    def running(self) -> bool:
        return self._thread is not None and not self._stopping

    @property
    def tokenizer(self) -> Tokenizer | None:
        return self.engine.tokenizer

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    @property
    def kv_block_size(self) -> int:
        return self.engine.engine_config.block_size

    def prefix_block_hashes(self, token_ids: list[int], cache_salt: str | None) -> list[bytes]:
        """The prefix-cache names of the whole blocks of `token_ids`, as the engine hashes them."""
        size, hashes = self.kv_block_size, []
        for start in range(0, len(token_ids) - size + 1, size):
            hashes.append(
                hash_block(hashes[-1] if hashes else None, token_ids[start : start + size], cache_salt)
            )
        return hashes

    def holds_prefix_block(self, block_hash: bytes) -> bool:
        """Whether the prefix cache holds the block now (the node publishes what it holds)."""
        return self.engine.block_manager.holds(block_hash)

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
        """Stream a request's deltas; the last has finished=True. Bad input raises before any delta,
        and so does QueueFullError for a request its tier's queue cannot take (nothing was taken)."""
        if not self.running:
            raise EngineError("AsyncEngine is not running: await start() first")
        request_id = request_id or uuid.uuid4().hex
        if request_id in self._queues:
            raise InvalidRequestError(f"request id {request_id!r} is already in use", "request_id")
        add = _Command(
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
        # An unknown tier is not counted: the engine's intake refuses it.
        if priority in PRIORITY_RANK:
            add.tier, add.tokens = (
                priority,
                self._num_tokens(prompt) + self._num_tokens(continuation_token_ids),
            )
        queue: asyncio.Queue[_Item] = asyncio.Queue()
        with self._cond:
            if add.tier is not None:
                admission.check(self.limits, self._queue_state(), add.tier, add.tokens)
                self._unpublished[add.tier] += add.tokens
                self._unpublished_requests[add.tier] += 1
            self._queues[request_id] = queue
            self._commands.append(add)
            self._cond.notify()
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
                self._submit("abort", request_id)

    async def abort(self, request_id: str) -> None:
        self._submit("abort", request_id)

    def stats(self) -> dict[str, Any]:
        """The step thread's snapshot after its latest step, with the adds it has not taken yet
        counted as waiting, and the queue's report as of now (admission.report). Safe from any
        thread."""
        with self._cond:
            stats = dict(self._stats)
            state = self._queue_state()
            stats["waiting_tokens"] = stats.get("waiting_tokens", 0) + sum(self._unpublished.values())
            stats["num_waiting"] = stats.get("num_waiting", 0) + sum(self._unpublished_requests.values())
        stats.update(admission.report(state, self.limits))
        return stats

    def _queue_state(self) -> QueueState:
        """The queue as admission reads it, the unpublished adds included; call with `_cond` held."""
        published = self._stats
        tokens = published.get("waiting_tokens_by_tier", {})
        requests = published.get("waiting_requests_by_tier", {})
        max_seqs = published.get("max_num_seqs")
        drain = self.engine.drain
        return QueueState(
            waiting_tokens={tier: tokens.get(tier, 0) + n for tier, n in self._unpublished.items()},
            waiting_requests={
                tier: requests.get(tier, 0) + n for tier, n in self._unpublished_requests.items()
            },
            drain_tokens_per_s=drain.rate(),
            step_cost=drain.step_cost(),
            max_num_batched_tokens=int(published.get("max_num_batched_tokens", 0) or 0),
            max_num_seqs=None if max_seqs is None else int(max_seqs),
            finish_rate=drain.slot_rate(),
            running=int(published.get("num_running", 0)),
            long_prefill_token_threshold=int(published.get("long_prefill_token_threshold", 0) or 0),
        )

    def _num_tokens(self, tokens: list[int] | str | None) -> int:
        """How many tokens a prompt counts for in the queue. Anything malformed counts 0: the
        engine's intake refuses it with the precise error."""
        if isinstance(tokens, list | tuple):
            return len(tokens)
        tokenizer = self.engine.tokenizer
        if not isinstance(tokens, str) or not tokens or tokenizer is None:
            return 0
        # The node sends token ids; a text prompt (from a library caller) is tokenized to count it.
        try:
            return len(tokenizer.encode(tokens))
        except Exception:
            return 0

    # -- the step thread --------------------------------------------------------------------------
    def _submit(self, kind: Literal["add", "abort"], request_id: str) -> None:
        with self._cond:
            self._commands.append(_Command(kind, request_id))
            self._cond.notify()

    def _run(self) -> None:
        if self.cpu_share is not None:
            # Before the first step: torch's intra-op threads, started by this thread's first
            # parallel region, inherit its cores and niceness.
            try:
                self.cpu_share.enter()
            except OSError as exc:  # cores taken away since start-up: compute unconfined, not never
                logging.getLogger(__name__).warning("engine step thread left unconfined: %s", exc)
            torch.set_num_threads(self.cpu_share.threads)
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
            for command in commands:
                if command.kind == "abort":
                    engine.abort_request(command.request_id)
                    continue
                try:
                    engine.add_request(command.request_id, **command.args)
                except Exception as exc:  # every failure reaches its caller instead of killing the loop
                    error = exc if isinstance(exc, EngineError) else EngineError(repr(exc))
                    out.append((command.request_id, error))
            if engine.has_unfinished_requests():
                out.extend(self._step())
            stats = engine.stats()
            with self._cond:
                # The adds taken above are in this snapshot now (waiting, running or refused).
                self._stats = stats
                for command in commands:
                    if command.tier is not None:
                        self._unpublished[command.tier] -= command.tokens
                        self._unpublished_requests[command.tier] -= 1
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
