"""Serving one OpenAI request end to end: translate, run on the engine, answer (JSON or SSE).

The route handlers stay thin: they read the body and call `serve_chat` / `serve_completion`.
Everything a request can get wrong is found before the engine runs it or raised by the engine
before its first delta, so errors are plain HTTP errors; only failures after the first byte of
a stream are error events.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec
from litestar import Request, Response

from http_server import EventStream
from protocol import ChatCompletionRequest, CompletionRequest
from protocol.chunk import CACHED_TOKENS_HEADER, PROMPT_TOKENS_HEADER
from protocol.timing import Timing
from regional_node.server.chat import ChatFormat
from regional_node.server.completions import CompletionFormat
from regional_node.server.config import NodeConfig
from regional_node.server.errors import api_error
from regional_node.server.generation import GenerationRequest, collect, start_generation
from regional_node.server.metrics import NodeMetrics
from regional_node.server.pool import ModelPool, ServedModel
from regional_node.server.prefixes import PrefixCacheView, PrefixDirectory, chat_prefixes
from regional_node.server.prompts import (
    chat_messages,
    chat_prompt_ids,
    completion_prompt,
    completion_prompt_ids,
)
from regional_node.server.sampling import check_supported, sampling_params
from regional_node.server.streaming import ChunkSource, sse_stream
from regional_node.server.tenancy import tenancy_from
from regional_node.server.tracing import NodeTracer
from regional_node.server.wire import new_id

_encoder = msgspec.json.Encoder()


@dataclass
class NodeState:
    """What request handling needs, built once by create_app and injected into handlers."""

    config: NodeConfig
    pool: ModelPool
    metrics: NodeMetrics
    tracer: NodeTracer | None = None  # OTEL_* said to trace (telemetry/); None: off
    # What the prefix caches hold, published in /load for the gateways' routers.
    prefixes: PrefixDirectory = field(default_factory=PrefixDirectory)


async def serve_chat(
    node: NodeState, request: Request[Any, Any, Any], body: ChatCompletionRequest
) -> Response[Any] | EventStream:
    model = node.pool.get(body.model)
    check_supported(body)
    tokenizer = model.engine.tokenizer
    try:
        prompt_ids = await asyncio.to_thread(chat_prompt_ids, tokenizer, body)
    except Exception as exc:
        raise api_error(exc, prompt_param="messages") from None
    response_id = new_id("chatcmpl")
    source = ChatFormat(body, response_id, model.name, tokenizer)
    job = _job(node, request.headers, model, body, prompt_ids, response_id, "chat", "messages")
    # Rendering the prefixes (a few ms of template and tokenizer work) runs beside the engine's
    # prefill, off the first token's path; it is done long before the response is.
    recording = asyncio.create_task(_record_prefixes(node, request.headers, model, body, prompt_ids))
    try:
        return await _respond(node, job, source, body.stream, body.stream_options)
    finally:
        await asyncio.shield(recording)


async def serve_completion(
    node: NodeState, request: Request[Any, Any, Any], body: CompletionRequest
) -> Response[Any] | EventStream:
    model = node.pool.get(body.model)
    check_supported(body)
    prompt = completion_prompt(body)
    tokenizer = model.engine.tokenizer
    try:
        prompt_ids = await asyncio.to_thread(completion_prompt_ids, tokenizer, prompt)
    except Exception as exc:
        raise api_error(exc, prompt_param="prompt") from None
    response_id = new_id("cmpl")
    source = CompletionFormat(body, response_id, model.name, tokenizer)
    job = _job(node, request.headers, model, body, prompt_ids, response_id, "completions", "prompt")
    return await _respond(node, job, source, body.stream, body.stream_options)


async def _record_prefixes(
    node: NodeState,
    headers: Mapping[str, str],
    model: ServedModel,
    body: ChatCompletionRequest,
    prompt_ids: list[int],
) -> None:
    """Note the request's message prefixes for publication (regional_node/server/prefixes.py)."""
    engine, tokenizer = model.engine, model.engine.tokenizer
    if not isinstance(engine, PrefixCacheView) or tokenizer is None:
        return  # an engine whose cache cannot be read (vLLM's): nothing is published
    conversation = tuple((m["role"], m["content"]) for m in chat_messages(body))
    salt = tenancy_from(headers, body.user).cache_salt
    prefixes = await asyncio.to_thread(
        chat_prefixes, engine, tokenizer, model.name, conversation, prompt_ids, salt, engine.kv_block_size
    )
    node.prefixes.record(model.name, prefixes)


def _job(
    node: NodeState,
    headers: Mapping[str, str],
    model: ServedModel,
    body: ChatCompletionRequest | CompletionRequest,
    prompt_ids: list[int],
    request_id: str,
    endpoint: str,
    prompt_param: str,
) -> GenerationRequest:
    continuation = list(body.continuation_token_ids or [])
    params = sampling_params(
        body, prompt_tokens=len(prompt_ids) + len(continuation), max_total_tokens=model.max_total_tokens
    )
    trace = None
    if node.tracer is not None:
        trace = node.tracer.start(headers, model=model.name, endpoint=endpoint, request_id=request_id)
    return GenerationRequest(
        request_id=request_id,
        model=model,
        prompt_ids=prompt_ids,
        params=params,
        tenancy=tenancy_from(headers, body.user),
        endpoint=endpoint,
        prompt_param=prompt_param,
        continuation_ids=continuation or None,
        trace=trace,
        reports_speculation=model.config.engine.speculative is not None,
    )


async def _respond(
    node: NodeState,
    job: GenerationRequest,
    source: ChatFormat | CompletionFormat,
    stream: bool,
    stream_options: Any,
) -> Response[Any] | EventStream:
    headers = {"x-request-id": job.request_id, "x-meridian-node": node.config.node_id}
    # A client that leaves cancels this task (the server's `cancel_on_disconnect`), wherever it
    # is: the engine request's iterator is closed as the cancellation unwinds it, which aborts
    # the request and frees its KV blocks.
    generation = await start_generation(job, node.metrics)
    if not stream:
        content = _encoder.encode(source.response(await collect(generation)))
        headers["server-timing"] = generation.server_timing()
        return Response(content=content, media_type="application/json", headers=headers)

    # What is known at the first byte; the usage chunk carries the rest.
    first = generation.timing()
    headers["server-timing"] = Timing(queue=first.queue, prefill=first.prefill).server_timing()
    opened = generation.last
    if opened is not None:  # the prompt as counted, for an answer whose first event says it
        headers[PROMPT_TOKENS_HEADER] = str(opened.prompt_tokens)
        headers[CACHED_TOKENS_HEADER] = str(opened.cached_tokens)
    include_usage = bool(stream_options is not None and stream_options.include_usage)
    chunks: ChunkSource = source
    # Sent from this task and closed however it ends (http_server/stream.py): sse_stream's
    # `finally` ends the engine request, a client that left mid-stream included.
    return EventStream(sse_stream(generation, chunks, include_usage=include_usage), headers)
