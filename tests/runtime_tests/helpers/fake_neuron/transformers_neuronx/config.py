"""Mirrors src/transformers_neuronx/config.py (0.13.x, 1ade6d7): NeuronConfig, ContinuousBatchingConfig and
GenerationConfig with the real constructors' arguments, defaults and checks.

The rules a caller can break, as the real library enforces them:
- NeuronConfig takes keyword arguments only and ends with `assert len(kwargs) == 0`: an unknown key is fatal;
- continuous batching forces `padding_side="right"` (lhs_aligned, so cache_ids are 2D);
- ContinuousBatchingConfig needs `max_num_seqs` or its alias `batch_size_for_shared_caches` and rejects unknown keys;
- QuantizationConfig and KVCacheQuantizationConfig refuse a quant_dtype or quantize_method they do not implement
  (NotImplementedError);
- GenerationConfig stores lists as given (top_p / temperature as floats); list lengths are checked against the batch
  size when a model compiles or `update_generation_config` runs (decoder.py `validate_generation_configs`).
"""

import enum
import os
import warnings
from typing import List, Optional

import torch

from transformers_neuronx.constants import GQA, Layout


class QuantizationConfig:
    def __init__(self, quant_dtype="s8", dequant_dtype="f16", quantize_method="vector_dynamic",
                 quantize_attn=True, no_quantize_list=[]):  # noqa: B006 (the real default)
        if quant_dtype not in ("s8", "f8e4m3fn"):
            raise NotImplementedError(f"{quant_dtype} is not implemented. Available options are s8,f8e4m3fn")
        if quantize_method not in ("vector_dynamic", "direct_cast"):
            raise NotImplementedError(f"{quantize_method} is not implemented.")
        self.quant_dtype, self.dequant_dtype, self.quantize_method = quant_dtype, dequant_dtype, quantize_method
        self.quantize_attn, self.no_quantize_list = quantize_attn, no_quantize_list


class KVCacheQuantizationConfig:
    def __init__(self, quant_dtype="s8", dequant_dtype="bf16", quantize_method="direct_cast"):
        if quant_dtype not in ("s8", "f16", "bf16", "f8e4m3fn"):
            raise NotImplementedError(f"{quant_dtype} is not implemented. Available options are s8,f16,bf16,f8e4m3fn")
        if quantize_method not in ("direct_cast",):
            raise NotImplementedError(f"{quantize_method} is not implemented.  Available options are direct_cast")
        self.quant_dtype, self.dequant_dtype, self.quantize_method = quant_dtype, dequant_dtype, quantize_method


class ContinuousBatchingConfig:
    """`max_num_seqs` (alias `batch_size_for_shared_caches`, required), max_model_len, optimized_paged_attention,
    enable_chunked_prefill (which needs optimized paged attention)."""

    def __init__(self, **kwargs):
        if kwargs.get("max_num_seqs", None) is not None:
            self.max_num_seqs = kwargs.pop("max_num_seqs")
        else:
            self.max_num_seqs = kwargs.pop("batch_size_for_shared_caches")  # KeyError when neither: as the real one
        self.max_model_len = kwargs.pop("max_model_len") if kwargs.get("max_model_len", None) is not None else None
        self.optimized_paged_attention = (kwargs.pop("optimized_paged_attention")
                                          if kwargs.get("optimized_paged_attention", None) is not None else False)
        self.enable_chunked_prefill = (kwargs.pop("enable_chunked_prefill")
                                       if kwargs.get("enable_chunked_prefill", None) is not None else False)
        if self.enable_chunked_prefill:
            assert self.optimized_paged_attention, "chunked prefill is only supported with optimized paged attention"
        self.block_size = None
        self.num_blocks = None
        assert len(kwargs) == 0, f"unexpected key word arguments: {kwargs.keys()}"

    @property
    def batch_size_for_shared_caches(self) -> int:
        return self.max_num_seqs

    @property
    def _paged_attention(self) -> bool:
        return bool(self.block_size and self.max_model_len and self.block_size < self.max_model_len)


class GenerationConfig:
    """On-device generation. `dynamic=True` keeps top_k / top_p / temperature / top_p_min_tokens as device inputs
    (changeable by `update_generation_config` without recompiling); `per_batch_line=True` makes them lists indexed by
    batch line, which with continuous batching is the KV line (`seq_ids`, layers/generation.py)."""

    def __init__(self, *, max_length=None, do_sample=False, top_k=50, top_p=1.0, top_p_min_tokens=1,
                 global_top_k=None, eos_token_id=None, temperature=1.0, dynamic=False, deterministic=False,
                 per_batch_line=False):
        self.max_length = max_length
        self.do_sample = do_sample
        self.per_batch_line = per_batch_line
        self.top_k = top_k
        self.top_p = [float(p) for p in top_p] if isinstance(top_p, list) else float(top_p)
        self.temperature = ([float(t) for t in temperature] if isinstance(temperature, list)
                            else float(temperature))
        self.top_p_min_tokens = top_p_min_tokens
        self.global_top_k = global_top_k
        self.eos_token_id = eos_token_id
        self.dynamic = dynamic
        self.deterministic = deterministic

    def __eq__(self, value: object) -> bool:
        return isinstance(value, GenerationConfig) and self.__dict__ == value.__dict__


valid_dtypes = ["float32", "float16", "bfloat16"]


class NeuronConfig:
    """The real keyword arguments and defaults; unknown keywords fail (`assert len(kwargs) == 0`)."""

    def __init__(self, *,
                 sparse_attn=None,
                 quant: Optional[QuantizationConfig] = None,
                 kv_cache_quant: Optional[KVCacheQuantizationConfig] = None,
                 continuous_batching: Optional[ContinuousBatchingConfig] = None,
                 attention_layout=Layout.HSB,
                 collectives_layout=Layout.HSB,
                 cache_layout=Layout.SBH,
                 padding_side: str = "left",
                 group_query_attention: Optional[GQA] = None,
                 sequence_parallel_norm: bool = False,
                 sequence_parallel_norm_threshold: int = 2048,
                 bf16_rms_norm: bool = False,
                 on_device_embedding: bool = False,
                 on_device_generation: Optional[GenerationConfig] = None,
                 all_reduce_dtype: Optional[str] = None,
                 cast_logits_dtype: str = "float32",
                 fuse_qkv: bool = False,
                 qkv_tiling: bool = False,
                 weight_tiling: bool = False,
                 mlp_in_weight_tiling_permute_order: List[int] = [1, 2, 0, 3],  # noqa: B006 (the real default)
                 mlp_out_weight_tiling_permute_order: List[int] = [1, 2, 0, 3],  # noqa: B006
                 log_softmax_scores: bool = False,
                 shard_over_sequence: bool = False,
                 output_all_logits: bool = False,
                 attn_output_transposed: bool = False,
                 fused_rmsnorm_qkv: bool = False,
                 fused_rmsnorm_mlp: bool = False,
                 mlp_out_weight_transpose: bool = False,
                 fuse_mlp: bool = False,
                 is_eagle_target: bool = False,
                 is_eagle_draft: bool = False,
                 has_pre_attention_norm: bool = True,
                 compilation_worker_count: Optional[int] = None,
                 duplicate_q_weight_sos: bool = False,
                 **kwargs):
        self.all_reduce_dtype = all_reduce_dtype
        self.sparse_attn = sparse_attn
        self.quant = quant
        self.kv_cache_quant = kv_cache_quant
        self.cast_logits_dtype = cast_logits_dtype
        assert cast_logits_dtype in valid_dtypes, (
            f"The `cast_logits_dtype={cast_logits_dtype}` argument must be one of {valid_dtypes}")
        self.fuse_qkv = fuse_qkv
        self.fuse_mlp = fuse_mlp
        self.continuous_batching = continuous_batching
        self.padding_side = padding_side
        assert padding_side in ["left", "right"], (
            f"The `padding_side={padding_side}` argument must be either 'left' or 'right'")
        self.lhs_aligned = padding_side == "right"
        if "use_2d_cache_ids" in kwargs:
            warnings.warn("NeuronConfig `use_2d_cache_ids` argument is deprecated. "
                          "Please specify `padding_side = 'right'`.")
            self.lhs_aligned = kwargs.pop("use_2d_cache_ids", False)
        if "lhs_aligned" in kwargs:
            warnings.warn("NeuronConfig `lhs_aligned` argument is deprecated. Please specify `padding_side = 'right'`.")
            self.lhs_aligned = kwargs.pop("lhs_aligned", False)
        if self.continuous_batching:
            # Continuous batching forces right padding (left-aligned sequences, 2D cache ids).
            self.lhs_aligned = True
            self.padding_side = "right"
        self.attention_layout = attention_layout
        self.collectives_layout = collectives_layout
        self.cache_layout = cache_layout
        self.log_softmax_scores = log_softmax_scores
        self.group_query_attention = GQA(group_query_attention) if group_query_attention is not None else None
        self.sequence_parallel_norm = sequence_parallel_norm
        self.sequence_parallel_norm_threshold = sequence_parallel_norm_threshold
        assert sequence_parallel_norm_threshold > 0, (
            f"sequence_parallel_norm_threshold={sequence_parallel_norm_threshold} must be greater than zero")
        self.bf16_rms_norm = bf16_rms_norm
        self.on_device_embedding = on_device_embedding
        self.on_device_generation = on_device_generation
        self.qkv_tiling = qkv_tiling
        if self.qkv_tiling is True:
            assert self.fuse_qkv is True, "QKV weight tiling is currently only supported when QKV fusion is enabled."
        self.weight_tiling = weight_tiling
        self.mlp_in_weight_tiling_permute_order = mlp_in_weight_tiling_permute_order
        self.mlp_out_weight_tiling_permute_order = mlp_out_weight_tiling_permute_order
        assert mlp_in_weight_tiling_permute_order.index(2) < mlp_in_weight_tiling_permute_order.index(3), \
            "original dim 2 has to be front of dim 3 after applying `mlp_in_weight_tiling_permute_order`"
        assert mlp_out_weight_tiling_permute_order.index(2) < mlp_out_weight_tiling_permute_order.index(3), \
            "original dim 2 has to be front of dim 3 after applying `mlp_out_weight_tiling_permute_order`"
        self.output_all_logits = output_all_logits

        assert len(kwargs) == 0, f"Unexpected NeuronConfig keyword arguments: {kwargs}"

        self.rank_id = int(os.getenv("NEURON_RANK_ID", "0"))
        local_tp = os.getenv("NEURON_LOCAL_TP", None)
        self.local_tp = int(local_tp) if local_tp is not None else None
        self.pp_stages = int(os.getenv("NEURON_PP_STAGES", 1))
        self.dist = None
        self.layer_partition = {}
        self.shard_over_sequence = shard_over_sequence
        self.is_sequence_parallel = False
        self.attn_output_transposed = attn_output_transposed
        self.fused_rmsnorm_qkv = fused_rmsnorm_qkv
        self.fused_rmsnorm_mlp = fused_rmsnorm_mlp
        self.mlp_out_weight_transpose = mlp_out_weight_transpose
        if self.shard_over_sequence:
            assert self.sparse_attn is None, "sparse attn is not supported with flash decoding"
        self.duplicate_q_weight_sos = duplicate_q_weight_sos
        self.is_eagle_target = is_eagle_target
        self.is_eagle_draft = is_eagle_draft
        self.has_pre_attention_norm = has_pre_attention_norm
        self.compilation_worker_count = compilation_worker_count

    @property
    def use_2d_cache_ids(self):
        return self.lhs_aligned

    @property
    def use_1d_query(self):
        return self.cache_layout == Layout.BSH and self.padding_side == "right"

    @property
    def bsh_cache_layout(self):
        return self.cache_layout == Layout.BSH

    @property
    def paged_attention(self):
        if self.continuous_batching:
            return self.continuous_batching._paged_attention and self.bsh_cache_layout
        return False

    @property
    def enable_chunked_prefill(self):
        return self.paged_attention and self.continuous_batching.enable_chunked_prefill

    @property
    def vectorize_last_token_id(self):
        return self.lhs_aligned

    def is_pp(self):
        return self.pp_stages > 1

    def to_json(self):
        def _to_json(obj):
            if obj is None or isinstance(obj, (str, int, float, bool)):
                return obj
            if isinstance(obj, enum.Enum):
                return obj.value
            if isinstance(obj, torch.Tensor):
                return obj.tolist()
            if isinstance(obj, list):
                return [_to_json(e) for e in obj]
            if isinstance(obj, dict):
                return {str(_to_json(k)): _to_json(v) for k, v in obj.items()}
            if isinstance(obj, tuple):
                return str(tuple(_to_json(e) for e in obj))
            return _to_json(obj.__dict__)
        return _to_json(self)
