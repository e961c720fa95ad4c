"""A streamed answer put back together as the non-streamed response the client asked for.

The confidence cascade streams from the small model even when the client did not ask for a
stream, so that it can decide on the first tokens and abort early. When the small model keeps the
request, the relayed chunks are collected here into OpenAI's `chat.completion` /
`text_completion` shape: text and logprobs concatenated per choice, tool-call fragments joined by
index, the last finish reason, and the usage the relay settled on.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gateway.upstreams.base import Endpoint

_OBJECT = {"chat": "chat.completion", "completions": "text_completion"}


def collect(
    endpoint: Endpoint, chunks: Iterable[Mapping[str, Any]], usage: Mapping[str, Any] | None
) -> dict[str, Any]:
    response: dict[str, Any] = {"object": _OBJECT[endpoint]}
    choices: dict[int, dict[str, Any]] = {}
    for chunk in chunks:
        for key in ("id", "created", "model", "system_fingerprint"):
            if chunk.get(key) is not None:
                response.setdefault(key, chunk[key])
        for part in chunk.get("choices") or []:
            index = int(part.get("index") or 0)
            choice = choices.setdefault(index, _empty(endpoint, index))
            _merge(endpoint, choice, part)
    response["choices"] = [_finished(endpoint, choices[i]) for i in sorted(choices)]
    if usage is not None:
        response["usage"] = dict(usage)
    return response


def _empty(endpoint: Endpoint, index: int) -> dict[str, Any]:
    if endpoint == "chat":
        return {"index": index, "message": {"role": "assistant", "content": ""}, "finish_reason": None}
    return {"index": index, "text": "", "finish_reason": None}


def _merge(endpoint: Endpoint, choice: dict[str, Any], part: Mapping[str, Any]) -> None:
    if part.get("finish_reason"):
        choice["finish_reason"] = part["finish_reason"]
    if part.get("token_ids"):
        choice.setdefault("token_ids", []).extend(part["token_ids"])
    logprobs = part.get("logprobs")
    if isinstance(logprobs, Mapping):
        merged = choice.setdefault("logprobs", {})
        for key, values in logprobs.items():
            if isinstance(values, list):
                merged.setdefault(key, []).extend(values)
    if endpoint != "chat":
        choice["text"] += part.get("text") or ""
        return
    delta = part.get("delta") or {}
    message = choice["message"]
    message["content"] += delta.get("content") or ""
    for call in delta.get("tool_calls") or []:
        calls = message.setdefault("tool_calls", {})
        slot = calls.setdefault(int(call.get("index") or 0), {"function": {"arguments": ""}})
        for key in ("id", "type"):
            if call.get(key):
                slot[key] = call[key]
        function = call.get("function") or {}
        if function.get("name"):
            slot["function"]["name"] = function["name"]
        slot["function"]["arguments"] += function.get("arguments") or ""


def _finished(endpoint: Endpoint, choice: dict[str, Any]) -> dict[str, Any]:
    if endpoint == "chat":
        calls = choice["message"].pop("tool_calls", None)
        if calls:
            choice["message"]["tool_calls"] = [calls[i] for i in sorted(calls)]
    choice.setdefault("logprobs", None)
    return choice
