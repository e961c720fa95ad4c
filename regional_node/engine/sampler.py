"""Turns each sequence's last-position logits into its next token, that token's log-probability
and, when a request asks (top_logprobs), the most likely tokens it was drawn among.

Processing order (as transformers): temperature, then top-k, then top-p. The reported logprob is
the log-softmax of the distribution actually sampled from, i.e. after those three steps; for greedy
requests (temperature 0) it is the log-softmax of the raw logits.

Random draws come from each request's own torch.Generator, one uniform number per token, turned into
a token by inverse-CDF over the processed distribution. So a seeded request gets the same tokens
whatever else shares its batch, and across preemptions.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from regional_node.engine.outputs import Alternatives
from regional_node.engine.sampling_params import SamplingParams


class SampledToken(NamedTuple):
    """One token a step emits: its logprob (None when the request did not ask and the step could
    skip computing it) and its alternatives (empty unless SamplingParams.top_logprobs)."""

    token: int
    logprob: float | None
    top: Alternatives = ()


def sample(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]
) -> list[SampledToken]:
    """logits: [num_seqs, vocab]; returns one SampledToken per row."""
    logits = logits.float()
    if all(p.greedy and not p.top_logprobs for p in params):
        greedy = argmax_rows(logits)
        if not any(p.logprobs for p in params):
            return [SampledToken(token, None) for token in greedy.tolist()]
        # max - logsumexp is the chosen token's log-softmax, without writing the whole [n, vocab] table.
        best = logits.gather(1, greedy[:, None]).squeeze(1)
        chosen = (best - torch.logsumexp(logits, dim=-1)).tolist()
        return [SampledToken(token, logprob) for token, logprob in zip(greedy.tolist(), chosen, strict=True)]

    device = logits.device
    logprobs = processed_logprobs(logits, params)
    tokens = argmax_rows(logits)  # greedy rows are neither scaled nor cut
    sampled_rows = [i for i, p in enumerate(params) if not p.greedy]
    if sampled_rows:
        uniforms = torch.stack(
            [torch.rand((), generator=generators[i], device=device) for i in sampled_rows]  # type: ignore[arg-type]
        )
        cdf = logprobs[sampled_rows].exp().cumsum(dim=-1)
        # right=True: the first token whose cumulative mass exceeds u, so zero-probability tokens are skipped.
        target = (uniforms * cdf[:, -1]).unsqueeze(1)
        sampled = torch.searchsorted(cdf, target, right=True).squeeze(1).clamp_(max=logits.shape[-1] - 1)
        tokens = tokens.clone()
        tokens[sampled_rows] = sampled
    chosen = logprobs.gather(1, tokens[:, None]).squeeze(1)
    tops = top_alternatives(logprobs, [p.top_logprobs for p in params])
    return [
        SampledToken(token, logprob, top)
        for token, logprob, top in zip(tokens.tolist(), chosen.tolist(), tops, strict=True)
    ]


def top_alternatives(logprobs: torch.Tensor, counts: list[int]) -> list[Alternatives]:
    """Per row of a processed-logprobs table, its `counts[row]` most likely tokens, most likely
    first. Tokens the row's top-k or top-p cut (logprob -inf: they could not be sampled) are not
    alternatives, so a row cut to fewer tokens lists fewer."""
    most = min(max(counts, default=0), logprobs.shape[-1])
    if most == 0:
        return [()] * len(counts)
    values, ids = logprobs.topk(most, dim=-1)
    return [
        tuple(
            (token, value)
            for token, value in zip(row_ids[:count], row_values[:count], strict=True)
            if value != -math.inf
        )
        for row_ids, row_values, count in zip(ids.tolist(), values.tolist(), counts, strict=True)
    ]


def processed_logprobs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Per row, the log-probabilities of the distribution that row samples from: after its
    temperature, top-k and top-p (greedy rows: the raw logits' log-softmax). logits are float32."""
    device = logits.device
    temperatures = torch.tensor([p.temperature if not p.greedy else 1.0 for p in params], device=device)
    logits = logits / temperatures[:, None]
    if any(p.top_k > 0 or p.top_p < 1.0 for p in params if not p.greedy):
        logits = _apply_top_k_top_p(logits, params)
    return torch.log_softmax(logits, dim=-1)


def inverse_cdf(probs: torch.Tensor, uniform: torch.Tensor) -> int:
    """The token one uniform draw picks from unnormalised probabilities (a 1-D row)."""
    cdf = probs.cumsum(dim=-1)
    # right=True: the first token whose cumulative mass exceeds u, so zero-probability tokens are skipped.
    token = torch.searchsorted(cdf, (uniform * cdf[-1]).reshape(1), right=True)
    return int(token.clamp_(max=probs.shape[-1] - 1))


def argmax_rows(logits: torch.Tensor) -> torch.Tensor:
    """logits.argmax(dim=-1) (the first of tied maxima, as transformers picks), in two levels.

    On CPU, argmax over a long row is a slow scalar loop (about 1 ms for 96 x 8192 floats) while
    amax is vectorized: so find each row's first slice holding its maximum (amax per slice, then an
    argmax over the few slices), then the first maximum inside that slice.
    """
    rows, vocab = logits.shape
    width = _ARGMAX_SLICE
    if logits.device.type != "cpu" or vocab % width or vocab == width:
        return logits.argmax(dim=-1)
    sliced = logits.reshape(rows, vocab // width, width)
    first = sliced.amax(dim=-1).argmax(dim=-1)
    inside = sliced[torch.arange(rows, device=logits.device), first].argmax(dim=-1)
    return first * width + inside


_ARGMAX_SLICE = 128


def _apply_top_k_top_p(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    vocab = logits.shape[-1]
    device = logits.device
    top_k = torch.tensor(
        [p.top_k if 0 < p.top_k < vocab and not p.greedy else vocab for p in params], device=device
    )
    top_p = torch.tensor([p.top_p if not p.greedy else 1.0 for p in params], device=device)
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(vocab, device=device)[None, :]
    remove = ranks >= top_k[:, None]
    sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
    probs = sorted_logits.softmax(dim=-1)
    # Drop a token when the mass strictly before it already reaches top_p (the top token always stays).
    mass_before = probs.cumsum(dim=-1) - probs
    remove |= (mass_before >= top_p[:, None]) & (top_p[:, None] < 1.0)
    remove[:, 0] = False
    mask = torch.zeros_like(remove).scatter_(1, order, remove)
    return logits.masked_fill(mask, float("-inf"))
