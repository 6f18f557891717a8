"""What a proposer hands the verifier, and the interface every proposer implements."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Protocol, Sequence

import torch


@dataclass
class Proposal:
    """Draft tokens of one speculative step, row i belonging to the step's row i."""

    tokens: list[list[int]]  # per row: 0..k_i proposed tokens (a row with none decodes without speculation)
    probs: Optional[torch.Tensor] = None  # [B, k, V] float32 q of each proposal, zero-padded; None = deterministic


class Proposer(Protocol):
    """Proposes draft tokens per slot; told of every slot's prefill, emitted tokens and release."""

    def start(self, slot: int, prompt_ids: Sequence[int], first_token: int) -> None: ...

    def accept(self, slot: int, emitted: Sequence[int]) -> None: ...

    def release(self, slot: int) -> None: ...

    def propose(self, slots: Sequence[int], histories: Sequence[Sequence[int]], num_spec: Sequence[int],
                params: torch.Tensor, generators: Sequence[torch.Generator]) -> Proposal: ...
