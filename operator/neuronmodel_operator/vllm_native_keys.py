"""The keys vLLM Neuron's native line (trn2) reads from `--additional-config`'s neuron_config, against which
engine vllm checks spec.neuronConfigOverrides there. Pure.

`NeuronConfig.from_dict` (vllm_neuron/model/neuron_config.py, read at whn09/vllm-neuron@7ea9927, a fork that carries
upstream's main: vllm-neuron.md's sources) reads each key below by name and silently drops any other, so a misspelt
or NxDI-only key (`fused_qkv`, `enable_bucketing`) would compile and serve as if it were not there. The image's own
release (images.VLLM_IMAGES) was not published as source: a key it reads that this list lacks is refused too, until
the list learns it.
"""

from __future__ import annotations

from typing import Mapping

from neuronmodel_operator.api import SpecError

#: NeuronConfig.from_dict's keys (whn09/vllm-neuron@7ea9927).
NATIVE_NEURON_CONFIG_KEYS = frozenset({
    "ep_degree", "attention_dp_size", "embedding_dp_size", "lm_head_dp_size", "mlp_dp_size",
    "on_device_sampling_config", "max_logprobs", "tensor_capture", "tensor_replacement", "kv_segment_size_buckets",
    "debug_logits_dir", "quantization", "all2all_backend", "modules_to_not_convert", "num_batched_tokens_buckets",
    "num_seqs_buckets", "decode_context_length_buckets", "enable_structured_outputs", "fp8_packed_kv",
    "hlo2tensorizer_options",
})


def check_native_overrides(overrides: Mapping[str, object], family: str) -> None:
    """Refuse a key of spec.neuronConfigOverrides that the native line's NeuronConfig does not read.

    Raises:
        SpecError: naming the unknown keys and the known ones.
    """
    unknown = sorted(set(overrides) - NATIVE_NEURON_CONFIG_KEYS)
    if unknown:
        raise SpecError(f"spec.neuronConfigOverrides: {', '.join(unknown)} "
                        f"{'is not a key' if len(unknown) == 1 else 'are not keys'} of vLLM Neuron's native "
                        f"NeuronConfig (engine vllm on {family}), which drops unknown keys silently: remove "
                        f"{'it' if len(unknown) == 1 else 'them'}; the keys it reads are "
                        f"{', '.join(sorted(NATIVE_NEURON_CONFIG_KEYS))}")


__all__ = ["NATIVE_NEURON_CONFIG_KEYS", "check_native_overrides"]
