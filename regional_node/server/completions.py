"""Legacy completions in OpenAI's shapes: the whole response, or the chunks of a stream."""

from __future__ import annotations

from typing import TYPE_CHECKING

from protocol.openai import (
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
    Usage,
)
from regional_node.server.generation import Result
from regional_node.server.wire import ResponseFormat, completion_logprobs, usage

if TYPE_CHECKING:
    from regional_node.engine import RequestDelta
    from regional_node.engine.outputs import Alternatives
    from regional_node.engine.tokenizer import Tokenizer


class CompletionFormat(ResponseFormat[CompletionRequest]):
    """Renders one completions request's results; also the chunk source for server/streaming.py."""

    def __init__(
        self, request: CompletionRequest, response_id: str, model: str, tokenizer: Tokenizer | None
    ) -> None:
        super().__init__(request, response_id, model, tokenizer)
        # Characters of output text streamed so far: logprobs' text_offset counts from here.
        self._offset = 0

    def _logprobs(
        self, token_ids: list[int], logprobs: list[float], tops: list[Alternatives], offset: int
    ) -> CompletionLogprobs | None:
        if self.request.logprobs is None:
            return None
        asked = tops if self.request.logprobs else None
        return completion_logprobs(self._tokenizer, token_ids, logprobs, asked, offset)

    def _body(self, choices: list[CompletionChoice], body_usage: Usage | None) -> CompletionResponse:
        return CompletionResponse(
            id=self.response_id, created=self.created, model=self.model, choices=choices, usage=body_usage
        )

    def response(self, result: Result) -> CompletionResponse:
        choice = CompletionChoice(
            index=0,
            text=result.text,
            finish_reason=result.finish_reason,
            stop_reason=result.stop_reason,
            logprobs=self._logprobs(result.token_ids, result.logprobs, result.top_logprobs, 0),
            token_ids=self._token_ids(result.token_ids),
        )
        return self._body(
            [choice], usage(result.prompt_tokens, result.completion_tokens, result.cached_tokens)
        )

    def opening(self) -> list[CompletionResponse]:
        return []

    def piece(self, delta: RequestDelta) -> CompletionResponse | None:
        wants_tokens = self.request.return_token_ids or self.request.logprobs is not None
        if not delta.new_text and not (delta.new_token_ids and wants_tokens):
            return None
        choice = CompletionChoice(
            index=0,
            text=delta.new_text,
            logprobs=self._logprobs(
                delta.new_token_ids, delta.new_logprobs, delta.new_top_logprobs, self._offset
            ),
            token_ids=self._token_ids(delta.new_token_ids),
        )
        self._offset += len(delta.new_text)
        return self._body([choice], None)

    def closing(self, finish_reason: str, stop_reason: str | int | None) -> CompletionResponse:
        choice = CompletionChoice(index=0, text="", finish_reason=finish_reason, stop_reason=stop_reason)
        return self._body([choice], None)

    def usage_chunk(self, chunk_usage: Usage) -> CompletionResponse:
        return self._body([], chunk_usage)
