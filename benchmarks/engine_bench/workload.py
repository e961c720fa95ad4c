"""The request mixes the engine benchmark replays; all requests arrive at t=0."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

# Ids 0-2 are the special tokens of our local checkpoints; prompts avoid them.
FIRST_ORDINARY_ID = 3


@dataclass(frozen=True)
class BenchRequest:
    request_id: str
    prompt_ids: list[int]
    max_tokens: int  # generated exactly: every system runs with EOS ignored


def mixed_workload(
    num_requests: int,
    *,
    vocab_size: int,
    seed: int,
    prompt_range: tuple[int, int] = (16, 512),
    output_range: tuple[int, int] = (8, 256),
) -> list[BenchRequest]:
    """Prompt and output lengths drawn uniformly (inclusive) from the ranges; random token ids."""
    rng = random.Random(seed)
    requests = []
    for i in range(num_requests):
        prompt_len = rng.randint(*prompt_range)
        requests.append(
            BenchRequest(
                request_id=f"mixed-{i}",
                prompt_ids=[rng.randrange(FIRST_ORDINARY_ID, vocab_size) for _ in range(prompt_len)],
                max_tokens=rng.randint(*output_range),
            )
        )
    return requests


def shared_prefix_workload(
    num_requests: int,
    *,
    vocab_size: int,
    seed: int,
    prefix_len: int = 256,
    suffix_range: tuple[int, int] = (16, 64),
    max_tokens: int = 8,
) -> tuple[list[int], list[BenchRequest]]:
    """One system prompt shared by every request, each followed by its own user suffix."""
    rng = random.Random(seed)
    prefix = [rng.randrange(FIRST_ORDINARY_ID, vocab_size) for _ in range(prefix_len)]
    requests = [
        BenchRequest(
            request_id=f"prefix-{i}",
            prompt_ids=prefix
            + [rng.randrange(FIRST_ORDINARY_ID, vocab_size) for _ in range(rng.randint(*suffix_range))],
            max_tokens=max_tokens,
        )
        for i in range(num_requests)
    ]
    return prefix, requests


def describe(requests: list[BenchRequest]) -> dict[str, Any]:
    prompts = [len(r.prompt_ids) for r in requests]
    outputs = [r.max_tokens for r in requests]
    return {
        "num_requests": len(requests),
        "prompt_tokens": {"total": sum(prompts), "min": min(prompts), "max": max(prompts)},
        "output_tokens": {"total": sum(outputs), "min": min(outputs), "max": max(outputs)},
    }
