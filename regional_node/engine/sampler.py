"""Turns each sequence's last-position logits into its next token and that token's log-probability.

Processing order (as transformers): temperature, then top-k, then top-p. The reported logprob is
the log-softmax of the distribution actually sampled from, i.e. after those three steps; for greedy
requests (temperature 0) it is the log-softmax of the raw logits.

Random draws come from each request's own torch.Generator, one uniform number per token, turned into
a token by inverse-CDF over the processed distribution. So a seeded request gets the same tokens
whatever else shares its batch, and across preemptions.
"""

from __future__ import annotations

import torch

from regional_node.engine.sampling_params import SamplingParams


def sample(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]
) -> tuple[list[int], list[float | None]]:
    """logits: [num_seqs, vocab]; returns (token ids, logprobs), one per row. The logprobs are None
    when no row asked for them (SamplingParams.logprobs) and a greedy step could skip them."""
    logits = logits.float()
    if all(p.greedy for p in params):
        tokens = argmax_rows(logits)
        if not any(p.logprobs for p in params):
            return tokens.tolist(), [None] * len(params)
        # max - logsumexp is the chosen token's log-softmax, without writing the whole [n, vocab] table.
        best = logits.gather(1, tokens[:, None]).squeeze(1)
        return tokens.tolist(), (best - torch.logsumexp(logits, dim=-1)).tolist()

    device = logits.device
    logprobs = processed_logprobs(logits, params)
    greedy_tokens = argmax_rows(logits)  # greedy rows are neither scaled nor cut

    sampled_rows = [i for i, p in enumerate(params) if not p.greedy]
    uniforms = torch.stack(
        [torch.rand((), generator=generators[i], device=device) for i in sampled_rows]  # type: ignore[arg-type]
    )
    cdf = logprobs[sampled_rows].exp().cumsum(dim=-1)
    # right=True: the first token whose cumulative mass exceeds u, so zero-probability tokens are skipped.
    target = (uniforms * cdf[:, -1]).unsqueeze(1)
    sampled = torch.searchsorted(cdf, target, right=True).squeeze(1).clamp_(max=logits.shape[-1] - 1)
    tokens = greedy_tokens.clone()
    tokens[sampled_rows] = sampled
    chosen = logprobs.gather(1, tokens[:, None]).squeeze(1)
    return tokens.tolist(), chosen.tolist()


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
