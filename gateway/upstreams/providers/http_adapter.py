"""What every HTTP provider adapter shares: its connection pool, the logical → provider model
lookup, opening a request with the provider's timeouts and error mapping, and closing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gateway.http import Connection, ConnectionPool
from gateway.upstreams.providers.config import ProviderEntry
from gateway.upstreams.providers.errors import ProviderError, unsupported
from gateway.upstreams.providers.transport import Post, build_pool, open_response, read_json

# (provider id, status, parsed body, raw text, retry-after) -> the error to raise
StatusErrorMapper = Callable[[str, int, Any, str, float | None], ProviderError]


class HTTPProviderAdapter:
    token_exact = False  # commercial APIs neither report token ids nor continue from them

    def __init__(
        self,
        entry: ProviderEntry,
        *,
        auth: dict[str, str],
        on_status: StatusErrorMapper,
        pool: ConnectionPool | None = None,
    ) -> None:
        self.entry = entry
        self._auth = auth
        self._on_status = on_status
        self._pool = pool or build_pool(entry.timeouts)
        self._owns_pool = pool is None

    def _models(self, body: dict[str, Any]) -> tuple[str, str]:
        """(logical, provider) model names; refuses what no provider can serve faithfully."""
        logical = str(body.get("model", ""))
        provider_model = self.entry.models.get(logical)
        if provider_model is None:
            raise unsupported(self.entry.id, f"model {logical!r}")
        if body.get("continuation_token_ids"):
            raise unsupported(self.entry.id, "a token-exact stream continuation")
        return logical, provider_model

    async def _open(self, post: Post, on_status: StatusErrorMapper | None = None) -> Connection:
        """A 2xx response with its body left to read; hand it back with `_release`."""
        return await open_response(
            self._pool,
            post,
            provider=self.entry.id,
            timeouts=self.entry.timeouts,
            on_status=on_status or self._on_status,
        )

    def _release(self, response: Connection) -> None:
        # Released before the body's end, the connection is closed: that is how the provider
        # learns the client went away.
        self._pool.release(response)

    async def _fetch_json(self, post: Post, on_status: StatusErrorMapper | None = None) -> Any:
        response = await self._open(post, on_status)
        try:
            return await read_json(response, provider=self.entry.id, timeouts=self.entry.timeouts)
        finally:
            self._release(response)

    def _count_status(
        self, provider: str, status: int, parsed: Any, text: str, retry_after: float | None
    ) -> ProviderError:
        if status == 404:
            # An API compatible with the provider's but without its count endpoint: the request
            # cannot be served here, which says nothing of the provider's health.
            return unsupported(provider, "token counting (no count endpoint at its base URL)")
        return self._on_status(provider, status, parsed, text, retry_after)

    async def _fetch_count(self, post: Post) -> int:
        """`input_tokens` of a provider's token-count answer (Anthropic's and OpenAI's name it so)."""
        answer = await self._fetch_json(post, self._count_status)
        count = answer.get("input_tokens")
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ProviderError(f"{self.entry.id}: malformed token count", kind="bad_response")
        return count

    async def aclose(self) -> None:
        if self._owns_pool:
            await self._pool.aclose()
