"""Chat completions in OpenAI's shapes: the whole response, or the chunks of a stream."""

from __future__ import annotations

from typing import TYPE_CHECKING

from protocol.openai import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatDelta,
    ChatLogprobs,
    ResponseMessage,
    Usage,
)
from regional_node.server.generation import Result
from regional_node.server.wire import ResponseFormat, chat_logprob_tokens, usage

if TYPE_CHECKING:
    from regional_node.engine import RequestDelta
    from regional_node.engine.outputs import Alternatives
    from regional_node.engine.tokenizer import Tokenizer


class ChatFormat(ResponseFormat[ChatCompletionRequest]):
    """Renders one chat request's results; also the chunk source for server/streaming.py."""

    def __init__(
        self, request: ChatCompletionRequest, response_id: str, model: str, tokenizer: Tokenizer | None
    ) -> None:
        super().__init__(request, response_id, model, tokenizer)
        self._top = request.top_logprobs or 0

    def _logprobs(
        self, token_ids: list[int], logprobs: list[float], tops: list[Alternatives]
    ) -> ChatLogprobs | None:
        if not self.request.logprobs:
            return None
        asked = tops if self._top else None
        return ChatLogprobs(content=chat_logprob_tokens(self._tokenizer, token_ids, logprobs, asked))

    def response(self, result: Result) -> ChatCompletionResponse:
        choice = ChatChoice(
            index=0,
            message=ResponseMessage(content=result.text),
            finish_reason=result.finish_reason,
            stop_reason=result.stop_reason,
            logprobs=self._logprobs(result.token_ids, result.logprobs, result.top_logprobs),
            token_ids=self._token_ids(result.token_ids),
        )
        return ChatCompletionResponse(
            id=self.response_id,
            created=self.created,
            model=self.model,
            choices=[choice],
            usage=usage(result.prompt_tokens, result.completion_tokens, result.cached_tokens),
        )

    def _chunk(self, choices: list[ChatChunkChoice], chunk_usage: Usage | None = None) -> ChatCompletionChunk:
        return ChatCompletionChunk(
            id=self.response_id, created=self.created, model=self.model, choices=choices, usage=chunk_usage
        )

    def opening(self) -> list[ChatCompletionChunk]:
        """OpenAI's first chunk announces the role, with empty content."""
        return [self._chunk([ChatChunkChoice(index=0, delta=ChatDelta(role="assistant", content=""))])]

    def piece(self, delta: RequestDelta) -> ChatCompletionChunk | None:
        """The chunk for one engine delta's new text/tokens, or None when it adds nothing."""
        if not delta.new_text and not (
            delta.new_token_ids and (self.request.return_token_ids or self.request.logprobs)
        ):
            return None
        # A stop token adds ids but no text; the chunk still carries them when the client asked.
        choice = ChatChunkChoice(
            index=0,
            delta=ChatDelta(content=delta.new_text),
            logprobs=self._logprobs(delta.new_token_ids, delta.new_logprobs, delta.new_top_logprobs),
            token_ids=self._token_ids(delta.new_token_ids),
        )
        return self._chunk([choice])

    def closing(self, finish_reason: str, stop_reason: str | int | None) -> ChatCompletionChunk:
        choice = ChatChunkChoice(
            index=0, delta=ChatDelta(), finish_reason=finish_reason, stop_reason=stop_reason
        )
        return self._chunk([choice])

    def usage_chunk(self, chunk_usage: Usage) -> ChatCompletionChunk:
        return self._chunk([], chunk_usage)
