"""Fake engines for in-process app tests: the behaviours a real engine rarely shows on demand
(slow loading, a failure mid-stream, an abort), scripted."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from regional_node.engine import EngineError, RequestDelta, SamplingParams


@dataclass
class FakeEngineConfig:
    block_size: int = 16


@dataclass
class FakeLLMEngine:
    tokenizer: Any = None
    max_model_len: int = 256
    engine_config: FakeEngineConfig = field(default_factory=FakeEngineConfig)


class FakeRunner:
    """The NodeEngine surface. `script` decides each request's fate: "ok", "fail_mid", "abort"."""

    def __init__(self, engine: FakeLLMEngine, script: str = "ok", tokens: int = 4) -> None:
        self.engine = engine
        self.script = script
        self.tokens = tokens
        self.aborted: list[str] = []
        self.started = False
        self.stopped = False

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    @property
    def kv_block_size(self) -> int:
        return self.engine.engine_config.block_size

    async def start(self) -> None:
        self.started = True

    async def shutdown(self) -> None:
        self.stopped = True

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    def stats(self) -> dict[str, Any]:
        return {"kv_blocks_total": 64, "kv_blocks_used": 0, "kv_cache_usage": 0.0, "num_running": 0}

    async def generate(
        self, prompt: list[int] | str, params: SamplingParams, *, request_id: str | None = None, **_: Any
    ) -> AsyncIterator[RequestDelta]:
        assert request_id is not None
        prompt_tokens = len(prompt)
        for index in range(self.tokens):
            await asyncio.sleep(0)
            if self.script == "fail_mid" and index == 2:
                raise EngineError("the model step failed")
            last = index == self.tokens - 1
            reason = ("abort" if self.script == "abort" else "length") if last else None
            yield RequestDelta(
                request_id=request_id,
                new_token_ids=[] if reason == "abort" else [7],
                new_text="" if reason == "abort" else "x",
                new_logprobs=[] if reason == "abort" else [-0.5],
                finished=last,
                finish_reason=reason,
                prompt_tokens=prompt_tokens,
                cached_tokens=0,
                num_output_tokens=index + 1,
            )
