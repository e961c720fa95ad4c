"""GET /openapi.json: the OpenAPI 3.1 document of the public API, for client generators and fuzzers.

The front doors read their bodies themselves (limits on size, time and depth come before any
decoding), so Litestar cannot infer request types from their signatures, and its own generator
would describe neither our error bodies nor our responses. The schemas come instead from the
msgspec structs the doors decode with (msgspec emits JSON Schema 2020-12, OpenAPI 3.1's dialect),
so the document cannot drift from what the gateway accepts. Bodies the gateway builds as dicts
(errors, usage, Anthropic's answers) are described here. Operator endpoints (/health, /ready, /metrics)
are left out. The document depends on no config: it is built and encoded once per process.
"""

from __future__ import annotations

import functools
from importlib.metadata import PackageNotFoundError, version
from typing import Any, get_args

import msgspec
from litestar import Controller, Response, get

from gateway.batches.records import BatchStatus
from protocol import ChatCompletionRequest, CompletionRequest
from protocol.anthropic import MessagesRequest
from protocol.openai import ChatCompletionChunk, ChatCompletionResponse, CompletionResponse, ModelList

_STRUCTS = (
    ChatCompletionRequest,
    CompletionRequest,
    MessagesRequest,
    ChatCompletionResponse,
    CompletionResponse,
    ChatCompletionChunk,
    ModelList,
)
_REQUESTS = ("ChatCompletionRequest", "CompletionRequest", "MessagesRequest")
# Where the Meridian extensions appear (MessagesRequest's `top_k` is Anthropic's own).
_EXTENDED = (
    "ChatCompletionRequest",
    "CompletionRequest",
    "ChatChoice",
    "ChatChunkChoice",
    "CompletionChoice",
)
_EXTENSIONS = {
    "top_k": "Meridian extension (as vLLM): sample among the k most likely tokens.",
    "ignore_eos": "Meridian extension (as vLLM): keep generating past the end-of-sequence token.",
    "stop_token_ids": "Meridian extension (as vLLM): token ids that end generation.",
    "return_token_ids": "Meridian extension: every choice and streamed chunk carries its token ids.",
    "continuation_token_ids": (
        "Meridian extension: continues a stream. Tokens already generated, whose streamed chunks you "
        "received; generation goes on exactly after them (held-back text comes with the next chunk)."
    ),
    "add_generation_prompt": "Meridian extension (as vLLM): end the chat template with an assistant turn.",
    "continue_final_message": "Meridian extension (as vLLM): continue the last message, not a new one.",
    "token_ids": "Meridian extension: the generated token ids, when the request set return_token_ids.",
}
# The statuses a request with a body can get, besides the `default` error.
_BODY_ERRORS = {
    400: "The body is not UTF-8 JSON, nests too deeply, or a field is wrong (the error names it).",
    401: "The API key is missing or unknown.",
    403: "The tenant's policy does not allow this model.",
    404: "The model is not in the catalog.",
    408: "The body did not arrive in time.",
    413: "The body is over the gateway's size limit.",
    429: "A quota is used up, or every target is at capacity; Retry-After says when to retry.",
    503: "No region may serve the request now, or the quota store is down; Retry-After says when to retry.",
}


def _ref(kind: str, name: str) -> dict[str, str]:
    return {"$ref": f"#/components/{kind}/{name}"}


def _object(properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(properties)}


_STRING, _INTEGER, _NULLABLE_STRING = {"type": "string"}, {"type": "integer"}, {"type": ["string", "null"]}
_LIMIT = {"type": ["integer", "null"], "description": "null: no limit"}


def _window(counter: str = "used", reset: bool = True) -> dict[str, Any]:
    return _object(
        {"limit": _LIMIT, counter: _INTEGER, "remaining": _LIMIT, **({"reset": _STRING} if reset else {})}
    )


_BATCH_STATUSES = get_args(BatchStatus)
_BUILT_AS_DICTS: dict[str, dict[str, Any]] = {
    "Error": _object(
        {"message": _STRING, "type": _STRING, "param": _NULLABLE_STRING, "code": _NULLABLE_STRING}
    ),
    "ErrorResponse": _object({"error": _ref("schemas", "Error")}),
    "ResponsesRequest": _object(
        {
            "model": _STRING,
            "input": {"description": "A string, or messages with string or input_text content."},
            "instructions": _STRING,
            "max_output_tokens": _INTEGER,
            "stream": {"type": "boolean"},
            "background": {"type": "boolean"},
        }
    ),
    "Response": _object(
        {
            "id": _STRING,
            "object": {"const": "response"},
            "status": _STRING,
            "model": _STRING,
            "output": {"type": "array", "items": {"type": "object"}},
            "usage": {"type": ["object", "null"]},
        }
    ),
    "AnthropicError": _object(
        {"type": {"const": "error"}, "error": _object({"type": _STRING, "message": _STRING})}
    ),
    "AnthropicMessage": _object(
        {
            "id": _STRING,
            "type": {"const": "message"},
            "role": {"const": "assistant"},
            "model": _STRING,
            "content": {"type": "array", "items": _object({"type": {"const": "text"}, "text": _STRING})},
            "stop_reason": {
                "type": ["string", "null"],
                "description": "end_turn, max_tokens, stop_sequence, ...",
            },
            "stop_sequence": _NULLABLE_STRING,
            "usage": _object(
                {
                    "input_tokens": _INTEGER,
                    "output_tokens": _INTEGER,
                    "cache_read_input_tokens": _INTEGER,
                    "cache_creation_input_tokens": _INTEGER,
                }
            ),
        }
    ),
    "FileObject": _object(
        {
            "id": _STRING,
            "object": {"const": "file"},
            "bytes": _INTEGER,
            "created_at": _INTEGER,
            "filename": _STRING,
            "purpose": {"enum": ["batch", "batch_output"]},
            "status": {"const": "processed"},
        }
    ),
    "FileDeleted": _object({"id": _STRING, "object": {"const": "file"}, "deleted": {"type": "boolean"}}),
    "Batch": _object(
        {
            "id": _STRING,
            "object": {"const": "batch"},
            "endpoint": _STRING,
            "input_file_id": _STRING,
            "completion_window": {"const": "24h"},
            "status": {"enum": list(_BATCH_STATUSES)},
            "output_file_id": _NULLABLE_STRING,
            "error_file_id": _NULLABLE_STRING,
            "created_at": _INTEGER,
            "request_counts": _object({"total": _INTEGER, "completed": _INTEGER, "failed": _INTEGER}),
            "metadata": {"type": ["object", "null"]},
            "errors": {
                "type": ["object", "null"],
                "description": "Why a `failed` batch failed: {object: list, data: [{code, message, param, line}]}",
            },
            "usage": _object(
                {
                    "input_tokens": _INTEGER,
                    "input_tokens_details": _object({"cached_tokens": _INTEGER}),
                    "output_tokens": _INTEGER,
                    "output_tokens_details": _object({"reasoning_tokens": _INTEGER}),
                    "total_tokens": _INTEGER,
                }
            ),
        }
    ),
    "BatchList": {
        "type": "object",
        "description": "{object: list, data: [Batch], first_id, last_id, has_more}",
    },
    "CreateBatch": _object(
        {
            "input_file_id": _STRING,
            "endpoint": {"enum": ["/v1/chat/completions", "/v1/completions"]},
            "completion_window": {"const": "24h"},
            "metadata": {"type": ["object", "null"]},
            "callback_url": {
                **_NULLABLE_STRING,
                "description": "Meridian extension: POSTed the batch when it ends.",
            },
        }
    ),
    "UsagePage": {"type": "object", "description": "{object: page, data: [buckets], has_more, next_page}"},
    "CostsPage": {"type": "object", "description": "{object: page, data: [buckets], has_more, next_page}"},
    "QuotaUsage": _object(
        {
            "object": {"const": "quota.usage"},
            "tenant": _STRING,
            "source": {"enum": ["redis", "memory", "local"], "description": "local: this replica's share"},
            "window_seconds": _INTEGER,
            "requests": _window(),
            "tokens": _window(),
            "concurrent_requests": _window("in_use", reset=False),
            "daily_tokens": _window(),
        }
    ),
}

_RESPONSE_HEADERS = {
    "x-request-id": "This request's id, also in the gateway's logs.",
    "x-meridian-region": "The region that served the request.",
    "x-meridian-model": "The catalog model that served it (`auto` resolved).",
    "x-meridian-node": "The node or provider that served it.",
    "x-meridian-route": "Why the router chose it.",
    # Sent for the quotas the tenant has.
    **{
        f"x-ratelimit-{what}-{unit}": text.format(unit=unit)
        for unit in ("requests", "tokens")
        for what, text in (
            ("limit", "The tenant's {unit} per minute."),
            ("remaining", "The {unit} left in this minute's window."),
            ("reset", "When the {unit} window resets (`1.5s`, `6m0s`)."),
        )
    },
    "retry-after": "Seconds to wait before retrying.",
}


def _nullable(prop: dict[str, Any]) -> dict[str, Any]:
    if {"type": "null"} in prop.get("anyOf", ()):
        return prop
    inner = {k: v for k, v in prop.items() if k != "default"}
    return {"anyOf": [inner, {"type": "null"}], **({"default": prop["default"]} if "default" in prop else {})}


def _schemas() -> dict[str, Any]:
    _, schemas = msgspec.json.schema_components(_STRUCTS, ref_template="#/components/schemas/{name}")
    for name in _REQUESTS:
        # The decoder drops top-level nulls (OpenAI reads `null` as "not given"): optional fields
        # accept null; a required one sent as null is missing.
        schema = schemas[name]
        required = set(schema.get("required", ()))
        schema["properties"] = {
            field: prop if field in required else _nullable(prop)
            for field, prop in schema["properties"].items()
        }
    for name in _EXTENDED:
        for field, prop in schemas[name]["properties"].items():
            if field in _EXTENSIONS:
                prop["description"] = _EXTENSIONS[field]
    overlap = schemas.keys() & _BUILT_AS_DICTS.keys()
    assert not overlap, f"schema names used twice: {overlap}"
    return {**schemas, **_BUILT_AS_DICTS}


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


def _errors(statuses: dict[int, str], error: str) -> dict[str, Any]:
    def response(description: str, status: int | None = None) -> dict[str, Any]:
        headers = ("x-request-id", "retry-after") if status in (429, 503) else ("x-request-id",)
        return {
            "description": description,
            "headers": {h: _ref("headers", h) for h in headers},
            "content": _json(_ref("schemas", error)),
        }

    answers = {str(status): response(text, status) for status, text in statuses.items()}
    return {**answers, "default": response("Any other error, in the same shape.")}


def _generation(
    op_id: str, summary: str, request: str, answer: str, events: str, *, error: str = "ErrorResponse"
) -> dict[str, Any]:
    """A POST that generates: JSON body in; JSON out, or server-sent events when `stream` is true."""
    ok = {
        "description": "The answer; with `stream: true`, server-sent events instead.",
        "headers": {h: _ref("headers", h) for h in _RESPONSE_HEADERS if h != "retry-after"},
        "content": {
            **_json(_ref("schemas", answer)),
            "text/event-stream": {"schema": {"type": "string", "description": events}},
        },
    }
    return {
        "operationId": op_id,
        "summary": summary,
        "parameters": [_ref("parameters", "ClientRegion")],
        "requestBody": {"required": True, "content": _json(_ref("schemas", request))},
        "responses": {"200": ok, **_errors(_BODY_ERRORS, error)},
    }


def _listing(op_id: str, summary: str, answer: str, errors: tuple[int, ...], **extra: Any) -> dict[str, Any]:
    ok = {
        "description": summary,
        "headers": {"x-request-id": _ref("headers", "x-request-id")},
        "content": _json(_ref("schemas", answer)),
    }
    statuses = {
        400: "A query parameter is invalid; `param` names it.",
        401: _BODY_ERRORS[401],
        403: "A key may read only its own tenant's usage.",
        404: "No such object for this key's tenant (another tenant's ids are not found either).",
        413: "The file is over the gateway's size limit.",
        503: _BODY_ERRORS[503],
    }
    return {
        "operationId": op_id,
        "summary": summary,
        **extra,
        "responses": {"200": ok, **_errors({s: statuses[s] for s in errors}, "ErrorResponse")},
    }


_OPENAI_EVENTS = "`data:` events, each a {chunk} in JSON (see components), then `data: [DONE]`."
_RESPONSES_EVENTS = (
    "The Responses event sequence (`event:` named, with sequence_number): response.created, "
    "response.in_progress, response.output_item.added, response.content_part.added, "
    "response.output_text.delta..., response.output_text.done, response.content_part.done, "
    "response.output_item.done, response.completed (or response.incomplete / response.failed)."
)
_ANTHROPIC_EVENTS = (
    "Anthropic's event sequence: message_start, content_block_start, content_block_delta..., "
    "content_block_stop, message_delta, message_stop; an `error` event if the stream breaks."
)


def build_document() -> dict[str, Any]:
    """The OpenAPI 3.1 document of the gateway's public API."""
    try:
        package_version = version("meridian")
    except PackageNotFoundError:
        package_version = "0"
    anthropic = _generation(
        "createMessage",
        "Anthropic Messages API: a chat completion in Anthropic's format.",
        "MessagesRequest",
        "AnthropicMessage",
        _ANTHROPIC_EVENTS,
        error="AnthropicError",
    )
    anthropic["security"] = [{"bearerAuth": []}, {"anthropicApiKey": []}]
    tenant = {"name": "tenant", "in": "query", "required": False, "schema": _STRING}
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Meridian gateway",
            "version": package_version,
            "description": "OpenAI- and Anthropic-compatible LLM gateway with per-tenant data residency.",
        },
        "security": [{"bearerAuth": []}],
        "paths": {
            "/v1/chat/completions": {
                "post": _generation(
                    "createChatCompletion",
                    "OpenAI chat completion.",
                    "ChatCompletionRequest",
                    "ChatCompletionResponse",
                    _OPENAI_EVENTS.format(chunk="ChatCompletionChunk"),
                )
            },
            "/v1/completions": {
                "post": _generation(
                    "createCompletion",
                    "OpenAI legacy text completion.",
                    "CompletionRequest",
                    "CompletionResponse",
                    _OPENAI_EVENTS.format(chunk="CompletionResponse"),
                )
            },
            "/v1/messages": {"post": anthropic},
            "/v1/responses": {
                "post": _generation(
                    "createResponse",
                    "OpenAI Responses API, text subset (gateway/README.md); `background: true` returns at once.",
                    "ResponsesRequest",
                    "Response",
                    _RESPONSES_EVENTS,
                )
            },
            "/v1/responses/{response_id}": {
                "get": _listing("getResponse", "A stored response of this key's tenant.", "Response", (401,)),
                "delete": _listing("deleteResponse", "Cancels and forgets a response.", "Response", (401,)),
            },
            "/v1/responses/{response_id}/cancel": {
                "post": _listing("cancelResponse", "Cancels a running response.", "Response", (400, 401))
            },
            "/v1/files": {
                "post": _listing(
                    "createFile",
                    "Uploads a batch input file (multipart: `file`, `purpose: batch`); JSONL lines are "
                    "checked (a bad line, unknown url or duplicate custom_id is a 400 naming the line).",
                    "FileObject",
                    (400, 401, 413),
                    requestBody={
                        "required": True,
                        "content": {
                            "multipart/form-data": {"schema": _object({"file": _STRING, "purpose": _STRING})}
                        },
                    },
                )
            },
            "/v1/files/{file_id}": {
                "get": _listing("retrieveFile", "A file of this key's tenant.", "FileObject", (401, 404)),
                "delete": _listing("deleteFile", "Deletes a file.", "FileDeleted", (401, 404)),
            },
            "/v1/files/{file_id}/content": {
                "get": _listing("downloadFile", "The file's content (JSONL).", "FileObject", (401, 404))
            },
            "/v1/batches": {
                "post": _listing(
                    "createBatch",
                    "Runs a file's requests at batch priority through the gateway (24h window).",
                    "Batch",
                    (400, 401, 404),
                    requestBody={"required": True, "content": _json(_ref("schemas", "CreateBatch"))},
                ),
                "get": _listing(
                    "listBatches",
                    "This tenant's batches, newest first (limit, after).",
                    "BatchList",
                    (400, 401),
                ),
            },
            "/v1/batches/{batch_id}": {
                "get": _listing("retrieveBatch", "A batch of this key's tenant.", "Batch", (401, 404))
            },
            "/v1/batches/{batch_id}/cancel": {
                "post": _listing("cancelBatch", "Cancels a running batch.", "Batch", (400, 401, 404))
            },
            "/v1/models": {
                "get": _listing("listModels", "The models this key may use.", "ModelList", (401,))
            },
            "/v1/quota": {
                "get": _listing(
                    "getQuota",
                    "Meridian extension: the tenant's quota use in the current windows.",
                    "QuotaUsage",
                    (401, 403, 503),
                    parameters=[tenant],
                )
            },
            "/v1/usage": {
                "get": _listing(
                    "getUsage",
                    "Token usage from the ledger, in time buckets (OpenAI's organization usage shape), "
                    "or one day's totals with ?date=YYYY-MM-DD. Parameters: start_time, end_time, "
                    "bucket_width (1m, 1h, 1d), group_by (model, region, api_key_id, tenant_id), "
                    "limit, page, tenant, date; a bad one is a 400 naming it.",
                    "UsagePage",
                    (400, 401, 403, 503),
                    parameters=[tenant],
                )
            },
            "/v1/costs": {
                "get": _listing(
                    "getCosts",
                    "Costs in USD from the ledger, in time buckets (OpenAI's organization costs shape). "
                    "Parameters as /v1/usage; group_by: model, line_item, region, api_key_id, tenant_id.",
                    "CostsPage",
                    (400, 401, 403, 503),
                    parameters=[tenant],
                )
            },
        },
        "components": {
            "schemas": _schemas(),
            "securitySchemes": {
                "bearerAuth": {"type": "http", "scheme": "bearer", "description": "A tenant's API key."},
                "anthropicApiKey": {
                    "type": "apiKey",
                    "in": "header",
                    "name": "x-api-key",
                    "description": "A tenant's API key, as Anthropic's SDKs send it (/v1/messages only).",
                },
            },
            "parameters": {
                "ClientRegion": {
                    "name": "x-meridian-client-region",
                    "in": "header",
                    "required": False,
                    "schema": _STRING,
                    "description": "The client's region (e.g. `eu-west`): routing prefers it, "
                    "within the tenant's residency policy.",
                }
            },
            "headers": {
                name: {"description": text, "schema": _STRING} for name, text in _RESPONSE_HEADERS.items()
            },
        },
    }


@functools.cache
def document_bytes() -> bytes:
    return msgspec.json.encode(build_document())


class OpenAPIController(Controller):
    @get("/openapi.json")
    async def openapi(self) -> Response[bytes]:
        """Public: no API key, so tools can fetch it before they have one."""
        return Response(document_bytes(), media_type="application/json")
