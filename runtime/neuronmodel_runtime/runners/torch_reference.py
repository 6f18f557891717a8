"""The PyTorch reference runner: our Llama-family model behind the slot contract, on CPU or a CUDA device.

It is the executable specification of what the Neuron runners do: fixed slots each owning a KV line, the
`[B, 3]` sampling tensor, and sampling inside the runner (token ids out). With `sampling.on_device` false it
copies the full logits to the host (numpy) and samples there with the same processing: the baseline of the
on-device-sampling benchmark, and the only path that would cost the transfer on a real accelerator.

Prefill runs the prompts in groups of similar length, right-padded (one forward per group), and takes the
logits at each row's last real token only. Decode runs every row in one forward, rows sorted by slot so that
consecutive slots read their KV lines as a view instead of a copy.

Speculation (`speculation.mode` draft or promptLookup) is scored: the engine proposes (prompt lookup, or the
draft model this runner loads, `draft_model()`), `score()` runs the target over all k+1 positions in one forward
per distinct k, and the engine verifies on this runner's per-slot generators. Rejected positions need no rollback:
the engine's next position is the source of truth, and every KV position is rewritten before it is read again.

Before sampling, the logits processors (min_tokens mask, logit_bias, penalties) apply to the rows that use them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import torch

from neuronmodel_runtime.config import RuntimeConfig
from neuronmodel_runtime.runners.base import (
    DecodeBatch,
    ModelRunner,
    PrefillBatch,
    RunnerCapabilities,
    RunnerCapacity,
    RunnerError,
    ScoreBatch,
    StepOutput,
    check_slots,
)
from neuronmodel_runtime.runners.checkpoint import build_weights, read_config, read_tensors, resolve_dtype
from neuronmodel_runtime.runners.llama import LlamaModel
from neuronmodel_runtime.runners.slot_sampler import SlotSampler
from neuronmodel_runtime.runners.vocabulary import vocabulary_mismatch
from neuronmodel_runtime.sampling.params import RowSampling, SamplingCapabilities

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
        self.model: Optional[LlamaModel] = None
        self.draft: Optional[LlamaModel] = None  # speculation.mode "draft" only
        spec = config.speculation
        self.speculation_length = spec.num_speculative_tokens if spec.mode in ("draft", "promptLookup") else 0
        # Host sampling draws on the CPU, so its generators live there.
        self.sampler = SlotSampler(config.sampling.global_top_k,
                                   self.device if config.sampling.on_device else torch.device("cpu"))

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
            self.draft = self._load_draft(model_config.vocab_size, dtype)

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

    def capabilities(self) -> RunnerCapabilities:
        on_device = self.config.sampling.on_device
        return RunnerCapabilities(
            sampling=SamplingCapabilities(
                runner=self.framework,
                max_top_k=self.config.sampling.global_top_k,
                top_p_rule="keep",
                seeds=True,
                logprobs=not on_device,  # on the device, only token ids leave the runner (as on Neuron)
                penalties=True,
                logit_bias=True,
                stop_token_masking=True,
                fixes={"logprobs": "start it with sampling.on_device=false to get logprobs"},
            ),
            host_drafts=True,
            per_row_speculation_length=True,
        )

    @torch.inference_mode()
    def prefill(self, batch: PrefillBatch) -> StepOutput:
        model = self._model()
        check_slots(batch.slots, self.config.max_num_seqs)
        lengths = [len(p) for p in batch.prompt_ids]
        if not all(1 <= n <= self.config.max_context_length for n in lengths):
            raise ValueError(f"prompt lengths {lengths} must be in [1, {self.config.max_context_length}]")
        self.sampler.seed(batch.slots, batch.sampling)
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
        return self._sample(logits, batch.slots, batch.sampling, batch.num_logprobs)

    @torch.inference_mode()
    def decode(self, batch: DecodeBatch) -> StepOutput:
        """Exactly one token per row (speculation is scored: see `score`)."""
        check_slots(batch.slots, self.config.max_num_seqs)
        if any(batch.num_spec_tokens):
            raise ValueError("the torch runner speculates through score(), not fused decode")
        model = self._model()
        order = sorted(range(len(batch.slots)), key=lambda i: batch.slots[i])  # by slot: consecutive lines
        tokens = torch.tensor([[batch.last_tokens[i]] for i in order], dtype=torch.int64)  # [B, 1]
        sorted_logits = model.last_logits(tokens, [batch.slots[i] for i in order],
                                          [batch.positions[i] for i in order])  # [B, V], rows in slot order
        logits = torch.empty_like(sorted_logits)  # [B, V], rows in batch order
        logits[torch.tensor(order, device=model.device)] = sorted_logits
        return self._sample(logits, batch.slots, batch.sampling, batch.num_logprobs)

    @torch.inference_mode()
    def score(self, batch: ScoreBatch) -> torch.Tensor:
        """Target logits at the last token and each draft, one forward per distinct k: `[B, k+1, V]`."""
        model = self._model()
        check_slots(batch.slots, self.config.max_num_seqs)
        num_spec = [len(d) for d in batch.draft_tokens]
        if not all(1 <= k <= self.speculation_length for k in num_spec):
            raise ValueError(f"draft lengths {num_spec} must be in [1, {self.speculation_length}]")
        logits = torch.zeros(len(num_spec), max(num_spec) + 1, model.vocab_size, dtype=model.dtype,
                             device=model.device)  # [B, k+1, V]; positions past a row's k_i stay unused
        by_k: dict[int, list[int]] = {}
        for i, k in enumerate(num_spec):
            by_k.setdefault(k, []).append(i)
        for k, rows in by_k.items():
            fed = torch.tensor([[batch.last_tokens[i], *batch.draft_tokens[i]] for i in rows])  # [G, k+1]
            scored = model.forward(fed, [batch.slots[i] for i in rows], [batch.positions[i] for i in rows])
            logits[torch.tensor(rows, device=model.device), : k + 1] = scored  # [G, k+1, V]
        if not self.config.sampling.on_device:
            return logits.float().cpu()  # host sampling: the verifier runs where the generators live
        return logits

    def slot_generators(self, slots: Sequence[int]) -> list[torch.Generator]:
        return self.sampler.generators(slots)

    def draft_model(self) -> LlamaModel:
        if self.draft is None:
            raise RunnerError("no draft model is loaded: set speculation.mode draft and speculation.draft_model")
        return self.draft

    def release(self, slot: int) -> None:
        # NOTE: the KV line needs no reset: a position is always written before it is read (see llama.py).
        self.sampler.release(slot)

    def info(self) -> dict[str, Any]:
        facts: dict[str, Any] = {"framework": self.framework, "torch": torch.__version__, "device": str(self.device)}
        if self.model is not None:
            facts.update(dtype=str(self.model.dtype).removeprefix("torch."), architecture=self.model.config.architecture)
        return facts

    def shutdown(self) -> None:
        self.model = None
        self.sampler.clear()

    def _model(self) -> LlamaModel:
        if self.model is None:
            raise RunnerError("the runner is not loaded: call load() first")
        return self.model

    def _sample(
        self,
        logits: torch.Tensor,
        slots: Sequence[int],
        sampling: list[RowSampling],
        num_logprobs: list[Optional[int]],
    ) -> StepOutput:
        """Sample one token per row (on the device, or on the host from a numpy copy); logprobs when asked.

        Logprobs are of the raw logits (vLLM's default `raw_logprobs`); the token is sampled from the processed ones.
        """
        if not self.config.sampling.on_device:
            logits = torch.from_numpy(np.array(logits.float().cpu().numpy(), copy=True))  # the device->host copy
        return self.sampler.sample(logits, slots, sampling, num_logprobs)


__all__ = ["PREFILL_PADDING_BUDGET", "TorchReferenceRunner", "prefill_groups"]
