"""models/llama/modeling_llama.py: LlamaInferenceConfig, NeuronLlamaModel, NeuronLlamaForCausalLM (same required
attributes at 5de79de and ef2731e). The fake's math also takes Mistral checkpoints here (vLLM maps
MistralForCausalLM to this class); a Qwen2 checkpoint needs NeuronQwen2ForCausalLM (its q/k/v biases)."""

from __future__ import annotations

from neuronx_distributed_inference.models._family import LLAMA_REQUIRED, causal_lm_family

LlamaInferenceConfig, NeuronLlamaModel, NeuronLlamaForCausalLM = causal_lm_family(
    __name__, "Llama", required=LLAMA_REQUIRED, hf_architectures=("LlamaForCausalLM", "MistralForCausalLM"))

__all__ = ["LlamaInferenceConfig", "NeuronLlamaForCausalLM", "NeuronLlamaModel"]
