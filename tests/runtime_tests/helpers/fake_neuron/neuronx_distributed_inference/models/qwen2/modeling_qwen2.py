"""models/qwen2/modeling_qwen2.py (from 0.4, 2c46add; ef2731e the same names): Qwen2NeuronConfig,
Qwen2InferenceConfig (add_derived_config: q/k/v biases, no o bias), NeuronQwen2Model, NeuronQwen2ForCausalLM."""

from __future__ import annotations

from neuronx_distributed_inference.models._family import LLAMA_REQUIRED, causal_lm_family
from neuronx_distributed_inference.models.config import NeuronConfig


class Qwen2NeuronConfig(NeuronConfig):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.attn_cls = "NeuronQwen2Attention"


Qwen2InferenceConfig, NeuronQwen2Model, NeuronQwen2ForCausalLM = causal_lm_family(
    __name__, "Qwen2", required=LLAMA_REQUIRED, hf_architectures=("Qwen2ForCausalLM",),
    neuron_config_cls=Qwen2NeuronConfig, derived={"num_cores_per_group": 1, "qkv_bias": True, "o_bias": False})

__all__ = ["NeuronQwen2ForCausalLM", "NeuronQwen2Model", "Qwen2InferenceConfig", "Qwen2NeuronConfig"]
