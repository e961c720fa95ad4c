"""The one interface the node's HTTP layer uses to run a model, whichever engine runs it.

Two implementations: our engine (`regional_node.engine.AsyncEngine`) and vLLM's
(`regional_node.vllm_engine.VllmEngine`, `engine: vllm`). Both take the same request (token ids,
our SamplingParams, tenant, tier, cache salt, continuation tokens), stream the same
`RequestDelta`s and report the same `stats()` keys, so handlers, /load, /metrics and the gateway
never know which engine a node runs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from regional_node.engine import RequestDelta, SamplingParams, Tokenizer


class NodeEngine(Protocol):
    @property
    def tokenizer(self) -> Tokenizer | None:
        """Chat templates and text: the node renders prompts and streams text with it."""
        ...

    @property
    def max_model_len(self) -> int: ...

    @property
    def kv_block_size(self) -> int:
        """Tokens per KV-cache block (stats' kv_blocks_* count these)."""
        ...

    async def start(self) -> None: ...

    async def shutdown(self) -> None:
        """Stop; requests still running end with an EngineError."""
        ...

    def generate(
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
        """A request's deltas, the last with finished=True. Bad input raises before the first
        delta, and so does QueueFullError; closing the iterator early aborts the request."""
        ...

    async def abort(self, request_id: str) -> None: ...

    def stats(self) -> dict[str, Any]:
        """KV blocks and use, running/waiting requests, waiting tokens (per tier), drain rate,
        queue bounds and estimated wait, prefix-cache and preemption totals (see AsyncEngine.stats)."""
        ...
