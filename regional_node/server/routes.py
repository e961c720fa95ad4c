"""The node's HTTP routes. Thin: decode the body, call serving/pool/metrics, return."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Request, Response, get, post
from litestar.types import ASGIApp

from http_server import read_body
from protocol import ChatCompletionRequest, CompletionRequest, NotFoundError, decode_request
from protocol.openai import ModelCard, ModelList
from protocol.prefix_cache import parse_since
from protocol.tokenize import DetokenizeRequest, TokenizeRequest
from regional_node.server.auth import PUBLIC
from regional_node.server.load import load_report
from regional_node.server.metrics import CONTENT_TYPE
from regional_node.server.prefixes import PrefixCacheView
from regional_node.server.serving import NodeState, serve_chat, serve_completion
from regional_node.server.tokenize import detokenize, tokenize

_encoder = msgspec.json.Encoder()


def _json(content: Any, status_code: int = 200) -> Response[bytes]:
    return Response(content=_encoder.encode(content), media_type="application/json", status_code=status_code)


async def _body(request: Request[Any, Any, Any], node: NodeState) -> bytes:
    return await read_body(request.receive, request.headers, node.config.server)


@post("/v1/chat/completions", status_code=200)
async def chat_completions(request: Request[Any, Any, Any], node: NodeState) -> ASGIApp:
    body = decode_request(await _body(request, node), ChatCompletionRequest)
    return await serve_chat(node, request, body)


@post("/v1/completions", status_code=200)
async def completions(request: Request[Any, Any, Any], node: NodeState) -> ASGIApp:
    body = decode_request(await _body(request, node), CompletionRequest)
    return await serve_completion(node, request, body)


@post("/tokenize", status_code=200)
async def tokenize_prompt(request: Request[Any, Any, Any], node: NodeState) -> Response[bytes]:
    """vLLM's token count of a prompt or a conversation (the gateway's count doors ask it)."""
    return _json(await tokenize(node.pool, decode_request(await _body(request, node), TokenizeRequest)))


@post("/detokenize", status_code=200)
async def detokenize_tokens(request: Request[Any, Any, Any], node: NodeState) -> Response[bytes]:
    return _json(await detokenize(node.pool, decode_request(await _body(request, node), DetokenizeRequest)))


@get("/v1/models")
async def list_models(node: NodeState) -> Response[bytes]:
    served = {model.name: model for model in node.pool.models()}
    cards = [
        ModelCard(id=config.name, created=served[config.name].created if config.name in served else 0)
        for config in node.pool.configs
    ]
    return _json(ModelList(data=cards))


@get("/v1/models/{model:path}")
async def retrieve_model(model: str, node: NodeState) -> Response[bytes]:
    """OpenAI's `models.retrieve`; names may hold `/`, hence the path parameter."""
    name = model.lstrip("/")
    if name not in {config.name for config in node.pool.configs}:
        raise NotFoundError(f"The model `{name}` does not exist on this node.", param="model")
    served = {served.name: served for served in node.pool.models()}
    return _json(ModelCard(id=name, created=served[name].created if name in served else 0))


@get("/health", opt=PUBLIC)
async def health() -> Response[bytes]:
    """Liveness: the process answers. Never depends on models, so it is 200 during loading."""
    return _json({"status": "ok"})


@get("/ready")
async def ready(node: NodeState, model: str | None = None) -> Response[bytes]:
    """Readiness: 200 once every model is loaded, warmed up and probed and one of them serves,
    else 503 with the state; `?model=NAME` asks about that model alone. `failing` lists the
    models that fail their golden probes (not served here)."""
    pool = node.pool
    names = [config.name for config in pool.configs]
    if model is not None and model not in names:
        raise NotFoundError(f"The model `{model}` does not exist on this node.", param="model")
    body: dict[str, Any] = {
        "status": pool.state,
        "models": names,
        "probes": {name: state.status for name, state in pool.probe_states().items()},
        "failing": sorted(name for name, state in pool.probe_states().items() if state.failing),
    }
    if pool.error:
        body["error"] = pool.error
    ok = pool.serving(model) if model is not None else pool.ready
    return _json(body, 200 if ok else 503)


@get("/load")
async def load(node: NodeState, prefixes: str | None = None) -> Response[bytes]:
    """`prefixes=<epoch>.<version>`: the prefix table's changes since then (protocol/prefix_cache.py)."""
    engines = {m.name: m.engine for m in node.pool.models() if isinstance(m.engine, PrefixCacheView)}
    node.prefixes.refresh(engines)
    report = load_report(node.config, node.pool)
    report.prefix_cache = node.prefixes.state(parse_since(prefixes))
    return _json(report)


@get("/metrics")
async def metrics(node: NodeState) -> Response[bytes]:
    return Response(content=node.metrics.render(), media_type=CONTENT_TYPE)


ROUTES = [
    chat_completions,
    completions,
    tokenize_prompt,
    detokenize_tokens,
    list_models,
    retrieve_model,
    health,
    ready,
    load,
    metrics,
]
