"""models/model_wrapper.py: what ModelWrapper.forward does around one compiled graph, after
src/neuronx_distributed_inference/models/model_wrapper.py at 5de79de (0.3) and ef2731e (0.9) (same logic for the
paths the fake models): int64 -> int32, bucket choice and padding (pad_inputs / get_target_bucket), then by
input batch size B against the compiled batch size N:

* B == N: the graph runs the rows as given. Token generation reads and writes KV line i for row i; seq_ids are not
  used (kv_cache_manager.update_kv_by_layer_id scatters on position_ids only). Context encoding writes line
  seq_id under continuous batching (update_cache_const_indices, one seq_id per graph), else line i (fill_prefix).
* B > N: chunks of N rows (each re-padded with vllm_cte_repadding: cut at max(position_ids)+1, then re-bucketed),
  the remainder as below.
* B < N: _forward_with_pad: seq_ids are completed with the missing ones and sorted, every other input is padded
  by repeating row 0 and reordered the same way; the graph runs N rows (so each absent KV line gets row 0's token
  written at row 0's position, unless apply_seq_ids_mask), and the outputs come back index_select-ed by seq_id.
"""

from __future__ import annotations

import warnings
from math import log2

import torch
import torch.nn.functional as F

CONTEXT_ENCODING_MODEL_TAG = "context_encoding_model"
TOKEN_GENERATION_MODEL_TAG = "token_generation_model"
SPECULATION_MODEL_TAG = "speculation_model"
MEDUSA_MODEL_TAG = "medusa_speculation_model"
FUSED_SPECULATION_MODEL_TAG = "fused_speculation_model"


def generate_buckets(min_length: int, max_length: int) -> list[int]:
    """modules/autobucketing.py: powers of two from 2^floor(log2 min) below 2^round(log2 max), then max."""
    if min_length == max_length:
        return [max_length]
    return [2 ** i for i in range(int(log2(min_length)), round(log2(max_length)))] + [max_length]


class ModelWrapper:
    def __init__(self, app, tag: str, batch_size: int, buckets: list[int]):
        self.app, self.tag, self.batch_size, self.buckets = app, tag, batch_size, buckets
        self.neuron_config = app.neuron_config

    def is_neuron(self) -> bool:
        return True

    def get_target_bucket(self, input_len: int) -> int:
        """first_fit on the attention mask's length (+ speculation_length for the fused graph)."""
        spec = self.neuron_config.speculation_length if self.tag == FUSED_SPECULATION_MODEL_TAG else 0
        for bucket in self.buckets:
            if input_len + spec < bucket:
                return bucket
        if input_len + spec == self.buckets[-1] or self.neuron_config.allow_input_truncation:
            return self.buckets[-1]
        # The default first_fit strategy raises this one; pad_inputs' "... set allow_input_truncation=True"
        # message is reached only with pad_type="max", which forward never passes.
        raise ValueError(f"Input len {input_len} exceeds largest bucket ({self.buckets[-1]}) for {self.tag}")

    def pad_inputs(self, args: list) -> list:
        input_ids, attention_mask, position_ids, *rest = args
        length = self.get_target_bucket(attention_mask.shape[1])
        if self.tag == CONTEXT_ENCODING_MODEL_TAG:
            if attention_mask.shape[1] > length:  # only reachable with allow_input_truncation
                warnings.warn(f"Truncating input ({attention_mask.shape[1]} tokens) to max_context_length "
                              f"({self.neuron_config.max_context_length} tokens). This may cause unexpected outputs.")
            pad = [(input_ids, self.app.config.pad_token_id), (attention_mask, 0), (position_ids, 1)]
            return [F.pad(t, (0, length - t.shape[1]), "constant", v) for t, v in pad] + rest
        if attention_mask.shape[1] > length:
            warnings.warn(f"Truncating attention mask (length={attention_mask.shape[1]}) to max_length "
                          f"({self.neuron_config.max_length} tokens). This may cause unexpected outputs.")
        return [input_ids, F.pad(attention_mask, (0, length - attention_mask.shape[1]), "constant", 0),
                position_ids, *rest]

    def forward(self, input_ids, attention_mask, position_ids, seq_ids, sampling_params):
        args = [t.to(torch.int32) if t.dtype == torch.int64 else t
                for t in (input_ids, attention_mask, position_ids, seq_ids, sampling_params)]
        args = self.pad_inputs(args)
        n, b = self.batch_size, args[3].shape[0]
        if b == n:
            return self.app._run_graph(self.tag, *args)
        outputs = []
        for start in range(0, b, n):
            chunk = [t[start:start + n] for t in args]
            if start + n <= b:
                cut = int(torch.max(chunk[2])) + 1  # vllm_cte_repadding: assumes padding after max position
                chunk = self.pad_inputs([t[:, :cut] for t in chunk[:3]] + chunk[3:])
                outputs.append(self.app._run_graph(self.tag, *chunk))
            else:
                outputs.append(self._forward_with_pad(*chunk))
        if isinstance(outputs[0], list):
            return [torch.cat(parts, dim=0) for parts in zip(*outputs)]
        return torch.cat(outputs, dim=0)

    def _forward_with_pad(self, input_ids, attention_mask, position_ids, seq_ids, sampling_params):
        n, max_batch = self.batch_size, self.neuron_config.max_batch_size
        listed = seq_ids.tolist()
        padded_ids = torch.tensor(listed + [x for x in range(max_batch) if x not in listed], dtype=seq_ids.dtype)
        padded_ids, order = torch.sort(padded_ids)
        if getattr(self.neuron_config, "apply_seq_ids_mask", False):  # 0.4+: absent lines marked -1, not written
            padded_ids = torch.where(torch.isin(padded_ids, seq_ids), padded_ids, torch.full_like(padded_ids, -1))

        def pad(t):  # "repeat_first_batchline", then the seq_id order
            padded = t[:1].repeat(n, *([1] * (t.dim() - 1)))
            padded[: t.shape[0]] = t
            return torch.index_select(padded, 0, order)

        out = self.app._run_graph(self.tag, pad(input_ids), pad(attention_mask), pad(position_ids),
                                  padded_ids[:max_batch], pad(sampling_params))
        if isinstance(out, list):
            return [torch.index_select(o, 0, seq_ids) for o in out]
        return torch.index_select(out, 0, seq_ids)


__all__ = ["CONTEXT_ENCODING_MODEL_TAG", "FUSED_SPECULATION_MODEL_TAG", "MEDUSA_MODEL_TAG", "ModelWrapper",
           "SPECULATION_MODEL_TAG", "TOKEN_GENERATION_MODEL_TAG", "generate_buckets"]
