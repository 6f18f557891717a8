"""The draft model of draft-model speculation: its own slot KV cache, proposals and their distributions.

Bookkeeping: per slot, the runner's token history (prompt + every emitted token) and how many leading positions
of the draft's KV line are valid. A proposal first feeds the draft whatever it has not seen (usually just the
newest token; after a fully accepted step, also the last draft token, which the draft proposed but never fed),
then proposes autoregressively. Rejected proposals need no cleanup: `valid` only counts positions that match the
history, and every position is rewritten before it is read again.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional, Sequence

import torch

from neuronmodel_runtime.runners.llama import LlamaModel
from neuronmodel_runtime.sampling.sampler import sample, target_probs
from neuronmodel_runtime.sampling.tensors import TOP_K


def vocabulary_mismatch(target_dir: Path, draft_dir: Path, target_vocab: int, draft_vocab: int) -> Optional[str]:
    """Why a draft cannot serve this target (a different vocabulary), or None when they share it.

    The vocabulary sizes must match; when both folders carry a tokenizer.json, so must their token tables.
    """
    if target_vocab != draft_vocab:
        return f"its vocabulary has {draft_vocab} tokens, the target's {target_vocab}; use a draft of the same family"

    def vocab(folder: Path) -> Optional[dict]:
        path = folder / "tokenizer.json"
        return json.loads(path.read_text()).get("model", {}).get("vocab") if path.is_file() else None

    target, draft = vocab(target_dir), vocab(draft_dir)
    if target is not None and draft is not None and target != draft:
        return "its tokenizer maps tokens to different ids than the target's; draft and target must share a tokenizer"
    return None


class DraftModel:
    """Proposes k tokens per row with the draft model; see the module docstring for the KV bookkeeping."""

    def __init__(self, model: LlamaModel, global_top_k: int):
        self.model = model
        self.global_top_k = global_top_k
        self.history: dict[int, list[int]] = {}  # slot -> prompt + emitted tokens
        self.valid: dict[int, int] = {}  # slot -> leading positions of the draft KV line that match history

    def start(self, slot: int, prompt: Sequence[int], first_token: int) -> None:
        """A slot was prefilled by the target: the draft catches up lazily at the first proposal."""
        self.history[slot] = [*prompt, first_token]
        self.valid[slot] = 0

    def release(self, slot: int) -> None:
        self.history.pop(slot, None)
        self.valid.pop(slot, None)

    def accept(self, slot: int, emitted: Sequence[int], drafts_fed: int) -> None:
        """After a step: extend the history; the draft was fed the step's first `drafts_fed` drafts (0 if unused)."""
        accepted = len(emitted) - 1
        self.history[slot].extend(emitted)
        # The accepted drafts the draft was fed are in its KV line and match the history; nothing else changed.
        self.valid[slot] += min(accepted, drafts_fed)

    @torch.inference_mode()
    def propose(
        self,
        slots: Sequence[int],
        num_spec: Sequence[int],
        params: torch.Tensor,
        generators: Sequence[torch.Generator],
    ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """k_i draft tokens per row and the draft distributions q they were drawn from.

        Args:
            slots: B slots, each with a history whose last token is the newest (not yet in any KV cache).
            num_spec: per row, k_i >= 1 drafts to propose.
            params: `[B, 3]` sampling tensor; the draft uses the row's own processing, as the verifier does.
            generators: per row.

        Returns:
            draft_tokens: `[B, k]` int64 (k = max k_i), zero-padded.
            draft_probs: `[B, k, V]` float32, q at each proposed position, zero-padded and zero for greedy rows
                (their verification compares argmaxes); None when every row is greedy.
        """
        width, vocab = max(num_spec), self.model.config.vocab_size
        draft_tokens = torch.zeros(len(slots), width, dtype=torch.int64)
        sampled = set(i for i, top_k in enumerate(params[:, TOP_K].tolist()) if top_k != 1)
        draft_probs = None
        if sampled:
            draft_probs = torch.zeros(len(slots), width, vocab, dtype=torch.float32, device=self.model.device)
        logits = self._catch_up(slots)  # [B, V] at each row's newest token
        rows = list(range(len(slots)))
        for j in range(width):
            rows = [i for i in rows if num_spec[i] > j]
            index = torch.tensor(rows, device=self.model.device)
            row_params = params[rows]
            draft_tokens[rows, j] = sample(logits[index], row_params, [generators[i] for i in rows],
                                           self.global_top_k).cpu()
            q_rows = [i for i in rows if i in sampled]  # greedy rows are verified by argmax and need no q
            if draft_probs is not None and q_rows:
                q_index = torch.tensor(q_rows, device=self.model.device)
                draft_probs[q_index, j] = target_probs(logits[q_index], params[q_rows], self.global_top_k)
            feed = [i for i in rows if num_spec[i] > j + 1]  # the last draft of a row is never fed
            if not feed:
                break
            start = [len(self.history[slots[i]]) + j for i in feed]
            hidden = self.model.hidden_states(draft_tokens[feed, j : j + 1], [slots[i] for i in feed], start)
            logits[torch.tensor(feed, device=self.model.device)] = self.model.logits(hidden[:, -1])
        return draft_tokens, draft_probs

    def _catch_up(self, slots: Sequence[int]) -> torch.Tensor:
        """Feed each row the history it has not seen; returns `[B, V]` logits at the newest token."""
        pending = [self.history[s][self.valid[s] :] for s in slots]
        logits = torch.empty(len(slots), self.model.config.vocab_size, dtype=self.model.dtype,
                             device=self.model.device)  # [B, V]
        by_length: dict[int, list[int]] = {}
        for i, tokens in enumerate(pending):
            by_length.setdefault(len(tokens), []).append(i)
        for length, rows in by_length.items():  # usually one or two groups: 1 token, or 2 after full acceptance
            tokens = torch.tensor([pending[i] for i in rows], dtype=torch.int64)  # [G, length]
            hidden = self.model.hidden_states(tokens, [slots[i] for i in rows], [self.valid[slots[i]] for i in rows])
            logits[torch.tensor(rows, device=self.model.device)] = self.model.logits(hidden[:, -1])
        for s in slots:
            self.valid[s] = len(self.history[s])
        return logits
