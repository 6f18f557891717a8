"""Prompt-lookup proposals: continue the latest earlier occurrence of the sequence's own trailing n-gram.

No draft model: summaries, code edits and "repeat this" tasks copy long spans of their input, so the tokens that
followed the last n tokens the previous time are a cheap, often-right guess.
"""

from __future__ import annotations

from typing import Sequence

import torch

from neuronmodel_runtime.spec_decode.proposal import Proposal


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


class NgramProposer:
    """Prompt lookup as a `Proposer`: stateless, host-side, deterministic (q is one-hot)."""

    def __init__(self, n_min: int, n_max: int):
        self.n_min, self.n_max = n_min, n_max

    def start(self, slot: int, prompt_ids: Sequence[int], first_token: int) -> None:
        pass

    def accept(self, slot: int, emitted: Sequence[int]) -> None:
        pass

    def release(self, slot: int) -> None:
        pass

    def propose(self, slots: Sequence[int], histories: Sequence[Sequence[int]], num_spec: Sequence[int],
                params: torch.Tensor, generators: Sequence[torch.Generator]) -> Proposal:
        return Proposal([propose_ngram(h, k, self.n_min, self.n_max) for h, k in zip(histories, num_spec)])
