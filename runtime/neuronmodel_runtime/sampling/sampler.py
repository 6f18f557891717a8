"""The on-device sampler: vectorized over rows, one `torch.Generator` per row, on the logits' device.

Its input is the logits after the logits processors (`processors.py`: min_tokens mask, logit_bias, penalties).

Glossary:
    candidates: the `K = min(global_top_k, V)` highest logits of a row (NxDI's `max_topk` optimisation); every
        per-row filter works inside them, so a token outside the global top-k is never sampled.
    processing: in NxDI's order, temperature (divide the candidates' logits), per-row top-k (keep the k best),
        top-p (keep the smallest prefix of the sorted candidates whose probability mass reaches top_p; the top
        candidate is always kept), then renormalise; a dropped candidate gets logprob -inf.
    greedy row: top_k == 1; its token is the exact argmax of the (processed) logits (ties go to the lowest id, as
        `torch.argmax`), never a draw.
    sampled row: any other row; its token is drawn with the row's own generator by `draw`, the one sampling
        primitive (speculative verification draws its recovered and bonus tokens with it too), over the row's
        K candidates: a row draws exactly K numbers per token, so its output never depends on the other rows.

Note: NxDI drops the candidate whose cumulative mass first exceeds top_p; we keep it (the nucleus of Holtzman et
al., as vLLM and transformers do), so that top_p reaches at least the requested mass.
"""

from __future__ import annotations

from typing import Sequence

import torch

from neuronmodel_runtime.sampling.tensors import TEMPERATURE, TOP_K, TOP_P


def greedy_rows(params: torch.Tensor) -> list[bool]:
    """The one greedy rule: per row, True when top_k == 1 (read on the host: params are small)."""
    return (params[:, TOP_K].cpu() == 1).tolist()


def processed_logprobs(
    logits: torch.Tensor, params: torch.Tensor, global_top_k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The candidates of each row and their log-probabilities after temperature, top-k and top-p.

    Args:
        logits: `[B, V]` raw logits (any float dtype; computed in float32).
        params: `[B, 3]` sampling tensor (top_k, top_p, temperature); top_k -1 means all K candidates.
        global_top_k: candidates kept per row before the per-row filters.

    Returns:
        candidate_ids: `[B, K]` int64 token ids, by decreasing logit (tied logits in unspecified order).
        candidate_logprobs: `[B, K]` float32, log-softmax of the processed logits; -inf where filtered out.
    """
    logits = logits.float()
    num_candidates = min(global_top_k, logits.shape[-1])
    values, candidate_ids = torch.topk(logits, num_candidates, dim=-1)  # [B, K] each, sorted
    params = params.to(device=logits.device, dtype=torch.float32)
    top_k = params[:, TOP_K : TOP_K + 1]  # [B, 1]
    top_k = torch.where(top_k <= 0, float(num_candidates), top_k)
    top_p = params[:, TOP_P : TOP_P + 1]  # [B, 1]
    temperature = params[:, TEMPERATURE : TEMPERATURE + 1]  # [B, 1]

    rank = torch.arange(num_candidates, device=logits.device)  # [K]
    scaled = (values / temperature).masked_fill(rank >= top_k, float("-inf"))  # [B, K]
    probs = torch.softmax(scaled, dim=-1)  # [B, K]
    mass_before = torch.cumsum(probs, dim=-1) - probs  # [B, K], 0 for the top candidate
    # NOTE: top_p == 1 keeps everything even where float rounding pushes the running mass to 1 early.
    beyond_nucleus = (mass_before >= top_p) & (top_p < 1.0)  # [B, K]
    scaled = scaled.masked_fill(beyond_nucleus, float("-inf"))
    return candidate_ids, torch.log_softmax(scaled, dim=-1)


def target_probs(logits: torch.Tensor, params: torch.Tensor, global_top_k: int) -> torch.Tensor:
    """The full-vocabulary distribution `sample` draws from, per row (greedy rows: one-hot at the argmax).

    Speculative rejection sampling uses it for both the target (p) and the draft (q) distributions.

    Args:
        logits: `[B, V]` raw logits.
        params: `[B, 3]` sampling tensor.
        global_top_k: candidates kept per row before the per-row filters.

    Returns:
        `[B, V]` float32 probabilities, zero outside each row's kept candidates; rows sum to 1.
    """
    candidate_ids, candidate_logprobs = processed_logprobs(logits, params, global_top_k)
    probs = torch.zeros(logits.shape, dtype=torch.float32, device=logits.device)  # [B, V]
    probs.scatter_(1, candidate_ids, candidate_logprobs.exp())
    greedy = torch.tensor(greedy_rows(params), device=logits.device)  # [B]
    if bool(greedy.any()):
        one_hot = torch.zeros_like(probs).scatter_(1, torch.argmax(logits, dim=-1, keepdim=True), 1.0)
        probs = torch.where(greedy[:, None], one_hot, probs)
    return probs


def draw(candidate_ids: torch.Tensor, probs: torch.Tensor, generators: Sequence[torch.Generator]) -> torch.Tensor:
    """The one sampling draw, used by the sampler and by speculative verification alike.

    Row r picks candidate i with probability `probs[r, i] / probs[r].sum()` by an exponential race,
    `argmax(p / E)` with `E ~ Exp(1)` drawn from `generators[r]`: exactly one number per candidate, so a
    row's draw never depends on the other rows, and zero-probability candidates never win.

    Args:
        candidate_ids: `[R, K]` int64 token ids.
        probs: `[R, K]` non-negative weights (need not be normalised), on the generators' device.
        generators: R generators.

    Returns:
        `[R]` int64 token ids.
    """
    race = torch.empty(probs.shape, dtype=torch.float32, device=probs.device)  # [R, K]
    for row, generator in enumerate(generators):
        race[row].exponential_(generator=generator)
    # NOTE: the clamp keeps an E of exactly 0 from dividing by zero.
    choice = torch.argmax(probs.float() / race.clamp_min(1e-30), dim=-1, keepdim=True)  # [R, 1]
    return candidate_ids.gather(1, choice).squeeze(1)


def sample(
    logits: torch.Tensor, params: torch.Tensor, generators: Sequence[torch.Generator], global_top_k: int
) -> torch.Tensor:
    """One token per row: exact argmax for greedy rows, a `draw` with the row's own generator otherwise.

    Args:
        logits: `[B, V]` logits (after the logits processors), on any device.
        params: `[B, 3]` sampling tensor (top_k, top_p, temperature).
        generators: B generators on the logits' device, row i draws from `generators[i]` only.
        global_top_k: candidates kept per row before the per-row filters.

    Returns:
        `[B]` int64 token ids on the logits' device.
    """
    tokens = torch.argmax(logits, dim=-1)  # [B]
    sampled = [i for i, greedy in enumerate(greedy_rows(params)) if not greedy]
    if not sampled:
        return tokens
    index = torch.tensor(sampled, device=logits.device)  # [S]
    candidate_ids, candidate_logprobs = processed_logprobs(logits[index], params[sampled], global_top_k)  # [S, K]
    tokens[index] = draw(candidate_ids, candidate_logprobs.exp(), [generators[i] for i in sampled])
    return tokens


__all__ = ["draw", "greedy_rows", "processed_logprobs", "sample", "target_probs"]
