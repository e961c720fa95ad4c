"""Request intake: validates a request at once (specific errors, nothing recorded on failure) and
builds its scheduler Sequence and per-request output state.

A continuation's tokens (`continuation_token_ids`: generated earlier, by this node or another,
their chunks already with the client) are prefilled as prompt tokens, but their text state is
rebuilt by replaying them (output_processor.replay_tokens), so the stream goes on exactly where the
broken one stopped."""

from __future__ import annotations

import secrets
from collections.abc import Sequence as SequenceOf

import torch

from regional_node.engine.detokenizer import IncrementalDetokenizer
from regional_node.engine.errors import ContextLengthExceededError, InvalidRequestError
from regional_node.engine.output_processor import RequestState, replay_tokens
from regional_node.engine.outputs import Finish
from regional_node.engine.sampling_params import SamplingParams
from regional_node.engine.sequence import PRIORITY_RANK, Sequence
from regional_node.engine.stop_strings import StopStringMatcher
from regional_node.engine.tokenizer import Tokenizer

NO_TOKENIZER = "this engine has no tokenizer (skip_tokenizer_init, or none in its checkpoint)"


class RequestIntake:
    def __init__(
        self,
        *,
        vocab_size: int,
        max_model_len: int,
        tokenizer: Tokenizer | None,
        eos_token_ids: tuple[int, ...],
        device: torch.device,
    ) -> None:
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.device = device

    def build(
        self,
        request_id: str,
        prompt: list[int] | str,
        params: SamplingParams,
        *,
        tenant: str,
        priority: str,
        cache_salt: str | None,
        continuation_token_ids: list[int] | None,
        arrival: int,
    ) -> tuple[RequestState, Finish | None]:
        """The request's state, and how it ends if its continuation tokens already end it (then
        it must not be scheduled: nothing is left to generate)."""
        if priority not in PRIORITY_RANK:
            raise InvalidRequestError(
                f"priority must be one of {', '.join(PRIORITY_RANK)}, got {priority!r}", "priority"
            )
        if not isinstance(params, SamplingParams):
            raise InvalidRequestError("params must be a SamplingParams", "params")
        carried = self._token_ids(continuation_token_ids or [], "continuation_token_ids")
        params.validate(continuation=bool(carried))
        if params.stop and self.tokenizer is None:
            raise InvalidRequestError(f"stop strings need a tokenizer: {NO_TOKENIZER}", "stop")
        prompt_ids = self._prompt_ids(prompt)
        ids = prompt_ids + carried
        if not ids:
            raise InvalidRequestError("prompt must not be empty", "prompt")
        if len(ids) >= self.max_model_len or len(ids) + params.max_tokens > self.max_model_len:
            raise ContextLengthExceededError(
                f"this model's maximum context length is {self.max_model_len} tokens; the prompt has "
                f"{len(ids)} tokens and max_tokens is {params.max_tokens}",
                "prompt",
            )
        seq = Sequence(
            request_id=request_id,
            token_ids=ids,
            num_prompt_tokens=len(ids),
            max_tokens=params.max_tokens,
            tenant=tenant,
            priority=priority,  # type: ignore[arg-type]
            cache_salt=cache_salt,
            arrival=arrival,
        )
        generator = None
        if not params.greedy:
            # Per request, so its draws do not depend on what else shares the batch.
            generator = torch.Generator(device=self.device)
            generator.manual_seed(params.seed if params.seed is not None else secrets.randbits(63))
        eos_ids: frozenset[int] = frozenset() if params.ignore_eos else frozenset(self.eos_token_ids)
        state = RequestState(
            seq=seq,
            params=params,
            generator=generator,
            stop_token_ids=frozenset(params.stop_token_ids) | eos_ids,
            eos_token_ids=eos_ids,
            detokenizer=(
                IncrementalDetokenizer(self.tokenizer, prompt_ids) if self.tokenizer is not None else None
            ),
            stop_matcher=StopStringMatcher(params.stop) if params.stop else None,
        )
        finish = replay_tokens(state, carried) if carried else None
        return state, finish

    def _prompt_ids(self, prompt: list[int] | str) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise InvalidRequestError(f"{NO_TOKENIZER}: send the prompt as token ids", "prompt")
            return self.tokenizer.encode(prompt) if prompt else []
        if isinstance(prompt, list | tuple):
            return self._token_ids(prompt, "prompt")
        raise InvalidRequestError("prompt must be a string or a list of token ids", "prompt")

    def _token_ids(self, ids: SequenceOf[int], param: str) -> list[int]:
        for t in ids:
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < self.vocab_size:
                raise InvalidRequestError(
                    f"{param} has token id {t!r}, outside the vocabulary [0, {self.vocab_size})", param
                )
        return list(ids)
