"""Verification: which proposed tokens the target model accepts, from one forward pass.

A speculating sequence runs its last token plus k proposed tokens d_1..d_k through the target
model; logits row i (0 <= i <= k) is the target's prediction for the token after position i, so
row i judges d_{i+1} and row k yields a bonus token when every proposal is accepted. The run ends
at the first rejection with the target's own token there, so each verification yields 1..k+1
tokens.

- Greedy: accept d_i while it is the target's argmax; the token at the first mismatch is the
  argmax. The tokens are exactly greedy decoding's.
- Sampling: standard speculative rejection sampling (Leviathan et al. 2023; Chen et al. 2023):
  d_i, drawn from the proposer's distribution q, is accepted with probability min(1, p(d_i) /
  q(d_i)) (one uniform draw from the request's generator); on rejection the token is drawn from
  the residual max(0, p - q), renormalised. Each emitted token is then distributed exactly as the
  target's p (temperature, top-k and top-p applied), whatever q is. A draft model gives q as a
  full distribution per proposal; an n-gram proposal is a point mass q = 1 at d_i, so it is
  accepted with probability p(d_i) and the residual is p with d_i removed (no q rows are built).
- Logprobs are always the target's: log p of each emitted token and, when asked, its most likely
  alternatives under p, as the sampler reports them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from regional_node.engine.sampler import (
    SampledToken,
    argmax_rows,
    inverse_cdf,
    processed_logprobs,
    top_alternatives,
)
from regional_node.engine.sampling_params import SamplingParams


@dataclass
class VerifyRun:
    """One speculating sequence: its logits are rows [first_row, first_row + len(draft) + 1)."""

    first_row: int
    draft_token_ids: list[int]
    params: SamplingParams
    generator: torch.Generator | None
    # The proposer's distributions, one row per proposal (q of draft_token_ids[i] is row i); None:
    # point masses at the proposals.
    draft_probs: torch.Tensor | None = None


def verify(logits: torch.Tensor, runs: list[VerifyRun]) -> list[list[SampledToken]]:
    """The tokens each run emits (accepted proposals, then the target's token), with logprobs
    (None when the request did not ask for them) and alternatives (when it asked for them)."""
    logits = logits.float()
    targets = argmax_rows(logits).tolist()
    row_params = [run.params for run in runs for _ in range(len(run.draft_token_ids) + 1)]
    rows = [run.first_row + i for run in runs for i in range(len(run.draft_token_ids) + 1)]
    logprobs = None
    if any(not r.params.greedy or r.params.logprobs for r in runs):
        table = processed_logprobs(logits[rows], row_params)
        logprobs = torch.empty((logits.shape[0], logits.shape[1]), device=logits.device)
        logprobs[rows] = table
    out = []
    for run in runs:
        if run.params.greedy:
            tokens = _verify_greedy(targets, run)
        else:
            assert logprobs is not None and run.generator is not None
            tokens = _verify_sampled(logprobs, run)
        if not run.params.logprobs or logprobs is None:
            out.append([SampledToken(token, None) for token in tokens])
            continue
        emitted = logprobs[run.first_row : run.first_row + len(tokens)]
        chosen = emitted.gather(1, torch.tensor(tokens, device=emitted.device)[:, None]).squeeze(1)
        tops = top_alternatives(emitted, [run.params.top_logprobs] * len(tokens))
        out.append(
            [
                SampledToken(token, logprob, top)
                for token, logprob, top in zip(tokens, chosen.tolist(), tops, strict=True)
            ]
        )
    return out


def _verify_greedy(targets: list[int], run: VerifyRun) -> list[int]:
    tokens = []
    for i, proposed in enumerate(run.draft_token_ids):
        target = targets[run.first_row + i]
        tokens.append(target)
        if target != proposed:
            return tokens
    tokens.append(targets[run.first_row + len(run.draft_token_ids)])
    return tokens


def _verify_sampled(logprobs: torch.Tensor, run: VerifyRun) -> list[int]:
    device = logprobs.device
    q = run.draft_probs
    tokens = []
    for i, proposed in enumerate(run.draft_token_ids):
        probs = logprobs[run.first_row + i].exp()
        # Accept with probability min(1, p/q), compared as u * q < p (no division by a tiny q).
        q_proposed = 1.0 if q is None else q[i, proposed].to(probs.dtype)
        uniform = torch.rand((), generator=run.generator, device=device)
        if uniform * q_proposed < probs[proposed]:
            tokens.append(proposed)
            continue
        if q is None:
            residual = probs.clone()
            residual[proposed] = 0.0
        else:
            residual = (probs - q[i].to(device=device, dtype=probs.dtype)).clamp_(min=0.0)
            if not residual.sum() > 0:  # p == q up to rounding: a rejection had probability ~0
                residual = probs
        tokens.append(inverse_cdf(residual, torch.rand((), generator=run.generator, device=device)))
        return tokens
    bonus = logprobs[run.first_row + len(run.draft_token_ids)].exp()
    tokens.append(inverse_cdf(bonus, torch.rand((), generator=run.generator, device=device)))
    return tokens
