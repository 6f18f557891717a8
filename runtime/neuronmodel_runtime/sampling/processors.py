"""Logits processors, vectorised over the rows that use them, in vLLM's order:

1. the min_tokens mask: EOS and stop token ids get -inf while a row has fewer than min_tokens outputs;
2. logit_bias: a per-row bias added to the listed tokens;
3. penalties: repetition (tokens seen in the prompt or the output: positive logits divided by the penalty,
   negative ones multiplied), then frequency (minus penalty x count in the output), then presence (minus
   penalty once per token present in the output).

Rows that use none of them are not touched (and cost nothing). Every value was checked at admission
(`SamplingParams.validate`), so no row can produce a NaN or an infinity here except the intended -inf mask.
"""

from __future__ import annotations

from typing import Sequence

import torch

from neuronmodel_runtime.sampling.params import RowSampling


def _ragged(values: Sequence[Sequence], rows: Sequence[int], device: torch.device, dtype: torch.dtype
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """(row index, value) pairs of a ragged per-row list, flattened: two `[N]` tensors."""
    index = [r for r, vals in zip(rows, values) for _ in vals]
    flat = [v for vals in values for v in vals]
    return (torch.tensor(index, dtype=torch.int64, device=device), torch.tensor(flat, dtype=dtype, device=device))


def apply_logits_processors(logits: torch.Tensor, rows: Sequence[RowSampling]) -> torch.Tensor:
    """The processed logits: a float32 copy when some row is processed, else `logits` itself.

    Args:
        logits: `[B, V]` raw logits of rows `rows` (same order).
        rows: B per-row settings.

    Returns:
        `[B, V]` logits, float32 if any row was processed.
    """
    if not any(r.processes_logits for r in rows):
        return logits
    out = logits.float().clone()
    device, vocab = out.device, out.shape[-1]

    masked = [i for i, r in enumerate(rows) if r.masked_token_ids]
    if masked:
        row_idx, token_idx = _ragged([rows[i].masked_token_ids for i in masked], masked, device, torch.int64)
        out[row_idx, token_idx] = float("-inf")

    biased = [i for i, r in enumerate(rows) if r.logit_bias]
    if biased:
        row_idx, token_idx = _ragged([[t for t, _ in rows[i].logit_bias] for i in biased], biased, device,
                                     torch.int64)
        _, bias = _ragged([[b for _, b in rows[i].logit_bias] for i in biased], biased, device, torch.float32)
        out.index_put_((row_idx, token_idx), bias, accumulate=True)

    penalised = [i for i, r in enumerate(rows) if r.has_penalties]
    if penalised:
        index = torch.tensor(penalised, dtype=torch.int64, device=device)  # [R]
        counts = torch.zeros(len(penalised), vocab, dtype=torch.float32, device=device)  # [R, V] output counts
        r_idx, t_idx = _ragged([rows[i].output_ids for i in penalised], range(len(penalised)), device, torch.int64)
        counts.index_put_((r_idx, t_idx), torch.ones_like(t_idx, dtype=torch.float32), accumulate=True)
        in_prompt = torch.zeros(len(penalised), vocab, dtype=torch.bool, device=device)  # [R, V]
        r_idx, t_idx = _ragged([rows[i].prompt_ids for i in penalised], range(len(penalised)), device, torch.int64)
        in_prompt[r_idx, t_idx] = True

        def column(name: str) -> torch.Tensor:
            return torch.tensor([getattr(rows[i], name) for i in penalised], device=device)[:, None]  # [R, 1]

        sub = out[index]  # [R, V]
        repetition = column("repetition_penalty")
        seen = in_prompt | (counts > 0)
        sub = torch.where(seen, torch.where(sub > 0, sub / repetition, sub * repetition), sub)
        sub = sub - column("frequency_penalty") * counts - column("presence_penalty") * (counts > 0)
        out[index] = sub
    return out


__all__ = ["apply_logits_processors"]
