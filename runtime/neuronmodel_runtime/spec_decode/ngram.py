"""Prompt-lookup proposals: continue the latest earlier occurrence of the sequence's own trailing n-gram.

No draft model: summaries, code edits and "repeat this" tasks copy long spans of their input, so the tokens that
followed the last n tokens the previous time are a cheap, often-right guess.
"""

from __future__ import annotations

from typing import Sequence


def propose_ngram(tokens: Sequence[int], k: int, n_min: int, n_max: int) -> list[int]:
    """Up to k tokens that followed the latest earlier match of the last n tokens (n from n_max down to n_min).

    Returns [] when no n-gram of those sizes recurs or k <= 0.
    """
    if k <= 0:
        return []
    size = len(tokens)
    for n in range(min(n_max, size - 1), n_min - 1, -1):
        tail = list(tokens[size - n :])
        # latest match first: the most recent context is the likeliest to be continued
        for start in range(size - n - 1, -1, -1):
            if tokens[start] == tail[0] and list(tokens[start : start + n]) == tail:
                follow = list(tokens[start + n : start + n + k])
                if follow:
                    return follow
    return []
