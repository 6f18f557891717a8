"""Mirrors src/transformers_neuronx/fused_speculation.py (0.13.x, 1ade6d7): FusedSpeculativeDecoder for continuous
batching, with the speculator's math of `_fused_hlo_with_standalone_draft` and hlo.py's
speculative_adjust_distribution / speculative_mask / speculative_token_selection.

- the constructor asserts: both models with on_device_embedding and on_device_generation, the same vocabulary and
  tp_degree, an int k, right padding for batch sizes > 1;
- `speculative_iteration(input_ids, cache_ids, start_ids)`: if any row's min(cache_ids) == 0, context encoding of
  the target and the draft, returning (target token [B, 1], [[1]] * B); otherwise one fused step over the compiled
  batch: rows are placed on their lines by start_ids and the other lines get zeros (`preprocess_input`: token 0 at
  cache id 0, which the step writes into their KV caches, draft and target, positions 0..k); the draft runs k + 1
  times from each line's token (k proposals; the last run only fills its cache), the target scores the k + 1 fed
  tokens at cache_ids .. cache_ids + k; proposal i is accepted while uniform < p_target/p_draft (the filtered,
  on-device distributions of each model's generation config), the first rejection (or the bonus position k) is
  sampled from the adjusted distribution norm(max(0, p - q)) (p at position k). Output tokens [B, k + 1] with
  counts [B, 1] in 1..k + 1; positions past a row's count hold pad_token_id, and
  `speculative_iteration_post_process` first replaces EVERY token equal to pad_token_id, generated ones included,
  by tokens[0, 0]. Rows come back in start_ids order (`postprocess_output`).
"""

from typing import Dict, List, Optional

import torch

from transformers_neuronx import base
from transformers_neuronx.layers.generation import multinomial, uniform


def _prob_of(candidates, token: int) -> float:
    probs, ids = candidates
    return float(probs[ids == token].sum())


class FusedSpeculativeBase(torch.nn.Module):

    def speculative_iteration_post_process(self, output_tokens, output_counts):
        non_pad_value = output_tokens[0, 0]
        output_tokens[output_tokens == self.pad_token_id] = non_pad_value
        result_tokens = torch.full_like(output_tokens, fill_value=self.pad_token_id)
        for i in range(output_tokens.size(0)):
            result_tokens[i, : output_counts[i].item()] = output_tokens[i, : output_counts[i].item()]
        return result_tokens, output_counts

    def _check_models(self, draft, target) -> None:
        assert draft.neuron_config.on_device_embedding == True, (  # noqa: E712 (the real assertion)
            "The draft model must enable on-device embedding.")
        assert draft.neuron_config.on_device_generation is not None, (
            "The draft model must enable on-device sampling.")
        assert target.neuron_config.on_device_embedding == True, (  # noqa: E712
            "The target model must enable on-device embedding.")
        assert target.neuron_config.on_device_generation is not None, (
            "The target model must enable on-device sampling.")
        assert target.config.vocab_size == draft.config.vocab_size, (
            "The target model and draft model must have the same vocab size.")
        assert target.decoder_lm_head.tp_degree == draft.decoder_lm_head.tp_degree, (
            "The target model and draft model must have the same tp degree.")

    def _init_common(self, draft, target, pad_token_id, eos_token_id, buckets, output_scores, debug,
                     simulation_acceptance_length) -> None:
        """The attributes both constructors set the same way, after their own checks."""
        if simulation_acceptance_length is not None:
            raise NotImplementedError("the contract fake does not simulate acceptance lengths")
        self.draft, self.target = draft, target
        self.pad_token_id, self.eos_token_id = pad_token_id, eos_token_id
        self.output_scores, self.debug, self.sampler = output_scores, debug, None
        self.neuron_config = self.target.neuron_config
        self.tp_degree = self.target.decoder_lm_head.tp_degree
        self.buckets = buckets if buckets is not None else self.target.decoder_lm_head.n_positions_list
        self.batch_sizes = self.target.batch_sizes
        self.max_position = self.buckets[-1]
        self.vocab_size = self.target.config.vocab_size
        self.speculator = None
        self.hidden: Dict[int, torch.Tensor] = {}

    def to_neuron(self, workers=None):
        for model in (self.draft, self.target):
            if model.decoder_lm_head.program is None:  # valid_parameters of a model that has no weights on device
                raise AttributeError("'NoneType' object has no attribute 'valid_parameters': to_neuron() the draft "
                                     "and the target first")
        base.COMPILE_LOG.append(type(self).__name__)
        self.speculator = True

    def _start_iteration(self, input_ids: torch.Tensor, cache_ids: Optional[torch.Tensor]):
        """speculative_iteration's first lines in both decoders: (batch_size, cache_ids, whether any row's
        min(cache_ids) == 0, i.e. a new request in continuous batching: context encoding)."""
        if self.speculator is None:
            raise AttributeError("'NoneType' object has no attribute 'execute': call to_neuron() first")
        batch_size, context_len = input_ids.shape
        if cache_ids is None:
            cache_ids = torch.arange(context_len).unsqueeze(0).expand(batch_size, context_len)
        min_values_per_row, _ = torch.min(cache_ids, dim=-1)
        return batch_size, cache_ids, bool((min_values_per_row == 0).any())


class FusedSpeculativeDecoder(FusedSpeculativeBase):

    def __init__(self, draft, target, k: int = 2, pad_token_id: int = 0, eos_token_id: Optional[int] = None,
                 buckets: Optional[List[int]] = None, output_scores: Optional[bool] = False,
                 deterministic_threshold: Optional[float] = None, debug: Optional[bool] = False,
                 simulation_acceptance_length: Optional[float] = None) -> None:
        super().__init__()
        self._check_models(draft, target)
        assert isinstance(k, int), "The k value must be an integer."
        if draft.batch_sizes != [1]:
            assert draft.neuron_config.padding_side == "right", (
                "The draft model must set padding_side as right for batch size > 1.")
        if target.batch_sizes != [1]:
            assert target.neuron_config.padding_side == "right", (
                "The target model must set padding_side as right for batch size > 1.")
        self._init_common(draft, target, pad_token_id, eos_token_id, buckets, output_scores, debug,
                          simulation_acceptance_length)
        self.k = k
        self.deterministic_threshold = deterministic_threshold
        self.is_eagle = self.draft.neuron_config.is_eagle_draft and self.target.neuron_config.is_eagle_target
        if self.is_eagle:
            raise NotImplementedError("the contract fake computes EAGLE with EagleSpeculativeDecoder only")

    def update_generation_config(self, generation_config):
        if self.draft.neuron_config.on_device_generation.dynamic:
            self.draft.update_generation_config(generation_config)
        self.target.update_generation_config(generation_config)

    def speculative_iteration(self, input_ids: torch.Tensor, cache_ids: torch.Tensor, start_ids: torch.Tensor):
        batch_size, cache_ids, context_encoding = self._start_iteration(input_ids, cache_ids)
        if context_encoding:
            target_next_id = self.target(input_ids, cache_ids, start_ids).reshape(batch_size, -1)
            self.draft(input_ids, cache_ids, start_ids)
            return target_next_id, torch.tensor([[1]] * batch_size)
        seq_ids = start_ids.flatten().to(torch.long)
        graph_batch_size = self.batch_sizes[0]
        full_input_ids, cache_ids_pad = [self.preprocess_input(t, seq_ids, graph_batch_size)
                                         for t in (input_ids, cache_ids)]
        tokens, counts = self._execute(full_input_ids[:, 0].to(torch.int64), cache_ids_pad[:, 0].to(torch.int64))
        output_tokens, output_counts = [self.postprocess_output(t, seq_ids) for t in (tokens, counts)]
        return self.speculative_iteration_post_process(output_tokens, output_counts)

    def preprocess_input(self, tensor: torch.Tensor, seq_ids: torch.Tensor, target_batch_size: int):
        output_tensor = torch.zeros((target_batch_size,) + tuple(tensor.shape[1:]), dtype=tensor.dtype)
        output_tensor[seq_ids] = tensor
        return output_tensor

    def postprocess_output(self, tensor: torch.Tensor, seq_ids: torch.LongTensor):
        return tensor[seq_ids]

    def _execute(self, tokens: torch.Tensor, cache: torch.Tensor):
        """The fused graph over every line: (tokens [G, k + 1] int32, counts [G, 1] int32)."""
        k, draft, target = self.k, self.draft, self.target
        lines = list(range(tokens.shape[0]))
        current, fed, draft_candidates = tokens, [tokens], []
        for i in range(k):
            logits = draft._device.forward(current[:, None], lines, (cache + i).tolist())[:, -1]
            candidates = draft._generation.candidates(logits, lines)
            current = torch.tensor([int(ids[multinomial(p, draft._generation.config.deterministic)])
                                    for p, ids in candidates])
            draft_candidates.append(candidates)
            fed.append(current)
        draft._device.forward(current[:, None], lines, (cache + k).tolist())  # the k+1-th draft run
        fed_t = torch.stack(fed, dim=1)  # [G, k + 1]
        target_logits = target._device.forward(fed_t, lines, cache.tolist())  # [G, k + 1, V]
        target_candidates = [target._generation.candidates(target_logits[:, j], lines) for j in range(k + 1)]
        deterministic = target._generation.config.deterministic
        out = torch.full((len(lines), k + 1), self.pad_token_id, dtype=torch.int32)
        counts = torch.zeros(len(lines), 1, dtype=torch.int32)
        for g in lines:
            if self.deterministic_threshold:
                draws = torch.full((k,), float(self.deterministic_threshold))
            else:
                draws = uniform(k)
            accepted = 0
            for j in range(k):
                token = int(fed_t[g, j + 1])
                p, q = _prob_of(target_candidates[j][g], token), _prob_of(draft_candidates[j][g], token)
                ratio = min(p / q, 1.0) if q > 0 else 1.0
                if not draws[j] < ratio:
                    break
                accepted += 1
            targets = []
            for j in range(k + 1):
                probs, ids = target_candidates[j][g]
                if j < k:  # speculative_adjust_distribution over the target's candidates
                    q_probs, q_ids = draft_candidates[j][g]
                    q_on_target = (ids[:, None] == q_ids[None, :]).float() @ q_probs  # select_from
                    adjusted = (probs - q_on_target).clamp(min=0.0)
                    probs = adjusted / adjusted.sum() if float(adjusted.sum()) > 0 else probs
                targets.append(int(ids[multinomial(probs, deterministic)]))
            row = [int(fed_t[g, j + 1]) if j < accepted else targets[j] for j in range(accepted + 1)]
            out[g, : accepted + 1] = torch.tensor(row, dtype=torch.int32)
            counts[g, 0] = accepted + 1
        return out, counts
