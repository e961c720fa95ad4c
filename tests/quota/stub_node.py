"""A fixed-response regional node for gateway quota tests: `python -m tests.quota.stub_node PORT DELAY_S`.

Answers /ready, /load and non-streaming /v1/chat/completions with a fixed usage
(PROMPT_TOKENS + COMPLETION_TOKENS) after DELAY_S, and counts how many requests of each tenant
(x-meridian-tenant) it holds at once: GET /stats -> {"max_in_flight": {tenant: n}, "served": {...}}.
That count is a lower bound on the concurrency slots the gateways held, since a slot is taken
before the node is called and released after it answers.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections import Counter
from typing import Any

import uvicorn

PROMPT_TOKENS = 10
COMPLETION_TOKENS = 20


class StubNode:
    def __init__(self, delay_s: float):
        self.delay_s = delay_s
        self.in_flight: Counter[str] = Counter()
        self.max_in_flight: Counter[str] = Counter()
        self.served: Counter[str] = Counter()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        path = scope["path"]
        if path == "/ready":
            await self._json(send, {"status": "ready"})
        elif path == "/load":
            await self._json(
                send, {"kv_cache_usage": 0.0, "waiting_tokens": 0, "num_running": 0, "num_waiting": 0}
            )
        elif path == "/stats":
            await self._json(send, {"max_in_flight": self.max_in_flight, "served": self.served})
        elif path == "/v1/chat/completions":
            body = b""
            while True:
                message = await receive()
                body += message.get("body", b"")
                if not message.get("more_body"):
                    break
            headers = {k.decode(): v.decode() for k, v in scope["headers"]}
            await self._complete(send, json.loads(body), headers.get("x-meridian-tenant", "-"))
        else:
            await self._json(send, {"error": {"message": "not found", "type": "invalid_request_error"}}, 404)

    async def _complete(self, send: Any, body: dict[str, Any], tenant: str) -> None:
        self.in_flight[tenant] += 1
        self.max_in_flight[tenant] = max(self.max_in_flight[tenant], self.in_flight[tenant])
        try:
            await asyncio.sleep(self.delay_s)
        finally:
            self.in_flight[tenant] -= 1
        self.served[tenant] += 1
        usage = {
            "prompt_tokens": PROMPT_TOKENS,
            "completion_tokens": COMPLETION_TOKENS,
            "total_tokens": PROMPT_TOKENS + COMPLETION_TOKENS,
        }
        await self._json(
            send,
            {
                "id": "chatcmpl-stub",
                "object": "chat.completion",
                "created": 0,
                "model": body.get("model", "stub"),
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
                ],
                "usage": usage,
            },
        )

    @staticmethod
    async def _json(send: Any, payload: Any, status: int = 200) -> None:
        data = json.dumps(payload).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(data)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": data})


if __name__ == "__main__":
    port, delay_s = int(sys.argv[1]), float(sys.argv[2])
    uvicorn.run(StubNode(delay_s), host="127.0.0.1", port=port, log_level="warning", lifespan="on")
