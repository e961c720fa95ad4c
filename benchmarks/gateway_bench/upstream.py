"""A fixed-response OpenAI-compatible node: the cheapest upstream a proxy can have in front of it.

    python -m gateway_bench.upstream --port 9100 [--chunks 16]

A raw ASGI app under uvicorn (uvloop + httptools), so that the upstream's own cost is as small as
Python allows and whatever a proxy adds stands out. Every answer is canned and pre-encoded:

  POST /v1/chat/completions   a chat.completion (16 words, usage), or with `stream: true` an SSE
                              stream of a role chunk, `max_tokens` content chunks (without
                              it, `--chunks`), a finish chunk, a
                              usage chunk when `stream_options.include_usage`, then [DONE]; no delay
  GET  /ready, /health        200 {"status": "ok"}
  GET  /load                  a node /load report with an idle node (what Meridian's prober reads)
  GET  /v1/models             the one model

It honours Meridian's node extension `return_token_ids` (one id per content chunk), as a real node
does, so the gateway's stream relay takes its ordinary path. Credentials are accepted, not checked.
"""

from __future__ import annotations

import argparse
import importlib.util
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import uvicorn

MODEL = "bench-model"
NODE_ID = "bench-node"
REGION = "bench"
JURISDICTION = "us"
CREATED = 1_700_000_000
WORDS = tuple(f" word{i}" for i in range(16))
PROMPT_TOKENS = 8

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

_encode = msgspec.json.encode


class _StreamOptions(msgspec.Struct):
    include_usage: bool = False


class _ChatRequest(msgspec.Struct):
    """Only the fields that change the canned answer; anything else in the body is ignored."""

    model: str = MODEL
    stream: bool = False
    stream_options: _StreamOptions | None = None
    return_token_ids: bool = False
    max_tokens: int | None = None  # a stream's content chunks, when given (else --chunks)


_decode_request = msgspec.json.Decoder(_ChatRequest).decode


def _usage(completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": PROMPT_TOKENS,
        "completion_tokens": completion_tokens,
        "total_tokens": PROMPT_TOKENS + completion_tokens,
    }


def completion_body(model: str, *, token_ids: bool) -> bytes:
    choice: dict[str, Any] = {
        "index": 0,
        "message": {"role": "assistant", "content": "".join(WORDS)},
        "finish_reason": "stop",
    }
    if token_ids:
        choice["token_ids"] = list(range(1, len(WORDS) + 1))
    return _encode(
        {
            "id": "chatcmpl-bench",
            "object": "chat.completion",
            "created": CREATED,
            "model": model,
            "choices": [choice],
            "usage": _usage(len(WORDS)),
        }
    )


def stream_frames(model: str, chunks: int, *, token_ids: bool, include_usage: bool) -> list[bytes]:
    """The SSE frames of one streamed completion, [DONE] included."""

    def frame(choices: list[dict[str, Any]], usage: dict[str, int] | None = None) -> bytes:
        chunk: dict[str, Any] = {
            "id": "chatcmpl-bench",
            "object": "chat.completion.chunk",
            "created": CREATED,
            "model": model,
            "choices": choices,
        }
        if usage is not None:
            chunk["usage"] = usage
        return b"data: " + _encode(chunk) + b"\n\n"

    frames = [frame([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])]
    for i in range(chunks):
        choice: dict[str, Any] = {
            "index": 0,
            "delta": {"content": WORDS[i % len(WORDS)]},
            "finish_reason": None,
        }
        if token_ids:
            choice["token_ids"] = [i + 1]
        frames.append(frame([choice]))
    frames.append(frame([{"index": 0, "delta": {}, "finish_reason": "stop"}]))
    if include_usage:
        frames.append(frame([], _usage(chunks)))
    frames.append(b"data: [DONE]\n\n")
    return frames


def load_report() -> bytes:
    return _encode(
        {
            "node_id": NODE_ID,
            "region": REGION,
            "jurisdiction": JURISDICTION,
            "models": [{"name": MODEL, "tier": "small"}],
            "kv_cache_usage": 0.0,
            "waiting_tokens": 0,
            "num_running": 0,
            "num_waiting": 0,
            "prefix_cache_hit_rate": 0.0,
        }
    )


_JSON = [(b"content-type", b"application/json")]
_SSE = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]


class FixedUpstream:
    """The ASGI app. Answers are encoded once per distinct request shape and then reused."""

    def __init__(self, chunks: int = 16) -> None:
        self._chunks = chunks
        self._static: dict[str, bytes] = {
            "/ready": b'{"status":"ok"}',
            "/health": b'{"status":"ok"}',
            "/load": load_report(),
            "/v1/models": _encode(
                {"object": "list", "data": [{"id": MODEL, "object": "model", "created": CREATED}]}
            ),
        }
        self._completions: dict[tuple[str, bool], bytes] = {}
        self._streams: dict[tuple[str, bool, bool, int], list[bytes]] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return  # lifespan is off; nothing else is served
        path = scope["path"]
        if scope["method"] == "POST" and path == "/v1/chat/completions":
            await self._chat(receive, send)
            return
        body = self._static.get(path) if scope["method"] == "GET" else None
        if body is None:
            await _respond(send, 404, b'{"error":{"message":"not found","type":"invalid_request_error"}}')
            return
        await _respond(send, 200, body)

    async def _chat(self, receive: Receive, send: Send) -> None:
        raw = await _read_body(receive)
        try:
            request = _decode_request(raw)
        except msgspec.DecodeError as exc:
            message = _encode({"error": {"message": str(exc), "type": "invalid_request_error"}})
            await _respond(send, 400, message)
            return
        if not request.stream:
            key = (request.model, request.return_token_ids)
            body = self._completions.get(key)
            if body is None:
                body = self._completions[key] = completion_body(
                    request.model, token_ids=request.return_token_ids
                )
            await _respond(send, 200, body)
            return
        include_usage = request.stream_options is not None and request.stream_options.include_usage
        chunks = min(request.max_tokens, 4096) if request.max_tokens else self._chunks
        skey = (request.model, request.return_token_ids, include_usage, chunks)
        frames = self._streams.get(skey)
        if frames is None:
            frames = self._streams[skey] = stream_frames(
                request.model, chunks, token_ids=request.return_token_ids, include_usage=include_usage
            )
        await send({"type": "http.response.start", "status": 200, "headers": _SSE})
        for frame in frames:
            await send({"type": "http.response.body", "body": frame, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _read_body(receive: Receive) -> bytes:
    parts = []
    while True:
        message = await receive()
        parts.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(parts)


async def _respond(send: Send, status: int, body: bytes) -> None:
    headers = [*_JSON, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--chunks", type=int, default=16, help="content chunks per streamed completion")
    args = parser.parse_args(argv)
    uvicorn.run(
        FixedUpstream(args.chunks),
        host=args.host,
        port=args.port,
        loop="uvloop" if importlib.util.find_spec("uvloop") else "asyncio",
        http="httptools" if importlib.util.find_spec("httptools") else "h11",
        lifespan="off",
        log_level="warning",
        access_log=False,
        backlog=4096,
        # uvicorn's 5 s default lets the upstream close an idle pooled connection just as a proxy
        # reuses it (LiteLLM's aiohttp pool then answers 500 "Connection error"): a race that
        # would be counted against whichever proxy hit it, not a cost of proxying.
        timeout_keep_alive=300,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
