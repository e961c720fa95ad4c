"""Prompt-lookup (n-gram) proposals: the sequence's own earlier tokens predict its next ones.

If the last n tokens (n from prompt_lookup_max down to prompt_lookup_min, longest first) occurred
earlier in the prompt or output, the tokens that followed that occurrence are proposed. Costs no
model. It runs for every decoding sequence in every step, so it is written for the usual case,
few earlier occurrences of the last token: those are found by `list.index` (a C loop; a numpy
copy of the sequence alone cost more than a whole lookup), and only they are extended backwards.
"""

from __future__ import annotations


def propose_ngram(token_ids: list[int], *, k: int, min_n: int, max_n: int) -> list[int]:
    """Up to k proposed next tokens (possibly none)."""
    length = len(token_ids)
    if k < 1 or length <= min_n:
        return []
    last = token_ids[-1]
    longest = min(max_n, length - 1)
    best_n = 0
    # For the longest match: the most recent occurrence with k tokens after it (recent text
    # predicts best; in a repeating cycle the very last occurrence leaves fewer than k), else the
    # earliest (the longest continuation).
    recent_full = earliest = -1
    j = -1
    while True:
        try:
            j = token_ids.index(last, j + 1, length - 1)
        except ValueError:
            break
        n = 1
        while n < longest and n <= j and token_ids[j - n] == token_ids[length - 1 - n]:
            n += 1
        if n < min_n or n < best_n:
            continue
        if n > best_n:
            best_n, recent_full, earliest = n, -1, j
        if j + 1 + k <= length:
            recent_full = j
    if best_n == 0:
        return []
    start = (recent_full if recent_full >= 0 else earliest) + 1
    return token_ids[start : start + k]
