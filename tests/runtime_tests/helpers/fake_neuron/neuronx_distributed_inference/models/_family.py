"""Not a module of the real library: the fake's one builder of the model families whose math it backs (llama, qwen2,
mistral). In the real each family's modeling_<family>.py defines the same three classes, which differ only in what
`causal_lm_family` takes: `<Family>InferenceConfig` (get_required_attributes, get_neuron_config_cls, any
add_derived_config), `Neuron<Family>Model` (the traced decoder, FusedSpecNeuronConfig's worker_cls) and
`Neuron<Family>ForCausalLM` (its `_model_cls`, get_config_cls)."""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Tuple, Type

from neuronx_distributed_inference.models.config import InferenceConfig, NeuronConfig
from neuronx_distributed_inference.models.model_base import NeuronBaseForCausalLM, NeuronBaseModel

#: LlamaInferenceConfig's required attributes (Qwen2InferenceConfig's too).
LLAMA_REQUIRED = ("hidden_size", "num_attention_heads", "num_hidden_layers", "num_key_value_heads", "pad_token_id",
                  "vocab_size", "max_position_embeddings", "rope_theta", "rms_norm_eps", "hidden_act")


def causal_lm_family(module: str, family: str, *, required: Sequence[str], hf_architectures: Sequence[str],
                     neuron_config_cls: Type[NeuronConfig] = NeuronConfig,
                     derived: Optional[Dict[str, Any]] = None) -> Tuple[type, type, type]:
    """(<family>InferenceConfig, Neuron<family>Model, Neuron<family>ForCausalLM), defined in `module` (the caller's
    __name__, so that a saved config's {"__module__", "__name__"} of a class loads it back). `derived`: what the
    config's own add_derived_config sets (else it keeps the base's); `hf_architectures`: the checkpoints whose math
    the fake backs with this class."""
    config_ns: Dict[str, Any] = {
        "__module__": module,
        "get_required_attributes": lambda self: list(required),
        "get_neuron_config_cls": classmethod(lambda cls: neuron_config_cls)}
    if derived:
        def add_derived_config(self):
            for key, value in derived.items():
                setattr(self, key, value)

        config_ns["add_derived_config"] = add_derived_config
    config_cls = type(f"{family}InferenceConfig", (InferenceConfig,), config_ns)
    model_cls = type(f"Neuron{family}Model", (NeuronBaseModel,), {"__module__": module})
    causal_lm_cls = type(f"Neuron{family}ForCausalLM", (NeuronBaseForCausalLM,), {
        "__module__": module, "_model_cls": model_cls, "_hf_architectures": tuple(hf_architectures),
        "get_config_cls": classmethod(lambda cls: config_cls)})
    return config_cls, model_cls, causal_lm_cls
