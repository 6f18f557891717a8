"""Sampling from full logits in the runner's process, with one seeded generator per slot.

The reference runner samples this way on its device, and every runner samples this way on the host when it returns
logits instead of token ids (`sampling.on_device` false on NxDI and TNx): the logits processors (min_tokens mask,
logit_bias, penalties), then the one sampler (`sampling.sampler.sample`) with the slot's generator, and the logprobs
of the raw logits (vLLM's default `raw_logprobs`) where asked. So seeds, logprobs and penalties mean the same on
every runner that samples here.
"""

from __future__ import annotations

import os
from typing import Optional, Sequence

import torch

from neuronmodel_runtime.runners.base import StepOutput, TokenLogprob
from neuronmodel_runtime.sampling.params import RowSampling
from neuronmodel_runtime.sampling.processors import apply_logits_processors
from neuronmodel_runtime.sampling.sampler import sample
from neuronmodel_runtime.sampling.tensors import sampling_tensor, validate_sampling_tensor


class SlotSampler:
    """Per-slot generators (seeded at prefill, continued by every decode) and the sampling of one step."""

    def __init__(self, global_top_k: int, device: torch.device):
        self.global_top_k = global_top_k
        self.device = device  # where the generators live: the logits' device
        self._generators: dict[int, torch.Generator] = {}

    def seed(self, slots: Sequence[int], rows: Sequence[RowSampling]) -> None:
        """A new sequence in each slot: its generator starts from the row's seed (None: a fresh random one)."""
        for slot, row in zip(slots, rows):
            self._generators[slot] = self._seeded(row.seed)

    def generators(self, slots: Sequence[int]) -> list[torch.Generator]:
        """The slots' generators; a slot never seeded in this process gets a fresh random one."""
        for slot in slots:
            if slot not in self._generators:
                self._generators[slot] = self._seeded(None)
        return [self._generators[s] for s in slots]

    def release(self, slot: int) -> None:
        self._generators.pop(slot, None)

    def clear(self) -> None:
        self._generators.clear()

    def params(self, rows: list[RowSampling]) -> torch.Tensor:
        """NxDI's `[B, 3]` tensor of `rows`, checked with NxDI's rules, as a Neuron runner hands it over."""
        params = sampling_tensor(rows, self.global_top_k)
        validate_sampling_tensor(params, self.global_top_k)
        return params

    def sample(self, logits: torch.Tensor, slots: Sequence[int], rows: list[RowSampling],
               num_logprobs: Sequence[Optional[int]]) -> StepOutput:
        """One token per row from `[B, V]` logits (on `self.device`); logprobs of the rows that ask.

        The token is sampled from the processed logits; logprobs are of the raw ones.
        """
        params = self.params(rows)  # [B, 3]
        processed = apply_logits_processors(logits, rows)
        tokens = sample(processed, params, self.generators(slots), self.global_top_k).tolist()
        wanted = list(num_logprobs) + [None] * (len(slots) - len(num_logprobs))
        logprobs = top_logprobs(logits, tokens, wanted) if any(n is not None for n in wanted) else None
        return StepOutput(token_ids=[[t] for t in tokens], logprobs=logprobs)

    def _seeded(self, seed: Optional[int]) -> torch.Generator:
        generator = torch.Generator(device=self.device)
        generator.manual_seed(seed if seed is not None else int.from_bytes(os.urandom(8), "little") >> 1)
        return generator


def top_logprobs(logits: torch.Tensor, tokens: list[int],
                 wanted: list[Optional[int]]) -> list[Optional[list[TokenLogprob]]]:
    """Per row: log_softmax of the raw logits at the chosen token and its top-N, or None where not asked."""
    rows = [i for i, n in enumerate(wanted) if n is not None]
    logp = torch.log_softmax(logits[torch.tensor(rows, device=logits.device)].float(), dim=-1).cpu()  # [R, V]
    top_n = max(wanted[i] for i in rows)
    top_values, top_ids = logp.topk(max(top_n, 1), dim=-1)  # [R, N]
    out: list[Optional[list[TokenLogprob]]] = [None] * len(tokens)
    for r, i in enumerate(rows):
        n = wanted[i]
        top = dict(zip(top_ids[r, :n].tolist(), top_values[r, :n].tolist()))
        out[i] = [TokenLogprob(logprob=float(logp[r, tokens[i]]), top=top)]
    return out


__all__ = ["SlotSampler", "top_logprobs"]
