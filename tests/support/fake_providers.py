"""Stand-ins for OpenAI's and Anthropic's HTTP APIs, on loopback, that fail on request.

Written from the public API references: OpenAI chat/completions (JSON and `data:` SSE chunks
ending in `data: [DONE]`, `{"error": {...}}` errors) and Anthropic's Messages API (`x-api-key`
and `anthropic-version` headers, the `event:`/`data:` stream message_start ... message_stop with
pings, `{"type": "error", "error": {type, message}}` errors). The reply is the configured text
split into word pieces, one "token" each; max_tokens and stop sequences cut it as a real API would.
A request that offers tools (and does not forbid them) whose last message is not a tool's result
is answered with one call to its first tool, `TOOL_CALL_ARGUMENTS` as arguments (streamed in
pieces: OpenAI's tool_calls deltas, Anthropic's input_json_delta events).
Each also counts input tokens (one per word) on its own API's path: Anthropic's
`/v1/messages/count_tokens`, OpenAI's `/v1/responses/input_tokens`.

Each server runs uvicorn in its own thread, so sync tests, async tests and gateway processes can
all call it. Faults are scripted per request with `fail_next` (or for every request with
`always`): an error status (with Retry-After), a slow first byte, a stream cut or stalled midway,
or (Anthropic) an `error` event midway.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

from tests.support.threaded_server import serve_in_thread

Kind = Literal["openai", "anthropic"]
# (generation path, token count path) of each API.
PATHS = {
    "anthropic": ("/v1/messages", "/v1/messages/count_tokens"),
    "openai": ("/v1/chat/completions", "/v1/responses/input_tokens"),
}
# The arguments of the one tool call the fakes make, and the call's id on each API.
TOOL_CALL_ARGUMENTS: dict[str, Any] = {"city": "Paris"}
TOOL_CALL_IDS: dict[Kind, str] = {"openai": "call_fake1", "anthropic": "toolu_fake1"}
# Anthropic's stop_reason (how the fakes' answers end) as OpenAI's finish_reason.
OPENAI_FINISH = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
}
ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
    404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
    529: "overloaded_error",
}  # fmt: skip


class StreamCut(Exception):
    """Raised inside the app to make uvicorn drop the connection mid-body."""


@dataclass
class Fault:
    status: int | None = None  # answer with this error status
    retry_after: str | None = None  # Retry-After header with the error
    first_byte_delay_s: float = 0.0  # wait before the response starts
    cut_after: int | None = None  # drop the connection after this many stream frames
    stall_after: int | None = None  # go silent after this many stream frames ...
    stall_s: float = 0.0  # ... for this long
    error_event: str | None = None  # Anthropic: an `error` event of this type after 2 deltas


@dataclass
class Answer:
    pieces: list[str]  # the reply's pieces, one token each; for a tool call, its arguments' pieces
    finish: str  # as Anthropic's stop_reason
    stop: str | None = None  # the stop sequence that cut the reply
    tool: str | None = None  # the tool called, if the answer is a tool call

    @property
    def openai_finish(self) -> str:
        return OPENAI_FINISH[self.finish]


@dataclass
class Recorded:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


@dataclass
class FakeProvider:
    kind: Kind
    api_key: str = "test-key"
    reply: str = "Hello from the fake provider, nice to meet you."
    requests: list[Recorded] = field(default_factory=list)
    port: int = 0
    _faults: list[Fault] = field(default_factory=list)
    _always: Fault | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def base_url(self) -> str:
        """As a provider entry's base_url: OpenAI's includes /v1, Anthropic's does not."""
        root = f"http://127.0.0.1:{self.port}"
        return root + "/v1" if self.kind == "openai" else root

    def fail_next(self, fault: Fault, times: int = 1) -> None:
        with self._lock:
            self._faults.extend([fault] * times)

    def always(self, fault: Fault | None) -> None:
        with self._lock:
            self._always = fault

    def _next_fault(self) -> Fault:
        with self._lock:
            if self._faults:
                return self._faults.pop(0)
            return self._always or Fault()

    # -- ASGI --------------------------------------------------------------------------------

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        body = await read_json_body(receive)
        self.requests.append(Recorded(scope["path"], headers, body))
        fault = self._next_fault()
        if fault.first_byte_delay_s:
            await asyncio.sleep(fault.first_byte_delay_s)
        status, payload, extra = self._check(scope["path"], headers, fault)
        refused = self._refused(body) if status == 200 else None
        if refused is not None:
            status, payload, extra = 400, self._error(400, refused), {}
        if status != 200:
            await _send_json(send, status, payload, extra)
            return
        if scope["path"] == PATHS[self.kind][1]:
            count: dict[str, Any] = {"input_tokens": self._prompt_tokens(body)}
            if self.kind == "openai":
                count["object"] = "response.input_tokens"
            await _send_json(send, 200, count, {})
            return
        answer = self._generate(body)
        if body.get("stream"):
            frames = self._openai_frames if self.kind == "openai" else self._anthropic_frames
            await _send_stream(send, frames(body, answer, fault), fault)
        else:
            respond = self._openai_json if self.kind == "openai" else self._anthropic_json
            await _send_json(send, 200, respond(body, answer), {})

    def _check(self, path: str, headers: dict[str, str], fault: Fault) -> tuple[int, Any, dict[str, str]]:
        if path not in PATHS[self.kind]:
            return 404, self._error(404, f"no route {path}"), {}
        if self.kind == "openai":
            authorized = headers.get("authorization") == f"Bearer {self.api_key}"
        else:
            authorized = headers.get("x-api-key") == self.api_key
            if authorized and not headers.get("anthropic-version"):
                return 400, self._error(400, "anthropic-version header is required"), {}
        if not authorized:
            return 401, self._error(401, "invalid x-api-key"), {}
        if fault.status is not None:
            extra = {"retry-after": fault.retry_after} if fault.retry_after is not None else {}
            return fault.status, self._error(fault.status, f"injected HTTP {fault.status}"), extra
        return 200, None, {}

    def _refused(self, body: dict[str, Any]) -> str | None:
        """What the real Messages API refuses of a well-formed body that the adapter could get
        wrong: tool ids outside its pattern (`messages.N.content.M.tool_use.id`)."""
        if self.kind != "anthropic":
            return None
        for n, message in enumerate(body.get("messages") or []):
            content = message.get("content")
            for m, block in enumerate(content if isinstance(content, list) else []):
                key = {"tool_use": "id", "tool_result": "tool_use_id"}.get(block.get("type"))
                if key is not None and not re.fullmatch(r"[A-Za-z0-9_-]+", str(block.get(key))):
                    return f"messages.{n}.content.{m}.{block['type']}.{key}: String should match pattern"
        return None

    def _error(self, status: int, message: str) -> dict[str, Any]:
        if self.kind == "anthropic":
            error_type = ANTHROPIC_ERROR_TYPES.get(status, "api_error")
            return {"type": "error", "error": {"type": error_type, "message": message}}
        error_type = "invalid_request_error" if status < 500 else "server_error"
        return {"error": {"message": message, "type": error_type, "param": None, "code": None}}

    def _tool_to_call(self, body: dict[str, Any]) -> str | None:
        """The first tool's name when the answer is to call it; None to answer in text."""
        tools = body.get("tools") or []
        last = (body.get("messages") or [{}])[-1]
        if self.kind == "openai":
            if not tools or body.get("tool_choice") == "none" or last.get("role") == "tool":
                return None
            return str(tools[0]["function"]["name"])
        content = last.get("content")
        answered = (
            last.get("role") == "user"
            and isinstance(content, list)
            and any(block.get("type") == "tool_result" for block in content)
        )
        if not tools or (body.get("tool_choice") or {}).get("type") == "none" or answered:
            return None
        return str(tools[0]["name"])

    def _generate(self, body: dict[str, Any]) -> Answer:
        tool = self._tool_to_call(body)
        if tool is not None:
            arguments = json.dumps(TOOL_CALL_ARGUMENTS)
            third = -(-len(arguments) // 3)
            pieces = [arguments[i : i + third] for i in range(0, len(arguments), third)]
            return Answer(pieces, "tool_use", tool=tool)
        words = self.reply.split(" ")
        pieces = [w if i == 0 else " " + w for i, w in enumerate(words)]
        stops = body.get("stop_sequences") if self.kind == "anthropic" else body.get("stop")
        stops = [stops] if isinstance(stops, str) else list(stops or [])
        for stop in stops:
            at = self.reply.find(stop)
            if at >= 0:
                kept: list[str] = []
                for piece in pieces:
                    if len("".join(kept) + piece) > at:
                        break
                    kept.append(piece)
                return Answer(kept, "stop_sequence", stop)
        limit = body.get("max_tokens") or body.get("max_completion_tokens")
        if limit is not None and len(pieces) > int(limit):
            return Answer(pieces[: int(limit)], "max_tokens")
        return Answer(pieces, "end_turn")

    def _prompt_tokens(self, body: dict[str, Any]) -> int:
        # A generation's messages, or the Responses input a count of OpenAI's gets.
        texts = [json.dumps(m.get("content")) for m in body.get("messages", body.get("input", []))]
        if isinstance(body.get("system"), str):
            texts.append(body["system"])
        return sum(len(t.split()) for t in texts)

    # -- OpenAI wire -------------------------------------------------------------------------

    def _openai_usage(self, body: dict[str, Any], pieces: list[str]) -> dict[str, Any]:
        prompt = self._prompt_tokens(body)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": len(pieces),
            "total_tokens": prompt + len(pieces),
            "prompt_tokens_details": {"cached_tokens": 0},
        }

    def _openai_json(self, body: dict[str, Any], answer: Answer) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": "".join(answer.pieces)}
        if answer.tool is not None:
            function = {"name": answer.tool, "arguments": "".join(answer.pieces)}
            call = {"id": TOOL_CALL_IDS["openai"], "type": "function", "function": function}
            message = {"role": "assistant", "content": None, "tool_calls": [call]}
        return {
            "id": "chatcmpl-fake1",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body["model"],
            "choices": [
                {"index": 0, "message": message, "finish_reason": answer.openai_finish, "logprobs": None}
            ],
            "usage": self._openai_usage(body, answer.pieces),
        }

    def _openai_frames(self, body: dict[str, Any], answer: Answer, fault: Fault) -> Iterator[bytes]:
        def chunk(delta: dict[str, Any], reason: str | None = None) -> dict[str, Any]:
            return {
                "id": "chatcmpl-fake1",
                "object": "chat.completion.chunk",
                "created": 1,
                "model": body["model"],
                "choices": [{"index": 0, "delta": delta, "finish_reason": reason}],
            }

        yield b": keep-alive comment, which clients must ignore\n\n"
        first = json.dumps(chunk({"role": "assistant", "content": ""}), indent=1)
        # One event's JSON over several `data:` lines: legal SSE, and a parser's classic trap.
        yield "".join(f"data: {line}\n" for line in first.splitlines()).encode() + b"\n"
        if answer.tool is not None:
            function = {"name": answer.tool, "arguments": ""}
            call = {"index": 0, "id": TOOL_CALL_IDS["openai"], "type": "function", "function": function}
            yield f"data: {json.dumps(chunk({'tool_calls': [call]}))}\n\n".encode()
        for piece in answer.pieces:
            if answer.tool is not None:
                delta: dict[str, Any] = {"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}
            else:
                delta = {"content": piece}
            yield f"data: {json.dumps(chunk(delta))}\n\n".encode()
        yield f"data: {json.dumps(chunk({}, answer.openai_finish))}\n\n".encode()
        if (body.get("stream_options") or {}).get("include_usage"):
            final = {**chunk({}), "choices": [], "usage": self._openai_usage(body, answer.pieces)}
            yield f"data: {json.dumps(final)}\n\n".encode()
        yield b"data: [DONE]\n\n"

    # -- Anthropic wire ----------------------------------------------------------------------

    def _anthropic_usage(self, body: dict[str, Any], pieces: list[str]) -> dict[str, Any]:
        # Pretend the first 2 prompt tokens were a cache hit, to exercise cache accounting.
        prompt = self._prompt_tokens(body)
        cached = min(2, prompt)
        return {
            "input_tokens": prompt - cached,
            "output_tokens": len(pieces),
            "cache_read_input_tokens": cached,
        }

    def _anthropic_json(self, body: dict[str, Any], answer: Answer) -> dict[str, Any]:
        block: dict[str, Any] = {"type": "text", "text": "".join(answer.pieces)}
        if answer.tool is not None:
            block = {"type": "tool_use", "id": TOOL_CALL_IDS["anthropic"], "name": answer.tool}
            block["input"] = json.loads("".join(answer.pieces))
        return {
            "id": "msg_fake1",
            "type": "message",
            "role": "assistant",
            "model": body["model"],
            "content": [block],
            "stop_reason": answer.finish,
            "stop_sequence": answer.stop,
            "usage": self._anthropic_usage(body, answer.pieces),
        }

    def _anthropic_frames(self, body: dict[str, Any], answer: Answer, fault: Fault) -> Iterator[bytes]:
        def event(name: str, data: dict[str, Any]) -> bytes:
            return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()

        start = {
            **self._anthropic_json(body, answer),
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
        }
        start["usage"] = {**self._anthropic_usage(body, answer.pieces), "output_tokens": 1}
        yield event("message_start", {"type": "message_start", "message": start})
        opened: dict[str, Any] = {"type": "text", "text": ""}
        if answer.tool is not None:
            opened = {"type": "tool_use", "id": TOOL_CALL_IDS["anthropic"], "name": answer.tool, "input": {}}
        yield event(
            "content_block_start", {"type": "content_block_start", "index": 0, "content_block": opened}
        )
        yield event("ping", {"type": "ping"})
        for i, piece in enumerate(answer.pieces):
            if fault.error_event is not None and i == 2:
                yield event(
                    "error", {"type": "error", "error": {"type": fault.error_event, "message": "injected"}}
                )
                return
            delta = {"type": "text_delta", "text": piece}
            if answer.tool is not None:
                delta = {"type": "input_json_delta", "partial_json": piece}
            yield event("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta})
        yield event("content_block_stop", {"type": "content_block_stop", "index": 0})
        yield event(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": answer.finish, "stop_sequence": answer.stop},
                "usage": {"output_tokens": len(answer.pieces)},
            },
        )
        yield event("message_stop", {"type": "message_stop"})


async def read_json_body(receive: Any) -> Any:
    """The request's whole body, as JSON ({} when empty)."""
    raw = b""
    while True:
        message = await receive()
        raw += message.get("body", b"")
        if not message.get("more_body"):
            return json.loads(raw or b"{}")


async def _send_json(send: Any, status: int, payload: Any, extra: dict[str, str]) -> None:
    data = json.dumps(payload).encode()
    headers = [(b"content-type", b"application/json"), *((k.encode(), v.encode()) for k, v in extra.items())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


async def _send_stream(send: Any, frames: Iterator[bytes], fault: Fault) -> None:
    headers = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    for i, frame in enumerate(frames):
        if fault.cut_after is not None and i >= fault.cut_after:
            raise StreamCut("injected: connection dropped mid-stream")
        if fault.stall_after is not None and i == fault.stall_after:
            await asyncio.sleep(fault.stall_s)
        await send({"type": "http.response.body", "body": frame, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


@contextmanager
def running(provider: FakeProvider) -> Iterator[FakeProvider]:
    """Serve `provider` on a free loopback port for the block's duration."""
    with serve_in_thread(provider) as port:
        provider.port = port
        yield provider
