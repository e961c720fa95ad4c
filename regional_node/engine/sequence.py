"""One request's token state as the scheduler and block manager see it. No torch here."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Literal

Priority = Literal["interactive", "batch"]
# Lower rank is served first and preempted last.
PRIORITY_RANK: dict[str, int] = {"interactive": 0, "batch": 1}


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    """Prompt plus generated tokens, how many of them have KV in the cache, and the blocks holding it.

    After a preemption `num_computed_tokens` drops to 0 and the whole of `token_ids` (prompt and the
    tokens generated so far) is prefilled again, so recomputation never changes what was generated.
    """

    request_id: str
    token_ids: list[int]
    num_prompt_tokens: int
    max_tokens: int
    tenant: str = "default"
    priority: Priority = "interactive"
    cache_salt: str | None = None
    arrival: int = 0
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed_tokens: int = 0
    block_table: list[int] = field(default_factory=list)
    # Hashes of the full blocks of token_ids, in order (filled lazily; valid across preemptions).
    block_hashes: list[bytes] = field(default_factory=list)
    # How many leading entries of block_table are registered in the prefix cache.
    num_cached_blocks: int = 0
    # Prompt tokens served from the prefix cache at first admission (reported to the client).
    num_cached_prompt_tokens: int = 0
    # Fairness accounting: token positions already charged to the tenant (recompute is free).
    num_charged_tokens: int = 0
    admitted_order: int = -1
    ever_admitted: bool = False

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def rank(self) -> int:
        return PRIORITY_RANK[self.priority]

    @property
    def max_total_tokens(self) -> int:
        """Tokens whose KV may ever be stored: the last generated token is never fed back."""
        return self.num_prompt_tokens + self.max_tokens - 1
