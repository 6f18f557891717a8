"""The PyTorch reference runner: our Llama-family model behind the slot contract, on CPU or a CUDA device.

It is the executable specification of what the Neuron runners do: fixed slots each owning a KV line, the
`[B, 3]` sampling tensor, and sampling inside the runner (token ids out). With `sampling.on_device` false it
copies the full logits to the host (numpy) and samples there with the same processing: the baseline of the
on-device-sampling benchmark, and the only path that would cost the transfer on a real accelerator.

Prefill runs the prompts in groups of similar length, right-padded (one forward per group), and takes the
logits at each row's last real token only. Decode runs every row in one forward, rows sorted by slot so that
consecutive slots read their KV lines as a view instead of a copy.

Speculation (`speculation.mode` draft or promptLookup) is fused into `decode`, as NxDI's fused speculation is:
the proposals (the draft model's, or the engine's prompt-lookup tokens) and the target's scoring of all k+1
positions in one forward happen inside one call, and the result travels in NxDI's shape (tokens padded with 0,
next positions) before it becomes per-row token lists. Rejected positions need no rollback: the engine's next
position is the source of truth, and every KV position is rewritten before it is read again.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import torch

from neuronmodel_runtime.config import RuntimeConfig
from neuronmodel_runtime.runners.base import (
    DecodeBatch,
    ModelRunner,
    PrefillBatch,
    RunnerCapacity,
    RunnerError,
    StepOutput,
    TokenLogprob,
)
from neuronmodel_runtime.runners.checkpoint import build_weights, read_config, read_tensors, resolve_dtype
from neuronmodel_runtime.runners.draft import DraftModel, vocabulary_mismatch
from neuronmodel_runtime.runners.llama import LlamaModel
from neuronmodel_runtime.sampling.params import RowSampling
from neuronmodel_runtime.sampling.sampler import sample
from neuronmodel_runtime.sampling.tensors import sampling_tensor, validate_sampling_tensor
from neuronmodel_runtime.spec_decode.verify import unpad_fused, verify

#: A prefill group grows while its padded size stays within this factor of its real tokens. Measured on 2 CPU
#: cores with SmolLM2: one right-padded forward of 8-16 short prompts is 30-40% faster than one forward each.
PREFILL_PADDING_BUDGET = 1.25


def prefill_groups(lengths: Sequence[int], budget: float = PREFILL_PADDING_BUDGET) -> list[list[int]]:
    """Row indices grouped by similar length (shortest first); each group is padded to its longest row."""
    groups: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        group = groups[-1] if groups else []
        real = sum(lengths[j] for j in group) + lengths[i]
        if group and lengths[i] * (len(group) + 1) <= budget * real:
            group.append(i)
        else:
            groups.append([i])
    return groups


class TorchReferenceRunner(ModelRunner):
    """Llama / Mistral / Qwen2 from a Hugging Face folder, served from `config.max_num_seqs` slots."""

    framework = "torch"

    def __init__(self, config: RuntimeConfig, model_path: str):
        self.config = config
        self.model_path = Path(model_path)
        self.device = torch.device(config.device)
        self.global_top_k = config.sampling.global_top_k
        self.model: Optional[LlamaModel] = None
        self.draft: Optional[DraftModel] = None  # speculation.mode "draft" only
        spec = config.speculation
        self.speculation_length = spec.num_speculative_tokens if spec.mode in ("draft", "promptLookup") else 0
        # Per slot: the generator its sequence samples with; seeded at prefill, continued by every decode.
        self._generators: dict[int, torch.Generator] = {}
        # Host sampling draws on the CPU, so its generators live there.
        self._sampling_device = self.device if config.sampling.on_device else torch.device("cpu")

    @torch.inference_mode()
    def load(self) -> None:
        cfg = self.config
        if cfg.parallelism.tensor_parallel_degree != 1 or cfg.parallelism.nodes != 1:
            raise RunnerError("the torch reference runner supports tensor_parallel_degree=1 and nodes=1 only")
        if not self.model_path.is_dir():
            raise RunnerError(f"model folder {self.model_path} does not exist")
        model_config = read_config(self.model_path, cfg.max_model_len)
        if cfg.max_model_len > model_config.max_position_embeddings:
            raise RunnerError(
                f"max_model_len {cfg.max_model_len} exceeds the model's max_position_embeddings "
                f"{model_config.max_position_embeddings}"
            )
        if cfg.speculation.mode == "eagle":
            raise RunnerError(
                "speculation.mode 'eagle' is not supported by the torch reference runner (the NxDI and TNx runners "
                "take it); use 'draft' or 'promptLookup', or framework nxdi"
            )
        dtype = resolve_dtype(cfg.dtype, self.device)
        weights = build_weights(model_config, read_tensors(self.model_path), self.device, dtype)
        self.model = LlamaModel(model_config, weights, cfg.max_num_seqs, cfg.max_model_len)
        if cfg.speculation.mode == "draft":
            self.draft = DraftModel(self._load_draft(model_config.vocab_size, dtype), self.global_top_k)

    def _load_draft(self, vocab_size: int, dtype: torch.dtype) -> LlamaModel:
        cfg = self.config
        path = Path(str(cfg.speculation.draft_model))
        if not (path / "config.json").is_file():
            raise RunnerError(f"speculation.draft_model: no Hugging Face model folder (config.json) at {path}")
        draft_config = read_config(path, cfg.max_model_len)
        mismatch = vocabulary_mismatch(self.model_path, path, vocab_size, draft_config.vocab_size)
        if mismatch:
            raise RunnerError(f"speculation.draft_model cannot serve this model: {mismatch}")
        weights = build_weights(draft_config, read_tensors(path), self.device, dtype)
        return LlamaModel(draft_config, weights, cfg.max_num_seqs, cfg.max_model_len)

    def capacity(self) -> RunnerCapacity:
        return RunnerCapacity(
            max_num_seqs=self.config.max_num_seqs,
            max_context_length=self.config.max_context_length,
            max_model_len=self.config.max_model_len,
            speculation_length=self.speculation_length,
            vocab_size=self._model().config.vocab_size,
        )

    @torch.inference_mode()
    def prefill(self, batch: PrefillBatch) -> StepOutput:
        model = self._model()
        self._check_slots(batch.slots)
        lengths = [len(p) for p in batch.prompt_ids]
        if not all(1 <= n <= self.config.max_context_length for n in lengths):
            raise ValueError(f"prompt lengths {lengths} must be in [1, {self.config.max_context_length}]")
        for slot, row in zip(batch.slots, batch.sampling):
            self._generators[slot] = self._seeded(row.seed)
        logits = torch.empty((len(lengths), model.config.vocab_size), dtype=model.dtype, device=model.device)
        for group in prefill_groups(lengths):
            width = max(lengths[i] for i in group)
            tokens = torch.zeros((len(group), width), dtype=torch.int64)  # [G, T], right-padded with 0
            for row, i in enumerate(group):
                tokens[row, : lengths[i]] = torch.tensor(batch.prompt_ids[i])
            hidden = model.hidden_states(tokens, [batch.slots[i] for i in group], [0] * len(group))  # [G, T, D]
            last = torch.tensor([lengths[i] - 1 for i in group], device=model.device)  # [G]
            logits[torch.tensor(group, device=model.device)] = model.logits(
                hidden[torch.arange(len(group), device=model.device), last]
            )  # [G, V]
        out = self._sample(logits, batch.slots, batch.sampling, batch.num_logprobs)
        if self.draft is not None:
            for slot, prompt, first in zip(batch.slots, batch.prompt_ids, out.token_ids):
                self.draft.start(slot, prompt, first[0])
        return out

    @torch.inference_mode()
    def decode(self, batch: DecodeBatch) -> StepOutput:
        """1..k_i+1 tokens per row with speculation (`num_spec_tokens`), else exactly one."""
        self._check_slots(batch.slots)
        if any(batch.num_spec_tokens):
            out = self._speculate(batch)
        else:
            out = self._decode_one(batch)
        if self.draft is not None:
            for i, slot in enumerate(batch.slots):
                fed = max(batch.num_spec_tokens[i] - 1, 0) if batch.num_spec_tokens else 0
                self.draft.accept(slot, out.token_ids[i], drafts_fed=fed)
        return out

    def _decode_one(self, batch: DecodeBatch) -> StepOutput:
        model = self._model()
        order = sorted(range(len(batch.slots)), key=lambda i: batch.slots[i])  # by slot: consecutive lines
        tokens = torch.tensor([[batch.last_tokens[i]] for i in order], dtype=torch.int64)  # [B, 1]
        hidden = model.hidden_states(tokens, [batch.slots[i] for i in order], [batch.positions[i] for i in order])
        sorted_logits = model.logits(hidden[:, -1])  # [B, V], rows in slot order
        logits = torch.empty_like(sorted_logits)  # [B, V], rows in batch order
        logits[torch.tensor(order, device=model.device)] = sorted_logits
        return self._sample(logits, batch.slots, batch.sampling, batch.num_logprobs)

    def _speculate(self, batch: DecodeBatch) -> StepOutput:
        """Propose, score all k_i+1 positions with the target in one forward per k, verify exactly."""
        model = self._model()
        num_spec = list(batch.num_spec_tokens)
        if max(num_spec) > self.speculation_length:
            raise ValueError(f"num_spec_tokens {num_spec} exceed the speculation length {self.speculation_length}")
        params = self._sampling_tensor(batch.sampling)  # [B, 3]
        generators = self._generators_of(batch.slots)
        width = max(num_spec)
        drafts = torch.zeros(len(num_spec), width, dtype=torch.int64)  # [B, k], zero-padded
        draft_probs: Optional[torch.Tensor] = None  # [B, k, V]; None = deterministic (prompt-lookup) proposals
        if self.draft is not None:
            rows = [i for i, k in enumerate(num_spec) if k]
            proposed, probs = self.draft.propose(
                [batch.slots[i] for i in rows], [num_spec[i] for i in rows], params[rows], [generators[i] for i in rows]
            )
            drafts[rows, : proposed.shape[1]] = proposed
            if probs is not None:  # some row samples: verification needs its q
                draft_probs = torch.zeros(len(num_spec), width, model.config.vocab_size, device=model.device)
                draft_probs[torch.tensor(rows, device=model.device), : probs.shape[1]] = probs
        else:
            for i, proposal in enumerate(batch.draft_tokens):
                if len(proposal) != num_spec[i]:
                    raise ValueError(f"row {i}: {len(proposal)} draft tokens for num_spec_tokens {num_spec[i]}")
                drafts[i, : len(proposal)] = torch.tensor(proposal, dtype=torch.int64)
        logits = torch.zeros(len(num_spec), width + 1, model.config.vocab_size, dtype=model.dtype,
                             device=model.device)  # [B, k+1, V]; positions past a row's k_i stay unused
        by_k: dict[int, list[int]] = {}
        for i, k in enumerate(num_spec):
            by_k.setdefault(k, []).append(i)
        for k, rows in by_k.items():
            fed = torch.cat([torch.tensor([[batch.last_tokens[i]] for i in rows]), drafts[rows, :k]], dim=1)  # [G, k+1]
            scored = model.forward(fed, [batch.slots[i] for i in rows], [batch.positions[i] for i in rows])
            logits[torch.tensor(rows, device=model.device), : k + 1] = scored  # [G, k+1, V]
        tokens, emitted = verify(logits, drafts, num_spec, params, generators, self.global_top_k, draft_probs)
        next_positions = torch.tensor(batch.positions)[:, None] + emitted[:, None]  # [B, 1], NxDI's fused output
        token_ids = unpad_fused(tokens, batch.positions, next_positions)
        wanted = list(batch.num_logprobs) + [None] * (len(num_spec) - len(batch.num_logprobs))
        logprobs = None
        if any(n is not None for n in wanted):  # the engine never speculates for such rows (k_i = 0)
            logprobs = _logprobs(logits[:, 0], [t[0] for t in token_ids], wanted)
        return StepOutput(token_ids=token_ids, logprobs=logprobs, num_draft_tokens=num_spec)

    def release(self, slot: int) -> None:
        # NOTE: the KV line needs no reset: a position is always written before it is read (see llama.py).
        self._generators.pop(slot, None)
        if self.draft is not None:
            self.draft.release(slot)

    def info(self) -> dict[str, Any]:
        facts: dict[str, Any] = {"framework": self.framework, "torch": torch.__version__, "device": str(self.device)}
        if self.model is not None:
            facts.update(dtype=str(self.model.dtype).removeprefix("torch."), architecture=self.model.config.architecture)
        return facts

    def shutdown(self) -> None:
        self.model = None
        self._generators.clear()

    def _model(self) -> LlamaModel:
        if self.model is None:
            raise RunnerError("the runner is not loaded: call load() first")
        return self.model

    def _check_slots(self, slots: Sequence[int]) -> None:
        if len(set(slots)) != len(slots) or not all(0 <= s < self.config.max_num_seqs for s in slots):
            raise ValueError(f"slots {list(slots)} must be distinct and in [0, {self.config.max_num_seqs})")

    def _seeded(self, seed: Optional[int]) -> torch.Generator:
        generator = torch.Generator(device=self._sampling_device)
        generator.manual_seed(seed if seed is not None else int.from_bytes(os.urandom(8), "little") >> 1)
        return generator

    def _sampling_tensor(self, rows: list[RowSampling]) -> torch.Tensor:
        """NxDI's `[B, 3]` tensor, checked against NxDI's rules, as a Neuron runner would hand it over."""
        params = sampling_tensor(rows, self.global_top_k)
        validate_sampling_tensor(params, self.global_top_k)
        return params

    def _generators_of(self, slots: Sequence[int]) -> list[torch.Generator]:
        for slot in slots:
            if slot not in self._generators:  # a decode without a prefill in this runner: a fresh random seed
                self._generators[slot] = self._seeded(None)
        return [self._generators[s] for s in slots]

    def _sample(
        self,
        logits: torch.Tensor,
        slots: Sequence[int],
        sampling: list[RowSampling],
        num_logprobs: list[Optional[int]],
    ) -> StepOutput:
        """Sample one token per row (on the device, or on the host from a numpy copy); logprobs when asked."""
        params = self._sampling_tensor(sampling)  # [B, 3]
        generators = self._generators_of(slots)
        if not self.config.sampling.on_device:
            logits = torch.from_numpy(np.array(logits.float().cpu().numpy(), copy=True))  # the device->host copy
        tokens = sample(logits, params, generators, self.global_top_k).tolist()
        wanted = list(num_logprobs) + [None] * (len(slots) - len(num_logprobs))
        logprobs = _logprobs(logits, tokens, wanted) if any(n is not None for n in wanted) else None
        return StepOutput(token_ids=[[t] for t in tokens], logprobs=logprobs)


def _logprobs(
    logits: torch.Tensor, tokens: list[int], wanted: list[Optional[int]]
) -> list[Optional[list[TokenLogprob]]]:
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


__all__ = ["PREFILL_PADDING_BUDGET", "TorchReferenceRunner", "prefill_groups"]
