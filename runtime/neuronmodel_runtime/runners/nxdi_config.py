"""The NeuronConfig the NxDI runner compiles with (NxDI 0.3-0.10, `models/config.py`): its keyword arguments derived
from RuntimeConfig, and `neuron_config_overrides` (vLLM's override_neuron_config) checked and merged last, so they are
part of the compiled artifacts' key: a key the runner derives is refused, and so is one the installed release's
NeuronConfig does not keep (NxDI itself only logs it).

Nothing here imports NxDI.
"""

from __future__ import annotations

import copy
import os
from typing import Any, Mapping

from neuronmodel_runtime.config import RuntimeConfig, env as env_names
from neuronmodel_runtime.runners.base import RunnerError
from neuronmodel_runtime.runners.neuron_overrides import refuse_managed_overrides

#: RuntimeConfig.dtype -> NeuronConfig.torch_dtype ("auto" is bfloat16 on Neuron, NxDI's own default).
TORCH_DTYPES = {"auto": "bfloat16", "bfloat16": "bfloat16", "float16": "float16", "float32": "float32"}


def speculation_length(config: RuntimeConfig) -> int:
    """NxDI's speculation_length for our k drafts: one step emits up to k+1 tokens (0 without fused speculation)."""
    spec = config.speculation
    return spec.num_speculative_tokens + 1 if spec.mode in ("draft", "eagle") else 0


def neuron_config_kwargs(config: RuntimeConfig, eagle3: bool = False,
                         env: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """The NeuronConfig keyword arguments of this RuntimeConfig (pure; the desired compiled shape).

    The compiled sequence is max_model_len + k long: a fused step writes k positions past a row's last token
    even when only its first token is kept, so the last k positions of a line are scratch. Every kwarg here exists
    with the same meaning in every release 0.3-0.10 (`models/config.py`), except is_eagle3 (0.7+), which `load`
    refuses on older releases rather than let NxDI ignore it. The logical NeuronCore config comes from
    $NEURON_LOGICAL_NC_CONFIG (which NxDI would read anyway): passed explicitly, it is part of the artifacts' digest,
    since it changes the compiled graphs.
    """
    s = speculation_length(config)
    kwargs: dict[str, Any] = {
        "tp_degree": config.parallelism.tensor_parallel_degree,
        "batch_size": config.max_num_seqs,
        "ctx_batch_size": 1,  # one prompt per context-encoding call
        "tkg_batch_size": config.max_num_seqs,
        "max_batch_size": config.max_num_seqs,
        "is_continuous_batching": True,  # seq_ids name the KV lines
        "max_context_length": config.max_context_length,
        "seq_len": config.max_model_len + max(s - 1, 0),
        "torch_dtype": TORCH_DTYPES[config.dtype],
        "padding_side": "right",
        "enable_bucketing": True,  # NxDI buckets powers of two up to max_context_length / seq_len
        # weights/tp{r}_sharded_checkpoint.safetensors in the artifacts, or sharded from the checkpoint at load (the
        # default flipped between releases: always passed, so the artifacts' digest says which)
        "save_sharded_checkpoint": config.compile_cache.sharded_weights,
    }
    if config.sampling.on_device:
        # dynamic: per-row params from the [B, 3] tensor; without it NxDI takes the argmax and ignores them. Fused
        # speculation verifies by argmax and refuses do_sample at compile: greedy there.
        sampled = not s
        kwargs["on_device_sampling_config"] = {
            "dynamic": sampled, "do_sample": sampled, "deterministic": False,
            "global_topk": config.sampling.global_top_k,
        }
    if s:
        kwargs.update(speculation_length=s, enable_fused_speculation=True)
        if config.speculation.mode == "eagle":
            kwargs["enable_eagle_speculation"] = True
            if eagle3:
                kwargs["is_eagle3"] = True
    lnc = env.get(env_names.LOGICAL_NC_CONFIG)  # the node's (trn2: 1 or 2); NxDI would read it before any kwarg
    if lnc:
        if lnc not in ("1", "2"):
            raise RunnerError(f"{env_names.LOGICAL_NC_CONFIG}={lnc!r}: the logical NeuronCore config is 1 or 2")
        kwargs["logical_nc_config"] = int(lnc)
    nodes = config.parallelism.nodes
    if nodes > 1:
        kwargs["local_ranks_size"] = config.parallelism.tensor_parallel_degree // nodes
    refuse_managed_overrides(config.neuron_config_overrides, MANAGED_KEYWORDS)
    return {**kwargs, **copy.deepcopy(config.neuron_config_overrides)}  # last, as vLLM's override_neuron_config


#: NeuronConfig keywords the runner derives from RuntimeConfig fields (keyword -> the field): the slot contract
#: depends on their values, so neuron_config_overrides may not set them.
MANAGED_KEYWORDS = {
    "tp_degree": "parallelism.tensor_parallel_degree", "local_ranks_size": "parallelism.nodes",
    "start_rank_id": "parallelism.nodes", **dict.fromkeys(
        ("batch_size", "ctx_batch_size", "tkg_batch_size", "max_batch_size", "kv_cache_batch_size",
         "is_continuous_batching"), "max_num_seqs"),
    "max_context_length": "max_context_length",
    **dict.fromkeys(("seq_len", "max_length", "n_positions", "max_new_tokens"), "max_model_len"),
    "torch_dtype": "dtype", "padding_side": "the runner (right padding)",
    "save_sharded_checkpoint": "compile_cache.sharded_weights",
    "on_device_sampling_config": "sampling.on_device and sampling.global_top_k",
    **dict.fromkeys(("speculation_length", "enable_fused_speculation", "enable_eagle_speculation", "is_eagle3"),
                    "speculation.mode and speculation.num_speculative_tokens"),
    "logical_nc_config": f"${env_names.LOGICAL_NC_CONFIG} (the operator's parallelism.logicalCoreConfig)",
    "output_logits": "the runner (it reads tokens, or the last position's logits)",
}


def unknown_overrides(neuron_config: Any, overrides: Mapping[str, Any]) -> list[str]:
    """The overrides a release's NeuronConfig did not take: NxDI pops every keyword it knows into an attribute of
    the same name and only logs the rest ("Unexpected keyword arguments"), so a key it lacks would silently do
    nothing."""
    return sorted(key for key in overrides if not hasattr(neuron_config, key))


__all__ = ["MANAGED_KEYWORDS", "TORCH_DTYPES", "neuron_config_kwargs", "speculation_length",
           "unknown_overrides"]
