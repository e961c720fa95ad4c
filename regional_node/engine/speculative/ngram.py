"""Prompt-lookup (n-gram) proposals: the sequence's own earlier tokens predict its next ones.

If the last n tokens (n from prompt_lookup_max down to prompt_lookup_min, longest first) occurred
earlier in the prompt or output, the tokens that followed that occurrence are proposed. Costs no
model: one vectorized comparison per n over the sequence's tokens.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


def propose_ngram(token_ids: list[int], *, k: int, min_n: int, max_n: int) -> list[int]:
    """Up to k proposed next tokens (possibly none)."""
    length = len(token_ids)
    if k < 1 or length <= min_n:
        return []
    tokens = np.asarray(token_ids, dtype=np.int64)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        pattern = tokens[length - n :]
        # Windows starting at 0 .. length-1-n: each has at least one token after it, and the
        # suffix itself (starting at length-n) is excluded.
        windows = sliding_window_view(tokens[: length - 1], n)
        hits = np.flatnonzero((windows == pattern).all(axis=1))
        if hits.size == 0:
            continue
        # The most recent occurrence that still has k tokens after it (recent text predicts best;
        # in a repeating cycle the very last occurrence would leave fewer than k), else the earliest.
        full = hits[hits + n + k <= length]
        start = int(full[-1] if full.size else hits[0]) + n
        return token_ids[start : start + k]
    return []
