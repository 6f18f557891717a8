"""Draft-model proposals: the draft model's own slot KV cache, its proposals and their distributions q.

Bookkeeping: per slot, the token history (prompt + every emitted token) and how many leading positions of the
draft's KV line are valid. A proposal first feeds the draft whatever it has not seen (usually just the newest
token; after a fully accepted step, also the last draft token, which the draft proposed but never fed), then
proposes autoregressively. Rejected proposals need no cleanup: `valid` only counts positions that match the
history, and every position is rewritten before it is read again.
"""

from __future__ import annotations

from typing import Protocol, Sequence

import torch

from neuronmodel_runtime.sampling.sampler import greedy_rows, sample, target_probs
from neuronmodel_runtime.spec_decode.proposal import Proposal


class SlotModel(Protocol):
    """A model over slot KV lines (the reference runner's `LlamaModel`)."""

    device: torch.device
    dtype: torch.dtype
    vocab_size: int

    def last_logits(self, tokens: torch.Tensor, slots: Sequence[int], start_pos: Sequence[int]) -> torch.Tensor:
        """Feed `[B, T]` tokens at `start_pos` of each slot's line; `[B, V]` logits at the last position."""
        ...


class DraftProposer:
    """Proposes k_i tokens per row with the draft model, each drawn with the row's own sampling settings."""

    def __init__(self, model: SlotModel, global_top_k: int):
        self.model = model
        self.global_top_k = global_top_k
        self.history: dict[int, list[int]] = {}  # slot -> prompt + emitted tokens
        self.valid: dict[int, int] = {}  # slot -> leading positions of the draft KV line that match history
        self._fed: dict[int, int] = {}  # slot -> drafts of the current step fed to the draft model

    def start(self, slot: int, prompt_ids: Sequence[int], first_token: int) -> None:
        """A slot was prefilled by the target: the draft catches up lazily at the first proposal."""
        self.history[slot] = [*prompt_ids, first_token]
        self.valid[slot] = 0

    def release(self, slot: int) -> None:
        self.history.pop(slot, None)
        self.valid.pop(slot, None)
        self._fed.pop(slot, None)

    def accept(self, slot: int, emitted: Sequence[int]) -> None:
        """After a step: extend the history; the accepted drafts fed to the draft are valid in its KV line."""
        accepted = len(emitted) - 1
        self.history[slot].extend(emitted)
        self.valid[slot] += min(accepted, self._fed.pop(slot, 0))

    @torch.inference_mode()
    def propose(self, slots: Sequence[int], histories: Sequence[Sequence[int]], num_spec: Sequence[int],
                params: torch.Tensor, generators: Sequence[torch.Generator]) -> Proposal:
        """k_i >= 1 draft tokens per row and the draft distributions q they were drawn from.

        Args:
            slots: B slots, each with a history whose last token is the newest (not yet in any KV cache).
            histories: unused (the proposer keeps its own, told by start/accept).
            num_spec: per row, k_i >= 1 drafts to propose.
            params: `[B, 3]` sampling tensor; the draft uses the row's own processing, as the verifier does.
            generators: per row, on the draft model's device.

        Returns:
            A Proposal with `probs` `[B, k, V]`: q at each proposed position, zero for greedy rows (their
            verification compares argmaxes); None when every row is greedy.
        """
        width, vocab = max(num_spec), self.model.vocab_size
        device = generators[0].device  # where this runner samples (the host, with sampling.on_device false)
        draft_tokens = torch.zeros(len(slots), width, dtype=torch.int64)  # [B, k]
        sampled = set(i for i, greedy in enumerate(greedy_rows(params)) if not greedy)
        draft_probs = torch.zeros(len(slots), width, vocab, dtype=torch.float32, device=device) if sampled else None
        logits = self._catch_up(slots).to(device)  # [B, V] at each row's newest token
        rows = list(range(len(slots)))
        for j in range(width):
            rows = [i for i in rows if num_spec[i] > j]
            index = torch.tensor(rows, device=device)
            draft_tokens[rows, j] = sample(logits[index], params[rows], [generators[i] for i in rows],
                                           self.global_top_k).cpu()
            q_rows = [i for i in rows if i in sampled]  # greedy rows are verified by argmax and need no q
            if draft_probs is not None and q_rows:
                q_index = torch.tensor(q_rows, device=device)
                draft_probs[q_index, j] = target_probs(logits[q_index], params[q_rows], self.global_top_k)
            feed = [i for i in rows if num_spec[i] > j + 1]  # the last draft of a row is never fed
            if not feed:
                break
            start = [len(self.history[slots[i]]) + j for i in feed]
            logits[torch.tensor(feed, device=device)] = self.model.last_logits(
                draft_tokens[feed, j : j + 1], [slots[i] for i in feed], start
            ).to(device)
        for slot, k in zip(slots, num_spec):
            self._fed[slot] = max(k - 1, 0)
        return Proposal([draft_tokens[i, :k].tolist() for i, k in enumerate(num_spec)], draft_probs)

    def _catch_up(self, slots: Sequence[int]) -> torch.Tensor:
        """Feed each row the history it has not seen; returns `[B, V]` logits at the newest token."""
        pending = [self.history[s][self.valid[s] :] for s in slots]
        logits = torch.empty(len(slots), self.model.vocab_size, dtype=self.model.dtype,
                             device=self.model.device)  # [B, V]
        by_length: dict[int, list[int]] = {}
        for i, tokens in enumerate(pending):
            by_length.setdefault(len(tokens), []).append(i)
        for length, rows in by_length.items():  # usually one or two groups: 1 token, or 2 after full acceptance
            tokens = torch.tensor([pending[i] for i in rows], dtype=torch.int64)  # [G, length]
            logits[torch.tensor(rows, device=self.model.device)] = self.model.last_logits(
                tokens, [slots[i] for i in rows], [self.valid[slots[i]] for i in rows]
            )
        for s in slots:
            self.valid[s] = len(self.history[s])
        return logits


__all__ = ["DraftProposer", "SlotModel"]
