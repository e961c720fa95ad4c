"""The gateway's answers beyond the generation structs of `protocol.openai` and `protocol.anthropic`:
errors, Anthropic's message, the Responses, Files and Batches objects and the quota report, as
typed structs. The OpenAPI document's schemas are generated from them (gateway/api/openapi.py),
and tests/gateway/test_openapi.py fuzzes the live gateway against that document, so a body the
gateway builds that strays from its struct is found there.

A field without a default is required; `X | None` without a default is a required field that may
be null (OpenAI's objects name every field, null or not).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from protocol.anthropic import TextBlock, ToolUseBlock

BatchStatus = Literal[
    "validating", "in_progress", "finalizing", "completed", "failed", "expired", "cancelling", "cancelled"
]


class Error(msgspec.Struct, kw_only=True):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(msgspec.Struct, kw_only=True):
    """Every OpenAI-shaped error: the HTTP status says which."""

    error: Error


class AnthropicErrorDetail(msgspec.Struct, kw_only=True):
    type: str
    message: str


class AnthropicError(msgspec.Struct, kw_only=True):
    type: Literal["error"]
    error: AnthropicErrorDetail


class AnthropicUsage(msgspec.Struct, kw_only=True):
    input_tokens: int
    output_tokens: int
    cache_read_input_tokens: int
    cache_creation_input_tokens: int


class AnthropicMessage(msgspec.Struct, kw_only=True):
    id: str
    type: Literal["message"]
    role: Literal["assistant"]
    model: str
    # The blocks an answer has are the ones a conversation gives back as the assistant's turn.
    content: list[TextBlock | ToolUseBlock]
    stop_reason: Annotated[
        str | None, msgspec.Meta(description="end_turn, max_tokens, stop_sequence, tool_use, ...")
    ]
    stop_sequence: str | None
    usage: AnthropicUsage


# Metadata as OpenAI limits it (batches, responses): keys, each key's and each value's characters.
METADATA_KEYS, METADATA_KEY_LEN, METADATA_VALUE_LEN = 16, 64, 512
# A batch's callback_url: what the gateway can POST to. http(s), optional user info, a host name
# or IPv4 address in ASCII (an international name in its xn-- form), a port up to 65535, then
# printable ASCII. The door and the document both check this one pattern (JSON Schema syntax).
_PORT = r"(?:6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[0-9]{1,4})"
_USER = r"[A-Za-z0-9._~%!$&'()*+,;=-]"
CALLBACK_URL_PATTERN = (
    rf"^https?://(?:{_USER}+(?::{_USER}*)?@)?"
    rf"[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?(?::{_PORT})?"
    r"(?:[/?#][!-~]*)?$"
)


class ResponsesInputText(msgspec.Struct, kw_only=True):
    type: Literal["input_text", "output_text"]
    text: str


ItemStatus = Literal["in_progress", "completed", "incomplete"]


class ResponsesInputMessage(msgspec.Struct, kw_only=True):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[ResponsesInputText]


class ResponsesFunctionCall(msgspec.Struct, kw_only=True):
    """A function call the model made, given back as input (an earlier response's output item)."""

    type: Literal["function_call"]
    call_id: Annotated[str, msgspec.Meta(min_length=1)]
    name: Annotated[str, msgspec.Meta(min_length=1)]
    arguments: str
    id: str | None = None
    status: ItemStatus | None = None


class ResponsesToolOutputText(msgspec.Struct, kw_only=True):
    type: Literal["input_text"]
    text: str


class ResponsesFunctionCallOutput(msgspec.Struct, kw_only=True):
    """The client's result of the call `call_id`: text (a tool's images and files are refused)."""

    type: Literal["function_call_output"]
    call_id: Annotated[str, msgspec.Meta(min_length=1)]
    output: str | list[ResponsesToolOutputText]
    id: str | None = None
    status: ItemStatus | None = None


# An input item: a message, whose `type` may be left out, or a function call or its output. Not a
# tagged union (msgspec's needs the tag in every item), so stated as JSON Schema over these
# structs' components, which gateway/api/openapi.py generates beside the request's.
RESPONSES_INPUT_ITEMS = (ResponsesInputMessage, ResponsesFunctionCall, ResponsesFunctionCallOutput)
_ResponsesInputItem = Annotated[
    dict[str, Any],
    msgspec.Meta(
        extra_json_schema={
            "anyOf": [{"$ref": f"#/components/schemas/{item.__name__}"} for item in RESPONSES_INPUT_ITEMS]
        }
    ),
]


class ResponsesFunctionTool(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    type: Literal["function"]
    name: Annotated[str, msgspec.Meta(min_length=1)]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ResponsesToolChoiceFunction(msgspec.Struct, kw_only=True):
    type: Literal["function"]
    name: Annotated[str, msgspec.Meta(min_length=1)]


# `include` values of a Responses request: the one Meridian fills (each output_text's logprobs),
# and those naming what a Meridian response never holds (reasoning, images, server tools: refused
# where they would be asked for), so including them adds nothing, as for a model without them.
INCLUDE_LOGPROBS = "message.output_text.logprobs"
RESPONSES_INCLUDABLE = (
    INCLUDE_LOGPROBS,
    "reasoning.encrypted_content",
    "message.input_image.image_url",
    "computer_call_output.output.image_url",
    "file_search_call.results",
    "web_search_call.results",
    "web_search_call.action.sources",
    "code_interpreter_call.outputs",
)
MAX_RESPONSES_TOP_LOGPROBS = 20


class ResponsesRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The Responses API's text and function tools (gateway/README.md), as
    gateway/responses/translate.py checks it: any other field is refused. `background` cannot be
    streamed, and must be stored; a `tool_choice` that asks for a call needs `tools`."""

    model: Annotated[str, msgspec.Meta(min_length=1)]
    input: Annotated[
        str | Annotated[list[_ResponsesInputItem], msgspec.Meta(min_length=1)],
        msgspec.Meta(
            description="A string (one user message), or items: messages with string or text-part "
            "content, function calls and their outputs."
        ),
    ]
    instructions: str | None = None
    max_output_tokens: Annotated[int, msgspec.Meta(ge=1)] | None = None
    temperature: Annotated[float, msgspec.Meta(ge=0, le=2)] | None = None
    top_p: Annotated[float, msgspec.Meta(ge=0, le=1)] | None = None
    stream: bool | None = None
    background: bool | None = None
    store: bool | None = None
    metadata: Annotated[dict[str, str], msgspec.Meta(max_length=METADATA_KEYS)] | None = None
    user: str | None = None
    tools: list[ResponsesFunctionTool] | None = None
    tool_choice: Literal["auto", "none", "required"] | ResponsesToolChoiceFunction | None = None
    parallel_tool_calls: bool | None = None
    previous_response_id: Annotated[
        str | None,
        msgspec.Meta(
            description="A stored, finished response of this tenant's whose conversation (input and "
            "output, not instructions) this one continues; another is a 404, a running one a 409."
        ),
    ] = None
    include: Annotated[
        list[Literal[RESPONSES_INCLUDABLE]] | None,
        msgspec.Meta(
            description="`message.output_text.logprobs` fills each output_text's `logprobs` (and its "
            "streamed deltas'); the others name what a Meridian response never holds and add nothing."
        ),
    ] = None
    top_logprobs: (
        Annotated[
            int,
            msgspec.Meta(
                ge=0,
                le=MAX_RESPONSES_TOP_LOGPROBS,
                description="The most likely alternatives listed with each token's logprob (with "
                "include `message.output_text.logprobs`).",
            ),
        ]
        | None
    ) = None


class OutputMessage(msgspec.Struct, kw_only=True, tag_field="type", tag="message"):
    id: str
    status: ItemStatus
    role: Literal["assistant"]
    content: list[dict[str, Any]]


class FunctionCallItem(msgspec.Struct, kw_only=True, tag_field="type", tag="function_call"):
    """A function call the model made (an output item; listed as an input item when given back)."""

    id: str
    call_id: str
    name: str
    arguments: str
    status: ItemStatus


class ResponseObject(msgspec.Struct, kw_only=True):
    """A Responses API response (its `output` items as OpenAI shapes them)."""

    id: str
    object: Literal["response"]
    status: str
    model: str
    output: list[OutputMessage | FunctionCallItem]
    usage: dict[str, Any] | None


class InputMessageItem(msgspec.Struct, kw_only=True, tag_field="type", tag="message"):
    id: str
    status: ItemStatus
    role: Literal["user", "assistant", "system", "developer"]
    content: list[dict[str, Any]]


class FunctionCallOutputItem(msgspec.Struct, kw_only=True, tag_field="type", tag="function_call_output"):
    id: str
    call_id: str
    output: str | list[ResponsesToolOutputText]
    status: ItemStatus


# One input item of a response, as `GET /v1/responses/{id}/input_items` lists it.
InputItem = InputMessageItem | FunctionCallItem | FunctionCallOutputItem


class InputItemList(msgspec.Struct, kw_only=True):
    object: Literal["list"]
    data: list[InputItem]
    first_id: str | None
    last_id: str | None
    has_more: bool


class AnthropicModel(msgspec.Struct, kw_only=True):
    """A model as Anthropic's Models API describes one (what its SDK's `models` methods parse)."""

    type: Literal["model"] = "model"
    id: str
    display_name: str
    created_at: str  # RFC 3339
    lifecycle: Literal["active"] = "active"


class AnthropicModelList(msgspec.Struct, kw_only=True):
    data: list[AnthropicModel]
    has_more: bool
    first_id: str | None
    last_id: str | None


class InputTokenCount(msgspec.Struct, kw_only=True):
    """`POST /v1/responses/input_tokens`: a Responses request's input, in the model's tokens."""

    object: Literal["response.input_tokens"] = "response.input_tokens"
    input_tokens: int


class MessageTokensCount(msgspec.Struct, kw_only=True):
    """`POST /v1/messages/count_tokens` (Anthropic's): a Messages request's input tokens."""

    input_tokens: int


class ResponseDeleted(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["response"]
    deleted: bool


class FileUpload(msgspec.Struct, kw_only=True):
    """The multipart form of an upload: the JSONL file and `purpose: batch`."""

    # `format: binary`, as OpenAI's own document has it: generators (schemathesis) then send a
    # file's bytes, never a JSON value they think breaks the type (a part's bytes cannot).
    file: Annotated[
        str,
        msgspec.Meta(extra_json_schema={"format": "binary", "contentMediaType": "application/octet-stream"}),
    ]
    purpose: Literal["batch"]


class FileObject(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["file"]
    bytes: int
    created_at: int
    filename: str
    purpose: Literal["batch", "batch_output"]
    status: Literal["processed"]
    expires_at: int | None
    status_details: str | None


class FileDeleted(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["file"]
    deleted: bool


class CreateBatch(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    input_file_id: str
    endpoint: Literal["/v1/chat/completions", "/v1/completions"]
    completion_window: Literal["24h"]
    metadata: (
        Annotated[
            dict[
                Annotated[str, msgspec.Meta(max_length=METADATA_KEY_LEN)],
                Annotated[str, msgspec.Meta(max_length=METADATA_VALUE_LEN)],
            ],
            msgspec.Meta(max_length=METADATA_KEYS),
        ]
        | None
    ) = None
    callback_url: (
        Annotated[
            str,
            msgspec.Meta(
                pattern=CALLBACK_URL_PATTERN,
                description="Meridian extension: POSTed the batch when it ends. An http(s) URL with "
                "an ASCII host name (xn-- form) or IPv4 address, in printable ASCII.",
            ),
        ]
        | None
    ) = None


class BatchErrors(msgspec.Struct, kw_only=True):
    """Why a `failed` batch failed: each entry has code, message, param and line."""

    object: Literal["list"]
    data: list[dict[str, Any]]


class RequestCounts(msgspec.Struct, kw_only=True):
    total: int
    completed: int
    failed: int


class InputTokensDetails(msgspec.Struct, kw_only=True):
    cached_tokens: int


class OutputTokensDetails(msgspec.Struct, kw_only=True):
    reasoning_tokens: int


class BatchUsage(msgspec.Struct, kw_only=True):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class Batch(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["batch"]
    endpoint: str
    errors: BatchErrors | None
    input_file_id: str
    completion_window: Literal["24h"]
    status: BatchStatus
    output_file_id: str | None
    error_file_id: str | None
    created_at: int
    expires_at: int | None
    in_progress_at: int | None
    finalizing_at: int | None
    completed_at: int | None
    failed_at: int | None
    expired_at: int | None
    cancelling_at: int | None
    cancelled_at: int | None
    request_counts: RequestCounts
    metadata: dict[str, Any] | None
    usage: BatchUsage


class BatchList(msgspec.Struct, kw_only=True):
    object: Literal["list"]
    data: list[Batch]
    first_id: str | None
    last_id: str | None
    has_more: bool


class FileList(msgspec.Struct, kw_only=True):
    """A page of the tenant's files: while `has_more`, the next page is the one `after` `last_id`."""

    object: Literal["list"]
    data: list[FileObject]
    first_id: str | None
    last_id: str | None
    has_more: bool


class LedgerPage(msgspec.Struct, kw_only=True):
    """/v1/usage and /v1/costs in OpenAI's organization shape: time buckets, each with its results.
    (/v1/usage?date=YYYY-MM-DD answers one day's totals instead.)"""

    object: Literal["page"]
    data: list[dict[str, Any]]
    has_more: bool
    next_page: str | None


Limit = Annotated[int | None, msgspec.Meta(description="null: no limit")]


class Window(msgspec.Struct, kw_only=True):
    limit: Limit
    used: int
    remaining: Limit
    reset: str


class ConcurrencyWindow(msgspec.Struct, kw_only=True):
    limit: Limit
    in_use: int
    remaining: Limit


class QuotaUsage(msgspec.Struct, kw_only=True):
    object: Literal["quota.usage"]
    tenant: str
    source: Annotated[
        Literal["redis", "memory", "local"], msgspec.Meta(description="local: this replica's share")
    ]
    window_seconds: int
    requests: Window
    tokens: Window
    concurrent_requests: ConcurrencyWindow
    daily_tokens: Window
