"""Mirrors src/transformers_neuronx/eagle_speculation.py (0.13.x, 1ade6d7): EagleSpeculativeDecoder for continuous
batching.

Rules of the real code kept here:
- the constructor asserts on_device_embedding / on_device_generation on both models, 2D cache ids (right padding),
  the same vocabulary and tp_degree, and `token_tree is not None` (0.13 has no flat EAGLE without a tree);
  `validate_token_tree` gives k = the number of tree nodes (the root is the fed token) and depth = its levels, so a
  chain {0: [1], ..., n-1: [n]} proposes n tokens and a step emits 1..n + 1;
- per-sequence state lives in the decoder, keyed by KV line: `hidden` (the target hidden state of the line's last
  accepted token), `cache_gather_indices`, `cache_scatter_indices`; set by context encoding, read (KeyError for a
  line never encoded) and rewritten for every line a step runs;
- `speculative_iteration`: context encoding if any row's min(cache_ids) == 0 (target, then the draft on
  input_ids[:, 1:] at cache_ids[:, :-1] with the target's hidden states; the stored hidden is the one at
  count_nonzero(cache_ids)); otherwise cache_ids - 1, rows padded onto their lines with zeros (`pad`), the step over
  every line, then `handle_padding`: with fewer rows than lines the outputs are gathered by start_ids, but with as
  many rows as lines the outputs are returned in LINE order as they are (so a full batch must come with start_ids
  sorted), and the state of the i-th start_id is set from the i-th output.
- start_ids must be int64 (torch.long), on every call; the fake refuses any other dtype (TypeError) and never
  converts them. The real decoder indexes host tensors with start_ids as given (`pad`: `padded_tensor[seq_ids] =
  tensor`, `handle_padding`, `self.hidden[i.item()]`) beside the graph's own seq ids, `torch.arange` (int64), and
  torch before 2.0 refuses int32 indices; vLLM's neuron runner passes its input_block_ids as torch.long, the inputs
  this decoder is known to run with. (FusedSpeculativeDecoder converts them itself: `.to(torch.long)`.)
- a tree draft proposes the top-`width` tokens of its logits with probability 1 (draft_probs = 1.0), so a proposal
  is accepted with probability p_target(token) and a rejection samples p_target without that token.
The fake computes chain trees only (one path); the draft KV of accepted positions is rewritten from the target's
hidden states (the final draft pass of `_fused_hlo_with_eagle_draft`).
"""

from typing import Dict, List, Optional

import torch

from transformers_neuronx import _backing
from transformers_neuronx.fused_speculation import FusedSpeculativeBase, _prob_of
from transformers_neuronx.layers.generation import multinomial, uniform
from transformers_neuronx.util.token_tree import validate_token_tree


def _check_int64(start_ids) -> None:
    """start_ids as the real decoder can index with them on any torch it supports (see the module docstring)."""
    dtype = start_ids.dtype if isinstance(start_ids, torch.Tensor) else type(start_ids).__name__
    if dtype != torch.int64:
        raise TypeError(
            f"EagleSpeculativeDecoder.speculative_iteration: start_ids must be an int64 (torch.long) tensor, got "
            f"{dtype}: eagle_speculation.py indexes host tensors with them as given (pad: padded_tensor[seq_ids] = "
            "tensor), which torch before 2.0 refuses for int32, beside the graph's own int64 seq ids "
            "(torch.arange); vLLM passes them as torch.long")


class EagleSpeculativeDecoder(FusedSpeculativeBase):

    def __init__(self, draft, target, k: int = 2, pad_token_id: int = 0, eos_token_id: Optional[int] = None,
                 buckets: Optional[List[int]] = None, output_scores: Optional[bool] = False,
                 token_tree: Optional[Dict[int, List[int]]] = None, greedy: Optional[bool] = False,
                 debug: Optional[bool] = False, simulation_acceptance_length: Optional[float] = None) -> None:
        super().__init__()
        self._check_models(draft, target)
        assert draft.neuron_config.use_2d_cache_ids, "We only support 2D cache ID. Set padding_side='right'."
        assert target.neuron_config.use_2d_cache_ids, "We only support 2D cache ID. Set padding_side='right'."
        assert token_tree is not None, "Need to provide a token tree."
        self.token_tree = token_tree
        self.k, self.depth = validate_token_tree(token_tree)
        self.width = max([1] + [len(v) for v in token_tree.values()])
        if self.width != 1:
            raise NotImplementedError("the contract fake computes chain token trees only")
        self.greedy = greedy
        self._init_common(draft, target, pad_token_id, eos_token_id, buckets, output_scores, debug,
                          simulation_acceptance_length)
        self.cache_gather_indices: Dict[int, torch.Tensor] = {}
        self.cache_scatter_indices: Dict[int, torch.Tensor] = {}

    def update_generation_config(self, generation_config):
        self.draft.update_generation_config(generation_config)
        self.target.update_generation_config(generation_config)

    def speculative_iteration(self, input_ids: torch.Tensor, cache_ids: torch.Tensor, start_ids: torch.Tensor):
        _check_int64(start_ids)
        batch_size, cache_ids, context_encoding = self._start_iteration(input_ids, cache_ids)
        if context_encoding:
            target_next_id, hidden = self.target(input_ids, cache_ids, start_ids)
            if input_ids.shape[-1] > 1:  # skip draft ctx if the prompt length is 1
                self.draft(input_ids[:, 1:], cache_ids=cache_ids[:, :-1], start_ids=start_ids, prev_hidden=hidden)
            next_cache_ids = torch.count_nonzero(cache_ids, dim=1).view(-1, 1)
            gather_index = next_cache_ids.reshape(batch_size, -1, 1).expand(-1, -1, hidden.shape[-1])
            hidden = torch.gather(hidden, 1, gather_index)
            for ctr, i in enumerate(start_ids.flatten()):
                self.hidden[i.item()] = hidden[ctr].unsqueeze(0) if hidden.shape[0] > 1 else hidden
                self.cache_gather_indices[i.item()] = torch.arange(0, self.depth).unsqueeze(0).to(torch.int64)
                self.cache_scatter_indices[i.item()] = torch.arange(0, self.depth).unsqueeze(0).to(torch.int64)
            return target_next_id, torch.tensor([[1]] * batch_size)

        seq_ids = start_ids.flatten()
        graph_batch_size = self.batch_sizes[0]
        hidden = torch.cat([self.hidden[i.item()] for i in seq_ids], dim=0)
        gather = torch.cat([self.cache_gather_indices[i.item()] for i in seq_ids], dim=0)
        scatter = torch.cat([self.cache_scatter_indices[i.item()] for i in seq_ids], dim=0)
        cache_ids = cache_ids - 1

        def pad(tensor, seq_ids, target_batch):
            padded = torch.zeros([target_batch] + list(tensor.shape[1:]), dtype=tensor.dtype)
            padded[seq_ids] = tensor
            return padded

        full_input_ids, cache_ids_pad, hidden_pad, gather_pad, scatter_pad = [
            pad(t, seq_ids, graph_batch_size) for t in (input_ids, cache_ids, hidden, gather, scatter)]
        tokens, counts, next_hidden = self._execute(full_input_ids[:, 0].to(torch.int64),
                                                    cache_ids_pad[:, 0].to(torch.int64), hidden_pad)
        out_tokens, out_counts, out_hidden, out_gather, out_scatter = [
            self.handle_padding(t, seq_ids, batch_size) for t in (tokens, counts, next_hidden, gather_pad,
                                                                  scatter_pad)]
        for ctr, i in enumerate(start_ids.flatten()):
            self.hidden[i.item()] = torch.unsqueeze(out_hidden[ctr], 0)
            self.cache_gather_indices[i.item()] = torch.unsqueeze(out_gather[ctr], 0)
            self.cache_scatter_indices[i.item()] = torch.unsqueeze(out_scatter[ctr], 0)
        return self.speculative_iteration_post_process(out_tokens, out_counts)

    def handle_padding(self, tensor: torch.Tensor, seq_ids: torch.Tensor, target_batch_size: int) -> torch.Tensor:
        current_batch_size = tensor.shape[0]
        if current_batch_size == target_batch_size:
            return tensor
        output = torch.zeros((target_batch_size,) + tuple(tensor.shape[1:]), dtype=tensor.dtype)
        for idx, seq_id in enumerate(seq_ids):
            if current_batch_size < target_batch_size:
                output[seq_id] = tensor[idx]
            else:
                output[idx] = tensor[seq_id]
        return output

    def _execute(self, tokens: torch.Tensor, cache: torch.Tensor, hidden: torch.Tensor):
        """One chain-tree step over every line (cache = position of the fed token - 1): (tokens [G, depth] int32,
        counts [G, 1] int32, hidden [G, 1, H] of each line's last accepted token)."""
        draft, target = self.draft._device, self.target._device
        lines = list(range(tokens.shape[0]))
        current, current_hidden, fed = tokens, hidden.float(), [tokens]
        for j in range(self.depth - 1):
            logits, out_hidden = draft.eagle_forward(current[:, None], current_hidden, lines, (cache + j).tolist())
            current = logits[:, -1].argmax(dim=-1)  # top-`width` (1) of the draft logits, probability 1
            current_hidden = out_hidden[:, -1:]
            fed.append(current)
        fed_t = torch.stack(fed, dim=1)  # [G, depth]
        target_logits, target_hidden = _backing.target_with_hidden(target, fed_t, lines, (cache + 1).tolist())
        # the draft cache of the fed positions, from the target's hidden states
        draft.eagle_forward(fed_t, torch.cat([hidden.float(), target_hidden[:, :-1]], dim=1), lines, cache.tolist())
        generation = self.target._generation
        candidates = [generation.candidates(target_logits[:, j], lines) for j in range(self.depth)]
        out = torch.full((len(lines), self.depth), self.pad_token_id, dtype=torch.int32)
        counts = torch.zeros(len(lines), 1, dtype=torch.int32)
        next_hidden = torch.zeros(len(lines), 1, target_hidden.shape[-1])
        for g in lines:
            draws = uniform(self.depth - 1)
            accepted = 0
            for j in range(self.depth - 1):
                if not draws[j] < min(_prob_of(candidates[j][g], int(fed_t[g, j + 1])), 1.0):
                    break
                accepted += 1
            probs, ids = candidates[accepted][g]
            if accepted < self.depth - 1:  # the adjusted distribution: the target's without the rejected proposal
                probs = torch.where(ids == int(fed_t[g, accepted + 1]), torch.zeros_like(probs), probs)
                probs = probs / probs.sum() if float(probs.sum()) > 0 else candidates[accepted][g][0]
            correction = int(ids[multinomial(probs, generation.config.deterministic)])
            row = [int(fed_t[g, j + 1]) for j in range(accepted)] + [correction]
            out[g, : accepted + 1] = torch.tensor(row, dtype=torch.int32)
            counts[g, 0] = accepted + 1
            next_hidden[g, 0] = target_hidden[g, accepted]
        return out, counts, next_hidden
