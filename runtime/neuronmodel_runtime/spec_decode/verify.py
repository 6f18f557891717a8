"""Exact verification of proposed tokens (Leviathan et al. 2023; Chen et al. 2023), row by row.

Glossary:
    draft tokens: the k_i tokens proposed for row i (by a draft model, or by prompt lookup).
    p, q: the target's and the proposer's distributions at each draft position, after the row's own
        temperature / top-k / top-p (`sampler.target_probs`, applied identically to both). Prompt lookup
        proposes deterministically, so its q is one-hot at the proposed token.
    accepted: draft token x_j is kept with probability min(1, p(x_j) / q(x_j)), in order, until the first
        rejection. Greedy rows have one-hot p and q, so this is exactly "keep while equal to the target argmax".
    recovered: the token emitted at the first rejection, drawn from normalize(max(p - q, 0)).
    bonus: when all k_i drafts are accepted, one more token drawn from p at position k_i.
Recovered and bonus tokens are drawn with `sampler.draw`, the one sampling primitive, over the target's candidates.
Each step emits the accepted tokens plus one recovered or bonus token: 1..k_i+1 tokens, and the emitted
sequence has exactly the target's distribution.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from neuronmodel_runtime.sampling.sampler import draw, greedy_rows, processed_logprobs


def verify(
    target_logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    num_drafts: Sequence[int],
    params: torch.Tensor,
    generators: Sequence[torch.Generator],
    global_top_k: int,
    draft_probs: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Accept or reject each row's draft tokens against the target.

    p lives in the target's candidate space (the K tokens `sample` chooses among): p is zero outside it, so
    the recovered distribution normalize((p - q)+) is too, and the recovered and bonus tokens are drawn with
    `sampler.draw`, exactly as `sample` draws a plain decode's token.

    Args:
        target_logits: `[B, k+1, V]` target logits at the fed positions (last token, then the k drafts).
        draft_tokens: `[B, k]` int64 proposals; row i uses its first `num_drafts[i]`.
        num_drafts: per row, k_i in 0..k.
        params: `[B, 3]` sampling tensor (top_k, top_p, temperature).
        generators: one per row, on the logits' device; row i draws only from `generators[i]`.
        global_top_k: candidates kept before the per-row filters.
        draft_probs: `[B, k, V]` the proposer's q; None means deterministic proposals (q one-hot).

    Returns:
        tokens: `[B, k+1]` int64, row i's emitted tokens first, padded with 0 (0 may also be a real token).
        num_emitted: `[B]` int64, tokens emitted per row: accepted + 1, in 1..k_i+1.
    """
    batch, width, vocab = target_logits.shape
    tokens = torch.zeros(batch, width, dtype=torch.int64)
    num_emitted = torch.zeros(batch, dtype=torch.int64)
    greedy = greedy_rows(params)
    by_argmax = [i for i in range(batch) if greedy[i]]
    if by_argmax:
        _verify_greedy(target_logits[by_argmax], draft_tokens[by_argmax], [num_drafts[i] for i in by_argmax],
                       tokens, num_emitted, by_argmax)
    sampled = [i for i in range(batch) if not greedy[i]]
    if not sampled:
        return tokens, num_emitted
    device = target_logits.device
    rows = torch.tensor(sampled, device=device)
    flat_params = params[sampled].repeat_interleave(width, dim=0)  # [S*(k+1), 3]
    ids, logp = processed_logprobs(target_logits[rows].reshape(len(sampled) * width, vocab), flat_params,
                                   global_top_k)
    ids, p_all = ids.view(len(sampled), width, -1), logp.exp().view(len(sampled), width, -1)  # [S, k+1, K]
    for r, i in enumerate(sampled):
        k_i, gen = num_drafts[i], generators[i]
        drafts = draft_tokens[i, :k_i].tolist()
        uniforms = torch.rand(k_i, generator=gen, device=device).tolist() if k_i else []
        emitted: list[int] = []
        for j, x in enumerate(drafts):
            p, cand = p_all[r, j], ids[r, j]  # [K] each
            p_x = float(p[cand == x].sum())  # 0 when x is not a candidate
            q_x = 1.0 if draft_probs is None else float(draft_probs[i, j, x])
            if uniforms[j] * q_x < p_x:  # accept with probability min(1, p(x) / q(x))
                emitted.append(x)
                continue
            q = (cand == x).float() if draft_probs is None else draft_probs[i, j, cand].float()  # [K]
            residual = (p - q).clamp_min(0.0)  # draw() normalises
            emitted.append(int(draw(cand[None], (residual if float(residual.sum()) > 0 else p)[None], [gen])[0]))
            break
        else:
            emitted.append(int(draw(ids[r, k_i][None], p_all[r, k_i][None], [gen])[0]))  # bonus
        tokens[i, : len(emitted)] = torch.tensor(emitted)
        num_emitted[i] = len(emitted)
    return tokens, num_emitted


def _verify_greedy(
    logits: torch.Tensor,
    drafts: torch.Tensor,
    num_drafts: list[int],
    tokens: torch.Tensor,
    num_emitted: torch.Tensor,
    rows: list[int],
) -> None:
    """Greedy rows, vectorized: p and q are one-hot, so accept while a draft equals the target's argmax, then emit
    the argmax at the first mismatch (recovered) or after the last draft (bonus). Writes into tokens/num_emitted.
    """
    width = logits.shape[1]
    best = torch.argmax(logits, dim=-1).cpu()  # [G, k+1]
    limit = torch.tensor(num_drafts)[:, None]  # [G, 1]
    positions = torch.arange(width - 1)[None]  # [1, k]
    match = (drafts[:, : width - 1] == best[:, : width - 1]) & (positions < limit)  # [G, k]
    accepted = torch.cumprod(match.to(torch.int64), dim=1).sum(dim=1)  # [G]
    out = torch.where(torch.arange(width)[None] < accepted[:, None], best, 0)  # accepted drafts equal the argmax
    out.scatter_(1, accepted[:, None], best.gather(1, accepted[:, None]))  # recovered or bonus
    index = torch.tensor(rows)
    tokens[index] = out
    num_emitted[index] = accepted + 1


def unpad_fused(tokens: torch.Tensor, positions: Sequence[int], next_positions: torch.Tensor) -> list[list[int]]:
    """NxDI fused-speculation outputs -> per-row token lists.

    The count is `next_pos - pos` (at least 1), never inferred from the 0 padding: 0 is a real token id.

    Args:
        tokens: `[B, W]` emitted tokens padded with 0.
        positions: B positions of each row's last token before the step.
        next_positions: `[B, 1]` (or `[B]`) positions after the step.
    """
    counts = next_positions.reshape(-1).tolist()
    out = []
    for row, pos, nxt in zip(tokens.tolist(), positions, counts):
        count = int(nxt) - int(pos)
        if not 1 <= count <= len(row):
            raise ValueError(f"fused speculation returned {count} tokens for a row (expected 1..{len(row)})")
        out.append(row[:count])
    return out
