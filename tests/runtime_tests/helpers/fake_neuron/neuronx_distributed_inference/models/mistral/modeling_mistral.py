"""models/mistral/modeling_mistral.py (0.9, ef2731e): MistralInferenceConfig (tie_word_embeddings required, no
pad_token_id), NeuronMistralModel, NeuronMistralForCausalLM."""

from __future__ import annotations

from neuronx_distributed_inference.models._family import causal_lm_family

MistralInferenceConfig, NeuronMistralModel, NeuronMistralForCausalLM = causal_lm_family(
    __name__, "Mistral", hf_architectures=("MistralForCausalLM",),
    required=("hidden_size", "num_attention_heads", "num_hidden_layers", "num_key_value_heads", "vocab_size",
              "max_position_embeddings", "rope_theta", "rms_norm_eps", "hidden_act", "tie_word_embeddings"))

__all__ = ["MistralInferenceConfig", "NeuronMistralForCausalLM", "NeuronMistralModel"]
