"""What every HTTP provider adapter shares: its client, the logical → provider model lookup,
opening a request with the provider's timeouts and error mapping, and closing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx

from gateway.upstreams.providers.config import ProviderEntry
from gateway.upstreams.providers.errors import ProviderError, unsupported
from gateway.upstreams.providers.transport import build_client, open_response, read_json

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
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self.entry = entry
        self._auth = auth
        self._on_status = on_status
        self._client = client or build_client(entry.timeouts)
        self._owns_client = client is None

    def _models(self, body: dict[str, Any]) -> tuple[str, str]:
        """(logical, provider) model names; refuses what no provider can serve faithfully."""
        logical = str(body.get("model", ""))
        provider_model = self.entry.models.get(logical)
        if provider_model is None:
            raise unsupported(self.entry.id, f"model {logical!r}")
        if body.get("continuation_token_ids"):
            raise unsupported(self.entry.id, "a token-exact stream continuation")
        return logical, provider_model

    async def _open(self, request: httpx.Request) -> httpx.Response:
        return await open_response(
            self._client,
            request,
            provider=self.entry.id,
            timeouts=self.entry.timeouts,
            on_status=self._on_status,
        )

    async def _fetch_json(self, request: httpx.Request) -> Any:
        response = await self._open(request)
        try:
            return await read_json(response, provider=self.entry.id)
        finally:
            await response.aclose()

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.aclose()
