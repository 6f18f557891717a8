"""The NeuronConfig the TNx runner compiles its models with (transformers-neuronx 0.13, config.py): the keywords of
the target and the draft derived from RuntimeConfig, `neuron_config_overrides` checked and merged last, and the
config objects (quant, kv_cache_quant, ...) built from JSON objects as vLLM's TNx loader builds them.

Nothing here imports transformers-neuronx: `build_neuron_config` gets its config module from the runner's `load()`.
"""

from __future__ import annotations

import copy
import inspect
from typing import Any, Mapping

from neuronmodel_runtime.config import RuntimeConfig
from neuronmodel_runtime.runners.base import RunnerError
from neuronmodel_runtime.runners.neuron_overrides import refuse_managed_overrides

#: RuntimeConfig.dtype -> TNx `amp` ("auto" is bfloat16 on Neuron).
AMP = {"auto": "bf16", "bfloat16": "bf16", "float16": "f16", "float32": "f32"}
#: A line's sampling on the device: (top_k, top_p, temperature); greedy is top_k 1.
GREEDY_LINE = (1, 1.0, 1.0)
#: NeuronConfig keywords the runner derives from RuntimeConfig fields (keyword -> the field): the slot contract
#: depends on their values, so neuron_config_overrides may not set them.
MANAGED_KEYWORDS = {
    "continuous_batching": "max_num_seqs",
    "on_device_generation": "sampling.on_device and sampling.global_top_k",
    **dict.fromkeys(("on_device_embedding", "is_eagle_target", "is_eagle_draft", "has_pre_attention_norm"),
                    "speculation.mode"),
    # they change the output's shape: the runner reads one token, or one row of logits, per line
    **dict.fromkeys(("output_all_logits", "log_softmax_scores"), "the runner (one output per line)"),
}
#: NeuronConfig keywords that take a config object, and its class in config.py: a JSON object given for one of
#: them is built into that class, as vLLM's TNx loader builds them (it builds sparse_attn's SparseAttnConfig too; the
#: runner does not, so a JSON object for sparse_attn, or any other keyword, is refused).
CONFIG_OBJECTS = {"continuous_batching": "ContinuousBatchingConfig", "on_device_generation": "GenerationConfig",
                  "quant": "QuantizationConfig", "kv_cache_quant": "KVCacheQuantizationConfig"}


def sequence_length(config: RuntimeConfig) -> int:
    """The compiled n_positions: max_model_len, plus k scratch positions that a fused step writes past a row."""
    spec = config.speculation
    return config.max_model_len + (spec.num_speculative_tokens if spec.mode in ("draft", "eagle") else 0)


def device_top_k(config: RuntimeConfig, vocab_size: int) -> int:
    """The compiled global top-k: sampling.global_top_k, at most the vocabulary (hlo.topk over it)."""
    return min(config.sampling.global_top_k, vocab_size)


def neuron_config_kwargs(config: RuntimeConfig, vocab_size: int, role: str = "target") -> dict[str, Any]:
    """NeuronConfig keyword arguments (nested configs as dicts) of the target or the draft (pure).

    Every key of ours is a NeuronConfig argument of 0.13 (config.py). BSH attention / collectives layouts and fused
    QKV are vLLM's TNx defaults (model_loader/neuron.py); the KV cache keeps the default SBH layout, which allows
    several context buckets. The target's `neuron_config_overrides` are merged last; the draft gets none, as in
    vLLM's TNx loader, which gives the draft its own draft_model_config.override_neuron_config (SpeculativeConfig
    never fills it from the target's).

    Raises:
        RunnerError: an override of a keyword the runner derives from a RuntimeConfig field, or a JSON object for a
            keyword that takes none the runner builds (`CONFIG_OBJECTS`).
    """
    batch = config.max_num_seqs
    mode = config.speculation.mode
    kwargs: dict[str, Any] = {
        "continuous_batching": {"batch_size_for_shared_caches": batch},
        "attention_layout": "BSH",  # constants.LAYOUT_BSH
        "collectives_layout": "BSH",
        "fuse_qkv": True,
    }
    if config.sampling.on_device:
        kwargs["on_device_generation"] = {
            "max_length": sequence_length(config), "do_sample": True, "dynamic": True, "per_batch_line": True,
            "global_top_k": device_top_k(config, vocab_size), "top_k": [GREEDY_LINE[0]] * batch,
            "top_p": [GREEDY_LINE[1]] * batch, "temperature": [GREEDY_LINE[2]] * batch,
        }
    if mode in ("draft", "eagle"):
        kwargs["on_device_embedding"] = True  # both fused speculators assert it on both models
    if mode == "eagle":
        if role == "target":
            kwargs["is_eagle_target"] = True
        else:
            kwargs.update(is_eagle_draft=True, has_pre_attention_norm=False)  # as vLLM's TNx EAGLE loader
    if role == "target":
        kwargs.update(checked_overrides(config.neuron_config_overrides))
    return kwargs


def checked_overrides(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of neuron_config_overrides once no key is one the runner manages and every JSON object is for a
    keyword that takes a config object (`CONFIG_OBJECTS`)."""
    refuse_managed_overrides(overrides, MANAGED_KEYWORDS)
    for key, value in overrides.items():
        if isinstance(value, dict) and key not in CONFIG_OBJECTS:
            built = ", ".join(k for k in CONFIG_OBJECTS if k not in MANAGED_KEYWORDS)
            raise RunnerError(f"neuron_config_overrides: {key}: the tnx runner builds a config object from a JSON "
                              f"object only for {built}; give {key} a plain value, or leave it out")
    return copy.deepcopy(dict(overrides))


def build_neuron_config(tnx_config: Any, kwargs: Mapping[str, Any], version: str) -> Any:
    """NeuronConfig from `neuron_config_kwargs`, its JSON objects built into TNx's config objects (`CONFIG_OBJECTS`;
    from a deep copy: TNx mutates the generation config it is given).

    Raises:
        RunnerError: TNx refuses an override: NeuronConfig asserts it knows every keyword and checks some values
            (config.py), the config objects check theirs.
    """
    values = copy.deepcopy(dict(kwargs))
    for key, value in values.items():
        if isinstance(value, dict) and key in CONFIG_OBJECTS:
            try:
                values[key] = getattr(tnx_config, CONFIG_OBJECTS[key])(**value)
            except (TypeError, NotImplementedError, AssertionError) as exc:
                raise RunnerError(f"neuron_config_overrides: {key}: transformers-neuronx {version} refuses it as "
                                  f"{CONFIG_OBJECTS[key]} ({exc}); fix or remove it") from exc
    try:
        return tnx_config.NeuronConfig(**values)
    except AssertionError as exc:
        known = inspect.signature(tnx_config.NeuronConfig).parameters
        unknown = [key for key in kwargs if key not in known]
        if unknown:
            raise RunnerError(f"neuron_config_overrides: {', '.join(unknown)} is not a NeuronConfig keyword of "
                              f"transformers-neuronx {version}; remove it (the keywords: NeuronConfig in its "
                              "config.py)") from exc
        raise RunnerError(f"neuron_config_overrides: transformers-neuronx {version} refuses the NeuronConfig they "
                          f"make ({exc}); fix or remove the override") from exc


__all__ = ["AMP", "CONFIG_OBJECTS", "GREEDY_LINE", "MANAGED_KEYWORDS", "build_neuron_config", "checked_overrides",
           "device_top_k", "neuron_config_kwargs", "sequence_length"]
