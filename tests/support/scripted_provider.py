"""A commercial-provider stand-in whose every answer is scripted: the text in pieces (each piece
one or more tokens, with logprobs and alternatives), and how the answer ends.

Unlike FakeProvider (which writes a well-formed answer and injects faults), this one says exactly
what an upstream sends, so a test can drive the gateway with any chunking and any ending an
upstream can produce, on OpenAI's wire format (chat and completions, JSON and SSE) and
Anthropic's (JSON and its event stream). An answer may end in a tool call after its text (its
arguments streamed in scripted pieces; finish_reason "tool_calls", stop_reason "tool_use").

OpenAI endings: finish (finish chunk, usage chunk, [DONE]), done_without_finish ([DONE] and no
finish_reason), cut (the connection drops), error_event (`{"error": ...}` midway), eof (the body
ends without [DONE]). Anthropic endings: finish (message_delta with stop_reason and usage, then
message_stop), stop_without_delta (message_stop with no message_delta), delta_without_stop
(message_delta, then the body ends), null_stop_reason (message_delta whose stop_reason is null,
then message_stop), cut, error_event.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from tests.support.fake_providers import FakeProvider, Fault, _send_json, _send_stream, read_json_body

OPENAI_ENDINGS = ("finish", "done_without_finish", "cut", "error_event", "eof")
ANTHROPIC_ENDINGS = (
    "finish",
    "stop_without_delta",
    "delta_without_stop",
    "null_stop_reason",
    "cut",
    "error_event",
)
FINISHED_ENDINGS = ("finish", "delta_without_stop")  # the upstream said how the answer ended
TOOL_NAME = "lookup"


@dataclass
class Script:
    pieces: list[list[str]]  # each piece: its tokens (the piece's text is their concatenation)
    ending: str = "finish"
    alternatives: tuple[str, ...] = ()  # offered as top_logprobs beside every token
    output_tokens: int = 0  # what the upstream's usage says (default: one per token)
    # The stop string the upstream says ended the text (vLLM's `stop_reason`, Anthropic's
    # `stop_sequence`); None: it ended of itself.
    stop: str | None = None
    # A call of TOOL_NAME after the text: its arguments (a JSON object's text) in streamed
    # pieces; None: the answer is text only.
    tool_arguments: list[str] | None = None

    @property
    def text(self) -> str:
        return "".join(token for piece in self.pieces for token in piece)

    @property
    def arguments(self) -> str:
        return "".join(self.tool_arguments or ())

    @property
    def tokens(self) -> int:
        return self.output_tokens or sum(len(piece) for piece in self.pieces)


@dataclass
class ScriptedProvider(FakeProvider):
    script: Script = field(default_factory=lambda: Script([["Hello."]]))

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = await read_json_body(receive)
        script = self.script
        completions = scope["path"].endswith("/completions") and "chat" not in scope["path"]
        if not body.get("stream"):
            if self.kind == "anthropic":
                payload = _anthropic_message(script)
            else:
                payload = _openai_whole(script, body, completions)
            await _send_json(send, 200, payload, {})
            return
        frames = (
            _anthropic_frames(script)
            if self.kind == "anthropic"
            else _openai_frames(script, body, completions)
        )
        cut = Fault(cut_after=len(frames)) if script.ending == "cut" else Fault()
        await _send_stream(send, iter(frames), cut)


def _logprob_entries(tokens: list[str], alternatives: tuple[str, ...]) -> list[dict[str, Any]]:
    return [
        {
            "token": token,
            "logprob": -0.25,
            "bytes": list(token.encode()),
            "top_logprobs": [
                {"token": token, "logprob": -0.25, "bytes": list(token.encode())},
                *({"token": alt, "logprob": -3.0, "bytes": list(alt.encode())} for alt in alternatives),
            ],
        }
        for token in tokens
    ]


def _completion_logprobs(tokens: list[str], alternatives: tuple[str, ...]) -> dict[str, Any]:
    return {
        "tokens": tokens,
        "token_logprobs": [-0.25] * len(tokens),
        "top_logprobs": [{token: -0.25, **{alt: -3.0 for alt in alternatives}} for token in tokens],
        "text_offset": [0] * len(tokens),
    }


def _usage(script: Script) -> dict[str, int]:
    return {"prompt_tokens": 5, "completion_tokens": script.tokens, "total_tokens": 5 + script.tokens}


def _stop(script: Script) -> dict[str, Any]:
    return {"stop_reason": script.stop} if script.stop is not None else {}


def _anthropic_stop(script: Script) -> dict[str, Any]:
    if script.tool_arguments is not None:
        return {"stop_reason": "tool_use", "stop_sequence": None}
    if script.stop is None:
        return {"stop_reason": "end_turn", "stop_sequence": None}
    return {"stop_reason": "stop_sequence", "stop_sequence": script.stop}


def _openai_whole(script: Script, body: dict[str, Any], completions: bool) -> dict[str, Any]:
    tokens = [token for piece in script.pieces for token in piece]
    wants_logprobs = bool(body.get("logprobs"))
    if completions:
        choice: dict[str, Any] = {"index": 0, "text": script.text, "finish_reason": "stop", **_stop(script)}
        choice["logprobs"] = _completion_logprobs(tokens, script.alternatives) if wants_logprobs else None
        kind = "text_completion"
    else:
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": script.text},
            "finish_reason": "stop",
            **_stop(script),
        }
        if script.tool_arguments is not None:
            call = {
                "id": "call_1",
                "type": "function",
                "function": {"name": TOOL_NAME, "arguments": script.arguments},
            }
            choice["message"]["tool_calls"] = [call]
            choice["finish_reason"] = "tool_calls"
        choice["logprobs"] = (
            {"content": _logprob_entries(tokens, script.alternatives)} if wants_logprobs else None
        )
        kind = "chat.completion"
    return {
        "id": "x1",
        "object": kind,
        "created": 1,
        "model": "m",
        "choices": [choice],
        "usage": _usage(script),
    }


def _openai_frames(script: Script, body: dict[str, Any], completions: bool) -> list[bytes]:
    wants_logprobs = bool(body.get("logprobs"))
    kind = "text_completion" if completions else "chat.completion.chunk"

    def frame(payload: dict[str, Any]) -> bytes:
        return b"data: " + json.dumps(payload).encode() + b"\n\n"

    def chunk(choices: list[dict[str, Any]], **extra: Any) -> bytes:
        return frame({"id": "x1", "object": kind, "created": 1, "model": "m", "choices": choices, **extra})

    frames = []
    if not completions:
        frames.append(
            chunk([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
        )
    for piece in script.pieces:
        text = "".join(piece)
        if completions:
            choice: dict[str, Any] = {"index": 0, "text": text, "finish_reason": None}
            choice["logprobs"] = _completion_logprobs(piece, script.alternatives) if wants_logprobs else None
        else:
            choice = {"index": 0, "delta": {"content": text}, "finish_reason": None}
            choice["logprobs"] = (
                {"content": _logprob_entries(piece, script.alternatives)} if wants_logprobs else None
            )
        frames.append(chunk([choice]))
    if script.tool_arguments is not None and not completions:
        call = {
            "index": 0,
            "id": "call_1",
            "type": "function",
            "function": {"name": TOOL_NAME, "arguments": ""},
        }
        frames.append(chunk([{"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": None}]))
        for piece in script.tool_arguments:
            delta = {"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}
            frames.append(chunk([{"index": 0, "delta": delta, "finish_reason": None}]))
    ending = script.ending
    if ending == "finish":
        last = {
            "index": 0,
            "finish_reason": "tool_calls" if script.tool_arguments is not None else "stop",
            **_stop(script),
            **({"text": ""} if completions else {"delta": {}}),
        }
        frames += [chunk([last]), chunk([], usage=_usage(script)), b"data: [DONE]\n\n"]
    elif ending == "done_without_finish":
        frames.append(b"data: [DONE]\n\n")
    elif ending == "error_event":
        frames.append(frame({"error": {"message": "the model crashed", "type": "server_error"}}))
    return frames  # cut: the provider drops the connection after these; eof: the body just ends


def _anthropic_message(script: Script) -> dict[str, Any]:
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "m",
        "content": [{"type": "text", "text": script.text}, *_tool_use(script)],
        **_anthropic_stop(script),
        "usage": {"input_tokens": 5, "output_tokens": script.tokens},
    }


def _tool_use(script: Script) -> list[dict[str, Any]]:
    if script.tool_arguments is None:
        return []
    return [{"type": "tool_use", "id": "toolu_1", "name": TOOL_NAME, "input": json.loads(script.arguments)}]


def _anthropic_frames(script: Script) -> list[bytes]:
    def event(name: str, data: dict[str, Any]) -> bytes:
        return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()

    start = {"id": "msg_1", "type": "message", "role": "assistant", "model": "m", "content": [],
             "stop_reason": None, "usage": {"input_tokens": 5, "output_tokens": 1}}  # fmt: skip
    frames = [
        event("message_start", {"type": "message_start", "message": start}),
        event(
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        ),
    ]
    for piece in script.pieces:
        delta = {"type": "text_delta", "text": "".join(piece)}
        frames.append(
            event("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta})
        )
    last_block = 0
    if script.tool_arguments is not None:
        frames.append(event("content_block_stop", {"type": "content_block_stop", "index": 0}))
        last_block = 1
        block = {"type": "tool_use", "id": "toolu_1", "name": TOOL_NAME, "input": {}}
        frames.append(
            event("content_block_start", {"type": "content_block_start", "index": 1, "content_block": block})
        )
        for piece in script.tool_arguments:
            delta = {"type": "input_json_delta", "partial_json": piece}
            frames.append(
                event("content_block_delta", {"type": "content_block_delta", "index": 1, "delta": delta})
            )
    usage = {"output_tokens": script.tokens}
    ending = script.ending
    stop = event("message_stop", {"type": "message_stop"})
    if ending in ("finish", "delta_without_stop", "null_stop_reason"):
        frames.append(event("content_block_stop", {"type": "content_block_stop", "index": last_block}))
        stop_delta = (
            {"stop_reason": None, "stop_sequence": None}
            if ending == "null_stop_reason"
            else _anthropic_stop(script)
        )
        frames.append(event("message_delta", {"type": "message_delta", "delta": stop_delta,
                                              "usage": usage}))  # fmt: skip
        if ending != "delta_without_stop":
            frames.append(stop)
    elif ending == "stop_without_delta":
        frames.append(stop)
    elif ending == "error_event":
        frames.append(
            event("error", {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}})
        )
    return frames
