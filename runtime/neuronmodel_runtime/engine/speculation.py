"""Speculative decode steps, composed from `spec_decode`'s pieces around what the runner declares.

Two ways a runner speculates (`RunnerCapabilities`), one engine path:

- scored (the reference runner): propose on the host (prompt lookup, or the runner's draft model through
  `DraftProposer`) -> `runner.score()` the k+1 positions -> `spec_decode.verify` on the runner's per-slot
  generators -> NxDI's fused shape (tokens padded, next positions) -> per-row tokens;
- fused (NxDI): `runner.decode()` with `num_spec_tokens` proposes and verifies on the device and returns the
  per-row tokens it unpadded from the same fused shape.

Rows that do not speculate this step (logprobs, logits processors, no proposal, the last k positions of a
fixed-k runner's KV line) decode in a plain `runner.decode()` of their own, so the tokens a row gets never depend
on whether another row speculates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from neuronmodel_runtime.config import ConfigError, SpeculationConfig
from neuronmodel_runtime.runners.base import DecodeBatch, ModelRunner, RunnerCapabilities, ScoreBatch, StepOutput
from neuronmodel_runtime.sampling.tensors import sampling_tensor
from neuronmodel_runtime.spec_decode.draft import DraftProposer
from neuronmodel_runtime.spec_decode.ngram import NgramProposer
from neuronmodel_runtime.spec_decode.proposal import Proposer
from neuronmodel_runtime.spec_decode.verify import unpad_fused, verify


@dataclass
class Speculation:
    """How this process speculates: k, and a proposer (scored) or none (fused on the device)."""

    k: int  # num_speculative_tokens: drafts per step at most
    proposer: Optional[Proposer]  # scored speculation; None = the runner's fused speculation
    per_row_length: bool  # False: a row speculates exactly k tokens or none (compiled for one k)


def build_speculation(config: SpeculationConfig, runner: ModelRunner) -> Optional[Speculation]:
    """The speculation the config asks for, as the loaded runner can serve it, or None for mode "none".

    Raises:
        ConfigError: the runner cannot serve that mode (named, with the fix).
    """
    if config.mode == "none":
        return None
    caps: RunnerCapabilities = runner.capabilities()
    name = caps.sampling.runner
    if config.mode in caps.fused_speculation:
        return Speculation(config.num_speculative_tokens, None, caps.per_row_speculation_length)
    if config.mode == "promptLookup" and caps.host_drafts:
        proposer: Proposer = NgramProposer(config.prompt_lookup_min, config.prompt_lookup_max)
    elif config.mode == "draft" and caps.host_drafts:
        proposer = DraftProposer(runner.draft_model(), caps.sampling.max_top_k)
    else:
        served = sorted({*caps.fused_speculation, *(("draft", "promptLookup") if caps.host_drafts else ())})
        raise ConfigError(
            f"speculation.mode: the {name} runner cannot speculate with {config.mode!r} "
            f"(it serves: {', '.join(served) or 'none'}); change speculation.mode or framework"
        )
    return Speculation(config.num_speculative_tokens, proposer, caps.per_row_speculation_length)


def speculative_decode(runner: ModelRunner, spec: Speculation, batch: DecodeBatch, budgets: Sequence[int],
                       histories: Sequence[Sequence[int]], global_top_k: int) -> StepOutput:
    """One decode step in which rows with a budget > 0 may speculate; rows in batch order.

    Args:
        batch: the plain decode batch of every row (no num_spec_tokens).
        budgets: per row, most drafts worth proposing (0 = this row does not speculate).
        histories: per row, prompt + output tokens (the last one is batch.last_tokens[i]).
    """
    rows = range(len(batch.slots))
    if spec.proposer is None and spec.per_row_length:  # fused, any k per row: one runner call does it all
        return runner.decode(_subset(batch, rows, budgets))
    spec_rows, emitted, drafted = _speculate(runner, spec, batch, budgets, histories, global_top_k)
    plain_rows = [i for i in rows if i not in set(spec_rows)]
    plain = runner.decode(_subset(batch, plain_rows)) if plain_rows else StepOutput([])
    return _merge(len(rows), plain_rows, plain, spec_rows, emitted, drafted)


def _speculate(runner: ModelRunner, spec: Speculation, batch: DecodeBatch, budgets: Sequence[int],
               histories: Sequence[Sequence[int]], global_top_k: int
               ) -> tuple[list[int], list[list[int]], list[int]]:
    """The rows that speculate, their emitted tokens (1..k_i+1 each) and their draft counts."""
    wanting = [i for i in range(len(batch.slots)) if budgets[i] > 0]
    if spec.proposer is None:  # fused, compiled for one k: every speculating row proposes exactly k
        out = runner.decode(_subset(batch, wanting, [spec.k] * len(wanting))) if wanting else StepOutput([])
        return wanting, out.token_ids, [spec.k] * len(wanting)
    if not wanting:
        return [], [], []
    params = sampling_tensor([batch.sampling[i] for i in wanting], global_top_k)  # [W, 3]
    generators = runner.slot_generators([batch.slots[i] for i in wanting])
    drafts, probs = _propose(spec.proposer, batch, wanting, budgets, histories, params, generators)
    keep = [j for j, i in enumerate(wanting) if drafts[i]]  # prompt lookup may find nothing to propose
    if not keep:
        return [], [], []
    spec_rows = [wanting[j] for j in keep]
    emitted = _verify(runner, batch, spec_rows, drafts, probs, params[keep], [generators[j] for j in keep],
                      global_top_k)
    return spec_rows, emitted, [len(drafts[i]) for i in spec_rows]


def _merge(size: int, plain_rows: list[int], plain: StepOutput, spec_rows: list[int], emitted: list[list[int]],
           drafted: list[int]) -> StepOutput:
    """One StepOutput in batch order from the plain and the speculative runner calls."""
    token_ids: list[list[int]] = [[] for _ in range(size)]
    num_drafts = [0] * size
    logprobs: Optional[list] = None if plain.logprobs is None else [None] * size
    for j, i in enumerate(plain_rows):
        token_ids[i] = plain.token_ids[j]
        if logprobs is not None:
            logprobs[i] = plain.logprobs[j]
    for j, i in enumerate(spec_rows):
        token_ids[i], num_drafts[i] = emitted[j], drafted[j]
    return StepOutput(token_ids=token_ids, logprobs=logprobs, num_draft_tokens=num_drafts)


def _subset(batch: DecodeBatch, rows: Sequence[int], num_spec: Sequence[int] = ()) -> DecodeBatch:
    return DecodeBatch(
        slots=[batch.slots[i] for i in rows],
        last_tokens=[batch.last_tokens[i] for i in rows],
        positions=[batch.positions[i] for i in rows],
        sampling=[batch.sampling[i] for i in rows],
        num_spec_tokens=list(num_spec),
        num_logprobs=[batch.num_logprobs[i] for i in rows] if batch.num_logprobs else [],
    )


def _propose(proposer: Proposer, batch: DecodeBatch, rows: list[int], budgets: Sequence[int],
             histories: Sequence[Sequence[int]], params: torch.Tensor, generators: list[torch.Generator]
             ) -> tuple[dict[int, list[int]], Optional[dict[int, torch.Tensor]]]:
    """Row -> its proposed tokens (maybe none), and row -> their draft distributions `[k, V]` (None: deterministic).
    `params` and `generators` are those of `rows`, in order."""
    slots = [batch.slots[i] for i in rows]
    proposal = proposer.propose(slots, [histories[i] for i in rows], [budgets[i] for i in rows], params, generators)
    probs = None if proposal.probs is None else dict(zip(rows, proposal.probs))
    return dict(zip(rows, proposal.tokens)), probs


def _verify(runner: ModelRunner, batch: DecodeBatch, rows: list[int], drafts: dict[int, list[int]],
            probs: Optional[dict[int, torch.Tensor]], params: torch.Tensor, generators: list[torch.Generator],
            global_top_k: int) -> list[list[int]]:
    """Score the proposed rows and verify them exactly; per-row emitted tokens (1..k_i+1 each). `params` and
    `generators` are those of `rows`, in order."""
    slots = [batch.slots[i] for i in rows]
    positions = [batch.positions[i] for i in rows]
    proposed = [drafts[i] for i in rows]
    logits = runner.score(ScoreBatch(slots, [batch.last_tokens[i] for i in rows], positions, proposed))
    width = max(len(d) for d in proposed)
    draft_tokens = torch.zeros(len(rows), width, dtype=torch.int64)  # [S, k], zero-padded
    for j, d in enumerate(proposed):
        draft_tokens[j, : len(d)] = torch.tensor(d, dtype=torch.int64)
    q = None if probs is None else torch.stack([probs[i][:width] for i in rows]).to(logits.device)  # [S, k, V]
    tokens, emitted = verify(logits, draft_tokens, [len(d) for d in proposed], params, generators, global_top_k, q)
    next_positions = torch.tensor(positions)[:, None] + emitted[:, None]  # [S, 1]: NxDI's fused output
    return unpad_fused(tokens, positions, next_positions)


__all__ = ["Speculation", "build_speculation", "speculative_decode"]
