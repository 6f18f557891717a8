"""models/mistral/modeling_mistral.py (0.9, ef2731e): MistralInferenceConfig (tie_word_embeddings required, no
pad_token_id), NeuronMistralModel, NeuronMistralForCausalLM."""

from __future__ import annotations

from typing import List, Type

from neuronx_distributed_inference.models.config import InferenceConfig, NeuronConfig
from neuronx_distributed_inference.models.model_base import NeuronBaseForCausalLM, NeuronBaseModel


class MistralInferenceConfig(InferenceConfig):
    def get_required_attributes(self) -> List[str]:
        return ["hidden_size", "num_attention_heads", "num_hidden_layers", "num_key_value_heads", "vocab_size",
                "max_position_embeddings", "rope_theta", "rms_norm_eps", "hidden_act", "tie_word_embeddings"]

    @classmethod
    def get_neuron_config_cls(cls) -> Type[NeuronConfig]:
        return NeuronConfig


class NeuronMistralModel(NeuronBaseModel):
    pass


class NeuronMistralForCausalLM(NeuronBaseForCausalLM):
    _model_cls = NeuronMistralModel
    _hf_architectures = ("MistralForCausalLM",)

    @classmethod
    def get_config_cls(cls):
        return MistralInferenceConfig


__all__ = ["MistralInferenceConfig", "NeuronMistralForCausalLM", "NeuronMistralModel"]
