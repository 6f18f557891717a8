"""models/config.py: NeuronConfig, OnDeviceSamplingConfig, FusedSpecNeuronConfig, InferenceConfig (and
ChunkedPrefillConfig from 0.4). Rules from src/neuronx_distributed_inference/models/config.py at 5de79de (0.3),
2c46add (0.4), f9e99f9 (0.5), e07f056 (0.6), fcb5a86 (0.7), cd3abf3 (0.8), ef2731e (0.9)."""

from __future__ import annotations

import importlib
import inspect
import json
import logging
import os
import warnings
from typing import Dict, List, Optional, Type

import torch

from neuronx_distributed_inference._release import at_least, platform_target

CONFIG_FILE = "neuron_config.json"

# Every kwarg the real NeuronConfig.__init__ pops, by the release that added it (0.4 removed the three chunked
# prefill kwargs of 0.3). Names the fake models are handled in NeuronConfig.__init__; the others are stored
# as given (they change nothing in the fake). Anything else is unknown: logged, no effect, exactly as the real.
_KNOWN = {
    (0, 3): "activation_quantization_type allow_input_truncation async_mode attn_block_tkg_nki_kernel_cache_update "
    "attn_block_tkg_nki_kernel_enabled attn_cls attn_kernel_enabled attn_tkg_builtin_kernel_enabled "
    "attn_tkg_nki_kernel_enabled bucket_n_active_tokens cc_pipeline_tiling_factor disable_kv_cache_tiling "
    "draft_model_modules_to_not_convert enable_eagle_draft_input_norm ep_degree flash_decoding_enabled fused_qkv "
    "fused_rmsnorm_skip_gamma is_block_kv_layout is_medusa is_prefix_caching k_cache_transposed kv_cache_quant "
    "layer_boundary_markers lora_config medusa_speculation_length medusa_tree mlp_kernel_enabled "
    "mlp_kernel_fuse_residual_add modules_to_not_convert n_active_tokens n_positions num_medusa_heads on_cpu "
    "output_logits pa_block_size pa_num_blocks pp_degree qk_layernorm qkv_kernel_enabled "
    "qkv_kernel_fuse_residual_add qkv_kernel_nbsd_layout quantization_dtype quantization_type "
    "quantize_clamp_bound quantized quantized_checkpoints_path quantized_mlp_kernel_enabled "
    "rmsnorm_quantize_kernel_enabled rpl_reduce_dtype sequence_parallel_enabled skip_sharding spec_batch_size "
    "target vocab_parallel weight_gather_seq_len_threshold world_size max_new_tokens",
    (0, 4): "attention_dtype cast_type cp_degree enable_spill_reload_dge prefix_buckets "
    "seq_len_threshold_for_cc_tiling",
    (0, 5): "attention_dp_degree attn_block_cte_nki_kernel_enabled enable_output_completion_notifications "
    "expert_mlp_nki_kernel_enabled lm_head_pad lm_head_pad_alignment_size moe_fused_nki_kernel_enabled "
    "router_topk_nki_kernel_enabled scratchpad_page_size shared_mlp_nki_kernel_enabled",
    (0, 6): "attn_block_tkg_nki_kernel_cascaded_attention enable_cte_modular_flow "
    "strided_context_parallel_kernel_enabled",
    (0, 7): "attn_block_tkg_nki_kernel_use_online_softmax disable_numeric_cc_token is_full_model_shuffled "
    "is_mxfp4_compute mlp_cp_degree mlp_tkg_nki_kernel_enabled out_proj_kernel_enabled padded_hidden_size "
    "padded_intermediate_size pre_rope_rmsnorm qkv_cte_nki_kernel_fuse_rope qkv_nki_kernel_enabled "
    "quantization_block_axis quantization_block_size quantization_scale_dtype switch_cc tensor_capture_config "
    "tensor_replacement_config windowed_context_encoding_size",
    (0, 8): "attn_block_tkg_nki_kernel_disable_gpsimd_sb2sb disable_argmax_kernel dma_order_config "
    "eagle_rolling_buffer_kernel_enabled ep_dispatch_cc_option kv_quant_config weights_to_skip_layout_optimization",
    (0, 9): "enable_ve_data_parallel",
}
# Stored as given; these change what the graphs compute, so the fake refuses a non-default value of them at
# construction instead of ignoring it (see NeuronBaseForCausalLM).
UNMODELLED = {"async_mode": False, "output_logits": False, "is_block_kv_layout": False, "is_prefix_caching": False,
              "is_medusa": False, "lora_config": None, "attention_dp_degree": 1, "cp_degree": 1, "quantized": False,
              "padding_side": "right", "k_cache_transposed": False, "kv_cache_quant": False}


def to_torch_dtype(dtype_str: str) -> torch.dtype:
    """5de79de config.py to_torch_dtype; float8 names from cd3abf3 (0.8)."""
    mapping = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
    if at_least((0, 8)):
        mapping.update(float8_e4m3fn=torch.float8_e4m3fn, float8_e5m2=torch.float8_e5m2)
    assert dtype_str in mapping, f"Unsupported dtype: {dtype_str}"
    return mapping[dtype_str]


def to_dict(obj):
    """config.py to_dict: classes as {"__module__", "__name__"}, dtypes as their short name."""
    if type(obj) is dict:
        return {k: to_dict(v) for k, v in obj.items()}
    if type(obj) is list:
        return [to_dict(v) for v in obj]
    if inspect.isclass(obj):
        return {"__module__": obj.__module__, "__name__": obj.__name__}
    if hasattr(obj, "__dict__"):
        return {k: to_dict(v) for k, v in obj.__dict__.items()}
    if type(obj) is torch.dtype:
        return str(obj).split(".")[1]
    return obj


class IncompatibleConfigError(ValueError):
    pass


def get_platform_lnc() -> int:
    """2 on trn2 (and trn3 from 0.7), else 1."""
    return 2 if platform_target() in (("trn2", "trn3") if at_least((0, 7)) else ("trn2",)) else 1


class OnDeviceSamplingConfig:
    """Unknown keys are silently ignored, as the real. top_k_kernel_enabled from 0.5 (f9e99f9: default False; 0.9
    ef2731e: default on except trn1); sampling_dp_degree from 0.8 (cd3abf3)."""

    def __init__(self, **kwargs):
        self.do_sample = kwargs.pop("do_sample", False)
        self.top_k = kwargs.pop("top_k", 1)
        self.top_p = kwargs.pop("top_p", 1.0)
        self.temperature = kwargs.pop("temperature", 1.0)
        self.dynamic = kwargs.pop("dynamic", False)
        self.deterministic = kwargs.pop("deterministic", False)
        self.global_topk = kwargs.pop("global_topk", 256)
        self.on_device_sampling_config = kwargs.pop("on_device_sampling_config", True)
        if at_least((0, 5)):
            self.top_k_kernel_enabled = kwargs.pop("top_k_kernel_enabled",
                                                   platform_target() != "trn1" if at_least((0, 9)) else False)
        if at_least((0, 8)):
            self.sampling_dp_degree = kwargs.pop("sampling_dp_degree", 1)


if at_least((0, 4)):

    class ChunkedPrefillConfig:
        """2c46add config.py (0.4): replaces 0.3's is_chunked_prefill / cp_max_num_seqs / cp_num_active_blocks."""

        def __init__(self, **kwargs):
            self.max_num_seqs = kwargs.pop("max_num_seqs", 0)
            self.tkg_model_enabled = kwargs.pop("tkg_model_enabled", True)
            self.kernel_q_tile_size = kwargs.pop("kernel_q_tile_size", 128)
            self.kernel_kv_tile_size = kwargs.pop("kernel_kv_tile_size", 1024)


class NeuronConfig:
    def __init__(self, **kwargs) -> None:
        pop = kwargs.pop
        self.batch_size = pop("batch_size", 1)
        self.padding_side = pop("padding_side", "right")
        self.allow_input_truncation = pop("allow_input_truncation", False)
        self.seq_len = pop("seq_len", 128)
        self.n_active_tokens = pop("n_active_tokens", self.seq_len)
        self.n_positions = pop("n_positions", self.seq_len)
        self.is_prefill_stage = None
        if "torch_dtype" in kwargs:  # a given dtype is kept by load_pretrained_config
            self.torch_dtype = pop("torch_dtype")
            if isinstance(self.torch_dtype, str):
                self.torch_dtype = to_torch_dtype(self.torch_dtype)
            self.overrides_torch_dtype = pop("overrides_torch_dtype", True)
        else:
            self.torch_dtype, self.overrides_torch_dtype = torch.bfloat16, False
        if at_least((0, 4)):  # 2c46add
            self.cast_type = pop("cast_type", "config")
            if self.cast_type not in ["config", "as-declared"]:
                raise ValueError("cast_type must be one of config, as-declared")
        self.max_context_length = pop("max_context_length", self.seq_len)
        self.max_length = pop("max_length", self.seq_len)
        if at_least((0, 5)):  # f9e99f9
            assert self.max_context_length <= self.max_length, "max_context_length cannot be more than max_length"
        # Continuous batching and the KV cache
        self.ctx_batch_size = pop("ctx_batch_size", self.batch_size)
        self.tkg_batch_size = pop("tkg_batch_size", self.batch_size)
        self.max_batch_size = pop("max_batch_size", self.batch_size)
        self.is_continuous_batching = pop("is_continuous_batching", False)
        self.kv_cache_batch_size = pop("kv_cache_batch_size", self.batch_size)
        self.kv_cache_padding_size = pop("kv_cache_padding_size", 0)
        self.on_device_sampling_config = pop("on_device_sampling_config", None)
        if type(self.on_device_sampling_config) is dict:
            self.on_device_sampling_config = OnDeviceSamplingConfig(**self.on_device_sampling_config)
        # Bucketing
        self.enable_bucketing = pop("enable_bucketing", False)
        self.buckets = pop("buckets", [self.seq_len])
        self.context_encoding_buckets = pop("context_encoding_buckets", None)
        self.token_generation_buckets = pop("token_generation_buckets", None)
        if self.context_encoding_buckets is not None:
            self.context_encoding_buckets.sort()
            assert self.context_encoding_buckets[-1] <= self.max_context_length, (
                f"Context bucket {self.context_encoding_buckets[-1]} should be <= {self.max_context_length}")
        if self.token_generation_buckets is not None:
            self.token_generation_buckets.sort()
            assert self.token_generation_buckets[-1] <= self.max_length, (
                f"Token generation bucket {self.token_generation_buckets[-1]} should be <= {self.max_length}")
        # Speculation: EAGLE forces fused speculation
        self.speculation_length = pop("speculation_length", 0)
        self.enable_fused_speculation = pop("enable_fused_speculation", False)
        self.enable_eagle_speculation = pop("enable_eagle_speculation", False)
        self.is_eagle_draft = pop("is_eagle_draft", False)
        if at_least((0, 7)):  # fcb5a86
            self.is_eagle3 = pop("is_eagle3", False)
        if self.enable_eagle_speculation:
            self.enable_fused_speculation = True
        self.token_tree_config = pop("token_tree_config", None)
        self.enable_token_tree = self.token_tree_config is not None
        # Chunked prefill: 0.3 kwargs, from 0.4 chunked_prefill_config (both require block KV)
        block_kv = kwargs.get("is_block_kv_layout", False)
        if at_least((0, 4)):
            self.chunked_prefill_config = pop("chunked_prefill_config", None)
            if type(self.chunked_prefill_config) is dict:
                self.chunked_prefill_config = ChunkedPrefillConfig(**self.chunked_prefill_config)
            self.is_chunked_prefill = self.chunked_prefill_config is not None
            if self.is_chunked_prefill:
                assert block_kv, "is_block_kv_layout has to be true for chunked prefill because it depends on block KV"
        else:
            self.is_chunked_prefill = pop("is_chunked_prefill", False)
            self.cp_max_num_seqs = pop("cp_max_num_seqs", 0)
            self.cp_num_active_blocks = pop("cp_num_active_blocks", 0)
            if self.is_chunked_prefill:
                assert block_kv, "is_block_kv_layout has to be true for chunked prefill because it depends on block KV"
                assert self.batch_size == 1, "batch_size has to be 1 for chunked prefill because it concatenates " \
                    "all requests into one long request"
        # Distributed
        self.tp_degree = pop("tp_degree", 1)
        self.save_sharded_checkpoint = pop("save_sharded_checkpoint", False)  # 0.3 onwards: shard on load
        self.start_rank_id = pop("start_rank_id", 0)
        self.local_ranks_size = pop("local_ranks_size", None)
        self.logical_nc_config = self._get_lnc(kwargs)
        if at_least((0, 8)):  # cd3abf3: decode batch buckets, refused with speculation (and others)
            self.token_generation_batches = pop("token_generation_batches", None)
            clash = [name for name, on in (("speculative decoding", self.speculation_length > 0),
                                           ("fused speculation", self.enable_fused_speculation),
                                           ("token tree", self.enable_token_tree)) if on]
            if self.token_generation_batches is not None and clash:
                raise ValueError(f"Batch bucketing (token_generation_batches={self.token_generation_batches}) is not "
                                 f"currently supported with the following features: {', '.join(clash)}. Please "
                                 "disable batch bucketing or the incompatible features.")
        # The rest: stored as given (see _KNOWN / UNMODELLED)
        late = {"skip_warmup", "apply_seq_ids_mask", "scratchpad_page_size", "enable_output_completion_notifications"}
        for release, names in _KNOWN.items():
            for name in names.split() if at_least(release) else ():
                if name in kwargs and not (name in late and not at_least((0, 7))):
                    setattr(self, name, pop(name))
        for name, default in UNMODELLED.items():
            if not hasattr(self, name) and (name != "attention_dp_degree" or at_least((0, 5))) and (
                    name != "cp_degree" or at_least((0, 4))):
                setattr(self, name, default)
        self.world_size = getattr(self, "world_size", None) or self.tp_degree * getattr(self, "pp_degree", 1) * \
            getattr(self, "ep_degree", 1)
        if self.local_ranks_size is None:
            self.local_ranks_size = self.world_size
        if at_least((0, 4)) and self.tp_degree % self.cp_degree != 0:
            raise ValueError("TP Degree must be evenly divisible by CP Degree")
        if at_least((0, 5)) and self.attention_dp_degree > 1:
            if self.tp_degree % self.attention_dp_degree != 0:
                raise ValueError("TP Degree must be evenly divisible by DP Degree")
            if self.tkg_batch_size % self.attention_dp_degree != 0:
                raise ValueError("Batch Size must be evenly divisible by DP Degree")
            if not self.is_continuous_batching:
                raise ValueError("--is-continuous-batching must be enabled when running DP")
        if not at_least((0, 7)):
            # Up to 0.6 the leftover check runs BEFORE skip_warmup (and 0.4's apply_seq_ids_mask, 0.5's
            # scratchpad_page_size / enable_output_completion_notifications) are popped: passing them logs
            # "Unexpected keyword arguments" although they take effect (e07f056 config.py).
            self._warn_unexpected(kwargs)
        self.skip_warmup = pop("skip_warmup", platform_target() == "trn2" if not at_least((0, 4)) else False)
        if at_least((0, 4)):
            self.apply_seq_ids_mask = pop("apply_seq_ids_mask", False)
        for name in ("scratchpad_page_size", "enable_output_completion_notifications") if at_least((0, 5)) else ():
            if name in kwargs:
                setattr(self, name, pop(name))
        if at_least((0, 7)):
            self._warn_unexpected(kwargs)

    @staticmethod
    def _warn_unexpected(kwargs) -> None:
        if kwargs:  # logging.warn up to 0.6, logging.warning from 0.7: the root logger, WARNING, either way
            logging.warning(f"NeuronConfig init: Unexpected keyword arguments: {kwargs}")

    @staticmethod
    def _get_lnc(kwargs) -> int:
        """0.3: int(env NEURON_LOGICAL_NC_CONFIG or kwarg or platform); from 0.4 the same priority, with a warning
        when the env and the kwarg disagree (2c46add _get_lnc). logical_neuron_cores is the deprecated alias."""
        kwarg = -1
        if "logical_neuron_cores" in kwargs:
            warnings.warn("'logical_neuron_cores' is deprecated and replaced by 'logical_nc_config'. In a future "
                          "release, this attribute will be removed.", category=DeprecationWarning)
            kwarg = int(kwargs.pop("logical_neuron_cores"))
        if "logical_nc_config" in kwargs:
            kwarg = int(kwargs.pop("logical_nc_config"))
        env = int(os.environ.get("NEURON_LOGICAL_NC_CONFIG", -1))
        if at_least((0, 4)) and env != -1 and kwarg != -1 and env != kwarg:
            warnings.warn(f"NEURON_LOGICAL_NC_CONFIG={env} does not match provided logical_nc_config={kwarg}. "
                          "Using NEURON_LOGICAL_NC_CONFIG to set LNC.", category=UserWarning)
        return env if env != -1 else kwarg if kwarg != -1 else get_platform_lnc()


class InferenceConfig:
    attribute_map: Dict[str, str] = {}

    def _setup(self, neuron_config, fused_spec_config, load_config, metadata, kwargs):
        self.neuron_config = neuron_config
        self.fused_spec_config = fused_spec_config
        if load_config is not None:
            load_config(self)
        else:
            self.load_config()
        if at_least((0, 4)):
            self.metadata = metadata
        for key, value in kwargs.items():
            setattr(self, key, value)
        self.add_derived_config()
        self.validate_config()

    if at_least((0, 4)):  # 2c46add added `metadata`
        def __init__(self, neuron_config: NeuronConfig, fused_spec_config=None, load_config=None,
                     metadata: Optional[Dict] = None, **kwargs):
            self._setup(neuron_config, fused_spec_config, load_config, metadata, kwargs)
    else:
        def __init__(self, neuron_config: NeuronConfig, fused_spec_config=None, load_config=None, **kwargs):
            self._setup(neuron_config, fused_spec_config, load_config, None, kwargs)

    def __setattr__(self, key, value):  # attribute_map aliases, as the real
        super().__setattr__(object.__getattribute__(self, "attribute_map").get(key, key), value)

    def __getattribute__(self, key):
        if key != "attribute_map":
            key = object.__getattribute__(self, "attribute_map").get(key, key)
        return object.__getattribute__(self, key)

    def add_derived_config(self):
        self.num_cores_per_group = 1

    def load_config(self):
        pass

    def get_required_attributes(self) -> List[str]:
        return []

    def validate_config(self):
        missing = [x for x in self.get_required_attributes() if not hasattr(self, x)]
        assert len(missing) == 0, f"Config must define {missing}"

    def save(self, model_path):
        os.makedirs(model_path, exist_ok=True)
        with open(os.path.join(model_path, CONFIG_FILE), "w", encoding="utf-8") as f:
            f.write(self.to_json_string() + "\n")

    def to_json_string(self) -> str:
        return json.dumps(to_dict(self), indent=2, sort_keys=True)

    def get_text_config(self):
        return getattr(self, "text_config", None) or self

    @classmethod
    def load(cls, model_path, **kwargs) -> "InferenceConfig":
        return cls.from_json_file(os.path.join(model_path, CONFIG_FILE), **kwargs)

    @classmethod
    def from_json_file(cls, json_file, **kwargs) -> "InferenceConfig":
        with open(json_file, "r", encoding="utf-8") as reader:  # FileNotFoundError when absent, as the real
            return cls.from_json_string(reader.read(), **kwargs)

    @classmethod
    def from_json_string(cls, json_string: str, **kwargs) -> "InferenceConfig":
        merged = json.loads(json_string)
        merged.update(kwargs)
        if isinstance(merged.get("neuron_config"), dict):
            merged["neuron_config"] = cls.get_neuron_config_cls()(**merged["neuron_config"])
        spec = merged.get("fused_spec_config")
        if isinstance(spec, dict):
            draft = spec.get("draft_config")
            if isinstance(draft, dict):
                if isinstance(draft.get("neuron_config"), dict):
                    draft["neuron_config"] = cls.get_neuron_config_cls()(**draft["neuron_config"])
                spec["draft_config"] = cls(**draft)
            worker = spec["worker_cls"]
            spec = FusedSpecNeuronConfig(**spec)
            try:
                spec.worker_cls = getattr(importlib.import_module(worker["__module__"]), worker["__name__"])
            except Exception as e:
                raise ModuleNotFoundError(
                    f"Failed to load class {worker['__name__']} from module {worker['__module__']}. Make sure the "
                    "module exists in NxDI and model class is supported. If the compiled model is from NxDI v0.2 or "
                    "earlier, try recompiling the model.") from e
            if isinstance(getattr(spec, "draft_model_cls", None), dict):
                draft_cls = spec.draft_model_cls
                spec.draft_model_cls = getattr(importlib.import_module(draft_cls["__module__"]), draft_cls["__name__"])
            merged["fused_spec_config"] = spec
        return cls(**merged)

    @classmethod
    def get_neuron_config_cls(cls) -> Type[NeuronConfig]:
        return NeuronConfig


class FusedSpecNeuronConfig:
    """(worker_cls, draft_config=None, draft_model_path=None); draft_model_cls=None from 0.7 (fcb5a86)."""

    def __init__(self, worker_cls, draft_config: InferenceConfig = None, draft_model_path: str = None, **kwargs):
        self.worker_cls = worker_cls
        self.draft_config = draft_config
        self.draft_model_path = draft_model_path
        if at_least((0, 7)):
            self.draft_model_cls = kwargs.pop("draft_model_cls", None)
        if kwargs:
            raise TypeError(f"FusedSpecNeuronConfig.__init__() got an unexpected keyword argument "
                            f"'{next(iter(kwargs))}'")


__all__ = ["CONFIG_FILE", "FusedSpecNeuronConfig", "IncompatibleConfigError", "InferenceConfig", "NeuronConfig",
           "OnDeviceSamplingConfig", "get_platform_lnc", "to_dict", "to_torch_dtype"] + (
    ["ChunkedPrefillConfig"] if at_least((0, 4)) else [])
