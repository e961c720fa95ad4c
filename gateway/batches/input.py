"""A batch input file: JSONL, one request a line, checked when a batch is created from it.

Each line is `{"custom_id": str, "method": "POST", "url": "/v1/chat/completions" or
"/v1/completions", "body": {...}}`. A line that is not such an object, an unknown url, or a
custom_id used twice fails the whole batch (its `errors` name the line), as OpenAI's validation
does: the file could never make a sensible batch. The upload itself takes any file (OpenAI's Files
API does too), so a file's faults are told about the batch that reads it. What is inside `body` is
the pipeline's to judge when the line runs, so a bad request fails that line only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from gateway.batches.errors import BatchInputError
from gateway.batches.records import storable
from gateway.upstreams.base import Endpoint
from protocol.openai import MAX_JSON_DEPTH, json_depth_exceeds

ENDPOINTS: dict[str, Endpoint] = {"/v1/chat/completions": "chat", "/v1/completions": "completions"}


@dataclass(frozen=True)
class InputLine:
    line_no: int  # 1-based, as an editor shows it
    custom_id: str
    url: str
    body: dict[str, Any]


def parse_input(data: bytes, *, max_lines: int) -> list[InputLine]:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BatchInputError(f"The file is not UTF-8 (at byte {exc.start}).", param="file") from None
    lines: list[InputLine] = []
    seen: dict[str, int] = {}
    for line_no, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        line = _parse_line(raw, line_no)
        if line.custom_id in seen:
            raise BatchInputError(
                f"Line {line_no}: custom_id '{line.custom_id}' is already used on line {seen[line.custom_id]};"
                " each request needs its own.",
                param="custom_id",
                code="duplicate_custom_id",
                line=line_no,
            )
        seen[line.custom_id] = line_no
        lines.append(line)
        if len(lines) > max_lines:
            raise BatchInputError(
                f"The file has more than {max_lines} requests.",
                param="file",
                code="too_many_lines",
                line=line.line_no,
            )
    if not lines:
        raise BatchInputError("The file has no requests.", param="file", code="empty_file")
    return lines


def _parse_line(raw: str, line_no: int) -> InputLine:
    if json_depth_exceeds(raw.encode("utf-8", "surrogatepass")):  # json's parser would recurse out
        raise BatchInputError(
            f"Line {line_no} nests arrays or objects more than {MAX_JSON_DEPTH} levels deep.",
            param="file",
            code="invalid_json_line",
            line=line_no,
        )
    try:
        item = json.loads(raw)
    except ValueError as exc:
        raise BatchInputError(
            f"Line {line_no} is not valid JSON: {exc}.", param="file", code="invalid_json_line", line=line_no
        ) from None
    if not isinstance(item, dict):
        raise BatchInputError(
            f"Line {line_no} is not a JSON object.", param="file", code="invalid_json_line", line=line_no
        )
    custom_id, method, url, body = (item.get(k) for k in ("custom_id", "method", "url", "body"))
    if not isinstance(custom_id, str) or not custom_id or not storable(custom_id):
        raise BatchInputError(
            f"Line {line_no}: custom_id must be a non-empty string without NUL or unpaired surrogates.",
            param="custom_id",
            line=line_no,
        )
    if method != "POST":
        raise BatchInputError(
            f"Line {line_no}: method must be 'POST', got {method!r}.", param="method", line=line_no
        )
    if not isinstance(url, str) or url not in ENDPOINTS:  # a JSON array or object is no dict key
        raise BatchInputError(
            f"Line {line_no}: url {url!r} is not supported; use one of {sorted(ENDPOINTS)}.",
            param="url",
            code="invalid_url",
            line=line_no,
        )
    if not isinstance(body, dict):
        raise BatchInputError(f"Line {line_no}: body must be a JSON object.", param="body", line=line_no)
    if body.get("stream"):
        raise BatchInputError(
            f"Line {line_no}: streaming is not supported in a batch.", param="body.stream", line=line_no
        )
    return InputLine(line_no, custom_id, url, body)
