"""Per-request generation settings and their validation."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from regional_node.engine.errors import InvalidRequestError

# What torch.Generator.manual_seed accepts (negative seeds wrap around); anything else raises there.
_SEED_MIN, _SEED_MAX = -(2**63), 2**64 - 1
# The most alternatives per token a request may ask for (OpenAI's limit, vLLM's default).
MAX_TOP_LOGPROBS = 20


@dataclass
class SamplingParams:
    """How to pick tokens and when to stop. temperature 0 means greedy; top_k 0 means no top-k cut."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    # Report each sampled token's log-probability (RequestDelta.new_logprobs). Off, a greedy step
    # skips the log-softmax over the vocabulary, and the deltas carry no logprobs.
    logprobs: bool = True
    # How many of the most likely tokens to report beside each sampled one
    # (RequestDelta.new_top_logprobs), from the distribution it was sampled from; needs logprobs.
    top_logprobs: int = 0
    # Whether this request may be decoded speculatively when its engine is configured for it (the
    # per-request opt-out). The tokens are the same either way (greedy) or distributed the same
    # (sampling); a caller may still opt out, e.g. for a seed-reproducible sample stream.
    speculative: bool = True

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def validate(self, *, continuation: bool = False) -> None:
        """Raise InvalidRequestError naming the first bad field; called by the engine on every request.

        A continuation may have max_tokens 0: its budget was spent, and it only asks how the
        carried tokens end the request (see output_processor.replay_tokens).
        """
        least, max_tokens = (0 if continuation else 1), self.max_tokens
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < least:
            raise InvalidRequestError(
                f"max_tokens must be an integer >= {least}, got {max_tokens!r}", "max_tokens"
            )
        if not _is_real(self.temperature) or self.temperature < 0:
            raise InvalidRequestError(f"temperature must be >= 0, got {self.temperature!r}", "temperature")
        if not _is_real(self.top_p) or not 0.0 < self.top_p <= 1.0:
            raise InvalidRequestError(f"top_p must be in (0, 1], got {self.top_p!r}", "top_p")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise InvalidRequestError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}", "top_k")
        if self.seed is not None and (
            isinstance(self.seed, bool)
            or not isinstance(self.seed, int)
            or not _SEED_MIN <= self.seed <= _SEED_MAX
        ):
            raise InvalidRequestError(
                f"seed must be an integer in [{_SEED_MIN}, {_SEED_MAX}], got {self.seed!r}", "seed"
            )
        if not isinstance(self.speculative, bool):
            raise InvalidRequestError(
                f"speculative must be true or false, got {self.speculative!r}", "speculative"
            )
        if not isinstance(self.logprobs, bool):
            raise InvalidRequestError(f"logprobs must be true or false, got {self.logprobs!r}", "logprobs")
        top = self.top_logprobs
        if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= MAX_TOP_LOGPROBS:
            raise InvalidRequestError(
                f"top_logprobs must be an integer in [0, {MAX_TOP_LOGPROBS}], got {top!r}", "top_logprobs"
            )
        if top and not self.logprobs:
            raise InvalidRequestError("top_logprobs needs logprobs", "top_logprobs")
        if not isinstance(self.stop, list) or not all(isinstance(s, str) and s for s in self.stop):
            raise InvalidRequestError("stop must be a list of non-empty strings", "stop")
        if not isinstance(self.stop_token_ids, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in self.stop_token_ids
        ):
            raise InvalidRequestError(
                "stop_token_ids must be a list of non-negative integers", "stop_token_ids"
            )


def _is_real(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
