"""models/llama/modeling_llama.py: LlamaInferenceConfig, NeuronLlamaModel, NeuronLlamaForCausalLM (same required
attributes at 5de79de and ef2731e). The fake's math also takes Mistral checkpoints here (vLLM maps
MistralForCausalLM to this class); a Qwen2 checkpoint needs NeuronQwen2ForCausalLM (its q/k/v biases)."""

from __future__ import annotations

from typing import List, Type

from neuronx_distributed_inference.models.config import InferenceConfig, NeuronConfig
from neuronx_distributed_inference.models.model_base import NeuronBaseForCausalLM, NeuronBaseModel


class LlamaInferenceConfig(InferenceConfig):
    def get_required_attributes(self) -> List[str]:
        return ["hidden_size", "num_attention_heads", "num_hidden_layers", "num_key_value_heads", "pad_token_id",
                "vocab_size", "max_position_embeddings", "rope_theta", "rms_norm_eps", "hidden_act"]

    @classmethod
    def get_neuron_config_cls(cls) -> Type[NeuronConfig]:
        return NeuronConfig


class NeuronLlamaModel(NeuronBaseModel):
    pass


class NeuronLlamaForCausalLM(NeuronBaseForCausalLM):
    _model_cls = NeuronLlamaModel
    _hf_architectures = ("LlamaForCausalLM", "MistralForCausalLM")

    @classmethod
    def get_config_cls(cls):
        return LlamaInferenceConfig


__all__ = ["LlamaInferenceConfig", "NeuronLlamaForCausalLM", "NeuronLlamaModel"]
