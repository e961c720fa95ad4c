"""What a proposer hands the scheduler and the verification: proposed tokens, and for a draft
model the distributions they were drawn from."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Proposal:
    token_ids: list[int]
    # [len(token_ids), vocab]: the draft model's distribution q each token was sampled from (the
    # request's temperature, top-k and top-p applied), for rejection sampling; None for greedy
    # requests (verified by argmax alone) and for n-gram proposals (point masses).
    probs: torch.Tensor | None = None
