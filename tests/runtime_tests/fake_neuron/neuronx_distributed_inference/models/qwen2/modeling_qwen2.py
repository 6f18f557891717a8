"""models/qwen2/modeling_qwen2.py (from 0.4, 2c46add; ef2731e the same names): Qwen2NeuronConfig,
Qwen2InferenceConfig, NeuronQwen2Model, NeuronQwen2ForCausalLM."""

from __future__ import annotations

from typing import List, Type

from neuronx_distributed_inference.models.config import InferenceConfig, NeuronConfig
from neuronx_distributed_inference.models.model_base import NeuronBaseForCausalLM, NeuronBaseModel


class Qwen2NeuronConfig(NeuronConfig):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.attn_cls = "NeuronQwen2Attention"


class Qwen2InferenceConfig(InferenceConfig):
    def add_derived_config(self):
        self.num_cores_per_group = 1
        self.qkv_bias = True
        self.o_bias = False

    def get_required_attributes(self) -> List[str]:
        return ["hidden_size", "num_attention_heads", "num_hidden_layers", "num_key_value_heads", "pad_token_id",
                "vocab_size", "max_position_embeddings", "rope_theta", "rms_norm_eps", "hidden_act"]

    @classmethod
    def get_neuron_config_cls(cls) -> Type[NeuronConfig]:
        return Qwen2NeuronConfig


class NeuronQwen2Model(NeuronBaseModel):
    pass


class NeuronQwen2ForCausalLM(NeuronBaseForCausalLM):
    _model_cls = NeuronQwen2Model
    _hf_architectures = ("Qwen2ForCausalLM",)

    @classmethod
    def get_config_cls(cls):
        return Qwen2InferenceConfig


__all__ = ["NeuronQwen2ForCausalLM", "NeuronQwen2Model", "Qwen2InferenceConfig", "Qwen2NeuronConfig"]
