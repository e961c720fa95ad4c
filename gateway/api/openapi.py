"""GET /openapi.json: the OpenAPI 3.1 document of the public API, generated, not written.

- Paths, methods and path parameters come from the app's own route table, so a route cannot be
  left out and a `{parameter}` cannot go undeclared (the hand-written document missed eight).
- Every schema comes from a typed struct by `msgspec.json.schema_components` (JSON Schema 2020-12,
  OpenAPI 3.1's dialect): the requests the front doors decode (`protocol.openai`,
  `protocol.anthropic`) and the answers they build (`protocol.objects`).
- What no signature says is the table `OPERATIONS`: each operation's id, summary, body and answer
  structs, the error statuses it may answer, and the operations its answer links to (OpenAPI
  links: the object it created, by its `id`, is what they act on; clients and stateful fuzzers
  such as schemathesis follow them from a create to its reads, cancels and deletes). The front
  doors read their own bodies (size, time and depth limits come before decoding), so Litestar's
  generator cannot see their types.

Operator endpoints (/health, /ready, /metrics) are left out. The document is built once per app.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import msgspec
from litestar import Controller, Request, Response, get
from litestar.routes import HTTPRoute

from gateway.batches.objects import FILES_PAGE_LIMIT
from protocol import ChatCompletionRequest, CompletionRequest
from protocol.anthropic import MessagesCountRequest, MessagesRequest
from protocol.capabilities import VLLM_EXTENSIONS
from protocol.objects import (
    RESPONSES_INPUT_ITEMS,
    AnthropicError,
    AnthropicMessage,
    AnthropicModel,
    AnthropicModelList,
    Batch,
    BatchList,
    CreateBatch,
    ErrorResponse,
    FileDeleted,
    FileList,
    FileObject,
    FileUpload,
    InputItemList,
    InputTokenCount,
    LedgerPage,
    MessageTokensCount,
    QuotaUsage,
    ResponseDeleted,
    ResponseObject,
    ResponsesRequest,
)
from protocol.openai import (
    ChatCompletionChunk,
    ChatCompletionResponse,
    CompletionResponse,
    ModelCard,
    ModelList,
)

OPERATOR_PATHS = frozenset({"/health", "/ready", "/metrics", "/openapi.json"})

_OPENAI_EVENTS = "`data:` events, each a {chunk} in JSON (see components), then `data: [DONE]`."


@dataclass(frozen=True)
class Operation:
    operation_id: str
    summary: str
    answer: type | tuple[type, ...]  # the 200 body's struct (several: any of them, by client)
    errors: tuple[int, ...]  # besides `default`
    body: type | None = None  # a JSON request body's struct
    form: type | None = None  # a multipart request body's struct
    events: str | None = None  # a generation: `stream: true` answers these server-sent events
    answer_type: str = "application/json"
    error: type | tuple[type, ...] = ErrorResponse
    tenant_query: bool = False  # ?tenant= (global keys read another tenant's)
    query: tuple[dict[str, Any], ...] = ()  # its own query parameters (OpenAPI parameter objects)
    anthropic_key: bool = False  # also takes Anthropic's x-api-key header
    by_client: bool = False  # answers an `anthropic-version` request in Anthropic's shapes
    links: tuple[Link, ...] = ()  # what the 200 answer's object can be used for next


@dataclass(frozen=True)
class Link:
    """An OpenAPI link from an answer to `operation_id`: `parameter` (a path parameter) takes the
    answer's `id` (or what `source` points at); or, without one, `body` is the request body with
    the id in `body_field`."""

    name: str
    operation_id: str
    parameter: str | None = None
    body: dict[str, Any] | None = None
    body_field: str | None = None
    source: str = "$response.body#/id"

    def document(self) -> dict[str, Any]:
        link: dict[str, Any] = {"operationId": self.operation_id}
        if self.parameter is not None:
            link["parameters"] = {self.parameter: self.source}
        if self.body is not None and self.body_field is not None:
            link["requestBody"] = {**self.body, self.body_field: self.source}
        return link


def _query(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    """An optional query parameter: a bad value is a 400 naming it."""
    return {"name": name, "in": "query", "required": False, "schema": schema, "description": description}


def _page_query(what: str, *, max_limit: int, default_limit: int) -> tuple[dict[str, Any], ...]:
    """A list's `limit`, `order` and `after` (gateway/api/paging.py reads them)."""
    return (
        _query(
            "limit",
            {"type": "integer", "minimum": 1, "maximum": max_limit, "default": default_limit},
            f"At most this many {what}.",
        ),
        _query(
            "order",
            {"type": "string", "enum": ["asc", "desc"], "default": "desc"},
            "`desc`: newest first; `asc`: oldest first.",
        ),
        _query(
            "after",
            {"type": "string"},
            "The last id of the previous page: this page starts after it (an unknown id: an empty page).",
        ),
    )


def _by_id(parameter: str, *operations: tuple[str, str]) -> tuple[Link, ...]:
    return tuple(Link(name, operation_id, parameter) for name, operation_id in operations)


_GENERATION_ERRORS = (400, 401, 403, 404, 408, 413, 415, 429, 503)

OPERATIONS: dict[tuple[str, str], Operation] = {
    ("POST", "/v1/chat/completions"): Operation(
        "createChatCompletion",
        "OpenAI chat completion.",
        ChatCompletionResponse,
        _GENERATION_ERRORS,
        body=ChatCompletionRequest,
        events=_OPENAI_EVENTS.format(chunk="ChatCompletionChunk"),
    ),
    ("POST", "/v1/completions"): Operation(
        "createCompletion",
        "OpenAI legacy text completion.",
        CompletionResponse,
        _GENERATION_ERRORS,
        body=CompletionRequest,
        events=_OPENAI_EVENTS.format(chunk="CompletionResponse"),
    ),
    ("POST", "/v1/messages"): Operation(
        "createMessage",
        "Anthropic Messages API: a chat completion in Anthropic's format.",
        AnthropicMessage,
        _GENERATION_ERRORS,
        body=MessagesRequest,
        events="Anthropic's event sequence: message_start, ping, then each content block in turn "
        "(content_block_start, content_block_delta..., content_block_stop: text as text_delta, a "
        "tool_use block's input as input_json_delta), message_delta, message_stop; an `error` event "
        "if the stream breaks.",
        error=AnthropicError,
        anthropic_key=True,
    ),
    ("POST", "/v1/messages/count_tokens"): Operation(
        "countMessageTokens",
        "Anthropic's token count: the input tokens of a Messages request's conversation, as the "
        "model that would serve it reads them (its chat template included). Counts as a request "
        "against the tenant's quota; charges no tokens.",
        MessageTokensCount,
        _GENERATION_ERRORS,
        body=MessagesCountRequest,
        error=AnthropicError,
        anthropic_key=True,
    ),
    ("POST", "/v1/responses/input_tokens"): Operation(
        "countResponseInputTokens",
        "OpenAI's input token count of a Responses request (its input and instructions), as the "
        "model that would serve it reads them. Counts as a request against the tenant's quota; "
        "charges no tokens.",
        InputTokenCount,
        _GENERATION_ERRORS,
        body=ResponsesRequest,
    ),
    ("POST", "/v1/responses"): Operation(
        "createResponse",
        "OpenAI Responses API: text and function tools (gateway/README.md); `background: true` "
        "returns at once.",
        ResponseObject,
        _GENERATION_ERRORS,
        body=ResponsesRequest,
        links=_by_id(
            "response_id",
            ("GetResponse", "getResponse"),
            ("ListInputItems", "listInputItems"),
            ("CancelResponse", "cancelResponse"),
            ("DeleteResponse", "deleteResponse"),
        ),
        events="The Responses event sequence (`event:` named, with sequence_number): response.created, "
        "response.in_progress; each output item as it first appears: response.output_item.added "
        "(a message's, then response.content_part.added and response.output_text.delta...; a "
        "function call's, then response.function_call_arguments.delta...); when the answer ends, "
        "each item in output order is done (response.output_text.done, response.content_part.done / "
        "response.function_call_arguments.done, then response.output_item.done); then "
        "response.completed (or response.incomplete / response.failed).",
    ),
    ("GET", "/v1/responses/{response_id}"): Operation(
        "getResponse", "A stored response of this key's tenant.", ResponseObject, (401, 404)
    ),
    ("GET", "/v1/responses/{response_id}/input_items"): Operation(
        "listInputItems",
        "A stored response's input items (messages, function calls and their outputs; not its "
        "instructions, nor its previous response's conversation), in pages.",
        InputItemList,
        (400, 401, 404),
        query=_page_query("items", max_limit=100, default_limit=20),
    ),
    ("DELETE", "/v1/responses/{response_id}"): Operation(
        "deleteResponse", "Cancels and forgets a response.", ResponseDeleted, (401, 404)
    ),
    ("POST", "/v1/responses/{response_id}/cancel"): Operation(
        "cancelResponse", "Cancels a running response.", ResponseObject, (401, 404, 409)
    ),
    ("POST", "/v1/files"): Operation(
        "createFile",
        "Uploads a batch input file (purpose `batch`), whatever it holds; its JSONL lines are read "
        "when a batch is created from it (a fault fails that batch, its `errors` naming the line).",
        FileObject,
        (400, 401, 408, 413, 415),
        form=FileUpload,
        links=(
            *_by_id(
                "file_id",
                ("RetrieveFile", "retrieveFile"),
                ("DownloadFile", "downloadFile"),
                ("DeleteFile", "deleteFile"),
            ),
            Link(
                "CreateBatch",
                "createBatch",
                body={"endpoint": "/v1/chat/completions", "completion_window": "24h"},
                body_field="input_file_id",
            ),
        ),
    ),
    ("GET", "/v1/files"): Operation(
        "listFiles",
        "This tenant's files, deleted ones left out, by created_at (ties by id), in pages.",
        FileList,
        (400, 401),
        query=(
            _query("purpose", {"type": "string"}, "Only files of this purpose (`batch`, `batch_output`)."),
            *_page_query("files", max_limit=FILES_PAGE_LIMIT, default_limit=FILES_PAGE_LIMIT),
        ),
    ),
    ("GET", "/v1/files/{file_id}"): Operation(
        "retrieveFile", "A file of this key's tenant.", FileObject, (401, 404)
    ),
    ("DELETE", "/v1/files/{file_id}"): Operation("deleteFile", "Deletes a file.", FileDeleted, (401, 404)),
    ("GET", "/v1/files/{file_id}/content"): Operation(
        "downloadFile", "The file's content (JSONL).", str, (401, 404), answer_type="application/jsonl"
    ),
    ("POST", "/v1/batches"): Operation(
        "createBatch",
        "Runs a file's requests at batch priority through the gateway (24h window). A file that is "
        "not a batch input file makes the batch `failed` at once, its `errors` naming the line.",
        Batch,
        (400, 401, 404, 408, 413, 415),
        body=CreateBatch,
        links=_by_id("batch_id", ("RetrieveBatch", "retrieveBatch"), ("CancelBatch", "cancelBatch")),
    ),
    ("GET", "/v1/batches"): Operation(
        "listBatches", "This tenant's batches, newest first (limit, after).", BatchList, (400, 401)
    ),
    ("GET", "/v1/batches/{batch_id}"): Operation(
        "retrieveBatch", "A batch of this key's tenant.", Batch, (401, 404)
    ),
    ("POST", "/v1/batches/{batch_id}/cancel"): Operation(
        "cancelBatch", "Cancels a running batch.", Batch, (401, 404, 409)
    ),
    ("GET", "/v1/models"): Operation(
        "listModels",
        "The models this key may use: OpenAI's list, or with `anthropic-version` Anthropic's "
        "(paged by its `limit`, `after_id`, `before_id`).",
        (ModelList, AnthropicModelList),
        (400, 401),
        error=(ErrorResponse, AnthropicError),
        anthropic_key=True,
        by_client=True,
        links=(Link("RetrieveModel", "retrieveModel", "model", source="$response.body#/data/0/id"),),
    ),
    ("GET", "/v1/models/{model}"): Operation(
        "retrieveModel",
        "One model this key may use (any other is a 404), in OpenAI's shape or, with "
        "`anthropic-version`, Anthropic's.",
        (ModelCard, AnthropicModel),
        (401, 404),
        error=(ErrorResponse, AnthropicError),
        anthropic_key=True,
        by_client=True,
    ),
    ("GET", "/v1/quota"): Operation(
        "getQuota",
        "Meridian extension: the tenant's quota use in the current windows.",
        QuotaUsage,
        (401, 403, 503),
        tenant_query=True,
    ),
    ("GET", "/v1/usage"): Operation(
        "getUsage",
        "Token usage from the ledger, in time buckets (OpenAI's organization usage shape), or one "
        "day's totals with ?date=YYYY-MM-DD. Parameters: start_time (default: the `limit` buckets "
        "up to the one holding end_time), end_time (default: now), bucket_width (1m, 1h, 1d), "
        "group_by (model, region, api_key_id, tenant_id), limit, page, tenant, date; a bad one is a "
        "400 naming it.",
        dict,
        (400, 401, 403, 503),
        tenant_query=True,
    ),
    ("GET", "/v1/costs"): Operation(
        "getCosts",
        "Costs in USD from the ledger, in time buckets (OpenAI's organization costs shape). "
        "Parameters as /v1/usage; group_by: model, line_item, region, api_key_id, tenant_id.",
        LedgerPage,
        (400, 401, 403, 503),
        tenant_query=True,
    ),
}

_STATUS_TEXT = {
    400: "The request is invalid: the body is not UTF-8 JSON, nests too deeply, a field or a query "
    "parameter is wrong (`param` names it).",
    401: "The API key is missing or unknown.",
    403: "The tenant's policy does not allow it (a model, or another tenant's usage).",
    404: "No such model or object for this key's tenant (another tenant's ids are not found either).",
    408: "The body did not arrive in time.",
    409: "The object is not in a state that allows it: it already ended.",
    413: "The body is over the gateway's size limit (decoded, if it came compressed).",
    415: "The body's Content-Encoding is not one the gateway decodes (gzip, deflate); "
    "Accept-Encoding names those.",
    429: "A quota is used up, or every target is at capacity; Retry-After says when to retry.",
    503: "No region may serve the request now, or a store is down; Retry-After says when to retry.",
}
# Meridian's extensions to OpenAI's request and answer fields (the structs are shared with the node).
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
    "speculative": (
        "Meridian extension: false never decodes this request speculatively (default true: as the "
        "serving node's policy decides). The tokens do not depend on it."
    ),
    "token_ids": "Meridian extension: the generated token ids, when the request set return_token_ids.",
    **dict.fromkeys(
        VLLM_EXTENSIONS,
        "vLLM extension that Meridian's nodes do not implement: set to anything but its default, the "
        "request is served only by an OpenAI-compatible provider the tenant may use (which gets it "
        "as sent), else refused with a 400 naming it.",
    ),
}


def _no_tools_for(choice: dict[str, Any]) -> dict[str, Any]:
    """A request whose tool_choice is `choice` (one that asks for a tool call) and has no tools."""
    return {
        "properties": {
            "tool_choice": choice,
            "tools": {"anyOf": [{"type": "null"}, {"type": "array", "maxItems": 0}]},
        },
        "required": ["tool_choice"],
    }


# Anthropic's choices that ask for a call ("any", or "tool"); OpenAI's ("required", or a function).
_CHOICE_NEEDS_TOOLS = {
    "not": _no_tools_for(
        {"type": "object", "properties": {"type": {"enum": ["any", "tool"]}}, "required": ["type"]}
    )
}
_OPENAI_CHOICE_ASKS_A_CALL: dict[str, Any] = {
    "anyOf": [
        {"const": "required"},
        {"type": "object", "properties": {"type": {"const": "function"}}, "required": ["type"]},
    ]
}
# Rules a door checks after decoding, so that its 400 can name what it does not serve (a struct
# constraint would refuse with the decoder's words): stated here so the document keeps them too.
# (struct, field) -> what the field's schema adds; field "": the struct's schema.
_CHECKED_AFTER_DECODING: dict[tuple[str, str], dict[str, Any]] = {
    # gateway/translate/anthropic_to_openai.py: client tools only (a server tool, which has no
    # input_schema, is refused by its type); a tool_choice of "any" or "tool" needs tools, and
    # "tool" names one; no extended thinking.
    ("Tool", "type"): {"enum": ["custom"]},
    ("Tool", ""): {"required": ["name", "input_schema"]},
    ("ToolChoice", ""): {
        "anyOf": [
            {"properties": {"type": {"enum": ["auto", "any", "none"]}}},
            {"properties": {"name": {"type": "string"}}, "required": ["name"]},
        ]
    },
    # protocol/openai.py: a tool_choice that asks for a call needs tools.
    ("ChatCompletionRequest", ""): {"not": _no_tools_for(_OPENAI_CHOICE_ASKS_A_CALL)},
    ("CompletionRequest", ""): {"not": _no_tools_for(_OPENAI_CHOICE_ASKS_A_CALL)},
    ("MessagesRequest", ""): _CHOICE_NEEDS_TOOLS,
    ("MessagesCountRequest", ""): _CHOICE_NEEDS_TOOLS,
    ("Thinking", "type"): {"enum": ["disabled"]},
    # gateway/responses/translate.py: a background response is not streamed, and is stored; a
    # tool_choice that asks for a call ("required", or a function) needs tools.
    ("ResponsesRequest", ""): {
        "not": {
            "anyOf": [
                {
                    "properties": {"background": {"const": True}, "stream": {"const": True}},
                    "required": ["background", "stream"],
                },
                {
                    "properties": {"background": {"const": True}, "store": {"const": False}},
                    "required": ["background", "store"],
                },
                _no_tools_for(_OPENAI_CHOICE_ASKS_A_CALL),
            ]
        }
    },
}
_RESPONSE_HEADERS = {
    "x-request-id": "This request's id, also in the gateway's logs.",
    "x-meridian-region": "The region that served the request.",
    "x-meridian-model": "The catalog model that served it (`auto` resolved).",
    "x-meridian-node": "The node or provider that served it.",
    "x-meridian-route": "Why the router chose it.",
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
_REF = "#/components/{kind}/{name}"


def _ref(kind: str, name: str) -> dict[str, str]:
    return {"$ref": _REF.format(kind=kind, name=name)}


def _schemas() -> tuple[dict[type, dict[str, Any]], dict[str, Any]]:
    """Each typed body's schema (a $ref for a struct) and the components they refer to."""
    # The Responses input items are referred to by name from the request's schema (protocol/objects.py).
    types = [ChatCompletionChunk, *RESPONSES_INPUT_ITEMS]
    for op in OPERATIONS.values():
        for each in (op.answer, op.body, op.form, op.error):
            types += each if isinstance(each, tuple) else [each] if each is not None else []
    types = list(dict.fromkeys(types))
    refs, components = msgspec.json.schema_components(
        types, ref_template=_REF.format(kind="schemas", name="{name}")
    )
    for struct in (ChatCompletionRequest, CompletionRequest, MessagesRequest, MessagesCountRequest):
        # The decoder drops top-level nulls (OpenAI reads `null` as "not given"): optional fields
        # accept null; a required one sent as null is missing.
        schema = components[struct.__name__]
        required = set(schema.get("required", ()))
        for name, prop in schema["properties"].items():
            if name not in required and {"type": "null"} not in prop.get("anyOf", ()):
                default = {"default": prop.pop("default")} if "default" in prop else {}
                schema["properties"][name] = {"anyOf": [prop, {"type": "null"}], **default}
    for schema in components.values():
        for name, prop in schema.get("properties", {}).items():
            if name in _EXTENSIONS:
                prop["description"] = _EXTENSIONS[name]
    for (struct, name), rule in _CHECKED_AFTER_DECODING.items():
        schema = components[struct]
        (schema["properties"][name] if name else schema).update(rule)
    return dict(zip(types, refs, strict=True)), components


def _operation(
    op: Operation, path_parameters: dict[str, Any], schemas: dict[type, dict[str, Any]]
) -> dict[str, Any]:
    def schema(of: type | tuple[type, ...]) -> dict[str, Any]:
        # Untagged structs have no union schema in msgspec: a door answering two clients in their
        # own shapes lists both.
        return {"anyOf": [schemas[t] for t in of]} if isinstance(of, tuple) else schemas[of]

    def error(status: int | None) -> dict[str, Any]:
        headers = ("x-request-id", "retry-after") if status in (429, 503) else ("x-request-id",)
        return {
            "description": _STATUS_TEXT[status] if status else "Any other error, in the same shape.",
            "headers": {h: _ref("headers", h) for h in headers},
            "content": {"application/json": {"schema": schema(op.error)}},
        }

    answer = {op.answer_type: {"schema": schema(op.answer)}}
    headers = ("x-request-id",)
    if op.events is not None:
        answer["text/event-stream"] = {"schema": {"type": "string", "description": op.events}}
        headers = tuple(h for h in _RESPONSE_HEADERS if h != "retry-after")
    # Litestar's parameter types (`{file_id:str}`), as JSON Schema; a `:path` one (a model name,
    # which may hold a slash) is a string on the wire.
    parameters: list[dict[str, Any]] = [
        {
            "name": name,
            "in": "path",
            "required": True,
            "schema": {"type": "string"} if parameter.type is Path else msgspec.json.schema(parameter.type),
        }
        for name, parameter in path_parameters.items()
    ]
    if op.events is not None:
        parameters.append(_ref("parameters", "ClientRegion"))
    if op.tenant_query:
        parameters.append(_ref("parameters", "Tenant"))
    if op.by_client:
        parameters.append(_ref("parameters", "AnthropicVersion"))
    parameters += op.query
    document: dict[str, Any] = {"operationId": op.operation_id, "summary": op.summary}
    if parameters:
        document["parameters"] = parameters
    if op.body is not None:
        document["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": schemas[op.body]}},
        }
    if op.form is not None:
        document["requestBody"] = {
            "required": True,
            "content": {"multipart/form-data": {"schema": schemas[op.form]}},
        }
    if op.anthropic_key:
        document["security"] = [{"bearerAuth": []}, {"anthropicApiKey": []}]
    ok = {"description": op.summary, "headers": {h: _ref("headers", h) for h in headers}, "content": answer}
    if op.links:
        ok["links"] = {link.name: link.document() for link in op.links}
    document["responses"] = {"200": ok, **{str(s): error(s) for s in op.errors}, "default": error(None)}
    return document


def build_document(routes: list[Any]) -> dict[str, Any]:
    """The OpenAPI 3.1 document of the public routes among `routes` (a Litestar app's)."""
    schemas, components = _schemas()
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        if not isinstance(route, HTTPRoute) or route.path_format in OPERATOR_PATHS:
            continue
        for method in sorted(route.methods - {"OPTIONS", "HEAD"}):
            op = OPERATIONS.get((method, route.path_format))
            if op is None:
                raise LookupError(f"{method} {route.path_format} is served but not in openapi.OPERATIONS")
            item = paths.setdefault(route.path_format, {})
            item[method.lower()] = _operation(op, dict(route.path_parameters), schemas)
    try:
        package_version = version("meridian")
    except PackageNotFoundError:
        package_version = "0"
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Meridian gateway",
            "version": package_version,
            "description": "OpenAI- and Anthropic-compatible LLM gateway with per-tenant data residency.",
        },
        "security": [{"bearerAuth": []}],
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {
                "bearerAuth": {"type": "http", "scheme": "bearer", "description": "A tenant's API key."},
                "anthropicApiKey": {
                    "type": "apiKey",
                    "in": "header",
                    "name": "x-api-key",
                    "description": "A tenant's API key, as Anthropic's SDKs send it (/v1/messages "
                    "and /v1/models).",
                },
            },
            "parameters": {
                "ClientRegion": {
                    "name": "x-meridian-client-region",
                    "in": "header",
                    "required": False,
                    "schema": {"type": "string"},
                    "description": "The client's region (e.g. `eu-west`): routing prefers it, "
                    "within the tenant's residency policy (one the fleet has nothing in is ignored).",
                },
                "AnthropicVersion": {
                    "name": "anthropic-version",
                    "in": "header",
                    "required": False,
                    "schema": {"type": "string"},
                    "description": "Sent by Anthropic's SDKs: the answer and its errors come in "
                    "Anthropic's shapes.",
                },
                "Tenant": {
                    "name": "tenant",
                    "in": "query",
                    "required": False,
                    "schema": {"type": "string"},
                    "description": "Another tenant's id (keys allowed to read every tenant's).",
                },
            },
            "headers": {
                name: {"description": text, "schema": {"type": "string"}}
                for name, text in _RESPONSE_HEADERS.items()
            },
        },
    }


class OpenAPIController(Controller):
    @get("/openapi.json")
    async def openapi(self, request: Request[Any, Any, Any]) -> Response[bytes]:
        """Public: no API key, so tools can fetch it before they have one."""
        state = request.app.state
        if "openapi_document" not in state:
            state["openapi_document"] = msgspec.json.encode(build_document(request.app.routes))
        return Response(state["openapi_document"], media_type="application/json")
